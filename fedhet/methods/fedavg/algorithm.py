"""FedAvg (McMahan et al.): local SGD, then the size-weighted average of the client models."""


from fedhet.engine.algorithm import Algorithm
from fedhet.methods.fedavg.config import FedAvgConfig


class FedAvg(Algorithm):
    name = "fedavg"


    Config = FedAvgConfig
