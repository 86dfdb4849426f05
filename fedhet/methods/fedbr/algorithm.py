"""The `fedbr` algorithm (paper Section 4, Algorithm 1).

At every local step, on a real batch (x, y) and the pseudo batch (x_p, y_p):
- max step (component 2): the projection head P ascends L_con, features detached;
- min step: features and classifier descend
  CE(x, y) + lam * CE(x_p, y_p) [component 1] + mu * L_con [component 2], P held fixed.
L_con (Eq. 5-7) = -log f1 / (f1 + f2) with f1 = exp(cos(P phi_i(x_p), P phi_g(x_p)) / tau1) and
f2 = exp(cos(P phi_i(x_p), P phi_i(x)) / tau2), averaged over every (pseudo, real) pair, i.e.
the expectation over x_p ~ D_p, x ~ D_i of Eq. 2-3. phi_g is the round's global feature
extractor, frozen. P lives in the model state, so it is averaged and checkpointed like the rest.

The official code multiplies the cosine similarities by tau instead of dividing by it:
tau1 = tau2 = 0.5 here reproduces its default of 2.0 (exactly: x / 0.5 == x * 2 in floating
point). It also pairs pseudo sample i with real sample i only (`pairing: index`).

FedBR + Mixup (`mixup: alpha`, a row of FedBR's Table 1): the real batch is replaced at every
local step by its mixup with itself (fedhet.plugin.Mixer, the helper of the `mixup` method), as
the official code's `use_Mixup` does (LINs-lab/FedBR fedbr/algorithms.py, FedBR's `update` with
`get_new_all_x`: lambda ~ Beta(0.2, 0.2), mixed inputs, mixed soft labels): the mixed inputs
give the features of both the min step's CE and L_con's negatives, and the CE is mixup's.
Draws come from a generator derived from the run's seed, the round and the client
(`fedbr-mixup`); with the option off nothing is drawn and every run is as before.
"""

from __future__ import annotations

import copy
import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from fedhet.methods.fedbr.config import FedBRConfig
from fedhet.methods.fedbr.pseudo import draw, mix_with_local, uniform_labels
from fedhet.methods.fedbr.pseudo_stage import load_pseudo, pools, round_generator
from fedhet.plugin import (
    ClientJob,
    ClientResult,
    Divergence,
    LocalStats,
    Mixer,
    Mixup,
    SGDSettings,
    Tensors,
    Trainer,
    TrainSetup,
    WithPart,
    derive_seed,
    seeded_mlp,
    tensors,
    torch_generator,
)

# --- model ------------------------------------------------------------------------------


def projection_head(in_dim: int, width: int, out_dim: int, seed: int) -> nn.Sequential:
    """The paper's 3-layer MLP P, initialized from `seed` (the global RNG is left untouched)."""
    return seeded_mlp(in_dim, width, out_dim, seed, "fedbr", "projection")


def frozen_copy(module: nn.Module) -> nn.Module:
    """A copy that never learns: no gradients. It keeps the local model's mode, so with
    BatchNorm both normalize a pseudo batch by its own statistics (as the official code)."""
    frozen = copy.deepcopy(module)
    for p in frozen.parameters():
        p.requires_grad_(False)
        p.grad = None
    return frozen


# --- the local objective ----------------------------------------------------------------


def contrastive_loss(
    local_pseudo: torch.Tensor,
    global_pseudo: torch.Tensor,
    local_real: torch.Tensor,
    tau1: float,
    tau2: float,
    pairing: str = "all",
) -> torch.Tensor:
    """L_con (Eq. 5-7) on projected features, averaged over every (pseudo j, real k) pair, or
    with index pairing over the pairs (pseudo i, real i), i < the smaller batch's size.

    -log f1 / (f1 + f2) = softplus(log f2 - log f1), computed in that stable form.
    """
    if pairing == "index":
        n = min(len(local_pseudo), len(local_real))
        positive = F.cosine_similarity(local_pseudo[:n], global_pseudo[:n], dim=1) / tau1
        negative = F.cosine_similarity(local_pseudo[:n], local_real[:n], dim=1) / tau2
        return F.softplus(negative - positive).mean()
    positive = F.cosine_similarity(local_pseudo, global_pseudo, dim=1) / tau1
    negative = F.normalize(local_pseudo, dim=1) @ F.normalize(local_real, dim=1).T / tau2
    return F.softplus(negative - positive[:, None]).mean()


class Features(NamedTuple):
    """A local step's features: of the real batch, of the pseudo batch (None: unused), and
    phi_g's of the pseudo batch (None: unused)."""

    real: torch.Tensor
    pseudo: torch.Tensor | None
    pseudo_global: torch.Tensor | None


class LocalRound:
    """One client's FedBR round: phi_g frozen at the round's start, one optimizer for the
    features and classifier (min step), one ascending optimizer for P (max step)."""

    def __init__(self, model: WithPart, config: FedBRConfig, settings: SGDSettings):
        self.model, self.config = model, config
        self.global_features = frozen_copy(model.net.features)
        self.net_params = list(model.net.parameters())
        self.projection_params = list(model.projection.parameters())
        sgd = {
            "lr": settings.lr,
            "momentum": settings.momentum,
            "weight_decay": settings.weight_decay,
        }
        self.main = torch.optim.SGD(self.net_params, **sgd)
        self.adversary = torch.optim.SGD(self.projection_params, maximize=True, **sgd)
        self._global_cache: tuple[torch.Tensor, torch.Tensor] | None = None

    def global_pseudo_features(self, x_pseudo: torch.Tensor) -> torch.Tensor:
        """phi_g(x_p); computed once while the pseudo batch stays the same tensor."""
        if self._global_cache is None or self._global_cache[0] is not x_pseudo:
            with torch.no_grad():
                self._global_cache = (x_pseudo, self.global_features(x_pseudo))
        return self._global_cache[1]

    def contrastive(
        self, z_pseudo: torch.Tensor, z_global: torch.Tensor, z_real: torch.Tensor
    ) -> torch.Tensor:
        p, cfg = self.model.projection, self.config
        return contrastive_loss(
            p(z_pseudo), p(z_global), p(z_real), cfg.tau1, cfg.tau2, cfg.pairing
        )

    def max_step(
        self, z_pseudo: torch.Tensor, z_global: torch.Tensor, z_real: torch.Tensor
    ) -> None:
        """P ascends L_con; the features are detached, so only P moves."""
        loss = self.contrastive(z_pseudo.detach(), z_global, z_real.detach())
        self.adversary.zero_grad(set_to_none=True)
        loss.backward(inputs=self.projection_params)
        self.adversary.step()

    def min_loss(
        self,
        features: Features,
        y: torch.Tensor,
        y_pseudo: torch.Tensor | None,
        mix: Mixup | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(the min-step objective, its real-data cross-entropy part: mixup's with `mix`)."""
        cfg, head = self.config, self.model.net.head
        z, z_pseudo, z_global = features
        ce = F.cross_entropy(head(z), y) if mix is None else mix.loss(head(z), y)
        loss = ce
        if cfg.debias_classifier:
            loss = loss + cfg.lam * F.cross_entropy(head(z_pseudo), y_pseudo)
        if cfg.debias_features:
            loss = loss + cfg.mu * self.contrastive(z_pseudo, z_global, z)
        return loss, ce

    def min_step(self, loss: torch.Tensor) -> None:
        """Features and classifier descend `loss` (`min_loss`'s); P is not moved."""
        self.main.zero_grad(set_to_none=True)
        loss.backward(inputs=self.net_params)
        self.main.step()

    def step(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        x_pseudo: torch.Tensor | None,
        y_pseudo: torch.Tensor | None,
        mix: Mixup | None = None,
    ) -> tuple[float, float]:
        """One local iteration (Algorithm 1, lines 7-10); returns (objective, real CE). With
        `mix`, the real batch is its mixup (FedBR + Mixup)."""
        cfg, features = self.config, self.model.net.features
        z = features(x if mix is None else mix.inputs(x))
        z_pseudo = features(x_pseudo) if cfg.uses_pseudo else None
        z_global = self.global_pseudo_features(x_pseudo) if cfg.debias_features else None
        if cfg.debias_features and cfg.max_step:
            self.max_step(z_pseudo, z_global, z)
        loss, ce = self.min_loss(Features(z, z_pseudo, z_global), y, y_pseudo, mix)
        self.min_step(loss)
        return float(loss.detach()), float(ce.detach())


# --- the algorithm ----------------------------------------------------------------------


class FedBR(Trainer):
    vectorizable = False  # its own adversarial local rounds

    def __init__(self, config: FedBRConfig, setup: TrainSetup):
        super().__init__(config, setup)
        self._pseudo: tuple[int, torch.Tensor] | None = None  # (round, x) last sent

    def build_model(self) -> WithPart:
        net = super().build_model()
        cfg = self.config
        head = projection_head(
            net.feature_dim, cfg.projection_width, cfg.projection_dim, self.setup.spec.seed
        )
        return WithPart(net, "projection", head)

    # --- server side: pseudo-data and its accounting --------------------------------------

    def download(self, round: int, server_state: Tensors) -> Tensors:
        """The pseudo batch, counted when it is sent: round 0, or every round on refresh."""
        if self.config.uses_pseudo and (round == 0 or self.config.pseudo.refresh == "round"):
            return {"pseudo_x": self.pseudo_x(round)}
        return {}

    def pseudo_x(self, rnd: int) -> torch.Tensor:
        """The round's pseudo batch: the stored one, or with refresh a fresh draw per round."""
        sent = rnd if self.config.pseudo.refresh == "round" else 0
        if self._pseudo is None or self._pseudo[0] != sent:
            self._pseudo = (sent, self._make_pseudo(sent).to(self.setup.device))
        return self._pseudo[1]

    def _make_pseudo(self, rnd: int) -> torch.Tensor:
        if rnd == 0:
            return load_pseudo(self.setup.extras["pseudo"])[0]
        ps, spec = self.config.pseudo, self.setup.spec
        pool = pools(ps.kind, [c.x for c in self.setup.clients], ps.proxy, spec)
        size = ps.size or spec.federation.batch_size
        gen = round_generator(spec.seed, rnd)
        return draw(ps.kind, pool, size, ps.subset, self.setup.dataset.shape, gen).x

    # --- client side ----------------------------------------------------------------------

    def pseudo_batch(
        self, job: ClientJob, gen: torch.Generator
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """This step's (x_p, soft labels): the shared batch, or mixed with local samples."""
        if not self.config.uses_pseudo:
            return None, None
        x = self.pseudo_x(job.round)
        classes = self.setup.dataset.num_classes
        if self.config.pseudo.kind == "mixture":
            return mix_with_local(
                x, job.client.x, job.client.y, classes, self.config.pseudo.mix, gen
            )
        return x, uniform_labels(len(x), classes).to(x.device)

    def mixer(self, job: ClientJob) -> Mixer | None:
        """FedBR + Mixup's draws for the client's round (None: the option is off)."""
        if self.config.mixup is None:
            return None
        seed = derive_seed(self.setup.spec.seed, "fedbr-mixup", job.round, job.client.id)
        return Mixer(self.config.mixup, seed)

    def client_update(self, job: ClientJob) -> ClientResult:
        """FedBR's own loop: each step is a min step of phi and h and a max (ascending) step of
        the projection P on the same pseudo and real batches, two optimizers in opposite
        directions, which neither a client step nor one loss per step states."""
        model = job.model
        local = LocalRound(model, self.config, job.sgd)
        mixing = torch_generator(self.setup.spec.seed, "fedbr-mix", job.round, job.client.id)
        mixer = self.mixer(job)
        model.train()
        total_ce, steps = 0.0, 0
        for step, idx in enumerate(self.client_batches(job)):
            x_pseudo, y_pseudo = self.pseudo_batch(job, mixing)
            x, y = job.client.rows(idx)
            mix = None if mixer is None else mixer.draw(len(y), x.device)
            objective, ce = local.step(x, y, x_pseudo, y_pseudo, mix)
            if not math.isfinite(objective):
                raise Divergence(step, objective)
            total_ce += ce
            steps += 1
        stats = LocalStats(steps, total_ce / max(steps, 1))
        return ClientResult(job.client.id, tensors.clone(model.state_dict()), job.client.n, stats)
