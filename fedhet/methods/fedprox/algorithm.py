"""FedProx: FedAvg with the proximal term mu/2 ||w - w_global||^2 in the local objective."""

from torch import Tensor

from fedhet.plugin import ClientStep, Stacked, Tensors, Trainer


class Proximal(ClientStep):
    """mu/2 ||w - anchor||^2 added to each client's loss, anchored at the round's global model."""

    def __init__(self, mu: float, anchor: Tensors):
        self.mu, self.anchor = mu, anchor

    def loss(self, params: Stacked) -> Tensor | None:
        if self.mu == 0:
            return None
        prox = sum(((p - self.anchor[n]) ** 2).flatten(1).sum(1) for n, p in params.items())
        return 0.5 * self.mu * prox


class FedProx(Trainer):
    def client_step(self, round: int, global_state: Tensors, server_state: Tensors) -> Proximal:
        anchor = {n: v for n, v in global_state.items() if n in self.param_names}
        return Proximal(self.config.mu, anchor)
