"""Methods: one package per method, each registered through the `fedhet.methods` entry points."""
