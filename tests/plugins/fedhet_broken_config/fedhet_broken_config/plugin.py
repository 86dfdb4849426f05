"""A broken plug-in: its algorithm's config is not a fedhet MethodConfig."""

from fedhet.core.registry import Method


class NotASpec:
    name = "badconfig"


METHOD = Method("badconfig", configs=(NotASpec,))
