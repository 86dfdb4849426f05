"""SCAFFOLD (Karimireddy et al.), option II control variates, in two forms (`correction`).

- `gradient` (default): the correction c - c_i is added to every gradient before the
  optimizer step, and c_i+ = c_i - c + (x - y_i) / (a_i lr) with a_i the number of local steps
  for plain SGD, or FedNova's effective step count under momentum (momentum scales the
  displacement by up to 1 / (1 - rho); dividing by the step count alone would inflate c_i by
  that factor and over-correct).
- `after_step`: the authors' code that VHL's and FedImpro's papers ran their baselines with
  (NIID-Bench's form): after each optimizer step, param -= lr (c - c_i), so momentum never
  sees the correction, and c_i+ = c_i - c + (x - y_i) / (K lr) with K the local step count.

Invariant kept by `aggregate`: the server control c equals sum_i p_i c_i over ALL clients
(p_i = n_i / n), so under full participation the corrections c_i - c sum (p-weighted) to zero.
"""

from collections.abc import Iterator

import torch
from torch import Tensor, nn

from fedhet.engine import tensors
from fedhet.engine.local import effective_steps
from fedhet.engine.tensors import Tensors
from fedhet.engine.trainer import ClientJob, ClientResult, Trainer
from fedhet.methods.scaffold.control import updated_control
from fedhet.methods.scaffold.vectorized import ScaffoldCorrection


class Scaffold(Trainer):
    def init_server_state(self, global_state: Tensors) -> Tensors:
        params = {k: v for k, v in global_state.items() if k in self.param_names}
        return tensors.zeros_like(params)

    def download(self, round: int, server_state: Tensors) -> Tensors:
        return server_state

    def before_step(self, job: ClientJob, model: nn.Module) -> None:
        if self.config.correction == "gradient":
            for p, correction in self._corrections(job, model):
                if p.grad is not None:
                    p.grad.add_(correction)

    @torch.no_grad()
    def after_step(self, job: ClientJob, model: nn.Module) -> None:
        if self.config.correction == "after_step":
            for p, correction in self._corrections(job, model):
                p.sub_(correction, alpha=job.lr)

    def _corrections(self, job: ClientJob, model: nn.Module) -> Iterator[tuple[Tensor, Tensor]]:
        """(parameter, c - c_i) for every parameter of the model."""
        c, c_i = job.server_state, self._client_control(job)
        for name, p in model.named_parameters():
            yield p, c[name] - c_i[name]

    def _client_control(self, job: ClientJob) -> Tensors:
        if not job.client_state:
            job.client_state.update(tensors.zeros_like(job.server_state))
        return job.client_state

    def _step_count(self, steps: int, carried: float = 0.0) -> float:
        """a_i: the displacement of the round in units of lr times a gradient (a kept momentum
        buffer's `carried` gradient weight included, see `effective_steps`)."""
        if self.config.correction == "after_step":
            return float(steps)
        return effective_steps(steps, self.momentum, carried)

    def client_update(self, job: ClientJob) -> ClientResult:
        c_i = self._client_control(job)
        result = super().client_update(job)
        scale = 1.0 / (self._step_count(result.stats.steps, result.stats.carried) * job.lr)
        new, result.upload = updated_control(
            job.server_state, c_i, job.global_state, result.state, scale
        )
        c_i.update(new)
        return result

    def vectorized_term(self, jobs: list[ClientJob]) -> ScaffoldCorrection | None:
        if self.config.correction != "gradient":
            return None  # the correction after the optimizer step has no vectorized form
        job = jobs[0]
        return ScaffoldCorrection(job.server_state, job.global_state, self._step_count)

    def aggregate(self, round, global_state, server_state, results, weights):
        sizes = self.setup.sizes
        total = sum(sizes)
        for r in results:
            for name, d in r.upload.items():
                server_state[name].add_(d, alpha=sizes[r.client] / total)
        return super().aggregate(round, global_state, server_state, results, weights)
