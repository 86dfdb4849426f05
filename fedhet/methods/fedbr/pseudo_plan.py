"""The `pseudo` stage's node (no torch): the config that determines FedBR's stored pseudo
batch; fedhet.methods.fedbr.pseudo_stage computes the artifact."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedhet.core.pipeline import StageNode
from fedhet.core.spec import Spec
from fedhet.data.partition_plan import partition_node

if TYPE_CHECKING:
    from fedhet.methods.fedbr.config import PseudoSpec

VERSION = 1


def pseudo_config(pseudo: PseudoSpec, spec: Spec) -> dict:
    """What determines the stored batch (mixing and refresh happen later, on the clients)."""
    config = {
        "kind": pseudo.kind,
        "size": pseudo.size or spec.federation.batch_size,
        "subset": pseudo.subset,
        "seed": spec.seed,
    }
    if pseudo.kind == "mixture":
        config |= {"proxy": pseudo.proxy, "dataset": spec.data.dataset}
    return config


def pseudo_node(pseudo: PseudoSpec, spec: Spec) -> StageNode:
    config = pseudo_config(pseudo, spec)
    upstream = {"partition": partition_node(spec)} if pseudo.kind == "rsm" else {}
    return StageNode("pseudo", VERSION, config, upstream)
