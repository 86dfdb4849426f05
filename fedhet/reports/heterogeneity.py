"""The report's section on how heterogeneous its partitions are: one row per distinct partition
(fedhet.data.heterogeneity's measures, as `fedhet partition` prints them)."""

from __future__ import annotations

from fedhet.core.store import ArtifactStore
from fedhet.data.heterogeneity import heterogeneity
from fedhet.execution.planning import Run

HEADER = (
    "| partition | clients | Hellinger | iid split | Jensen-Shannon | earth mover's | classes a "
    "client | sizes' CV | sizes' Gini |\n|---|--:|--:|--:|--:|--:|--:|--:|--:|"
)


def heterogeneity_section(runs: list[Run], store: ArtifactStore) -> str | None:
    """The markdown section: a row per stored partition the runs use, in run order (its
    histogram only is read); None when none is stored."""
    rows, seen = [], set()
    for run in runs:
        node = next((n for n in run.node.walk() if n.stage == "partition"), None)
        if node is None or node.key in seen or not store.exists(node.stage, node.key):
            continue
        seen.add(node.key)
        group = store.open(node.stage, node.key)
        if "histogram" not in group:  # not written by the partition stage: no row
            continue
        histogram = group["histogram"][:]
        h = heterogeneity(histogram)
        rows.append(
            f"| {run.node_labels()[node.key]} | {len(histogram)} | {h.hellinger:.3f} | "
            f"{h.iid_hellinger:.3f} | {h.jensen_shannon:.3f} | {h.earth_movers:.3f} | "
            f"{h.classes_held:.1f} of {h.classes} | {h.size_cv:.2f} | {h.size_gini:.2f} |"
        )
    if not rows:
        return None
    return (
        "## Heterogeneity of the partitions\n\nEach client's label distribution against the "
        "pooled one, mean over the clients that hold samples: Hellinger distance (beside what "
        "an iid split of the same sizes reaches by sampling alone), Jensen-Shannon divergence "
        "(base 2) and earth mover's distance; the classes a client holds; the clients' sizes' "
        "coefficient of variation and Gini coefficient (fedhet.data.heterogeneity).\n\n"
        + "\n".join([HEADER, *rows])
    )
