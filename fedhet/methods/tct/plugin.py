"""Registers tct with fedhet (entry point `fedhet.methods`)."""

from fedhet.core.registry import Method
from fedhet.methods.tct import entk_stage, regress_stage  # noqa: F401  (register the stages)
from fedhet.methods.tct.algorithm import TCT

METHOD = Method("tct", algorithms=(TCT,))
