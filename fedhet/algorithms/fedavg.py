"""FedAvg (McMahan et al.): local SGD, then the size-weighted average of the client models."""

from typing import Literal

from fedhet.fl.algorithm import Algorithm
from fedhet.virtual.objective import VHLOption


class FedAvg(Algorithm):
    name = "fedavg"

    class Config(VHLOption):
        name: Literal["fedavg"] = "fedavg"
