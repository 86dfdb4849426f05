"""TensorBoard events of runs' per-round metrics, one event folder per run named after its label.

Two writers share this module: a stage computing a run's final artifact writes each round as it
trains (`runtime.tensorboard`), and `fedhet export --tensorboard` writes stored runs, so the
same run gives the same scalars either way. Step k is round k (from 1); the scalars are the
stored metrics plus `learning_rate`, each in the unit every table shows it in and named with it
(`fedhet.core.units`: accuracies in percent as `test_accuracy_pct`, the rest under their stored
names). A metric that is NaN in a round (test accuracy between evaluations, TCT's quality
metrics during stage 1) is left out of that step.

A writer that starts at round k first purges the folder's events from step k on (TensorBoard's
purge step), so a resumed run or a second export replaces the events it repeats.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from fedhet.core import units
from fedhet.core.errors import InputError
from fedhet.core.pipeline import RunContext

LEARNING_RATE = "learning_rate"
RUN = "run"  # the text holding the run's label


def check_folder(folder: str | Path, field: str) -> Path:
    """`folder` as a path, once it is known that events can be written there (creating nothing);
    InputError naming `field` otherwise."""
    path = Path(folder).expanduser()
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not (existing.is_dir() and os.access(existing, os.W_OK | os.X_OK)):
        what = "is not a folder" if not existing.is_dir() else "is not writable"
        raise InputError(
            f"{field}: cannot write TensorBoard events under {folder} ({existing} {what}); "
            "choose a writable folder"
        )
    return path


def run_folder(root: Path, label: str) -> Path:
    """The event folder of the run labelled `label`, named safely for a shell and a URL: each
    run of characters other than letters, digits and `.=+@-` becomes one `_`
    (`FedAvg (momentum=0.9), alpha=0.1, seed 0` -> `FedAvg_momentum=0.9_alpha=0.1_seed_0`).
    The label itself is written in the events as the text `run`."""
    return root / (re.sub(r"[^\w.=+@-]+", "_", label).strip("_") or "_")


class RoundWriter:
    """Writes one run's rounds, from round `first_round` (0-based) on, into its event folder."""

    def __init__(self, root: Path, label: str, first_round: int = 0):
        from torch.utils.tensorboard import SummaryWriter  # imports TensorBoard: only when used

        self.events = SummaryWriter(str(run_folder(root, label)), purge_step=first_round + 1)
        self.events.add_text(RUN, label, 0)  # step 0: never purged, the same on each resume

    def write(self, round_index: int, row: Mapping[str, float], learning_rate: float) -> None:
        for name, value in {**row, LEARNING_RATE: learning_rate}.items():
            if not math.isnan(value):
                tag, shown = units.shown_name(name), units.shown_value(name, value)
                self.events.add_scalar(tag, shown, round_index + 1)

    def write_rounds(
        self, metrics: Mapping[str, Sequence[float]], learning_rates: Sequence[float]
    ) -> None:
        """Every round of a finished run: its stored metrics and each round's learning rate."""
        rounds = len(next(iter(metrics.values()), []))  # fewer for a run that diverged
        for index, rate in enumerate(learning_rates[:rounds]):
            self.write(index, {name: values[index] for name, values in metrics.items()}, rate)

    def close(self) -> None:
        self.events.close()

    def __enter__(self) -> RoundWriter:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()


def live_writer(ctx: RunContext, first_round: int) -> RoundWriter | None:
    """The writer of the run whose final artifact a stage computes, when the spec asks for
    TensorBoard events; None otherwise (and for upstream stages, which are no run's own)."""
    folder = ctx.spec.runtime.tensorboard
    if folder is None or ctx.run_name is None:
        return None
    return RoundWriter(Path(folder).expanduser(), ctx.run_name, first_round)
