"""What fedhet loads through the `fedhet.methods` entry point: the method, its spec block and
where its code lives. Light on purpose (no torch): validating a spec imports only this."""

from typing import Literal

from pydantic import Field

from fedhet.core.registry import AlgorithmEntry, Method
from fedhet.core.sections import AlgorithmSpec


class SkewAvgConfig(AlgorithmSpec):
    """`algorithm: {name: skewavg, temperature: 1.0}`."""

    name: Literal["skewavg"] = "skewavg"
    temperature: float = Field(
        1.0, ge=0, description="how strongly label-skewed clients are down-weighted; 0 is FedAvg"
    )


METHOD = Method(
    "skewavg",
    algorithms=(AlgorithmEntry(SkewAvgConfig, "fedhet_example.algorithm:SkewAvg"),),
    stages=("fedhet_example.stage",),
)
