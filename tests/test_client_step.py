"""The one client step (fedhet.engine.client_step): a method states it once, over a cohort of
clients. Run for one client (`OneClient`: the sequential executor) it gives that client bitwise
what it gives it as one row of a cohort (the vectorized executor): FedProx's proximal term and
its gradient, SCAFFOLD's gradient correction and its correction after the step. A trainer that
trains its clients its own way says so, or cannot be defined."""

from __future__ import annotations

import pytest
import torch

from fedhet.core.spec import parse_spec
from fedhet.engine.client_executors import why_sequential
from fedhet.engine.client_step import OneClient
from fedhet.engine.loop import Engine
from fedhet.engine.trainer import Trainer

torch.set_num_threads(1)
CLIENTS, LR = 3, 0.1
STEPS = {
    "fedprox": {"name": "fedprox", "mu": 0.1},
    "scaffold": {"name": "scaffold"},
    "scaffold-after-step": {"name": "scaffold", "correction": "after_step"},
}


def noisy(like: dict[str, torch.Tensor], generator: torch.Generator) -> dict[str, torch.Tensor]:
    return {n: 0.01 * torch.randn(v.shape, generator=generator) for n, v in like.items()}


@pytest.mark.parametrize("algorithm", STEPS)
def test_a_client_alone_gets_bitwise_its_row_of_the_cohort(tmp_path, algorithm):
    spec = parse_spec({"model": {"arch": "mlp", "hidden": [16]}, "algorithm": STEPS[algorithm]})
    trainer = Engine.from_spec(spec, tmp_path).algorithm
    generator = torch.Generator().manual_seed(0)
    models = [trainer.build_model() for _ in range(CLIENTS)]
    params = {n: p.detach() for n, p in models[0].named_parameters()}
    anchor = {n: v + 0.05 for n, v in params.items()}  # the global model the clients left
    step = trainer.client_step(0, anchor, noisy(params, generator))  # live c for SCAFFOLD
    extras = [step.extras(noisy(params, generator)) for _ in models]  # each with its own c_i
    grads = [noisy(params, generator) for _ in models]

    def stack(rows: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        return {n: torch.stack([row[n] for row in rows]) for n in rows[0]}

    cohort = stack([dict(m.named_parameters()) for m in models])
    cohort = {n: p.detach().clone().requires_grad_() for n, p in cohort.items()}
    term = step.loss(cohort)
    if term is not None:  # FedProx: the term and its gradient
        term.sum().backward()
    corrected = step.correct(
        stack(grads), stack(extras), {n: p.detach() for n, p in cohort.items()}
    )
    after = {n: p.detach().clone() for n, p in cohort.items()}
    step.after_step(after, stack(extras), LR)

    for i, model in enumerate(models):
        one = OneClient(step, model, extras[i], LR)
        if term is not None:
            alone = one.loss(torch.zeros(()))
            alone.backward()
            assert torch.equal(alone, term[i])
            for n, p in model.named_parameters():
                assert torch.equal(p.grad, cohort[n].grad[i])
        for n, p in model.named_parameters():
            p.grad = grads[i][n].clone()
        one.before_step(model)
        one.after_step(model)
        for n, p in model.named_parameters():
            assert torch.equal(p.grad, corrected[n][i])
            assert torch.equal(p.detach(), after[n][i])
    changed = [not torch.equal(corrected[n], stack(grads)[n]) for n in params]
    moved = [not torch.equal(after[n], cohort[n].detach()) for n in params]
    assert all(changed) == (algorithm == "scaffold") and all(moved) == algorithm.endswith("step")


def test_a_trainer_with_its_own_client_update_declares_it(tmp_path):
    with pytest.raises(TypeError, match="vectorizable = False"):

        class Undeclared(Trainer):
            def local_loss(self, job, model, x, y):
                return super().local_loss(job, model, x, y)

    class Declared(Trainer):
        vectorizable = False

        def client_update(self, job):
            return super().client_update(job)

    spec = parse_spec({"model": {"arch": "mlp", "hidden": [16]}})
    trainer = Engine.from_spec(spec, tmp_path, trainer=Declared).algorithm
    reason = "fedavg trains its clients its own way (client_update)"
    assert why_sequential(trainer, trainer.build_model()) == reason
