"""VHL's local objective (Tang et al., 2022), composable with any algorithm that accepts one.

Each local step draws a virtual batch (x_v, y_v) as large as the real batch (x, y) from the
shared virtual dataset with the job's seeded generator (each image randomly cropped and flipped,
as the authors' loader does, unless `augment` is off), and with z = features([x; x_v]),
logits = head(z):

    loss = CE(logits_real, y) + alpha * CE(logits_virtual, y_v + shift)
           + lam * SupCon([z_real; detach(z_virtual)], [y; y_v])        (calibration)
           + virtual_supcon * SupCon(z_virtual, y_v)                      (official code)

shift = C when virtual labels are extra classes (official code: the head has C + C_v outputs)
and 0 when they share the natural classes' outputs. Real class c is calibrated toward virtual
class c; the virtual features are detached in the calibration so client data never pull them.
FedProx's proximal term and SCAFFOLD's correction apply on top, as for plain cross-entropy.

Variants: `naive` keeps the two cross-entropy terms (no calibration, no SupCon at all).
`vfa` (Virtual Feature Alignment) uses no images: the real features are calibrated toward
features sampled from fixed per-class Gaussians N(m_c, s^2 I). The Gaussians are not estimated
from any data: as in the official code (`fed_align`), m_c ~ U(0, 1)^D is drawn once from the
seed (one draw shared by every client; penultimate features are non-negative ReLU outputs too),
s = `vfa_std`, and each step samples B // C + 1 features of every class.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

from fedhet.methods.vhl.augment import crop_and_flip
from fedhet.methods.vhl.config import VHLSpec
from fedhet.methods.vhl.generators import CLAMP_MEAN, CLAMP_STD
from fedhet.methods.vhl.supcon import supcon_loss, vhl_calibration_loss
from fedhet.methods.vhl.virtual_stage import load_virtual
from fedhet.plugin import RunError, torch_generator

if TYPE_CHECKING:
    from fedhet.plugin import FedModel, TrainSetup


@dataclass
class Terms:
    """One step's objective: the model's features of the forward batch (real rows first, then
    virtual rows), the unweighted terms by name, and their weighted sum."""

    features: Tensor
    parts: dict[str, Tensor]
    total: Tensor


def _weighted(features: Tensor, parts: dict[str, Tensor], weights: dict[str, float]) -> Terms:
    return Terms(features, parts, sum(weights[name] * part for name, part in parts.items()))


class VHLObjective:
    """The local objective of one run; `loss` is what the algorithm's local_loss returns."""

    def __init__(
        self,
        config: VHLSpec,
        natural_classes: int,
        seed: int,
        feature_dim: int,
        images: Tensor | None = None,
        labels: Tensor | None = None,
    ):
        if config.uses_images and (images is None or labels is None):
            raise RunError("VHL needs the virtual dataset; plan the run with its virtual stage")
        self.config = config
        self.images, self.labels = images, labels
        self.shift = natural_classes if config.labels == "extra" else 0
        self.gaussian_means = None
        if not config.uses_images:
            gen = torch_generator(config.seed if config.seed is not None else seed, "vhl", "vfa")
            self.gaussian_means = torch.rand(natural_classes, feature_dim, generator=gen)

    @classmethod
    def for_setup(cls, config: VHLSpec, setup: TrainSetup, feature_dim: int) -> VHLObjective:
        """The run's objective, with its `virtual` stage's artifact on the run's device."""
        images = labels = None
        if config.uses_images and "virtual" in setup.extras:
            images, labels = load_virtual(setup.extras["virtual"])
            if tuple(images.shape[1:]) != setup.dataset.shape:
                raise RunError(
                    f"virtual images {tuple(images.shape[1:])} do not match the dataset's "
                    f"{setup.dataset.shape}; fix fedhet.data.shapes.data_shape"
                )
            images, labels = images.to(setup.device), labels.to(setup.device)
        classes = setup.dataset.num_classes
        return cls(config, classes, setup.spec.seed, feature_dim, images, labels)

    def broadcast(self) -> dict[str, Tensor]:
        """What the server sends every client once, before training starts."""
        if self.gaussian_means is not None:
            return {"gaussian_means": self.gaussian_means}
        return {"images": self.images, "labels": self.labels}

    # --- sampling ---

    def virtual_batch(self, size: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """`size` (images, virtual class indices) drawn uniformly with replacement, each image
        cropped and flipped at random when `augment` is on."""
        idx = torch.randint(len(self.labels), (size,), generator=generator)
        images = self.images[idx]
        if self.config.augment:
            # clamp: the authors pad in [0, 1] before normalizing, with black
            fill = -CLAMP_MEAN / CLAMP_STD if self.config.virtual_scale == "clamp" else 0.0
            images = crop_and_flip(images, generator, fill=fill)
        return images, self.labels[idx]

    def gaussian_features(self, size: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """vfa: size // C + 1 features of every class from N(m_c, vfa_std^2 I), class-cyclic."""
        means = self.gaussian_means
        labels = torch.arange(len(means)).repeat(size // len(means) + 1)
        noise = torch.randn(len(labels), means.shape[1], generator=generator)
        return means[labels] + self.config.vfa_std * noise, labels

    # --- terms ---

    def virtual_terms(
        self, model: FedModel, x: Tensor, y: Tensor, x_virtual: Tensor, y_virtual: Tensor
    ) -> Terms:
        """The vhl / naive objective on a given real and virtual batch."""
        cfg, n = self.config, len(y)
        z = model.features(torch.cat([x, x_virtual]))
        logits = model.head(z)
        parts = {
            "real_ce": F.cross_entropy(logits[:n], y),
            "virtual_ce": F.cross_entropy(logits[n:], y_virtual + self.shift),
        }
        weights = {"real_ce": 1.0, "virtual_ce": cfg.alpha}
        if cfg.variant == "vhl":
            z_real, z_virtual = z[:n], z[n:]
            parts["calibration"] = vhl_calibration_loss(
                z_real, y, z_virtual, y_virtual, cfg.temperature
            )
            parts["virtual_supcon"] = supcon_loss(z_virtual, y_virtual, cfg.temperature)
            weights |= {"calibration": cfg.lam, "virtual_supcon": cfg.virtual_supcon}
        return _weighted(z, parts, weights)

    def gaussian_terms(
        self, model: FedModel, x: Tensor, y: Tensor, sampled: Tensor, sampled_labels: Tensor
    ) -> Terms:
        """The vfa objective on a given real batch and sampled Gaussian features."""
        z = model.features(x)
        parts = {
            "real_ce": F.cross_entropy(model.head(z), y),
            "calibration": vhl_calibration_loss(
                z, y, sampled.to(z.device), sampled_labels.to(y.device), self.config.temperature
            ),
        }
        return _weighted(z, parts, {"real_ce": 1.0, "calibration": self.config.lam})

    def terms(self, model: FedModel, x: Tensor, y: Tensor, generator: torch.Generator) -> Terms:
        size = self.config.batch_size or len(y)
        if self.config.uses_images:
            return self.virtual_terms(model, x, y, *self.virtual_batch(size, generator))
        return self.gaussian_terms(model, x, y, *self.gaussian_features(size, generator))

    def loss(self, model: FedModel, x: Tensor, y: Tensor, generator: torch.Generator) -> Tensor:
        return self.terms(model, x, y, generator).total
