"""Centralized training's spec block: `algorithm: {name: centralized}`."""

from __future__ import annotations

from typing import ClassVar, Literal

from fedhet.engine.description import MethodConfig


class CentralizedConfig(MethodConfig):
    trainer: ClassVar[str | None] = "fedhet.methods.centralized.algorithm:Centralized"
    name: Literal["centralized"] = "centralized"
