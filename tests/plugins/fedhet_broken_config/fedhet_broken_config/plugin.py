"""A broken plug-in: its algorithm's config is not a fedhet AlgorithmSpec."""

from fedhet.core.registry import AlgorithmEntry, Method


class NotASpec:
    name = "badconfig"


METHOD = Method(
    "badconfig",
    algorithms=(AlgorithmEntry(NotASpec, "fedhet_broken_config.plugin:NotASpec"),),
)
