"""The `partition:` section: how the training set is dealt to the clients (one class per
scheme, chosen by `scheme`), and the feature shifts applied on top."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, model_validator

from fedhet.core.sections import (
    MAX_CLASSES,
    MAX_CLIENTS,
    MAX_COUNT,
    MAX_FACTOR,
    OMIT_IF_DEFAULT,
    Clients,
    Count,
    Section,
)


class RotationSpec(Section):
    """Feature shift: client k's images are rotated by angles[k], or by k * step degrees."""

    angles: list[float] | None = None
    step: float = 15.0
    interpolation: Annotated[Literal["bilinear", "nearest"], OMIT_IF_DEFAULT] = Field(
        "bilinear",
        description="how rotated pixels are resampled (FedBR's code: nearest, PIL's default)",
    )


FeatureShiftKind = Literal["noise", "contrast", "blur"]
# the largest level of each kind: noise's std and blur's sigma in pixels' units, contrast's
# reduction (1 flattens every image to its mean)
FEATURE_SHIFT_MAX: dict[str, float] = {"noise": 10.0, "contrast": 1.0, "blur": 100.0}


class FeatureShiftSpec(Section):
    """Feature shift by an input transform (fedhet.data.feature_shift): client k's inputs get
    `kind` at `levels[k]`, or at max * k / (K - 1) (evenly from 0 to `max` over the K clients).
    Level 0 leaves a client's inputs as they are."""

    kind: FeatureShiftKind = Field(
        description="noise: Gaussian noise of std `level` (pixels in [0, 1]), drawn once per "
        "sample; contrast: each image scaled around its mean by 1 - `level`; blur: Gaussian "
        "blur of sigma `level` pixels"
    )
    levels: list[Annotated[float, Field(ge=0)]] | None = Field(
        None, max_length=MAX_CLIENTS, description="one level per client"
    )
    max: float | None = Field(None, ge=0, description="levels spread from 0 to max over clients")

    @model_validator(mode="after")
    def _levels_given_once(self) -> FeatureShiftSpec:
        if (self.levels is None) == (self.max is None):
            raise ValueError("give either levels (one per client) or max, not both or neither")
        ceiling = FEATURE_SHIFT_MAX[self.kind]
        given = [self.max] if self.levels is None else self.levels
        highest = max(given, default=0.0)
        if highest is not None and highest > ceiling:
            field = "max" if self.levels is None else "levels"
            raise ValueError(f"{field} reaches {highest}; {self.kind} levels go up to {ceiling}")
        return self

    def client_levels(self, clients: int) -> list[float]:
        """Each client's level."""
        if self.levels is not None:
            return list(self.levels)
        assert self.max is not None
        return [self.max * k / (clients - 1) if clients > 1 else 0.0 for k in range(clients)]


class _PartitionBase(Section):
    clients: Clients = 10
    rotation: RotationSpec | None = None
    feature_shift: Annotated[FeatureShiftSpec | None, OMIT_IF_DEFAULT] = Field(
        None,
        description="a per-client input transform (noise, contrast or blur), after the rotation",
    )
    max_samples: Annotated[Count | None, OMIT_IF_DEFAULT] = Field(
        None,
        description="a client dealt more samples keeps this many, drawn at random without "
        "replacement (a reduced-data edition of a partition)",
    )

    @property
    def interpolation(self) -> Literal["bilinear", "nearest"]:
        """How the rotation feature shift resamples pixels (bilinear without one)."""
        return "bilinear" if self.rotation is None else self.rotation.interpolation


class IIDPartition(_PartitionBase):
    scheme: Literal["iid"] = "iid"


class DirichletPartition(_PartitionBase):
    """Per class c: q_c ~ Dir_K(alpha), client k gets a q_c[k] share of class c."""

    scheme: Literal["dirichlet"] = "dirichlet"
    alpha: float = Field(0.5, gt=0, le=MAX_FACTOR)
    min_samples: int = Field(0, ge=0, le=MAX_COUNT, description="minimum samples per client")
    cap: Annotated[bool, OMIT_IF_DEFAULT] = Field(
        False,
        description="classes dealt in turn, a client holding N/K samples takes no more "
        "(the LDA of VHL's and FedImpro's code, with min_samples: 10)",
    )


class ClientDirichletPartition(_PartitionBase):
    """FedBR's label skew: client k draws q_k ~ Dir_C(alpha * v) and N // K samples without
    replacement from it, an exhausted class dropped and q_k renormalized."""

    scheme: Literal["client_dirichlet"] = "client_dirichlet"
    alpha: float = Field(0.1, gt=0, le=MAX_FACTOR)
    concentration: Annotated[Literal["uniform", "by_share"], OMIT_IF_DEFAULT] = Field(
        "uniform",
        description="v: uniform = all ones; by_share = each class's share of the samples no "
        "client holds yet (FedBR's code; summing to 1, so about 10x more skewed for 10 classes)",
    )


class ClassesPartition(_PartitionBase):
    """#C classes per client; each class split evenly among its owners."""

    scheme: Literal["classes"] = "classes"
    classes_per_client: int = Field(2, ge=1, le=MAX_CLASSES)
    shuffle_classes: bool = Field(
        True,
        description="False gives label-sorted contiguous blocks (client k owns classes kC..kC+C-1)",
    )


class SubsetPartition(_PartitionBase):
    """One dominant class per client plus `minor_samples` samples of every other class."""

    scheme: Literal["subset"] = "subset"
    minor_samples: int = Field(5, ge=0, le=MAX_COUNT)


class QuantityPartition(_PartitionBase):
    """Quantity skew: iid labels, client sizes proportional to a Dir_K(alpha) draw."""

    scheme: Literal["quantity"] = "quantity"
    alpha: float = Field(1.0, gt=0, le=MAX_FACTOR)
    min_samples: int = Field(1, ge=0, le=MAX_COUNT)


class RotationPartition(_PartitionBase):
    """iid labels with a per-client rotation (RotatedMNIST-style)."""

    scheme: Literal["rotation"] = "rotation"
    rotation: RotationSpec = RotationSpec()


class NaturalPartition(_PartitionBase):
    """The data's own clients (LEAF style): client k holds the samples whose client id is k."""

    scheme: Literal["natural"] = "natural"
    # filled in from the data (fedhet.core.natural_clients), so out of dumps: each run takes
    # its data's
    clients: Clients = Field(10, exclude=True, description="the data's clients (filled in)")
    by: Annotated[str | None, OMIT_IF_DEFAULT] = Field(
        None,
        min_length=1,
        description="the data's column of client ids, one client per distinct value in sorted "
        "order (dataset huggingface); default: the data's own client ids",
    )
    group: Annotated[Clients | None, OMIT_IF_DEFAULT] = Field(
        None,
        description="this many consecutive natural ids per client, the last client taking what "
        "remains (flwr-datasets' GroupedNaturalIdPartitioner, mode allow-smaller)",
    )


PartitionConfig = (
    IIDPartition
    | DirichletPartition
    | ClassesPartition
    | SubsetPartition
    | QuantityPartition
    | RotationPartition
    | ClientDirichletPartition
    | NaturalPartition
)
PartitionSpec = Annotated[PartitionConfig, Field(discriminator="scheme")]


def partition_label(p: BaseModel) -> str:
    """Short column label for a partition, like the papers' table headers."""
    base = {
        "iid": "iid",
        "dirichlet": f"alpha={getattr(p, 'alpha', '')}" + ("+cap" if getattr(p, "cap", 0) else ""),
        "client_dirichlet": f"client alpha={getattr(p, 'alpha', '')}",
        "classes": f"#C={getattr(p, 'classes_per_client', '')}",
        "subset": "subset",
        "quantity": f"quantity(alpha={getattr(p, 'alpha', '')})",
        "rotation": "rotated",
        "natural": _natural_label(p),
    }[p.scheme]
    if p.rotation is not None and p.scheme != "rotation":
        base += "+rot"
    if p.feature_shift is not None:
        base += f"+{p.feature_shift.kind}"
    if p.max_samples is not None:
        base += f", <={p.max_samples}/client"
    return base


def _natural_label(p: BaseModel) -> str:
    by, group = getattr(p, "by", None), getattr(p, "group", None)
    return "natural" + (f" by {by}" if by else "") + (f", {group} ids/client" if group else "")
