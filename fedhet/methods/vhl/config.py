"""VHL's spec block, `algorithm: {..., vhl: {...}}`: the variant, the virtual data's generator
and the weights of the objective's terms; and what it plans (the `virtual` stage's node)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from fedhet.plugin import (
    MAX_CLASSES,
    MAX_COUNT,
    MAX_LAYERS,
    MAX_SEED,
    MAX_WIDTH,
    OMIT_IF_DEFAULT,
    Count,
    InputError,
    ObjectiveConfig,
    Section,
    Spec,
    StageNode,
    Weight,
    Width,
    data_shape,
    refuse_text,
)


class _GeneratorSpec(Section):
    per_class: int = Field(
        200, ge=2, le=MAX_COUNT, description="virtual images per class (official: 200)"
    )


class StyleGAN2Spec(_GeneratorSpec):
    """Untrained StyleGAN2; class k's latents z ~ N(mu_k, latent_std^2), mu_k ~ N(0, 0.5^2)."""

    kind: Literal["stylegan2"] = "stylegan2"
    style_dim: Width = 64
    mapping_layers: int = Field(1, ge=0, le=MAX_LAYERS)
    channels: Width = Field(64, description="feature width (official code: 512)")
    noise_strength: float = Field(
        0.0,
        ge=0,
        description="scale of the per-layer noise inputs; 0 as the authors' untrained generator "
        "(its noise-injection weights start at zero), 1 lets the per-class noise act",
    )
    class_mean_std: float = Field(0.5, gt=0)
    latent_std: float = Field(0.3, ge=0)


class NoiseSpec(_GeneratorSpec):
    """Per-class mean image at low resolution plus per-sample noise, upsampled bilinearly."""

    kind: Literal["noise"] = "noise"
    low_resolution: int = Field(8, ge=1, le=MAX_WIDTH)
    class_mean_std: float = Field(1.0, gt=0)
    sample_std: float = Field(0.5, ge=0)


class ConvSpec(_GeneratorSpec):
    """One randomly initialized small conv generator per class."""

    kind: Literal["conv"] = "conv"
    z_dim: Width = 64
    channels: Width = 32


GeneratorSpec = Annotated[StyleGAN2Spec | NoiseSpec | ConvSpec, Field(discriminator="kind")]

_VARIANT_LABELS = {"vhl": "VHL", "naive": "naive VHL", "vfa": "VFA"}


class VHLSpec(ObjectiveConfig):
    variant: Literal["vhl", "naive", "vfa"] = "vhl"
    generator: GeneratorSpec = StyleGAN2Spec()
    classes: int | None = Field(
        None,
        ge=1,
        le=MAX_CLASSES,
        description="number of virtual classes C_v; default: the natural classes' C",
    )
    seed: int | None = Field(
        None,
        ge=0,
        le=MAX_SEED,
        description="seed of the virtual data (vfa: of the Gaussians); default: the spec's",
    )
    labels: Literal["extra", "shared"] = Field(
        "extra", description="virtual classes as C_v extra outputs (official) or sharing the first"
    )
    batch_size: Count | None = Field(
        None,
        description="virtual samples per step; default: the real batch's size",
    )
    augment: bool = Field(
        True,
        description="random crop (padding 4) and horizontal flip of every virtual image drawn "
        "(the authors' loader); false uses the stored images as they are",
    )
    virtual_scale: Annotated[Literal["standardize", "clamp"], OMIT_IF_DEFAULT] = Field(
        "standardize",
        description="the virtual images' values: standardize = per channel to mean 0, std 1 "
        "over the virtual set; clamp = clamped to [0, 1], then (x - 0.5) / 0.25, the random "
        "crop padding with black (-2), as the authors' loader (pair with data.scale: unit)",
    )
    predict: Annotated[Literal["natural", "all"], OMIT_IF_DEFAULT] = Field(
        "natural",
        description="evaluation's prediction: argmax over the natural classes' outputs only, or "
        "over all outputs, virtual classes included (a virtual prediction counts as wrong), "
        "as the authors' test accuracy",
    )
    alpha: Weight = Field(1.0, description="weight of the cross-entropy on virtual data")
    lam: Weight = Field(1.0, description="weight of the calibration term")
    virtual_supcon: Weight = Field(
        0.1, description="weight of SupCon over the virtual features alone (official code)"
    )
    temperature: float = Field(0.07, gt=0, description="SupCon temperature")
    vfa_std: float = Field(0.05, gt=0, description="vfa: std of the per-class Gaussians")

    @property
    def uses_images(self) -> bool:
        return self.variant != "vfa"

    def upstream(self, spec: Spec) -> dict[str, StageNode]:
        """The virtual dataset, when the variant trains on virtual images."""
        return {"virtual": virtual_node(self, spec)} if self.uses_images else {}

    def extra_outputs(self, num_classes: int) -> int:
        """Outputs the model needs beyond the natural classes (0 unless virtual labels are
        extra)."""
        if not self.uses_images or self.labels == "shared":
            return 0
        return virtual_classes(self, num_classes)

    def scored_extra_outputs(self, num_classes: int) -> int:
        return self.extra_outputs(num_classes) if self.predict == "all" else 0

    def check(self, spec: Spec) -> None:
        steps = "trains on virtual images beside its inputs" if self.uses_images else None
        refuse_text(spec, "algorithm.vhl", f"{spec.algorithm.name}+VHL", steps)
        classes = data_shape(spec.data).classes
        virtual_classes(self, classes)
        if self.virtual_scale != "standardize" and not self.uses_images:
            raise InputError(
                f"algorithm.vhl.virtual_scale: variant {self.variant} draws no virtual images; "
                "remove it"
            )
        if self.predict == "all" and self.extra_outputs(classes) == 0:
            raise InputError(
                "algorithm.vhl.predict: all scores the virtual classes' extra outputs, which "
                f"this VHL (variant {self.variant}, labels: {self.labels}) does not add; remove it"
            )

    def display_name(self) -> str:
        return _VARIANT_LABELS[self.variant]

    def settings(self) -> list[str]:
        generator = self.uses_images and self.generator.kind != "stylegan2"
        return [
            *([f"{self.generator.kind} generator"] if generator else []),
            *(["no aug"] if self.uses_images and not self.augment else []),
        ]


def virtual_classes(config: VHLSpec, natural_classes: int) -> int:
    """C_v; with shared labels virtual class k uses output k, so C_v may not exceed C."""
    classes = config.classes or natural_classes
    if config.labels == "shared" and classes > natural_classes:
        raise InputError(
            f"algorithm.vhl.classes={classes} exceeds the dataset's {natural_classes} classes "
            "with labels: shared; lower it or use labels: extra"
        )
    return classes


VIRTUAL_VERSION = 1  # the `virtual` stage's format (computed by fedhet.methods.vhl.virtual_stage)


def virtual_config(config: VHLSpec, spec: Spec) -> dict:
    """The virtual images' shape is the model's input shape (the spec's data format)."""
    shape, natural_classes = data_shape(spec.data)
    node = {
        "generator": config.generator.model_dump(mode="json"),
        "classes": virtual_classes(config, natural_classes),
        "shape": list(shape),
        "seed": config.seed if config.seed is not None else spec.seed,
    }
    if config.virtual_scale != "standardize":  # absent by default: today's keys stay
        node["scale"] = config.virtual_scale
    return node


def virtual_node(config: VHLSpec, spec: Spec) -> StageNode:
    return StageNode("virtual", VIRTUAL_VERSION, virtual_config(config, spec))
