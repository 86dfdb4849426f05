"""FedProx: FedAvg with the proximal term mu/2 ||w - w_global||^2 in the local objective (the
engine's `Proximal` client step, which the fused executor applies in closed form)."""

from fedhet.plugin import Proximal, Tensors, Trainer


class FedProx(Trainer):
    def client_step(self, round: int, global_state: Tensors, server_state: Tensors) -> Proximal:
        anchor = {n: v for n, v in global_state.items() if n in self.param_names}
        return Proximal(self.config.mu, anchor)
