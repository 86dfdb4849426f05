"""The `groupdro` algorithm: GroupDRO (Sagawa et al., ICLR 2020) as FedBR's Table 1 runs it.

GroupDRO minimizes sum_g q_g l_g, the groups' losses weighted by q on the simplex, with q moved
by exponentiated gradient ascent: q_g <- q_g exp(eta l_g), then normalized.

FedBR's federated adaptation, read in its official code (LINs-lab/FedBR: fedbr/algorithms_fed.py
FedGroupDRO, fedbr/algorithms.py GroupDRO, fedbr/scripts/train_fed.py, hparams_registry.py) and
in its paper's appendix ("the weight of each client is updated by w_i <- w_i exp(0.01 l_i)"),
and followed here:
- the groups are the clients, and q weighs them at the server: the round's aggregate is the
  clients' models averaged with weights proportional to q_c (`global_update` with weights
  p / sum p). Locally each client holds one group (its minibatch), so the local loss is the
  plain data loss (the in-client q of GroupDRO.update is reset to [1] before every step).
- q_c <- q_c exp(eta l_c) once a round, with l_c the client's loss at its first local step,
  i.e. the round's global model on the client's first batch (`FedGroupDRO.update` updates p
  while the round's gradients are still unset); eta = 0.01 (`groupdro_eta`).
- q_c lives with the client across rounds (the local algorithm's `p`), starting at 1; the
  server reads it when it aggregates. Here the client keeps log q_c in its state and uploads it
  with its model (8 bytes); normalized over the round's clients, exp(log q_c - max) is q_c / max q,
  so no weight overflows as q grows round after round (the official p is never renormalized).

Where fedhet differs, and why:
- the weights are FedAvg's n_c / n times q_c, renormalized over the round's clients (the
  official FedAvg's weights are uniform, so there q alone weighs them); eta = 0 is fedhet's
  FedAvg exactly.
- the official GroupDRO.update also mixes every batch with a shuffled copy of itself
  (`get_new_all_x`, lam ~ Beta(0.2, 0.2), unconditionally); the paper's description of its
  GroupDRO baseline has no mixup and Table 1 gives Mixup its own row, so by default fedhet's
  groupdro keeps the local objective FedAvg's; `mixup_alpha: 0.2` mixes as the official code
  does (fedhet.plugin.Mixer, the `mixup` method's; its clients then train one at a time).
- the official code attaches p to the i-th local model, which trains on a client redrawn every
  round; here q_c is the client's own.
"""

from __future__ import annotations

import math

import torch

from fedhet.plugin import (
    ClientStep,
    LocalStats,
    MixedBatches,
    SGDSettings,
    Tensors,
    Trainer,
)

LOG_Q = "groupdro_log_q"  # log q_c, in the client's state and its upload


def exponentiated_gradient(q: torch.Tensor, losses: torch.Tensor, eta: float) -> torch.Tensor:
    """One GroupDRO step on q: q_g exp(eta l_g), normalized (Sagawa et al., Algorithm 1)."""
    q = q * torch.exp(eta * losses)
    return q / q.sum()


def reweighted(weights: list[float], log_q: list[float]) -> list[float]:
    """The aggregation weights w_c q_c / sum_c' w_c' q_c' of the round's clients, from their
    log q; equal q leave `weights` as they are (already normalized by the engine)."""
    if all(value == log_q[0] for value in log_q):
        return list(weights)
    top = max(log_q)
    scaled = [w * math.exp(value - top) for w, value in zip(weights, log_q, strict=True)]
    total = sum(scaled)
    return [s / total for s in scaled]


class Reweighting(ClientStep):
    """FedAvg's local SGD; once trained, log q_c += eta l_c with l_c the first step's loss."""

    def __init__(self, eta: float):
        self.eta = eta

    def finish(
        self, client_state: Tensors, state: Tensors, stats: LocalStats, sgd: SGDSettings
    ) -> tuple[Tensors, Tensors]:
        before = client_state.get(LOG_Q, torch.zeros((), dtype=torch.float64))
        log_q = before + self.eta * stats.first_loss
        return {LOG_Q: log_q}, {LOG_Q: log_q}


class GroupDRO(Trainer):
    def client_step(self, round: int, global_state: Tensors, server_state: Tensors) -> Reweighting:
        return Reweighting(self.config.eta)

    def aggregate(self, round, global_state, server_state, results, weights):
        """FedAvg's average with the clients' weights times their q (`reweighted`)."""
        log_q = [float(r.upload[LOG_Q]) for r in results]
        reweighted_by_q = reweighted(weights, log_q)
        return super().aggregate(round, global_state, server_state, results, reweighted_by_q)


class MixedGroupDRO(MixedBatches, GroupDRO):
    """GroupDRO whose clients mix every local batch with itself (`mixup_alpha`), as the official
    GroupDRO.update does; q_c's loss is then the first step's mixed loss, as there."""

    vectorizable = False  # the data term is mixup's, which no client step states
    mixup_stream = "groupdro-mixup"

    @property
    def mixup_alpha(self) -> float:
        return self.config.mixup_alpha


GroupDRO.mixing = MixedGroupDRO  # the trainer of `mixup_alpha` (GroupDROConfig.trainer_class)
