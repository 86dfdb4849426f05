"""What fedhet loads through the `fedhet.methods` entry point: the method and its spec block,
which plans its runs and names where its trainer lives. Light on purpose (no torch): validating
and planning a spec import only this."""

from typing import ClassVar, Literal

from pydantic import Field

from fedhet.plugin import Method, MethodConfig, Spec, StageNode, train_node
from fedhet_example.stage import label_skew_node


class SkewAvgConfig(MethodConfig):
    """`algorithm: {name: skewavg, temperature: 1.0}`."""

    trainer: ClassVar[str | None] = "fedhet_example.algorithm:SkewAvg"
    display_name: ClassVar[str | None] = "SkewAvg"
    name: Literal["skewavg"] = "skewavg"
    temperature: float = Field(
        1.0, ge=0, description="how strongly label-skewed clients are down-weighted; 0 is FedAvg"
    )

    def settings(self) -> list[str]:
        return [f"temperature={self.temperature:g}"] if self.temperature != 1.0 else []

    def plan(self, spec: Spec) -> StageNode:
        # the train stage hands the label_skew artifact over as setup.extras["label_skew"]
        return train_node(spec, label_skew=label_skew_node(spec))


METHOD = Method("skewavg", configs=(SkewAvgConfig,), stages=("fedhet_example.stage",))
