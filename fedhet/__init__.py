"""fedhet: declarative federated learning under data heterogeneity.

`fedhet.load(spec, *overrides, store=...)` opens an experiment from Python (fedhet.api); it is
imported on first use, so `import fedhet` stays light.
"""

import os

__version__ = "0.1.0"

# OpenMP threads that wait for work sleep instead of spinning, so a run on a busy machine gives
# cores back (read when torch loads its OpenMP runtime: here, before any fedhet module imports
# torch; fedhet.process.cores explains the thread default).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def __getattr__(name: str):
    if name in ("load", "Experiment"):  # by name: every layer imports this package's version
        from importlib import import_module

        return getattr(import_module("fedhet.api"), name)
    raise AttributeError(f"module 'fedhet' has no attribute {name!r}")
