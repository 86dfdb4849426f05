"""The algorithm registry: name -> Algorithm class."""

from __future__ import annotations

from fedhet.algorithms.centralized import Centralized
from fedhet.algorithms.fedavg import FedAvg
from fedhet.algorithms.fednova import FedNova
from fedhet.algorithms.fedprox import FedProx
from fedhet.algorithms.scaffold import Scaffold
from fedhet.fl.algorithm import Algorithm

ALGORITHMS: dict[str, type[Algorithm]] = {
    algo.name: algo for algo in (FedAvg, FedProx, Scaffold, FedNova, Centralized)
}
