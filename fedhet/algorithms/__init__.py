"""The algorithm registry: name -> Algorithm class."""

from __future__ import annotations

from fedhet.algorithms.centralized import Centralized
from fedhet.algorithms.fedavg import FedAvg
from fedhet.algorithms.fednova import FedNova
from fedhet.algorithms.fedprox import FedProx
from fedhet.algorithms.scaffold import Scaffold
from fedhet.fedbr.algorithm import FedBR
from fedhet.fedimpro import FedImpro
from fedhet.fedtan.algorithms import FEDTAN_ALGORITHMS
from fedhet.fl.algorithm import Algorithm
from fedhet.tct.algorithm import TCT

ALGORITHMS: dict[str, type[Algorithm]] = {
    algo.name: algo
    for algo in (
        FedAvg,
        FedProx,
        Scaffold,
        FedNova,
        Centralized,
        FedImpro,
        FedBR,
        TCT,
    )
}
ALGORITHMS.update({algo.name: algo for algo in FEDTAN_ALGORITHMS})
