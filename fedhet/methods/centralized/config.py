"""Centralized training's spec block: `algorithm: {name: centralized}`."""

from __future__ import annotations

from typing import ClassVar, Literal

from fedhet.plugin import InputError, MethodConfig


class CentralizedConfig(MethodConfig):
    trainer: ClassVar[str | None] = "fedhet.methods.centralized.algorithm:Centralized"
    undefined_metrics: ClassVar[frozenset[str]] = frozenset({"divergence"})
    display_name: ClassVar[str | None] = "Centralized"
    name: Literal["centralized"] = "centralized"

    def check(self, spec) -> None:
        """One machine trains on the union: it has no clients' devices to be heterogeneous."""
        super().check(spec)
        if spec.federation.system is not None:
            raise InputError(
                "federation.system: centralized training has no clients whose devices differ; "
                "remove the section"
            )
