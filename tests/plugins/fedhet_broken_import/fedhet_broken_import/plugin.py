"""A broken plug-in: its module imports a package that is not installed."""

import fedhet_missing_dependency  # noqa: F401

from fedhet.core.registry import Method

METHOD = Method("broken_import")
