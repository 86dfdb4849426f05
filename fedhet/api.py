"""fedhet from Python, for notebooks: a spec's runs, their per-round metrics, evaluations and
paired comparisons as pandas DataFrames; training, tuning and reports as the command line does
them.

    import fedhet

    experiment = fedhet.load("specs/quickstart.yaml", "federation.rounds=10", store="artifacts")
    experiment.train()               # what `fedhet train` does (jobs=2: two worker processes)
    experiment.runs()                # a row per run: labels, seed, key, state, best_test_pct,
                                     # test_at_best_val_pct (with a validation split), final_pct
    experiment.metrics()             # a row per run and round: the columns of `fedhet export`
    experiment.compare()             # paired differences against the first algorithm
    experiment.personalized()        # with eval.client_test: a row per run, each client's own
                                     # model on its own test split, and the global model
    experiment.report("report")      # what `fedhet report` writes
    experiment.keys()                # every stage's key, as `fedhet spec hash` prints them
    fedhet.artifacts("artifacts").verify()   # what `fedhet artifacts verify` finds, a row each

Accuracies are in percent, in columns named `..._pct`, as in every table of the command line;
differences of accuracies in percentage points (`unit` "points"), and so is `floor`
(fedhet.core.units). Nothing is trained unless asked (`train()`, or `train=True` where a reader
takes it). Failures are fedhet's own errors (fedhet.core.errors) with the command line's one-line
messages, naming the Python call and arguments instead of the command and options: reading a run
that is not stored raises InputError, reading a damaged artifact DamagedArtifactError.

Every command of the command line does its work through the same sessions: `fedhet spec`'s
through a `SpecSession` (fedhet.spec_session), the other commands of a spec through a
`Session` (fedhet.session, whose rows hold stored quantities: accuracies as fractions), `fedhet
artifacts`' through a `StoreSession` (fedhet.store_session), so the command line and this module
refuse the same inputs with the same messages. Light to import:
pandas and what computes are imported on first use.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from fedhet.core import units
from fedhet.core.errors import DivergedError
from fedhet.core.sealed import damage_named
from fedhet.core.store import GRACE_S
from fedhet.execution.caller import Recomputer, Voice
from fedhet.session import ModelChoice, Session, open_session
from fedhet.spec_session import SpecSession, checked, open_spec_session
from fedhet.store_session import ArtifactView, StoreSession, open_store

if TYPE_CHECKING:
    import pandas as pd


def load(
    spec: str | Path | Mapping[str, Any], *overrides: str, store: str | Path | None = None
) -> Experiment:
    """The experiment of a spec file (or a spec as a mapping) with `overrides` (PATH=VALUE, as on
    the command line) over the artifact store `store`, a folder or `s3://BUCKET/PREFIX` (default:
    FEDHET_STORE or ./artifacts); InputError, with `fedhet spec validate`'s message, for a spec
    the command line refuses."""
    voice, console = PythonVoice(_load_call(spec, overrides, store), store), Console(stderr=True)
    return open_session(spec, overrides, voice, console, store, kind=Experiment)


def _load_call(
    spec: str | Path | Mapping[str, Any], overrides: Sequence[str], store: str | Path | None
) -> str:
    """The `fedhet.load(...)` call, as a message names it: `{...}` for a mapping."""
    arguments = ["{...}" if isinstance(spec, Mapping) else repr(str(spec))]
    arguments += map(repr, overrides)
    if store is not None:
        arguments.append(f"store={str(store)!r}")
    return f"fedhet.load({', '.join(arguments)})"


@dataclass(frozen=True)
class PythonVoice(Voice):
    """Messages in Python: arguments by name, what to call next."""

    call: str  # the `fedhet.load(...)` call of the experiment
    store: str | Path | None  # its `store` argument

    def option(self, name: str) -> str:
        return name

    def setting(self, name: str, value: object) -> str:
        return f"{name}={value!r}"

    def flag(self, name: str) -> str:
        return f"{name}=True"

    def train_first(self, reader: str) -> str:
        return f"call `{self.call}.train()` first or pass {reader}(train=True)"

    def tune_first(self) -> str:
        return f"call `{self.call}.tune()` first"

    def train_tuned(self) -> str:
        return f"compute them with `{self.call}.report(tuned=True, train=True)`"

    def recompute(self, key: str, cascade: bool, command: Recomputer) -> str:
        store = "" if self.store is None else repr(str(self.store))
        rm = f"fedhet.artifacts({store}).rm({key!r}{', cascade=True' if cascade else ''})"
        return f"`{rm}`, then `{self.call}.{command}()` recomputes it"


def _frame(rows: list[dict]) -> pd.DataFrame:
    """Rows of stored quantities as a DataFrame of shown ones (accuracies in percent)."""
    import pandas as pd

    return pd.DataFrame(units.shown_row(row) for row in rows)


class Experiment(Session):
    """A spec's runs over a store (`fedhet.load`): the session every command works through,
    its tables as DataFrames of shown quantities (accuracies in percent)."""

    @damage_named()
    def train(self, jobs: int | None = None, retry_diverged: bool = False) -> pd.DataFrame:
        """Compute what every run is missing (in order here, or on `jobs` worker processes); the
        runs' result rows. A diverged or failed run is a row too; the first failure that is not
        a divergence is raised after the others have run. A recorded divergence is computed
        again with `retry_diverged`."""
        rows, failures = self.train_rows(jobs, retry_diverged=retry_diverged)
        errors = [f for f in failures if not isinstance(f, DivergedError)]
        if errors:
            raise errors[0]
        return _frame(rows)

    @damage_named()
    def runs(self, algorithm: str | None = None, state: str | None = None) -> pd.DataFrame:
        """A row per run as far as the store has it: labels, seed, key, state, best and final
        test accuracy in percent (`best_test_pct`, `final_pct`), rounds, wall time (what
        `fedhet runs` prints); only `algorithm`'s runs, or those in `state` (stored, damaged,
        diverged, partial, missing), where given. A damaged run (its checksums fail, as `plan`
        checks them) has no results; a line on stderr says how to recompute it."""
        return _frame(self.run_rows(algorithm, state))

    @damage_named()
    def metrics(self, train: bool = False, tensorboard: str | Path | None = None) -> pd.DataFrame:
        """A row per run and round with the columns of `fedhet export` (accuracies in percent:
        `test_accuracy_pct`); with `tensorboard`, also written under that folder as TensorBoard
        events, a folder per run (`fedhet export --tensorboard`)."""
        import pandas as pd

        events = None if tensorboard is None else Path(tensorboard)
        return pd.DataFrame(self.metric_rows(train, events))

    @damage_named()
    def evaluate(
        self, model: ModelChoice = "final", cgv: bool = False, train: bool = False
    ) -> pd.DataFrame:
        """What `fedhet eval` reports, a row per run: global accuracy (`accuracy_pct`), loss,
        per-class and per-client accuracies (lists) of the `final` or `best` model, with `cgv`
        its client gradient variance; a diverged run's row says in which round, with no
        scores."""
        return _frame(self.evaluations(model, cgv, train))

    @damage_named()
    def plan(self, tune: bool = False) -> pd.DataFrame:
        """What `fedhet plan` prints: every run's stages and their state (stored, diverged,
        blocked by a diverged stage, partial, missing) with the time still needed where known;
        with `tune`, the runs of the tune's trials. The
        one-line summary is in `.attrs["summary"]`."""
        rows, summary = self.plan_rows(tune)
        frame = _frame(rows)
        frame.attrs["summary"] = summary
        return frame

    @damage_named()
    def tune(self, jobs: int | None = None, trials: bool = False) -> pd.DataFrame:
        """Select each method's hyperparameters as the spec's `tune:` section says (what `fedhet
        tune` does): a row per method and setting with the chosen values and validation scores
        in percent, or with `trials` a row per trial."""
        from fedhet.reports.tuning import selection_rows, trial_rows

        outcome = self.tune_outcome(jobs)
        return _frame(trial_rows(outcome) if trials else selection_rows(outcome))

    @damage_named()
    def compare(
        self, baseline: str | None = None, train: bool = False, floor: float | None = None
    ) -> pd.DataFrame:
        """The report's paired differences: a row per metric, setting and algorithm against
        `baseline` (default the matrix's first algorithm), in the metric's `unit`: "points"
        (percentage points) for accuracies, "rounds" for rounds to a target. `floor` is the
        smallest difference in accuracy, in points as `fedhet report --floor`, a verdict calls
        a gain (default 0.5). `early_training` is True where the method's curve or the
        baseline's has not levelled off (the report's plateau test): the verdict there is early
        training's, which the report marks "(early training)" (never on "too few seeds")."""
        import pandas as pd

        return pd.DataFrame(self.paired_rows(baseline, train, floor))

    def show(self) -> dict[str, Any]:
        """The spec with every default filled in, less the fields that do not apply to the
        chosen model and partition: what `fedhet spec show` prints (the model's split points
        are `.spec.model.split_points()`)."""
        return self.filled()

    def keys(self) -> pd.DataFrame:
        """What `fedhet spec hash` prints: a row per run and stage, `run` (its place among the
        spec's runs, from 0), `label` (the run's), `stage` and `key`, each run's stages from the
        first upstream to the run's own."""
        import pandas as pd

        return pd.DataFrame(self.key_rows(), columns=["run", "label", "stage", "key"])

    @damage_named()
    def personalized(self, train: bool = False) -> pd.DataFrame:
        """With `eval.client_test`, a row per run: each client's own final model on its own test
        split over the clients (`client_test_weighted_mean_pct`, `client_test_mean_pct`,
        `client_test_worst_decile_pct`, `client_test_std_pct`) and the global model's test
        accuracy (`global_accuracy_pct`, None for a method without one), in percent; the
        report's personalized section (fedhet.reports.personalized)."""
        return _frame(self.personalized_rows(train))


def artifacts(store: str | Path | None = None) -> Artifacts:
    """The artifact store `store`, a folder or `s3://BUCKET/PREFIX` (default: FEDHET_STORE or
    ./artifacts), to list, show, verify, prune, copy and collect as `fedhet artifacts` does;
    InputError for an object store that cannot be reached."""
    call = f"fedhet.artifacts({'' if store is None else repr(str(store))})"
    return open_store(store, PythonVoice(call, store), kind=Artifacts)


class Artifacts(StoreSession):
    """An artifact store (`fedhet.artifacts`): the session `fedhet artifacts` works through,
    its tables as DataFrames. A key may be a prefix, or `stage/prefix`, naming one artifact."""

    @damage_named()
    def ls(
        self,
        stage: str | None = None,
        algorithm: str | None = None,
        spec: str | Path | Mapping[str, Any] | None = None,
    ) -> pd.DataFrame:
        """What `fedhet artifacts ls` lists, a row per artifact: `stage`, `key`, `label`,
        `algorithm`, `size` (bytes), `created`; only `stage`'s, `algorithm`'s or the stages of
        the runs of `spec` (a file or a mapping, checked as `fedhet.load` checks it)."""
        import pandas as pd

        runs = None if spec is None else open_spec_session(spec, (), self.wording, _stderr())
        columns = ["stage", "key", "label", "algorithm", "size", "created"]
        return pd.DataFrame(self.ls_rows(stage, algorithm, runs), columns=columns)

    @damage_named()
    def show(self, key: str) -> ArtifactView:
        """What `fedhet artifacts show` prints of one artifact: its attributes, the
        environment it was computed in and its arrays."""
        return self.view(key)

    def verify(self, key: str | None = None) -> pd.DataFrame:
        """What `fedhet artifacts verify` prints: every artifact's (or `key`'s) checksums
        recomputed, a row each, `stage`, `key`, `problems` (empty when intact), `status`."""
        return _table(self.verified(key), ["stage", "key", "problems", "status"])

    def rm(self, *keys: str, cascade: bool = False) -> pd.DataFrame:
        """Remove artifacts as `fedhet artifacts rm` does: one that a stored artifact was built
        on only with `cascade` (which removes those too); a row per artifact removed."""
        return _table(self.removed(keys, cascade), ["stage", "key", "label"])

    def push(self, destination: str | Path) -> pd.DataFrame:
        """Copy every artifact missing from the store `destination` into it, bit for bit
        (`fedhet artifacts push`); a row per artifact copied."""
        into = open_store(destination, self.wording)
        return _table(self.copied_to(into), ["stage", "key", "label"])

    def pull(self, source: str | Path) -> pd.DataFrame:
        """Copy every artifact of the store `source` missing from this one, bit for bit
        (`fedhet artifacts pull`); a row per artifact copied."""
        return _table(open_store(source, self.wording).copied_to(self), ["stage", "key", "label"])

    def gc(self, dry_run: bool = False, grace: float = GRACE_S) -> pd.DataFrame:
        """Remove what `fedhet artifacts gc` removes (with `dry_run`, nothing); a row per
        location, `path`."""
        return _table(({"path": p} for p in self.collected(dry_run, grace)), ["path"])


def schema() -> dict[str, Any]:
    """The JSON Schema of specs, what `fedhet spec schema` prints."""
    from fedhet.core.spec import json_schema

    return json_schema()


def _table(rows: Iterable[dict[str, Any]], columns: list[str]) -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame(list(rows), columns=columns)


def _stderr() -> Console:
    return Console(stderr=True)


__all__ = [
    "ArtifactView",
    "Artifacts",
    "Experiment",
    "PythonVoice",
    "Session",
    "SpecSession",
    "artifacts",
    "checked",
    "load",
    "open_session",
    "open_spec_session",
    "open_store",
    "schema",
]
