"""FedAvg (McMahan et al.): local SGD, then the size-weighted average of the client models."""

from typing import Literal

from fedhet.fl.algorithm import Algorithm
from fedhet.spec import AlgorithmSpec


class FedAvg(Algorithm):
    name = "fedavg"

    class Config(AlgorithmSpec):
        name: Literal["fedavg"] = "fedavg"
