"""SCAFFOLD (Karimireddy et al.), option II control variates.

c_i+ = c_i - c + (x - y_i) / (a_i lr): the client's mean corrected gradient over the round.
a_i is the number of local steps for plain SGD; with momentum it is FedNova's effective step
count, since momentum scales the displacement by up to 1 / (1 - rho) (dividing by the step
count alone would inflate c_i by that factor and over-correct).

Invariant kept by `aggregate`: the server control c equals sum_i p_i c_i over ALL clients
(p_i = n_i / n), so under full participation the corrections c_i - c sum (p-weighted) to zero.
"""

from typing import Literal

import torch
from torch import nn

from fedhet.core.sections import AlgorithmSpec
from fedhet.engine import tensors
from fedhet.engine.algorithm import Algorithm, ClientJob, ClientResult
from fedhet.engine.local import effective_steps
from fedhet.engine.tensors import Tensors


class Scaffold(Algorithm):
    name = "scaffold"
    revision = 1  # 1: momentum-aware control variates

    accepts_objectives = True

    class Config(AlgorithmSpec):
        name: Literal["scaffold"] = "scaffold"

    def init_server_state(self, global_state: Tensors) -> Tensors:
        params = {k: v for k, v in global_state.items() if k in self.param_names}
        return tensors.zeros_like(params)

    def download(self, server_state: Tensors) -> Tensors:
        return server_state

    def before_step(self, job: ClientJob, model: nn.Module) -> None:
        c, c_i = job.server_state, self._client_control(job)
        for name, p in model.named_parameters():
            if p.grad is not None:
                p.grad.add_(c[name] - c_i[name])

    def _client_control(self, job: ClientJob) -> Tensors:
        if not job.client_state:
            job.client_state.update(tensors.zeros_like(job.server_state))
        return job.client_state

    def client_update(self, job: ClientJob) -> ClientResult:
        c_i = self._client_control(job)
        result = super().client_update(job)
        scale = 1.0 / (effective_steps(result.stats.steps, self.fed.momentum) * job.lr)
        delta = {}
        with torch.no_grad():
            for name, c in job.server_state.items():
                new = c_i[name] - c + scale * (job.global_state[name] - result.state[name])
                delta[name] = new - c_i[name]
                c_i[name] = new
        result.upload = delta
        return result

    def aggregate(self, global_state, server_state, results, weights):
        sizes = self.setup.sizes
        total = sum(sizes)
        for r in results:
            for name, d in r.upload.items():
                server_state[name].add_(d, alpha=sizes[r.client] / total)
        return super().aggregate(global_state, server_state, results, weights)
