"""FedAvg's spec block: `algorithm: {name: fedavg}`."""

from __future__ import annotations

from typing import ClassVar, Literal

from fedhet.plugin import MethodConfig


class FedAvgConfig(MethodConfig):
    accepts_objectives: ClassVar[bool] = True
    display_name: ClassVar[str | None] = "FedAvg"
    name: Literal["fedavg"] = "fedavg"
