"""Registers groupdro with fedhet (entry point `fedhet.methods`); imports no torch."""

from fedhet.methods.groupdro.config import GroupDROConfig
from fedhet.plugin import Method

METHOD = Method(
    "groupdro",
    configs=(GroupDROConfig,),
)
