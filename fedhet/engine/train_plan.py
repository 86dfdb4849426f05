"""The `train` stage's node: the config that enters its key, and its upstream stages.

Planning only (no torch): `MethodConfig.plan` and methods that train a model as one of their
stages (TCT's bootstrap, FedBR) call `train_node`; fedhet.engine.train_stage computes the
artifact.
"""

from __future__ import annotations

from fedhet.core.pipeline import StageNode
from fedhet.core.spec import Spec
from fedhet.data.client_test_plan import client_test_node
from fedhet.data.partition_plan import partition_node

VERSION = 1


def train_config(spec: Spec) -> dict:
    config = {
        "seed": spec.seed,
        "model": spec.model.model_dump(mode="json"),
        "federation": spec.federation.model_dump(mode="json"),
        "algorithm": spec.algorithm.model_dump(mode="json"),
        "eval_every": spec.eval.every,
    }
    if spec.data.input_format():
        config["input_format"] = spec.data.input_format()
    if spec.partition.rotation is not None:
        config["test_set"] = "rotated_like_clients"
    revision = spec.algorithm.revision
    if revision:
        config["algorithm_revision"] = revision
    return config


def train_node(spec: Spec, **extra_upstream: StageNode) -> StageNode:
    """The run's train node: upstream of it the partition, the stages its local objective needs
    (VHL's virtual data), for a personalized method with `eval.client_test` the clients' own
    test sets (its rounds' test accuracy is scored on them) and `extra_upstream` (role -> node;
    the train stage hands their artifacts to the trainer as `setup.extras[role]`)."""
    upstream = {
        "partition": partition_node(spec),
        **spec.algorithm.objective_upstream(spec),
        **extra_upstream,
    }
    own_tests = client_test_node(spec)
    if spec.algorithm.personalized and own_tests is not None:
        upstream["client_test"] = own_tests
    return StageNode("train", VERSION, train_config(spec), upstream)
