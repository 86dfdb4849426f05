"""Clients' SGD momentum buffers kept across rounds (`federation.momentum_buffers: client`), as
in code where every client owns its optimizer for the whole run.

A client's buffers and their gradient weight (`fedhet.engine.local.buffer_weight`, which
FedNova's and SCAFFOLD's effective step counts need) live in its persistent state, so they are
checkpointed and resumed with it; a client that does not report in a round keeps them as they
are.
"""

from __future__ import annotations

import torch
from torch import nn

from fedhet.engine.local import buffer_weight
from fedhet.engine.tensors import Tensors

BUFFER = "momentum_buffer."  # + parameter name
WEIGHT = "momentum_buffer_weight"


def restore(optimizer: torch.optim.SGD, model: nn.Module, client_state: Tensors) -> float:
    """Load the client's kept buffers into `optimizer`; the gradient weight they carry (0: none
    kept yet)."""
    for name, p in model.named_parameters():
        if BUFFER + name in client_state:
            optimizer.state[p]["momentum_buffer"] = client_state[BUFFER + name].clone()
    return float(client_state[WEIGHT]) if WEIGHT in client_state else 0.0


def keep(
    optimizer: torch.optim.SGD, model: nn.Module, client_state: Tensors, steps: int, carried: float
) -> None:
    """Store the optimizer's buffers after `steps` steps from `carried` in the client's state."""
    momentum = optimizer.param_groups[0]["momentum"]
    for name, p in model.named_parameters():
        buffer = optimizer.state[p].get("momentum_buffer")
        if buffer is not None:
            client_state[BUFFER + name] = buffer.detach().clone()
    weight = buffer_weight(steps, momentum, carried)
    client_state[WEIGHT] = torch.tensor(weight, dtype=torch.float64)
