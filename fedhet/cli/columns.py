"""What each command's table shows: its columns, in order (fedhet.cli.output renders them).
A `pct` column holds a stored fraction (its key in fedhet.core.units.FRACTIONS), shown in
percent."""

from __future__ import annotations

from fedhet.cli.output import Column, Kind


def named(*keys: str, kind: Kind = "text") -> list[Column]:
    """Columns headed by their own keys (`algorithm`, `setting`)."""
    return [Column(key, key, kind) for key in keys]


RUN_LABELS = named("algorithm", "setting")
RUN_ID = [*RUN_LABELS, Column("seed", "seed", "number")]  # one run: its labels and seed
ACCURACIES = [  # a run's test accuracy: its best, at its best validation round, its final
    Column("best_test", "best test %", "pct"),
    Column("test_at_best_val", "test at best val %", "pct", optional=True),
    Column("final", "final %", "pct"),
]


# fedhet partition
PARTITION_COLUMNS = [
    *named("client", "size", "classes", kind="number"),
    Column("dominant_class", "top class", "number"),
    Column("dominant_share", "top %", "pct"),
    Column("hellinger", "Hellinger", "number"),
    Column("jensen_shannon", "JS", "number"),
    Column("earth_movers", "EMD", "number"),
    Column("angle", "angle °", "number"),  # a rotation partition's, in degrees
]


# fedhet train
RESULT_COLUMNS = [
    *RUN_ID,
    *ACCURACIES,
    Column("rounds_to_target", "rounds to target", "number"),
    Column("wall_time_s", "time s", "seconds"),
]


# fedhet plan
PLAN_COLUMNS = [
    *named("run", "stage", "key", "state"),
    Column("runs", "runs", "number"),
    *named("left"),
]


# fedhet tune: a row per method, or per trial (--trials)
TUNE_COLUMNS = [
    *RUN_LABELS,
    *named("trials", kind="number"),
    Column("pruned", "stopped early", "number", optional=True),
    *named("chosen"),
    Column("best_val", "best val %", "pct"),
    Column("median_val", "median val %", "pct"),
    Column("extended", "values added", optional=True),
    Column("runoff", "runoff trials", "number", optional=True),
    Column("edge", "at an edge", optional=True),
]
TRIAL_COLUMNS = [
    *RUN_LABELS,
    *named("trial", kind="number"),
    *named("values"),
    Column("val_score", "val %", "pct"),
    Column("scores", "per seed %"),
    Column("pruned_at", "stopped at round", "number", optional=True),
    Column("runoff_score", "runoff mean %", "pct", optional=True),
    *named("chosen", "keys"),
]


# fedhet runs
RUN_COLUMNS = [
    *RUN_ID,
    *named("state"),
    *ACCURACIES,
    *named("rounds", kind="number"),
    Column("wall_time_s", "time s", "seconds", optional=True),  # none until a run is stored
]


# fedhet eval
EVAL_COLUMNS = [
    *RUN_ID,
    *named("model"),
    Column("accuracy", "accuracy %", "pct"),
    Column("global_accuracy", "global model %", "pct"),  # with a personalized run only
    Column("own_angle", "own angle %", "pct", optional=True),
    *named("loss", kind="number"),
    Column("per_class", "per class %"),
    Column("per_client", "per client % (train samples)"),
]
CLIENT_TEST_COLUMNS = [  # over the clients' accuracies on their own test sets
    Column("client_test_mean", "client mean %", "pct"),
    Column("client_test_weighted_mean", "weighted mean %", "pct"),
    Column("client_test_worst_decile", "worst 10% %", "pct"),
    Column("client_test_std", "client std %", "pct"),
]
CLIENT_TEST_LIST = Column("client_test", "per client % (own test set)")
CGV_COLUMNS = [
    Column(f"cgv_{part}", f"CGV {part}", "number") for part in ("total", "features", "head")
]


# fedhet artifacts ls
LS_COLUMNS = [
    *named("stage", "key", "label"),
    Column("size", "MB", "megabytes"),
    *named("created"),
]
ARRAY_COLUMNS = named("array", "shape", "chunks", "dtype")
