"""SCAFFOLD's control variate update at the end of a client's round, shared by the sequential
(`Scaffold.client_update`) and the vectorized (`ScaffoldCorrection.finish`) paths."""

from __future__ import annotations

import torch

from fedhet.engine.tensors import Tensors


@torch.no_grad()
def updated_control(
    c: Tensors, c_i: Tensors, global_state: Tensors, trained: Tensors, scale: float
) -> tuple[Tensors, Tensors]:
    """(c_i+, c_i+ - c_i) with c_i+ = c_i - c + scale (x - y_i): `scale` is 1 / (a_i lr)."""
    new, delta = {}, {}
    for name, c_name in c.items():
        new[name] = c_i[name] - c_name + scale * (global_state[name] - trained[name])
        delta[name] = new[name] - c_i[name]
    return new, delta
