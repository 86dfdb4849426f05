"""The clients' learning-rate schedule, known without torch (planning and reports use it)."""

from __future__ import annotations

from fedhet.core.spec import FederationSpec


def round_lr(fed: FederationSpec, round: int) -> float:
    """The clients' learning rate in round `round` (0-based): lr decayed once per round."""
    return fed.lr * fed.lr_decay**round
