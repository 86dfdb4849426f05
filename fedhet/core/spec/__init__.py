"""Experiment specs: validated pydantic models loaded from YAML, with matrix expansion.

Every section forbids unknown fields. Fields that cannot change results (names, paths,
devices, threads, progress) live in `runtime` or are marked `exclude_from_key` so that
they never enter a stage key.

One module per concept (docs/reference/architecture.md draws the map): a module per section
(`data`, `partition`, `model`, `federation`, `algorithm`, `evaluation`, `runtime`), the root
`Spec` (`root`), and above them the loading (`yaml_file`, `overrides`, `matrix`, `loading`),
the error wording (`wording`), `spec show`'s dump (`applicable`) and the JSON Schema (`schema`).
Code outside the package imports the names below from `fedhet.core.spec`.
"""

from fedhet.core.spec.applicable import applicable_dump
from fedhet.core.spec.data import DatasetName, DataSpec, dataset_configs
from fedhet.core.spec.federation import FederationSpec
from fedhet.core.spec.loading import load_spec, parse_spec
from fedhet.core.spec.matrix import expand, parse_run
from fedhet.core.spec.model import ModelSpec, model_configs
from fedhet.core.spec.overrides import apply_overrides, replaced_axes
from fedhet.core.spec.partition import (
    ClassesPartition,
    ClientDirichletPartition,
    DirichletPartition,
    FeatureShiftKind,
    IIDPartition,
    PartitionConfig,
    QuantityPartition,
    RotationPartition,
    RotationSpec,
    SubsetPartition,
    partition_label,
)
from fedhet.core.spec.root import Spec
from fedhet.core.spec.runtime import RuntimeSpec
from fedhet.core.spec.schema import json_schema
from fedhet.core.spec.yaml_file import derived, load_mapping

__all__ = [
    "ClassesPartition",
    "ClientDirichletPartition",
    "DataSpec",
    "DatasetName",
    "DirichletPartition",
    "FeatureShiftKind",
    "FederationSpec",
    "IIDPartition",
    "ModelSpec",
    "PartitionConfig",
    "QuantityPartition",
    "RotationPartition",
    "RotationSpec",
    "RuntimeSpec",
    "Spec",
    "SubsetPartition",
    "apply_overrides",
    "applicable_dump",
    "dataset_configs",
    "derived",
    "expand",
    "json_schema",
    "load_mapping",
    "load_spec",
    "model_configs",
    "parse_run",
    "parse_spec",
    "partition_label",
    "replaced_axes",
]
