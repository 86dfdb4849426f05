"""Local training's spec block: `algorithm: {name: local}`."""

from __future__ import annotations

from typing import ClassVar, Literal

from fedhet.plugin import MethodConfig


class LocalConfig(MethodConfig):
    trainer: ClassVar[str | None] = "fedhet.methods.local.algorithm:Local"
    # every client's own model is what is evaluated (and stored with the run)
    personalized: ClassVar[bool] = True
    # 1: each client's model scored on its own validation and test samples, not the pooled
    # sets (fedhet.engine.own_evaluation)
    revision: ClassVar[int] = 1
    # no global model moves: the distance of the clients' models to it measures nothing shared
    undefined_metrics: ClassVar[frozenset[str]] = frozenset({"divergence"})
    display_name: ClassVar[str | None] = "Local"
    name: Literal["local"] = "local"
