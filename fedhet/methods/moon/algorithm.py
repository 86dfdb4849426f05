"""MOON (Li, He, Song, "Model-Contrastive Federated Learning", CVPR 2021), Algorithm 1.

A client's local loss on a batch (x, y) is

    CE(model(x), y) + mu * mean_x l_con(x),
    l_con = -log( e^(sim(z, z_glob) / tau) / (e^(sim(z, z_glob) / tau) + e^(sim(z, z_prev) / tau)) )

with sim the cosine similarity, z the representation of x under the model being trained,
z_glob under the round's global model and z_prev under the client's own model from its previous
participation (both frozen). The server averages as FedAvg does.

The representation. The paper's network is base encoder -> projection head -> output layer, and
z is the projection head's output. FedBR's MOON baseline (LINs-lab/FedBR, fedbr/algorithms.py,
class Moon), the one FedBR's Table 1 ran, does the same: z = projection_head(featurizer(x)),
the classifier reads z, and the projection head is networks.MLP with width 256
(Linear(d, 256), ReLU, Linear(256, 256), ReLU, Linear(256, d)). fedhet follows it
(`projection: mlp`, `projection_width: 256`): the head is appended to the model's feature
extractor (`FedModel.features`, so `features(x)` is z and the classifier is the model's own
head), initialized from the spec's seed; the rest of the model is FedAvg's, weight for weight.
`projection: none` keeps the model unchanged and takes z = its penultimate features; with
`mu: 0` that is FedAvg bit for bit (tests/test_moon.py).

Defaults. tau = 0.5 (paper; official code QinbinLi/MOON main.py `--temperature`; FedBR's code).
mu = 1: the official code's default (`--mu`); the paper reports mu = 5 for CIFAR-10 and 1 for
CIFAR-100 and Tiny-ImageNet. FedBR hard-codes mu = 0.01 in its baseline (`Moon.update`), so a
spec reproducing FedBR's Table 1 row sets `mu: 0.01`.

Where fedhet differs, and why:
- The previous model is the client's own model after its last participation, kept in its
  client state (`moon_previous.*`); a client with none (its first round) uses the global model,
  which makes l_con a constant log 2 with zero gradient. The official code has no negative in
  round 0 (an empty model pool: l_con = 0, also gradient-free), and keeps every party's last
  model as fedhet does. FedBR's baseline does not follow the paper here: its training loop
  assigns `previous_featurizer` while `update` reads `previous_feature` (never reassigned after
  the model is built), and its local models are slots reused by whichever client is sampled.
- The frozen global and previous models compute their representations in eval mode (BatchNorm
  with running statistics, no dropout), as the official code (`global_model.eval()`, the pool's
  `net.eval()`); the two are identical for models without BatchNorm or dropout.
- Optimizer, learning rate, momentum and weight decay are the federation's, as for every
  fedhet method (the official code: SGD, momentum 0.9, weight decay 1e-5). The official
  model_buffer_size > 1 (several previous models as negatives) is not offered; its default is 1.
- Why not a ClientStep: a client step's loss sees the clients' parameters only, while l_con is a
  function of the batch's representations under three models; so MOON states its data term
  (`local_loss`) and its clients train one at a time (`vectorizable = False`). Every client keeps
  a copy of its model, as the official code's model pool does (memory: one model per client).
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from fedhet.methods.moon.config import MoonConfig
from fedhet.plugin import (
    ClientJob,
    ClientStep,
    FedModel,
    LocalStats,
    SGDSettings,
    Tensors,
    Trainer,
    seeded_mlp,
)

PREVIOUS = "moon_previous."  # + a model state name: the client's model of its last round


def projection_head(dim: int, width: int, seed: int) -> nn.Sequential:
    """FedBR's MOON projection head (networks.MLP): d -> width -> width -> d, ReLU between,
    initialized from `seed` (the global RNG is left untouched)."""
    return seeded_mlp(dim, width, dim, seed, "moon", "projection")


def with_projection(net: FedModel, width: int, seed: int) -> FedModel:
    """`net` with the projection head as the last stage of its features (same head)."""
    stages = [
        *net.features.named_children(),
        ("projection", projection_head(net.feature_dim, width, seed)),
    ]
    return FedModel(nn.Sequential(OrderedDict(stages)), net.head)


def contrastive_loss(
    z: torch.Tensor, z_global: torch.Tensor, z_previous: torch.Tensor, temperature: float
) -> torch.Tensor:
    """mean over the batch of -log(e^(s_g/tau) / (e^(s_g/tau) + e^(s_p/tau))), s the cosine
    similarities to the global and previous representations (a 2-way cross-entropy with the
    global one as the positive, as the official code computes it)."""
    logits = torch.stack(
        [F.cosine_similarity(z, z_global, dim=1), F.cosine_similarity(z, z_previous, dim=1)], 1
    )
    positive = torch.zeros(len(z), dtype=torch.long, device=z.device)
    return F.cross_entropy(logits / temperature, positive)


def frozen(model: nn.Module, state: Tensors) -> nn.Module:
    """A copy of `model` holding `state` that never learns, in eval mode."""
    copied = copy.deepcopy(model)
    copied.load_state_dict(state)
    copied.eval()
    for p in copied.parameters():
        p.requires_grad_(False)
        p.grad = None
    return copied


@dataclass
class Anchors:
    """A client's frozen global and previous models for one round."""

    global_model: nn.Module
    previous_model: nn.Module


class KeepsModel(ClientStep):
    """Keeps the trained model in the client's state: next round's previous model."""

    def finish(
        self, client_state: Tensors, state: Tensors, stats: LocalStats, sgd: SGDSettings
    ) -> tuple[Tensors, Tensors]:
        return {}, {PREVIOUS + n: v.detach().clone() for n, v in state.items()}


class Moon(Trainer):
    vectorizable = False  # its loss reads the batch under three models (module docstring)
    config: MoonConfig

    def build_model(self) -> nn.Module:
        net = super().build_model()
        if self.config.projection == "none":
            return net
        return with_projection(net, self.config.projection_width, self.setup.spec.seed)

    def client_step(self, round: int, global_state: Tensors, server_state: Tensors) -> ClientStep:
        return ClientStep() if self.config.mu == 0 else KeepsModel()

    @staticmethod
    def previous_state(job: ClientJob) -> Tensors:
        """The client's model of its last participation; the global model before its first."""
        kept = {
            n[len(PREVIOUS) :]: v for n, v in job.client_state.items() if n.startswith(PREVIOUS)
        }
        return kept or job.global_state

    def anchors(self, job: ClientJob) -> Anchors:
        """The job's frozen global and previous models (`job.model` holds the global state)."""
        return Anchors(
            frozen(job.model, job.global_state), frozen(job.model, self.previous_state(job))
        )

    def client_context(self, job: ClientJob) -> Anchors | None:
        return None if self.config.mu == 0 else self.anchors(job)

    def local_loss(
        self, job: ClientJob, model: nn.Module, x: torch.Tensor, y: torch.Tensor
    ) -> torch.Tensor:
        if self.config.mu == 0:
            return super().local_loss(job, model, x, y)  # FedAvg's cross-entropy
        return self.moon_loss(model, job.context, x, y)

    def moon_loss(
        self, model: nn.Module, anchors: Anchors, x: torch.Tensor, y: torch.Tensor
    ) -> torch.Tensor:
        """CE + mu * l_con on the batch (x, y)."""
        z = model.features(x)
        with torch.no_grad():
            z_global = anchors.global_model.features(x)
            z_previous = anchors.previous_model.features(x)
        con = contrastive_loss(z, z_global, z_previous, self.config.temperature)
        return F.cross_entropy(model.head(z), y) + self.config.mu * con
