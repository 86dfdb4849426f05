"""The natural partition's clients (`partition: {scheme: natural}`): the data's own, as its
description (a dataset plug-in's `describe()`, fedhet.core.data_config) counts them."""

from __future__ import annotations

from typing import Any

import numpy as np
from pydantic import ValidationError
from pydantic_core import PydanticCustomError

from fedhet.core.errors import InputError


def natural_count(data: Any, group: int | None = None) -> int | None:
    """The clients of the data's own partition, `group` natural ids to a client; None for data
    without client ids (fedhet's built-in datasets, a plug-in's without them)."""
    describe = getattr(data, "describe", None)
    count = describe().clients if describe is not None else None
    return count if count is None or group is None else -(-count // group)


def grouped(ids: np.ndarray, group: int | None) -> np.ndarray:
    """Client ids with `group` consecutive natural ids to a client (-1, no client's, stays)."""
    return ids if group is None else np.where(ids >= 0, ids // group, -1)


def with_natural_clients(spec: dict[str, Any]) -> dict[str, Any]:
    """A spec's mapping (its data validated) with a natural partition given its data's clients,
    unless it gives them; with `by`, the data's client ids are that column's (the data's
    `with_clients_from`: a ValidationError at partition.by when it has no such column)."""
    partition = spec.get("partition")
    if isinstance(partition, dict) and partition.get("scheme") == "natural":
        by, data = partition.get("by"), spec.get("data")
        if isinstance(by, str) and by:
            spec["data"] = data = _by_column(data, by)
        clients = natural_count(data, partition.get("group"))
        if clients is not None and "clients" not in partition:
            spec["partition"] = {**partition, "clients": clients}
    return spec


def _by_column(data: Any, column: str) -> Any:
    by_column = getattr(data, "with_clients_from", None)
    if by_column is None:
        name = getattr(data, "dataset", "digits")
        message = (
            f"dataset {name} has no columns to take clients from; remove it (a natural "
            "partition then uses the data's own client ids) or use dataset huggingface"
        )
    else:
        try:
            return by_column(column)
        except InputError as err:
            message = str(err)
    error = {"type": PydanticCustomError("spec", message), "loc": ("partition", "by")}
    raise ValidationError.from_exception_data("Spec", [{**error, "input": column}])


def natural_problem(data: Any, partition: Any) -> str | None:
    """What is wrong with a natural `partition` of `data`; None if nothing or not natural."""
    if partition.scheme != "natural":
        return None
    clients, count = partition.clients, natural_count(data, partition.group)
    if count is None and callable(getattr(data, "with_clients_from", None)):
        return (
            f"partition.by: a natural partition of dataset {data.dataset} needs the column of "
            "its client ids; name it (partition: {scheme: natural, by: COLUMN})"
        )
    if count is None:
        return (
            f"partition.scheme: natural needs data with client ids, which {data.dataset} has "
            "not; use dataset arrays with a client array, images in site folders, synthetic "
            "or leaf, or choose another scheme"
        )
    if clients != count:
        grouping = f" ({partition.group} ids a client)" if partition.group else ""
        return (
            f"partition.clients: {clients} for the {count} clients of the data{grouping}; "
            "remove it (a natural partition has the data's clients)"
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
