"""`algorithm: {name: plugin_fedavgm, beta: 0.9, server_lr: 1.0}` (no torch: validating and
planning import only this; fedhet's own FedOpt family has `fedavgm`)."""

from typing import ClassVar, Literal

from pydantic import Field

from fedhet.plugin import Method, MethodConfig


class FedAvgMConfig(MethodConfig):
    trainer: ClassVar[str | None] = "fedhet_fedavgm.algorithm:FedAvgM"
    name: Literal["plugin_fedavgm"] = "plugin_fedavgm"
    beta: float = Field(0.9, ge=0, lt=1, description="the server's momentum")
    server_lr: float = Field(1.0, gt=0, description="the server's step size")


METHOD = Method("plugin_fedavgm", configs=(FedAvgMConfig,))
