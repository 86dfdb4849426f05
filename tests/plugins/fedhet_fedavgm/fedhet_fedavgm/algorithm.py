"""The server treats x - avg (the FedAvg average of the clients' models) as a gradient:
v <- beta v + (x - avg), x <- x - server_lr v. Buffers (BatchNorm statistics) are averaged.
The clients train as FedAvg's, so either client executor runs them."""

from fedhet.plugin import Tensors, Trainer, tensors


class FedAvgM(Trainer):
    def init_server_state(self, global_state: Tensors) -> Tensors:
        return tensors.zeros_like({n: global_state[n] for n in self.param_names})

    def aggregate(self, round, global_state, server_state, results, weights):
        averaged = super().aggregate(round, global_state, server_state, results, weights)
        for name, v in server_state.items():
            v.mul_(self.config.beta).add_(global_state[name] - averaged[name])
            averaged[name] = global_state[name] - self.config.server_lr * v
        return averaged
