"""The natural partition's clients (`partition: {scheme: natural}`): the data's own, as its
description (a dataset plug-in's `describe()`, fedhet.core.data_config) counts them."""

from __future__ import annotations

from typing import Any


def natural_count(data: Any) -> int | None:
    """The clients of the data's own partition; None for data without client ids (fedhet's
    built-in datasets, a plug-in's without them)."""
    describe = getattr(data, "describe", None)
    return describe().clients if describe is not None else None


def with_natural_clients(spec: dict[str, Any]) -> dict[str, Any]:
    """A spec's mapping (its data validated) with a natural partition given its data's clients,
    unless it gives them."""
    partition = spec.get("partition")
    if isinstance(partition, dict) and partition.get("scheme") == "natural":
        clients = natural_count(spec.get("data"))
        if clients is not None and "clients" not in partition:
            spec["partition"] = {**partition, "clients": clients}
    return spec


def natural_problem(data: Any, partition: Any) -> str | None:
    """What is wrong with a natural `partition` of `data`; None if nothing or not natural."""
    if partition.scheme != "natural":
        return None
    clients, count = partition.clients, natural_count(data)
    if count is None:
        return (
            f"partition.scheme: natural needs data with client ids, which {data.dataset} has "
            "not; use dataset arrays with a client array, images in site folders, synthetic "
            "or leaf, or choose another scheme"
        )
    if clients != count:
        return (
            f"partition.clients: {clients} for the {count} clients of the data; remove it "
            "(a natural partition has the data's clients)"
        )
    return None


def own_tests_problem(spec: Any) -> str | None:
    """What keeps `eval.client_test` without `per_client` (each client's own test samples) from
    applying to a spec; None if nothing does or it asks for drawn test sets."""
    option = spec.eval.client_test
    if option is None or option.per_client is not None:
        return None
    describe = getattr(spec.data, "describe", None)
    if describe is None or not describe().client_tests:
        return (
            f"eval.client_test: {spec.data.dataset}'s test split names no clients; give "
            "per_client (test samples drawn for each client)"
        )
    if spec.partition.scheme != "natural":
        return (
            "eval.client_test: the clients' own test samples are those of the natural "
            "partition's clients; set partition.scheme: natural or give per_client"
        )
    return None
