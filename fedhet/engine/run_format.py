"""The train artifact's format: per-round metrics, run states (checkpoints) and clients' states,
all plain Zarr arrays. Importable without torch (tensors are built only inside the functions
that load them), so counting a run's rounds or reading its metrics never imports torch.

Clients' states are stored as one table per group (`clients/`): `ids` lists every client in the
table (an empty state included, and it costs no array), and each tensor name has its values
stacked over the clients that hold it (`values/<name>`, one row per client) with their ids in
row order (`holders/<name>`).

A checkpoint (`ckpt-<round>.zarr`) holds the global, server and best states and the metrics; the
clients' states live in append-only deltas beside it (`clients-<round>-<nonce>.zarr`, one table
of the clients whose state changed since the previous checkpoint), which the checkpoint lists
oldest first in its `client_deltas` attribute; reading applies them in order, a newer row
replacing an older one. Why this is atomic: a delta is immutable once renamed into place and is
written before the checkpoint that lists it; a checkpoint appears whole by one rename; and
only after that rename are older checkpoints and the deltas the newest one does not list
deleted (renamed out of the way, `.trash-*`, then removed on a thread the run waits for
before it returns). A crash at any point leaves the newest complete checkpoint with every delta
it lists, each holding the states of the rounds that checkpoint saw. A save therefore costs the
clients touched since the previous one; when the chain's rows exceed twice the clients held, the
next delta holds every client and starts a new chain, so reads and disk stay within a small
multiple of one full table and writes within twice the touched clients, amortized.

Every array carries zarr's crc32c checksum (fedhet.core.sealed.create_array), and a checkpoint and
a delta are sealed (fedhet.core.sealed.seal: the checksums of their members' metadata and of their
attributes): a checkpoint whose arrays, metadata or attributes, or those of a delta it lists, fail
them is skipped for an older one, if a crash left one, else round 0.

A train artifact's `continuation/` group holds one run state with its clients' table inside
(what a run with more rounds goes on from, see fedhet.engine.extension).

Checkpoints written before the deltas (one `clients/<id>` group per client inside the
checkpoint) and final artifacts with that layout are still read.
"""

from __future__ import annotations

import contextlib
import shutil
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import zarr

from fedhet.core.sealed import create_groups, damage_in, open_sealed, seal
from fedhet.engine.system import METRICS as SYSTEM_METRICS
from fedhet.process import interrupts

if TYPE_CHECKING:
    import torch

    from fedhet.core.spec import Spec
    from fedhet.engine.tensors import Tensors

METRICS = (
    "test_accuracy",
    "test_loss",
    "train_loss",
    "divergence",
    "bytes_up",
    "bytes_down",
    "comm_rounds",  # server-client round trips: 1 (model exchange) + Traffic.rounds (FedTAN)
    "wall_time",
)
# A round's costs, not its model's quality: what a stage counts of the stages it is built on
COST_METRICS = ("bytes_up", "bytes_down", "comm_rounds", "wall_time")
# Measured on evaluation rounds only (NaN in the rounds between)
EVALUATION_METRICS = ("test_accuracy", "test_loss")
# The group of a train artifact holding the state a longer run continues from
CONTINUATION = "continuation"
# The start of the name of a checkpoint folder's entry being deleted (`Checkpoints.save`)
TRASH = ".trash-"
# with a validation split (`data.validation`), per evaluated round; NaN in the others
VALIDATION_METRICS = ("val_accuracy", "val_loss")


def run_metrics(spec: Spec) -> tuple[str, ...]:
    """The metrics a run of `spec` stores per round: METRICS, plus those its options add."""
    validation = VALIDATION_METRICS if spec.data.validation is not None else ()
    system = SYSTEM_METRICS if spec.federation.system is not None else ()
    return METRICS + validation + system


@dataclass
class RunState:
    """Everything a checkpoint holds; the run continues exactly from it."""

    round: int  # rounds completed
    global_state: Tensors
    server_state: Tensors
    client_states: dict[int, Tensors]
    metrics: dict[str, list[float]] = field(default_factory=lambda: {m: [] for m in METRICS})
    best_state: Tensors | None = None
    best_accuracy: float = -1.0  # best_state's score: validation accuracy with a split, else test
    # where its rounds ran so far (fedhet.core.provenance.segments_after), for a run resumed in
    # another environment
    environments: list[dict] = field(default_factory=list)

    def snapshot(self) -> RunState:
        """A copy that later rounds leave alone: they replace tensors, never change them in
        place, so copying the containers is enough."""
        return replace(
            self,
            client_states=dict(self.client_states),
            metrics={name: list(values) for name, values in self.metrics.items()},
        )


# --- metrics ------------------------------------------------------------------------------


def metric_arrays(metrics: Mapping[str, list[float]]) -> dict[str, np.ndarray]:
    """The metrics as the arrays of the group `metrics` (`write_metrics`)."""
    return {name: np.asarray(values, dtype=np.float64) for name, values in metrics.items()}


def write_metrics(group: zarr.Group, metrics: Mapping[str, list[float]]) -> None:
    create_groups(group, {"metrics": metric_arrays(metrics)})


def read_metrics(group: zarr.Group) -> dict[str, list[float]]:
    """Every metric stored in `group`, METRICS first."""
    stored = [name for name, _ in group["metrics"].arrays()]
    names = [m for m in METRICS if m in stored] + sorted(set(stored) - set(METRICS))
    return {name: group["metrics"][name][:].tolist() for name in names}


# --- clients' states ----------------------------------------------------------------------


def write_client_states(group: zarr.Group, client_states: Mapping[int, Tensors]) -> None:
    """`client_states` as one stacked table in `group["clients"]` (see the module docstring)."""
    create_groups(group, {"clients": client_table(client_states)})


def client_table(client_states: Mapping[int, Tensors]) -> dict[str, np.ndarray]:
    """The arrays of the group `clients` (`write_client_states`)."""
    ids = sorted(client_states)
    table = {"ids": np.asarray(ids, dtype=np.int64)}
    for name in sorted({name for cid in ids for name in client_states[cid]}):
        holders = [cid for cid in ids if name in client_states[cid]]
        rows = [client_states[cid][name].detach().cpu().numpy() for cid in holders]
        table[f"values/{name}"] = np.stack(rows)
        table[f"holders/{name}"] = np.asarray(holders, dtype=np.int64)
    return table


def read_client_states(group: zarr.Group, device: torch.device | str = "cpu") -> dict[int, Tensors]:
    import torch

    from fedhet.engine import tensors

    table = group["clients"]
    if "ids" not in table:  # written before the stacked table: one group per client
        return {int(c): tensors.load(table, c, device) for c in table.group_keys()}
    states: dict[int, Tensors] = {int(cid): {} for cid in table["ids"][:]}
    if "values" not in table:
        return states
    for name, values in sorted(table["values"].arrays()):
        stacked = torch.from_numpy(np.asarray(values[...]))
        for row, cid in enumerate(table["holders"][name][:].tolist()):
            states[cid][name] = stacked[row].clone().to(device)
    return {cid: dict(sorted(state.items())) for cid, state in states.items()}


# --- run states and checkpoints -----------------------------------------------------------


def write_run_state(group: zarr.Group, state: RunState, client_deltas: list[str]) -> None:
    """`state` less its clients' states, which the deltas `client_deltas` hold."""
    from fedhet.engine import tensors

    group.update_attributes(
        {
            "round": state.round,
            "best_accuracy": state.best_accuracy,
            "client_deltas": client_deltas,
            "environments": state.environments,
        }
    )
    parts = {
        "metrics": metric_arrays(state.metrics),
        "global": tensors.arrays(state.global_state),
        "server": tensors.arrays(state.server_state),
    }
    if state.best_state is not None:
        parts["best"] = tensors.arrays(state.best_state)
    create_groups(group, parts)


def read_run_state(
    group: zarr.Group, client_states: dict[int, Tensors], device: torch.device | str
) -> RunState:
    from fedhet.engine import tensors

    return RunState(
        round=int(group.attrs["round"]),
        global_state=tensors.load(group, "global", device),
        server_state=tensors.load(group, "server", device),
        client_states=client_states,
        metrics=read_metrics(group),
        best_state=tensors.load(group, "best", device) if "best" in group else None,
        best_accuracy=float(group.attrs["best_accuracy"]),
        environments=list(group.attrs.get("environments", [])),
    )


def write_continuation(group: zarr.Group, state: RunState) -> None:
    """`state`, clients' states included, as the group `CONTINUATION` of `group`."""
    continuation = group.create_group(CONTINUATION)
    write_run_state(continuation, state, client_deltas=[])
    write_client_states(continuation, state.client_states)


def read_continuation(group: zarr.Group, device: torch.device | str) -> RunState:
    continuation = group[CONTINUATION]
    return read_run_state(continuation, read_client_states(continuation, device), device)


def _remove(folders: list[Path]) -> None:
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


@dataclass
class _Saved:
    """What the newest checkpoint holds of the clients: its delta chain, the rows in it, and
    the state objects it saved (a client whose state object is another has been touched)."""

    deltas: list[str] = field(default_factory=list)
    rows: int = 0
    states: dict[int, Tensors] = field(default_factory=dict)


class Checkpoints:
    """Run states saved in the stage's partial area; the newest complete one wins."""

    def __init__(
        self,
        folder: Path,
        device: torch.device | str = "cpu",
        announce: Callable[[str], None] = lambda line: None,
    ):
        self.folder, self.device, self.announce = folder, device, announce
        self._saved = _Saved()
        self._removal: threading.Thread | None = None  # deleting the entries the last save left

    def path(self, round: int) -> Path:
        return self.folder / f"ckpt-{round:06d}.zarr"

    def save(self, state: RunState) -> None:
        final = self.path(state.round)
        with interrupts.deferred():  # a checkpoint is written whole, or not at all
            self.folder.mkdir(parents=True, exist_ok=True)
            saved = self._next_deltas(state)
            self._publish(final, lambda group: write_run_state(group, state, saved.deltas))
            self._saved = saved
            self._remove_all_but(final)

    def _next_deltas(self, state: RunState) -> _Saved:
        """Write the delta of the clients touched since the last save; the chain to record."""
        states, before = state.client_states, self._saved
        touched = {c: s for c, s in states.items() if before.states.get(c) is not s}
        chain, rows = before.deltas, before.rows + len(touched)
        lost = not all((self.folder / name).is_dir() for name in chain)  # another writer's save
        if lost or not before.states.keys() <= states.keys() or rows > 2 * len(states):
            touched, chain, rows = states, [], len(states)  # a new chain from a full table
        if touched:
            name = f"clients-{state.round:06d}-{uuid.uuid4().hex[:8]}.zarr"
            self._publish(self.folder / name, lambda group: write_client_states(group, touched))
            chain = [*chain, name]
        return _Saved(chain, rows, dict(states))

    def _publish(self, final: Path, write: Callable[[zarr.Group], None]) -> None:
        tmp = self.folder / f".tmp-{final.name}"
        try:
            group = zarr.open_group(tmp, mode="w")
            write(group)
            seal(group)
            tmp.rename(final)
        finally:  # a write that failed (a full disk) leaves no half-written checkpoint
            shutil.rmtree(tmp, ignore_errors=True)

    def _remove_all_but(self, final: Path) -> None:
        """Older checkpoints, the deltas the newest does not list, and leftovers of a crash:
        renamed out of the way at once, then deleted on a thread while the run goes on (removing
        a folder can wait milliseconds on the disk: 1-4 ms on ext4 mounted with `discard`, so
        that a small checkpoint's few dozen folders took longer to delete than to write). The
        previous save's deletions are waited for first: one save's leftovers at most are on disk."""
        self.wait_for_removals()
        keep = {final.name, *self._saved.deltas}
        for entry in list(self.folder.iterdir()):
            if entry.name not in keep and entry.name.startswith(("ckpt-", "clients-", ".tmp-")):
                # never read again, nor sent to an object store's checkpoint area (names
                # starting with "." are not: fedhet.core.object_partial)
                with contextlib.suppress(FileNotFoundError):  # gone already: another writer's
                    entry.rename(self.folder / f"{TRASH}{uuid.uuid4().hex[:8]}-{entry.name}")
        trash = sorted(entry for entry in self.folder.iterdir() if entry.name.startswith(TRASH))
        self._removal = threading.Thread(
            target=_remove, args=(trash,), name="fedhet-checkpoint-removal"
        )
        self._removal.start()  # not a daemon: the interpreter waits for it before it exits

    def wait_for_removals(self) -> None:
        """Return once the entries the saves so far replaced are deleted."""
        if self._removal is not None:
            self._removal.join()

    def keep(self, state: RunState) -> None:
        """Save `state` unless it is already saved."""
        if not self.path(state.round).exists():
            self.save(state)

    def _newest(self) -> Path | None:
        found = sorted(self.folder.glob("ckpt-*.zarr"))
        return found[-1] if found else None

    def latest(self) -> RunState | None:
        """The newest checkpoint that reads whole. A damaged one (of it or of a delta it lists:
        a chunk fails its checksum, an array's metadata or an attribute is missing or changed)
        is removed and skipped for the one before it, if any, and said in one line to
        `announce`."""
        found, state = sorted(self.folder.glob("ckpt-*.zarr")), None
        damaged, whys = [], []
        while found and state is None:
            path = found.pop()
            try:
                state = self._read(path)
            except Exception as error:
                damage = damage_in(error)
                if damage is None:
                    raise
                damaged.append(f"{path.name} ({damage.folder.name}/{damage.member})")
                if damage.why not in whys:
                    whys.append(damage.why)
                shutil.rmtree(path, ignore_errors=True)
        if damaged:  # the run says once where it starts from, now that it is known
            self.announce(
                f"skipped the damaged checkpoint{'s' if len(damaged) > 1 else ''} "
                f"{', '.join(damaged)}: {', '.join(whys)}"
            )
        return state

    def _read(self, path: Path) -> RunState:
        group = open_sealed(path)
        if "client_deltas" in group.attrs:
            deltas = [open_sealed(self.folder / name) for name in group.attrs["client_deltas"]]
            client_states = {}
            for delta in deltas:
                client_states.update(read_client_states(delta, self.device))
            rows = sum(delta["clients/ids"].shape[0] for delta in deltas)
            saved = _Saved(list(group.attrs["client_deltas"]), rows, dict(client_states))
        else:  # written before the deltas: the checkpoint holds its clients; the next save all
            client_states = read_client_states(group, self.device)
            saved = _Saved()
        state = read_run_state(group, client_states, self.device)
        self._saved = saved
        return state

    def latest_round(self) -> int | None:
        """Rounds completed by the newest checkpoint (None without one), without loading it."""
        newest = self._newest()
        return None if newest is None else int(open_sealed(newest).attrs["round"])
