"""Centralized training's spec block: `algorithm: {name: centralized}`."""

from __future__ import annotations

from typing import Literal

from fedhet.core.sections import AlgorithmSpec


class CentralizedConfig(AlgorithmSpec):
    name: Literal["centralized"] = "centralized"
