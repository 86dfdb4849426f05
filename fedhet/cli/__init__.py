"""The `fedhet` command line."""

from fedhet.cli.app import main

__all__ = ["main"]
