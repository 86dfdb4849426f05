"""The `dann` algorithm: DANN (Ganin et al., JMLR 2016) as FedBR's Table 1 runs it.

DANN: a domain classifier D on the features z = phi(x) learns to tell the domains apart while
phi learns to confuse it, through a gradient reversal layer R (identity forward, -lam times the
gradient backward): phi and the label classifier h descend CE(h(z), y) + L_d(D(R(z)), d), so
phi's gradient from the domain loss is -lam dL_d/dz, while D descends L_d.

FedBR's federated adaptation, read in its official code (LINs-lab/FedBR: fedbr/algorithms.py
AbstractDANN/DANN, fedbr/scripts/train_fed.py, fedbr/networks.py MLP, fedbr/hparams_registry.py),
and followed here:
- the domains are the clients: D has one output per client (`num_domains`, the training
  environments) and every sample of a client's batch carries that client's label
  (`set_disc_label`); D sees the features of the client's own real batch only (no pseudo-data,
  no other client's data: DANN ignores the `unlabeled` batch FedBR's pseudo-data travels in).
- D is part of the model state and averaged with it (`global_update` runs over the whole
  state_dict), so it is sent both ways like the model.
- D is a 3-layer MLP of width 256 (Linear, ReLU, Linear, ReLU, Linear; no dropout); lambda is
  0.01 (the paper's appendix tunes it in {0.01, 0.1, 1}); D's SGD has no momentum and weight
  decay 0 (`weight_decay_d`), its lr `lr_d` equals the model's lr.
- the updates alternate (DomainBed's DANN): the client's update count c, kept across rounds,
  decides each local step: c % (1 + d_steps_per_g) < d_steps_per_g is a step of D alone on
  L_d, otherwise a step of phi and h alone on CE - lam L_d with D held (d_steps_per_g = 1: they
  take turns, each on its own batch). The official code computes phi's adversarial gradient as
  that of -lam L_d; the reversal layer here gives the same gradient up to float rounding.
  `schedule: joint` is Ganin et al.'s simultaneous update instead: every step moves D on L_d
  and phi, h on CE and the reversed domain gradient.

Where fedhet differs, and why:
- a client's domain label is its id. The official code labels the i-th local model's samples
  with i, and that model trains on `chosen_clients[i]`, redrawn every round, so a client's label
  changes between rounds; the label that names the client is what DANN's domains mean.
- phi and h train with the federation's SGD (lr schedule, momentum, weight decay), as fedhet's
  FedAvg does, so the row differs from FedAvg by the adversarial term alone (the official DANN's
  generator SGD has no momentum while its FedAvg's has 0.9). With lam = 0 (and schedule joint,
  or d_steps_per_g = 0) phi and h train exactly as FedAvg's model does.
- the gradient penalty on D's input (`grad_penalty`, 0 by default there), the conditional
  variant (CDANN) and the `use_Mixup` option (FedBR + Mixup rows) are left out.
- clients are averaged with fedhet's weights (n_c / n); the official FedAvg's are uniform.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from fedhet.methods.dann.config import DANNConfig
from fedhet.plugin import (
    ClientJob,
    ClientStep,
    LocalStats,
    SGDSettings,
    Tensors,
    Trainer,
    WithPart,
    gradient_only,
    scale_gradient,
    seeded_mlp,
)

UPDATES = "dann_updates"  # a client's update count (schedule: alternate), in its state


def reverse_gradient(x: torch.Tensor, scale: float) -> torch.Tensor:
    """R_scale(x): x forward; the gradient flowing back through it is multiplied by -scale."""
    return scale_gradient(x, -scale)


def domain_classifier(in_dim: int, width: int, domains: int, seed: int) -> nn.Sequential:
    """FedBR's code's D (networks.MLP): 3 linear layers with ReLUs, initialized from `seed`
    (the global RNG is left untouched, so the classifier starts as FedAvg's)."""
    return seeded_mlp(in_dim, width, domains, seed, "dann", "discriminator")


def trains_discriminator(count: int, d_steps_per_g: int) -> bool:
    """Whether update number `count` (1-based, the client's running count) is a step of D alone
    (FedBR's code: update_count % (1 + d_steps_per_g) < d_steps_per_g)."""
    return count % (1 + d_steps_per_g) < d_steps_per_g


# --- the algorithm ------------------------------------------------------------------------


class Alternation(ClientStep):
    """FedAvg's step; a client of `schedule: alternate` keeps its update count across rounds."""

    def __init__(self, alternate: bool):
        self.alternate = alternate

    def finish(
        self, client_state: Tensors, state: Tensors, stats: LocalStats, sgd: SGDSettings
    ) -> tuple[Tensors, Tensors]:
        if not self.alternate:
            return {}, {}
        count = update_count(client_state) + stats.steps
        return {}, {UPDATES: torch.tensor(count, dtype=torch.int64)}


def update_count(client_state: Tensors) -> int:
    """The client's updates before this round (schedule: alternate)."""
    return int(client_state[UPDATES]) if UPDATES in client_state else 0


@dataclass
class Updates:
    """A client's running update count while it trains (its job's context)."""

    count: int


class DANN(Trainer):
    vectorizable = False  # each step's loss and trained part depend on the client's count
    config: DANNConfig

    def build_model(self) -> WithPart:
        net = super().build_model()
        domains = len(self.setup.clients)
        disc = domain_classifier(
            net.feature_dim, self.config.disc_width, domains, self.setup.spec.seed
        )
        return WithPart(net, "discriminator", disc)

    def client_step(self, round: int, global_state: Tensors, server_state: Tensors) -> Alternation:
        return Alternation(self.config.schedule == "alternate")

    def client_context(self, job: ClientJob) -> Updates:
        return Updates(update_count(job.client_state))

    def client_optimizer(self, job: ClientJob, model: WithPart) -> torch.optim.SGD:
        """The job's SGD for phi and h; D's own: no momentum, `disc_lr` (default the job's lr)
        and `disc_weight_decay`. A step moves only the parameters its loss reached."""
        cfg, settings = self.config, job.sgd
        disc = {
            "params": model.discriminator.parameters(),
            "lr": cfg.disc_lr or settings.lr,
            "momentum": 0.0,
            "weight_decay": cfg.disc_weight_decay,
        }
        return torch.optim.SGD(
            [{"params": model.net.parameters()}, disc],
            lr=settings.lr,
            momentum=settings.momentum,
            weight_decay=settings.weight_decay,
        )

    def local_loss(
        self, job: ClientJob, model: WithPart, x: torch.Tensor, y: torch.Tensor
    ) -> torch.Tensor:
        """CE(h(z), y), with the domain loss's gradient: D's alone on D's turn, phi's (reversed)
        and h's with D held on theirs, both at once under `schedule: joint`. Its value is the
        CE, the run's train loss."""
        cfg, net, disc = self.config, model.net, model.discriminator
        domain = torch.full((len(y),), job.client.id, dtype=torch.long, device=y.device)
        job.context.count += 1
        alternate = cfg.schedule == "alternate"
        if alternate and trains_discriminator(job.context.count, cfg.d_steps_per_g):
            with torch.no_grad():
                z = net.features(x)
                ce = F.cross_entropy(net.head(z), y)
            return ce + gradient_only(F.cross_entropy(disc(z), domain))
        z = net.features(x)
        ce = F.cross_entropy(net.head(z), y)
        reversed_z = reverse_gradient(z, cfg.lam)
        logits = held(disc, reversed_z) if alternate else disc(reversed_z)
        return ce + gradient_only(F.cross_entropy(logits, domain))


def held(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """`module(x)` with its parameters held: the gradient reaches x, not them."""
    frozen = {name: p.detach() for name, p in module.named_parameters()}
    return functional_call(module, frozen, (x,))
