"""Supervised contrastive loss (Khosla et al., 2020) and VHL's feature calibration term."""

import torch
import torch.nn.functional as F
from torch import Tensor

from fedhet.plugin import InputError


def supcon_loss(
    features: Tensor,
    labels: Tensor,
    temperature: float = 0.07,
    anchors_mask: Tensor | None = None,
    *,
    base_temperature: float = 0.07,
) -> Tensor:
    """SupCon "L_out" on L2-normalized features (N x D; normalized here).

    For anchor i with positives P(i) (other samples with the same label):
        l_i = -(temperature / base_temperature) / |P(i)| * sum_{p in P(i)}
              log( exp(z_i.z_p / t) / sum_{a != i} exp(z_i.z_a / t) )
    and the loss is the mean of l_i over anchors (all samples, or those where `anchors_mask`
    is True) that have at least one positive; anchors without one are left out (the official
    VHL code counts them as zero in the mean instead). Every sample is a contrast, anchor or not.
    Returns a zero that keeps the graph when no anchor has a positive.
    """
    if features.ndim != 2 or labels.shape != features.shape[:1]:
        raise InputError(
            f"supcon features {tuple(features.shape)} / labels {tuple(labels.shape)}: "
            "pass features N x D and labels N"
        )
    if temperature <= 0:
        raise InputError(f"supcon temperature = {temperature}: use a value > 0")
    z = F.normalize(features, dim=1)
    self_pair = torch.eye(len(z), dtype=torch.bool, device=z.device)
    logits = (z @ z.T / temperature).masked_fill(self_pair, float("-inf"))
    log_prob = logits - torch.logsumexp(logits, dim=1, keepdim=True)
    positives = (labels[:, None] == labels[None, :]) & ~self_pair
    positive_count = positives.sum(dim=1)
    anchors = positive_count > 0
    if anchors_mask is not None:
        anchors &= anchors_mask.to(torch.bool)
    if not anchors.any():
        return features.sum() * 0.0
    positive_log_prob = log_prob.masked_fill(~positives, 0.0).sum(dim=1)
    mean_log_prob = positive_log_prob[anchors] / positive_count[anchors]
    return -(temperature / base_temperature) * mean_log_prob.mean()


def vhl_calibration_loss(
    real_feats: Tensor,
    real_labels: Tensor,
    virtual_feats: Tensor,
    virtual_labels: Tensor,
    temperature: float = 0.07,
    *,
    real_anchors_only: bool = False,
) -> Tensor:
    """VHL's conditional-distribution calibration: SupCon over real and DETACHED virtual
    features, so real features are pulled toward same-class virtual features while no gradient
    reaches the virtual path (the homogeneous virtual features are not biased by client data).

    Label matching: real class c is paired with virtual class c. `virtual_labels` are virtual
    class indices 0..C_v-1; the official code gives virtual samples the output indices C + k
    for the cross-entropy and subtracts that shift before this loss, so pass the unshifted
    indices. With C_v = C (the paper's setting) every real class has a virtual partner.

    By default every sample is an anchor (official code: contrast mode "all" over the
    concatenated batch); `real_anchors_only` keeps only real anchors. VHL's extra
    0.1 * SupCon over the non-detached virtual features alone is `supcon_loss(virtual_feats,
    virtual_labels)`.
    """
    features = torch.cat([real_feats, virtual_feats.detach()])
    labels = torch.cat([real_labels, virtual_labels])
    anchors_mask = None
    if real_anchors_only:
        anchors_mask = torch.arange(len(labels), device=labels.device) < len(real_labels)
    return supcon_loss(features, labels, temperature, anchors_mask)
