"""SCAFFOLD's part of vectorized local training (`fedhet.engine.vectorized`): the gradient
correction c - c_i and, once trained, the new control variate c_i+ and the upload c_i+ - c_i,
by the update `Scaffold.client_update` makes (correction `gradient` only)."""

from __future__ import annotations

from collections.abc import Callable

from fedhet.engine import tensors
from fedhet.engine.tensors import Tensors
from fedhet.engine.vectorized import CohortClient, CohortResult, GradientCorrection
from fedhet.methods.scaffold.control import updated_control

CONTROL = "control:"  # prefix of the client's own control variate c_i among its extras


class ScaffoldCorrection(GradientCorrection):
    def __init__(
        self, server_control: Tensors, global_state: Tensors, step_count: Callable[[int], float]
    ):
        self.c, self.global_state, self.step_count = server_control, global_state, step_count

    def extras(self, client_state: Tensors) -> Tensors:
        """A client's extras from its stored state (no state yet: c_i = 0): c - c_i per
        parameter, and c_i itself under CONTROL-prefixed names for `finish`."""
        c_i = client_state or tensors.zeros_like(self.c)
        return {n: c - c_i[n] for n, c in self.c.items()} | {CONTROL + n: v for n, v in c_i.items()}

    def finish(self, client: CohortClient, result: CohortResult, lr: float) -> None:
        c_i = {n: client.extras[CONTROL + n] for n in self.c}
        scale = 1.0 / (self.step_count(result.stats.steps) * lr)
        result.client_state, result.upload = updated_control(
            self.c, c_i, self.global_state, result.state, scale
        )
