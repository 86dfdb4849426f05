"""Registers moon with fedhet (entry point `fedhet.methods`); imports no torch."""

from fedhet.methods.moon.config import MoonConfig
from fedhet.plugin import Method

METHOD = Method(
    "moon",
    configs=(MoonConfig,),
)
