"""fedhet: declarative federated learning under data heterogeneity.

`fedhet.load(spec, *overrides, store=...)` opens an experiment from Python and
`fedhet.artifacts(store)` an artifact store (fedhet.api); it is imported on first use, so
`import fedhet` stays light.
"""

__version__ = "0.1.0"


_API = ("load", "Experiment", "artifacts", "Artifacts")


def __getattr__(name: str):
    if name in _API:  # by name: every layer imports this package's version
        from importlib import import_module

        return getattr(import_module("fedhet.api"), name)
    raise AttributeError(f"module 'fedhet' has no attribute {name!r}")
