"""Registers fedbr with fedhet (entry point `fedhet.methods`)."""

from fedhet.core.registry import Method
from fedhet.methods.fedbr import pseudo_stage  # noqa: F401  (registers the stage)
from fedhet.methods.fedbr.algorithm import FedBR

METHOD = Method("fedbr", algorithms=(FedBR,))
