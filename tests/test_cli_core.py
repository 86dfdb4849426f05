"""The core CLI: `partition` (reuse, plot), `artifacts ls|show|gc`, `spec validate|show|schema`."""

from __future__ import annotations

import json
import re
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path

import matplotlib
import numpy as np
import pytest
import yaml
from conftest import TINY_SPEC, CliResult, CliRunner, cli_env, write_spec
from matplotlib.image import imread
from scipy import ndimage
from scipy.spatial import cKDTree

from fedhet.core.spec import expand, json_schema, load_spec, parse_spec
from fedhet.core.store import ArtifactStore

QUICKSTART = Path(__file__).resolve().parents[1] / "specs" / "quickstart.yaml"


@dataclass
class Partitioned:
    spec: Path
    store: Path
    plot: Path
    first: CliResult
    second: CliResult
    stamp_after_first: tuple[int, int]
    hashed: CliResult

    @property
    def artifact(self):
        (info,) = ArtifactStore(self.store).ls()
        return info


def stamp(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_ino, stat.st_mtime_ns


@pytest.fixture(scope="module")
def partitioned(fedhet: CliRunner, tmp_path_factory: pytest.TempPathFactory) -> Partitioned:
    """`fedhet partition` run twice on a tiny digits spec, the second time with --plot."""
    root = tmp_path_factory.mktemp("partition-cli")
    spec, store, plot = write_spec(root / "tiny.yaml", TINY_SPEC), root / "store", root / "hm.png"
    first = fedhet("partition", spec, store=store)
    (info,) = ArtifactStore(store).ls()
    stamp_after_first = stamp(info.path / "zarr.json")
    second = fedhet("partition", spec, "--plot", plot, store=store)
    return Partitioned(
        spec, store, plot, first, second, stamp_after_first, fedhet("spec", "hash", spec)
    )


# --- partition ----------------------------------------------------------------------------


def test_second_partition_run_reuses_the_artifact(partitioned: Partitioned):
    first, second = partitioned.first, partitioned.second
    assert first.rc == 0 and second.rc == 0, first.stderr + second.stderr
    assert "computing" in first.stderr and "reusing" not in first.stderr
    assert "reusing" in second.stderr and "computing" not in second.stderr
    assert stamp(partitioned.artifact.path / "zarr.json") == partitioned.stamp_after_first
    assert ArtifactStore(partitioned.store).verify("partition", partitioned.artifact.key) == []


def test_partition_artifact_has_the_key_spec_hash_prints(partitioned: Partitioned):
    assert partitioned.hashed.rc == 0
    keys = dict(re.findall(r"^(\w+) +([0-9a-f]{64})$", partitioned.hashed.stdout, flags=re.M))
    assert partitioned.artifact.key == keys["partition"]
    assert partitioned.artifact.attrs["spec_name"] == TINY_SPEC["name"]


def client_rows(table: str) -> list[tuple[int, int]]:
    """(client, size) from the summary table's rows."""
    rows = re.findall(r"^│\s*(\d+)\s*│\s*(\d+)\s*│", table, flags=re.M)
    return [(int(client), int(size)) for client, size in rows]


def test_partition_prints_one_summary_row_per_client(partitioned: Partitioned):
    histogram = ArtifactStore(partitioned.store).open("partition", partitioned.artifact.key)[
        "histogram"
    ][:]
    expected = [(k, int(n)) for k, n in enumerate(histogram.sum(axis=1))]
    assert histogram.shape == (TINY_SPEC["partition"]["clients"], 10)
    assert client_rows(partitioned.first.stdout) == expected
    assert client_rows(partitioned.second.stdout) == expected  # the reused artifact reads the same


def test_partition_plot_writes_a_png(partitioned: Partitioned):
    data = partitioned.plot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert width > 100 and height > 100
    assert f"wrote {partitioned.plot}" in partitioned.second.stdout.replace("\n", "")


def heatmap_levels(png: Path, rows: int, columns: int) -> np.ndarray:
    """The viridis level (0 to 1) at the centre of each cell of the heatmap in a PNG: the
    largest area drawn in viridis colours (the colour bar is a smaller one)."""
    lut = matplotlib.colormaps["viridis"](np.linspace(0, 1, 256))[:, :3]
    image = imread(png)[..., :3]
    distance, level = cKDTree(lut).query(image.reshape(-1, 3))
    in_colormap = (distance < 0.01).reshape(image.shape[:2])
    areas, count = ndimage.label(in_colormap)
    largest = 1 + np.argmax(ndimage.sum(in_colormap, areas, range(1, count + 1)))
    ys, xs = np.nonzero(areas == largest)
    centre_y = ys.min() + (np.arange(rows) + 0.5) * (ys.max() + 1 - ys.min()) / rows
    centre_x = xs.min() + (np.arange(columns) + 0.5) * (xs.max() + 1 - xs.min()) / columns
    levels = level.reshape(image.shape[:2]) / 255
    return levels[np.ix_(centre_y.astype(int), centre_x.astype(int))]


def test_partition_heatmap_shades_each_cell_by_its_sample_count(partitioned: Partitioned):
    histogram = ArtifactStore(partitioned.store).open("partition", partitioned.artifact.key)[
        "histogram"
    ][:]
    levels = heatmap_levels(partitioned.plot, *histogram.shape)
    expected = (histogram - histogram.min()) / (histogram.max() - histogram.min())
    assert expected.std() > 0.1  # a label skew: cells differ
    # viridis runs dark to bright: more samples, brighter cell, on a scale from min to max
    assert np.abs(levels - expected).max() < 0.01


# --- artifacts ----------------------------------------------------------------------------


def test_artifacts_ls_shows_stage_key_label_size_created(
    fedhet: CliRunner, partitioned: Partitioned
):
    env = cli_env(COLUMNS="120")  # wide enough that the label does not wrap
    env.pop("FEDHET_STORE", None)
    result = fedhet("artifacts", "ls", "--store", partitioned.store, env=env)
    assert result.rc == 0, result.stderr
    info = partitioned.artifact
    (row,) = [line for line in result.stdout.splitlines() if info.key[:10] in line]
    cells = [cell.strip() for cell in row.strip("│ ").split("│")]
    created = info.attrs["created"][:16].replace("T", " ")
    label = "digits alpha=0.5, 4 clients, seed 3"
    assert cells == ["partition", info.key[:10], label, cells[3], created]
    assert re.fullmatch(r"\d+\.\d\d", cells[3])


def test_artifacts_show_prints_arrays_with_shapes_and_dtypes(
    fedhet: CliRunner, partitioned: Partitioned
):
    info = partitioned.artifact
    result = fedhet("artifacts", "show", info.key[:8], store=partitioned.store)
    assert result.rc == 0, result.stderr
    assert f"partition/{info.key}" in result.stdout
    group = ArtifactStore(partitioned.store).open("partition", info.key)
    for name in ("indices", "offsets", "histogram"):
        array = group[name]
        pattern = rf"│ {name}\s*│ {re.escape(str(array.shape))}\s*│ .*│ {array.dtype}\s*│"
        assert re.search(pattern, result.stdout), name
    attrs = json.loads(result.stdout[result.stdout.index("{") : result.stdout.rindex("}") + 1])
    assert attrs["config"]["partition"]["alpha"] == TINY_SPEC["partition"]["alpha"]
    assert "checksums" not in attrs


def test_artifacts_show_unknown_prefix_is_an_input_error(
    fedhet: CliRunner, partitioned: Partitioned
):
    result = fedhet("artifacts", "show", "zzzz", store=partitioned.store)
    assert result.rc == 2 and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1
    assert "no artifact key starts with 'zzzz'" in result.stderr


def test_artifacts_gc_removes_dead_temporaries_and_keeps_artifacts(
    fedhet: CliRunner, partitioned: Partitioned, tmp_path: Path
):
    store = tmp_path / "store"
    shutil.copytree(partitioned.store, store)
    info = ArtifactStore(store).ls()[0]
    dead = info.path.with_name(f"{info.path.name}.tmp-999999-deadbeef")
    shutil.copytree(info.path, dead)
    (dead / "zarr.json").unlink()  # a half-written temporary of a killed writer
    result = fedhet("artifacts", "gc", store=store)
    assert result.rc == 0, result.stderr
    assert f"removed {dead}" in result.stdout.replace("\n", "")
    assert not dead.exists()
    assert ArtifactStore(store).verify("partition", info.key) == []
    assert fedhet("artifacts", "gc", store=store).stdout.strip() == "0 entries removed"


# --- spec ---------------------------------------------------------------------------------


def test_spec_validate_counts_the_runs(fedhet: CliRunner):
    result = fedhet("spec", "validate", QUICKSTART)
    assert result.rc == 0, result.stderr
    assert result.stdout.strip() == f"{QUICKSTART}: valid (10 runs)"


def test_spec_show_prints_the_filled_in_spec_as_yaml(fedhet: CliRunner):
    result = fedhet("spec", "show", QUICKSTART)
    assert result.rc == 0, result.stderr
    shown, _, split_points = result.stdout.partition("# model split points: ")
    shown_spec, spec = parse_spec(yaml.safe_load(shown)), load_spec(QUICKSTART)
    assert shown_spec.model_copy(update={"matrix": None}) == spec.model_copy(
        update={"matrix": None}
    )
    # matrix entries are shown filled in: the same runs
    assert [run for _, run in expand(shown_spec)] == [run for _, run in expand(spec)]
    assert yaml.safe_load(shown)["federation"]["momentum"] == 0.0  # a default, filled in
    assert split_points.strip()


def test_spec_schema_prints_the_json_schema(fedhet: CliRunner):
    result = fedhet("spec", "schema")
    assert result.rc == 0, result.stderr
    assert json.loads(result.stdout) == json.loads(json.dumps(json_schema()))
