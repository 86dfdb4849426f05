"""FedAvg (McMahan et al.): local SGD, then the size-weighted average of the client models."""

from typing import Literal

from fedhet.core.sections import AlgorithmSpec
from fedhet.engine.algorithm import Algorithm


class FedAvg(Algorithm):
    name = "fedavg"

    accepts_objectives = True

    class Config(AlgorithmSpec):
        name: Literal["fedavg"] = "fedavg"
