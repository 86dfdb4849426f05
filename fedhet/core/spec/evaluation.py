"""The `eval:` section: when the global model is scored, and the clients' own test sets."""

from __future__ import annotations

from pydantic import Field

from fedhet.core.sections import Count, Section


class ClientTestSpec(Section):
    """Each client's own test set, drawn from the dataset's test split in the client's training
    label proportions (fedhet.data.client_test); `fedhet eval` and `fedhet report` score every
    client on it with the model that client would use."""

    per_client: Count | None = Field(
        None,
        description="test samples per client (fewer where a class runs out); none: each "
        "client's own test samples, of data whose test split names its clients (LEAF)",
    )


class EvalSpec(Section):
    every: Count = Field(1, description="evaluate the global model every N rounds")
    target_accuracy: float | None = Field(
        None,
        gt=0,
        le=1,
        description="the test accuracy the rounds to target count to, a fraction of 1 (0.85: "
        "85%, as the tables show it)",
    )
    client_test: ClientTestSpec | None = Field(
        None, description="per-client test sets from the test split (eval and report only)"
    )
