"""VHL's local objective (Tang et al., 2022), composable with any algorithm that accepts one.

Each local step draws a virtual batch (x_v, y_v) as large as the real batch (x, y) from the
shared virtual dataset with the job's seeded generator, and with z = features([x; x_v]),
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
from typing import TYPE_CHECKING, Annotated, Any, Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor

from fedhet.core.errors import InputError, RunError
from fedhet.core.rng import torch_generator
from fedhet.core.sections import Section
from fedhet.methods.vhl.supcon import supcon_loss, vhl_calibration_loss

if TYPE_CHECKING:
    from fedhet.engine.algorithm import TrainSetup
    from fedhet.models import FedModel

# --- config -----------------------------------------------------------------------------


class _GeneratorSpec(Section):
    per_class: int = Field(200, ge=2, description="virtual images per class (official: 200)")

    def options(self) -> dict[str, Any]:
        """Keyword options of `fedhet.methods.vhl.generate` for this generator."""
        return self.model_dump(exclude={"kind", "per_class"})


class StyleGAN2Spec(_GeneratorSpec):
    """Untrained StyleGAN2; class k's latents z ~ N(mu_k, latent_std^2), mu_k ~ N(0, 0.5^2)."""

    kind: Literal["stylegan2"] = "stylegan2"
    style_dim: int = Field(64, ge=1)
    mapping_layers: int = Field(1, ge=0)
    channels: int = Field(64, ge=1, description="feature width (official code: 512)")
    noise_strength: float = Field(1.0, ge=0)
    class_mean_std: float = Field(0.5, gt=0)
    latent_std: float = Field(0.3, ge=0)


class NoiseSpec(_GeneratorSpec):
    """Per-class mean image at low resolution plus per-sample noise, upsampled bilinearly."""

    kind: Literal["noise"] = "noise"
    low_resolution: int = Field(8, ge=1)
    class_mean_std: float = Field(1.0, gt=0)
    sample_std: float = Field(0.5, ge=0)


class ConvSpec(_GeneratorSpec):
    """One randomly initialized small conv generator per class."""

    kind: Literal["conv"] = "conv"
    z_dim: int = Field(64, ge=1)
    channels: int = Field(32, ge=1)


GeneratorSpec = Annotated[StyleGAN2Spec | NoiseSpec | ConvSpec, Field(discriminator="kind")]

_VARIANT_LABELS = {"vhl": "VHL", "naive": "naive VHL", "vfa": "VFA"}


class VHLSpec(Section):
    variant: Literal["vhl", "naive", "vfa"] = "vhl"
    generator: GeneratorSpec = StyleGAN2Spec()
    classes: int | None = Field(
        None, ge=1, description="number of virtual classes C_v; default: the natural classes' C"
    )
    seed: int | None = Field(
        None,
        ge=0,
        description="seed of the virtual data (vfa: of the Gaussians); default: the spec's",
    )
    labels: Literal["extra", "shared"] = Field(
        "extra", description="virtual classes as C_v extra outputs (official) or sharing the first"
    )
    batch_size: int | None = Field(
        None, ge=1, description="virtual samples per step; default: the real batch's size"
    )
    alpha: float = Field(1.0, ge=0, description="weight of the cross-entropy on virtual data")
    lam: float = Field(1.0, ge=0, description="weight of the calibration term")
    virtual_supcon: float = Field(
        0.1, ge=0, description="weight of SupCon over the virtual features alone (official code)"
    )
    temperature: float = Field(0.07, gt=0, description="SupCon temperature")
    vfa_std: float = Field(0.05, gt=0, description="vfa: std of the per-class Gaussians")

    @property
    def uses_images(self) -> bool:
        return self.variant != "vfa"

    def label(self) -> str:
        label = _VARIANT_LABELS[self.variant]
        if self.uses_images and self.generator.kind != "stylegan2":
            label += f"({self.generator.kind})"
        return label


def virtual_classes(config: VHLSpec, natural_classes: int) -> int:
    """C_v; with shared labels virtual class k uses output k, so C_v may not exceed C."""
    classes = config.classes or natural_classes
    if config.labels == "shared" and classes > natural_classes:
        raise InputError(
            f"algorithm.vhl.classes={classes} exceeds the dataset's {natural_classes} classes "
            "with labels: shared; lower it or use labels: extra"
        )
    return classes


def extra_outputs(config: VHLSpec | None, natural_classes: int) -> int:
    """Outputs the model needs beyond the natural classes (0 unless virtual labels are extra)."""
    if config is None or not config.uses_images or config.labels == "shared":
        return 0
    return virtual_classes(config, natural_classes)


# --- the objective ----------------------------------------------------------------------


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
            from fedhet.methods.vhl.virtual_stage import load_virtual

            images, labels = load_virtual(setup.extras["virtual"])
            if tuple(images.shape[1:]) != setup.dataset.shape:
                raise RunError(
                    f"virtual images {tuple(images.shape[1:])} do not match the dataset's "
                    f"{setup.dataset.shape}; fix NATURAL_DATA in "
                    "fedhet/methods/vhl/virtual_stage.py"
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
        """`size` (images, virtual class indices) drawn uniformly with replacement."""
        idx = torch.randint(len(self.labels), (size,), generator=generator)
        return self.images[idx], self.labels[idx]

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
