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

import math

import torch
import torch.nn.functional as F
from torch import nn

from fedhet.methods.dann.config import DANNConfig
from fedhet.plugin import (
    ClientJob,
    ClientResult,
    Divergence,
    LocalStats,
    Trainer,
    WithPart,
    scale_gradient,
    seeded_mlp,
    tensors,
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


class DANN(Trainer):
    vectorizable = False  # two optimizers and alternating steps of its own
    config: DANNConfig

    def build_model(self) -> WithPart:
        net = super().build_model()
        domains = len(self.setup.clients)
        disc = domain_classifier(
            net.feature_dim, self.config.disc_width, domains, self.setup.spec.seed
        )
        return WithPart(net, "discriminator", disc)

    def client_update(self, job: ClientJob) -> ClientResult:
        cfg, model = self.config, job.model
        net, disc = model.net, model.discriminator
        net_params, disc_params = list(net.parameters()), list(disc.parameters())
        main = torch.optim.SGD(
            net_params, lr=job.lr, momentum=self.momentum, weight_decay=self.fed.weight_decay
        )
        adversary = torch.optim.SGD(
            disc_params, lr=cfg.disc_lr or job.lr, weight_decay=cfg.disc_weight_decay
        )
        alternate = cfg.schedule == "alternate"
        count = int(job.client_state[UPDATES]) if UPDATES in job.client_state else 0
        model.train()
        total, steps, first = 0.0, 0, math.nan
        for step, idx in enumerate(self.client_batches(job)):
            x, y = job.client.rows(idx)
            domain = torch.full((len(idx),), job.client.id, dtype=torch.long, device=y.device)
            count += 1
            if alternate and trains_discriminator(count, cfg.d_steps_per_g):
                with torch.no_grad():
                    z = net.features(x)
                    ce = F.cross_entropy(net.head(z), y)
                domain_loss = F.cross_entropy(disc(z), domain)
                adversary.zero_grad(set_to_none=True)
                domain_loss.backward(inputs=disc_params)
                adversary.step()
            else:
                z = net.features(x)
                ce = F.cross_entropy(net.head(z), y)
                domain_loss = F.cross_entropy(disc(reverse_gradient(z, cfg.lam)), domain)
                main.zero_grad(set_to_none=True)
                adversary.zero_grad(set_to_none=True)
                if alternate:  # D held: only phi and h move
                    (ce + domain_loss).backward(inputs=net_params)
                    main.step()
                else:
                    (ce + domain_loss).backward()
                    main.step()
                    adversary.step()
            value = float(ce.detach())
            for loss in (value, float(domain_loss.detach())):
                if not math.isfinite(loss):
                    raise Divergence(step, loss)
            first = value if steps == 0 else first
            total += value
            steps += 1
        if alternate:
            job.client_state[UPDATES] = torch.tensor(count, dtype=torch.int64)
        stats = LocalStats(steps, total / max(steps, 1), first_loss=first)
        return ClientResult(job.client.id, tensors.clone(model.state_dict()), job.client.n, stats)
