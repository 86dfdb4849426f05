"""SCAFFOLD's part of vectorized local training (`fedhet.engine.vectorized`): the gradient
correction c - c_i and, once trained, the new control variate c_i+ and the upload c_i+ - c_i,
as `Scaffold.client_update` computes them (correction `gradient` only)."""

from __future__ import annotations

import torch

from fedhet.engine import tensors
from fedhet.engine.local import effective_steps
from fedhet.engine.tensors import Tensors
from fedhet.engine.vectorized import CohortClient, CohortResult, GradientCorrection

CONTROL = "control:"  # prefix of the client's own control variate c_i among its extras


class ScaffoldCorrection(GradientCorrection):
    def __init__(self, server_control: Tensors, global_state: Tensors, momentum: float):
        self.c, self.global_state, self.momentum = server_control, global_state, momentum

    def extras(self, client_state: Tensors) -> Tensors:
        """A client's extras from its stored state (no state yet: c_i = 0): c - c_i per
        parameter, and c_i itself under CONTROL-prefixed names for `finish`."""
        c_i = client_state or tensors.zeros_like(self.c)
        return {n: c - c_i[n] for n, c in self.c.items()} | {CONTROL + n: v for n, v in c_i.items()}

    @torch.no_grad()
    def finish(self, client: CohortClient, result: CohortResult, lr: float) -> None:
        scale = 1.0 / (effective_steps(result.stats.steps, self.momentum) * lr)
        new, upload = {}, {}
        for name, c in self.c.items():
            c_i = client.extras[CONTROL + name]
            new[name] = c_i - c + scale * (self.global_state[name] - result.state[name])
            upload[name] = new[name] - c_i
        result.upload, result.client_state = upload, new
