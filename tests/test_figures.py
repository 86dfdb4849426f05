"""Figures for a paper: curves that stay visible when they overlap, a band for the spread over
seeds, one y axis per metric, one legend outside the panels, stage boundaries, every format."""

from pathlib import Path

import numpy as np
import pytest
from matplotlib.colors import to_rgb
from PIL import Image

from fedhet.core.errors import InputError
from fedhet.figures import Curve, curves_figure, figure_format, metric_curves, partition_heatmaps


def _curve(values, std=0.0, seeds=1) -> Curve:
    mean = np.asarray(values, dtype=float)
    return Curve(mean, np.full_like(mean, std), seeds)


def _colour_pixels(path, colour: str, tolerance: int = 12) -> int:
    with Image.open(path) as png:
        pixels = np.asarray(png.convert("RGB"), dtype=int)
    target = np.array([round(255 * c) for c in to_rgb(colour)])
    return int((np.abs(pixels - target).max(axis=-1) <= tolerance).sum())


def test_identical_curves_both_stay_visible(tmp_path):
    rounds = np.linspace(0.1, 0.9, 30)
    panels = {"test accuracy": {"alpha=0.1": {"fedavg": _curve(rounds), "fedprox": _curve(rounds)}}}
    (png,) = metric_curves(panels, tmp_path / "curves.png")
    # the second curve is drawn over the first; dashes and markers leave the first one visible
    assert _colour_pixels(png, "C0") > 200
    assert _colour_pixels(png, "C1") > 200


def test_spread_over_seeds_is_a_band_and_one_seed_has_none(tmp_path):
    values = np.full(20, 0.5)
    with_band = {"acc": {"s": {"a": _curve(values, std=0.2, seeds=3)}}}
    without = {"acc": {"s": {"a": _curve(values, std=0.2, seeds=1)}}}
    banded = metric_curves(with_band, tmp_path / "band.png")[0]
    plain = metric_curves(without, tmp_path / "plain.png")[0]
    # the band is C0 at 15% opacity over white
    light = "#" + "".join(f"{round(255 - 0.15 * (255 - 255 * c)):02x}" for c in to_rgb("C0"))
    band = _colour_pixels(banded, light, tolerance=6)
    assert band > 5000
    assert _colour_pixels(plain, light, tolerance=6) < band / 50  # anti-aliased edges only


def test_panels_share_one_y_axis_per_metric_and_one_legend_outside():
    panels = {
        "test accuracy": {
            "#C=2": {"fedavg": _curve([0.1, 0.2]), "scaffold": _curve([0.2, 0.3])},
            "alpha=0.1": {"fedavg": _curve([0.5, 0.9])},
        },
        "divergence": {
            "#C=2": {"fedavg": _curve([3.0, 4.0]), "scaffold": _curve([1.0, 2.0])},
            "alpha=0.1": {"fedavg": _curve([10.0, 20.0])},
        },
    }
    fig = curves_figure(panels)
    axes = np.array(fig.axes).reshape(2, 2)
    for row in axes:
        assert row[0].get_ylim() == row[1].get_ylim()
    assert axes[0][0].get_ylim() != axes[1][0].get_ylim()
    assert all(ax.get_legend() is None for ax in fig.axes)
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == ["fedavg", "scaffold"]


def test_stage_boundary_and_undefined_metric():
    panels = {
        "acc": {"s": {"tct": _curve([np.nan, 0.3, 0.5, 0.8]), "centralized": _curve([np.nan] * 4)}}
    }
    fig = curves_figure(panels, boundaries={"tct": [2]})
    (ax,) = fig.axes
    vertical = [line for line in ax.lines if list(line.get_xdata()) == [2.5, 2.5]]
    assert len(vertical) == 1
    drawn = [line.get_label() for line in ax.lines if not line.get_label().startswith("_")]
    assert drawn == ["tct"]  # centralized has no such metric: nothing drawn, no flat line


@pytest.mark.parametrize("fmt", ["png", "svg", "pdf"])
def test_every_format_is_written(tmp_path, fmt):
    panels = {"acc": {"s": {"a": _curve([0.1, 0.2])}}}
    (written,) = metric_curves(panels, tmp_path / "c.png", formats=[fmt])
    assert written.suffix == f".{fmt}" and written.stat().st_size > 1000


def test_one_file_for_several_partitions(tmp_path):
    target = tmp_path / "clients.png"
    hist = {"#C=2": np.eye(4) * 10, "alpha=0.1": np.ones((4, 4))}
    assert partition_heatmaps(hist, target) == [target]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clients.png"]


def test_unknown_figure_suffix_is_an_input_error():
    with pytest.raises(InputError, match="--plot x.jpg: name a .png, .svg or .pdf file"):
        figure_format(Path("x.jpg"), "--plot")
