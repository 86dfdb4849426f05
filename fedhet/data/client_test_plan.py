"""The `client_test` stage's node, known without loading data (planning imports no torch);
fedhet.data.client_test computes the artifact."""

from __future__ import annotations

from fedhet.core.pipeline import StageNode
from fedhet.core.spec import Spec
from fedhet.data.partition_plan import partition_node

VERSION = 1


def client_test_node(spec: Spec) -> StageNode | None:
    """The node of the spec's per-client test sets; None without `eval.client_test`."""
    option = spec.eval.client_test
    if option is None:
        return None
    config = {"per_client": option.per_client}
    return StageNode("client_test", VERSION, config, {"partition": partition_node(spec)})
