"""Figures for a paper: curves that stay visible when they overlap, a band for the spread over
seeds, one y axis per metric, one legend outside the panels, stage boundaries, every format;
accuracy in %, integer rounds, every mark explained, a diverged run that does not flatten the
others, heatmaps with every client labelled and one panel per distinct partition."""

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.collections import PolyCollection
from matplotlib.colors import to_rgb
from matplotlib.image import AxesImage
from matplotlib.ticker import PercentFormatter
from PIL import Image

from fedhet.core.errors import InputError
from fedhet.core.spec import parse_spec
from fedhet.data.partition_stage import spec_partition
from fedhet.figures import (
    Curve,
    curves_figure,
    figure_format,
    heatmaps_figure,
    metric_curves,
    partition_heatmaps,
)


@pytest.fixture(autouse=True)
def _close_figures():
    """Each test's figures closed after it (pyplot keeps them open, and warns past 20)."""
    yield
    plt.close("all")


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


def test_accuracy_is_drawn_in_percent_on_integer_rounds():
    panels = {
        "test accuracy": {"s": {"a": _curve([0.1, 0.4, 0.5])}},
        "divergence": {"s": {"a": _curve([3.0, 4.0, 5.0])}},
    }
    fig = curves_figure(panels, percent=("test accuracy",))
    accuracy, divergence = fig.axes
    fig.canvas.draw()
    formatter = accuracy.yaxis.get_major_formatter()
    assert isinstance(formatter, PercentFormatter)
    assert formatter(0.5).endswith("%") and float(formatter(0.5)[:-1]) == 50  # a fraction, in %
    assert not isinstance(divergence.yaxis.get_major_formatter(), PercentFormatter)
    for ax in fig.axes:  # 3 rounds: matplotlib's default would tick 1.25, 1.5, ...
        ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        assert ticks and all(float(t).is_integer() for t in ticks), ticks
        assert min(ticks) >= 1, ticks  # rounds count from 1: no round 0 on the axis


def test_the_round_labels_of_a_long_run_in_one_column_never_overlap():
    """240 rounds, many algorithms in the legend (a narrow panel): FedBR Table 1's figure ran
    120, 150, ..., 240 together."""
    name = "FedBR (tau=0.5/0.5, index pairs, mixup, momentum=0.9) {}"
    curves = {name.format(i): _curve(np.linspace(0.1, 0.9, 240)) for i in range(11)}
    fig = curves_figure({"acc": {"s": curves}, "divergence": {"s": curves}})
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        shown = [
            label for label in ax.get_xticklabels() if label.get_visible() and label.get_text()
        ]
        boxes = sorted((label.get_window_extent(renderer) for label in shown), key=lambda b: b.x0)
        gaps = [right.x0 - left.x1 for left, right in zip(boxes, boxes[1:], strict=False)]
        assert all(gap > 0 for gap in gaps), [label.get_text() for label in shown]


def test_a_long_run_has_no_round_zero_tick():
    fig = curves_figure({"acc": {"s": {"a": _curve(np.linspace(0.1, 0.9, 30))}}})
    fig.canvas.draw()
    (ax,) = fig.axes
    low, high = ax.get_xlim()
    ticks = [t for t in ax.get_xticks() if low <= t <= high]
    assert 0.5 <= low < 1 and high >= 30
    assert all(float(t).is_integer() and t >= 1 for t in ticks) and len(ticks) >= 4, ticks


def test_every_kind_of_mark_has_a_legend_entry_and_the_metric_a_caption():
    diverging = [1.0, 2.0, 3.0, 4.0, 1e29]
    panels = {
        "acc": {"s": {"fedavg": _curve([0.1] * 5, std=0.1, seeds=3), "tct": _curve([0.2] * 5)}},
        "div": {"s": {"fedavg": _curve([1.0] * 5, std=0.1, seeds=3), "tct": _curve(diverging)}},
    }
    caption = "div: the mean over clients of a distance"
    fig = curves_figure(panels, boundaries={"tct": [2]}, captions=(caption,))
    (legend,) = fig.legends
    texts = [t.get_text() for t in legend.get_texts()]
    assert texts[:2] == ["fedavg", "tct"]
    kinds = {
        "band": any(isinstance(c, PolyCollection) for ax in fig.axes for c in ax.collections),
        "stage": any(line.get_linestyle() == ":" for ax in fig.axes for line in ax.lines),
        "clipped": any(line.get_marker() == "^" for ax in fig.axes for line in ax.lines),
    }
    assert all(kinds.values())  # each kind is drawn, and each is named in the legend:
    assert [text.split(":")[0] for text in texts[2:]] == ["shaded", "dotted", "above the axis"]
    assert fig.get_supxlabel() == caption


def test_marks_not_drawn_are_not_in_the_legend():
    fig = curves_figure({"acc": {"s": {"a": _curve([0.1, 0.2])}}})
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["a"]


def test_one_diverged_value_is_drawn_at_the_top_without_flattening_the_rest():
    diverging = np.r_[np.linspace(0.3, 0.5, 9), 1e29]
    panels = {
        "div": {
            "s": {"fedavg": _curve(np.linspace(0.3, 0.6, 10)), "fedbr": _curve(diverging)},
            "t": {"fedavg": _curve(np.linspace(0.2, 0.4, 10))},
        }
    }
    fig = curves_figure(panels)
    low, high = fig.axes[0].get_ylim()
    assert fig.axes[1].get_ylim() == (low, high)  # one y axis per row
    assert 0.6 < high < 0.7 and 0.1 < low < 0.2  # the finite values' range and a margin
    (marker,) = [line for line in fig.axes[0].lines if line.get_marker() == "^"]
    assert list(marker.get_xdata()) == [10] and list(marker.get_ydata()) == [high]
    assert marker.get_color() == "C1" and not marker.get_clip_on()


def test_a_one_round_spike_over_seeds_moves_neither_end_of_the_axis():
    # tct_fmnist's scaffold: one seed at 1e29 in round 10, so its mean and ± std band there
    spike = Curve(
        np.r_[np.full(9, 0.5), 0.7e29, np.full(10, 0.5)],
        np.r_[np.full(9, 0.1), 1e29, np.full(10, 0.1)],
        3,
    )
    fig = curves_figure(
        {"div": {"s": {"fedavg": _curve(np.linspace(0.2, 0.9, 20)), "scaffold": spike}}}
    )
    low, high = fig.axes[0].get_ylim()
    assert 0.0 < low < 0.2 and 0.9 < high < 1.0
    (marker,) = [line for line in fig.axes[0].lines if line.get_marker() == "^"]
    assert list(marker.get_xdata()) == [10]


def test_a_diverged_runs_blow_up_leaves_the_other_curves_readable():
    """tct_fmnist's weight divergence: means near 0.5, and SCAFFOLD's diverged runs climbing to
    32 before they diverged, which drew every mean flat along the axis' floor."""
    blow_up = Curve(
        np.full(10, np.nan), np.full(10, np.nan), 0, (np.r_[np.linspace(0.5, 4, 8), 32.0],)
    )
    panels = {"div": {"s": {"fedavg": _curve(np.linspace(0.4, 0.6, 10), std=0.05, seeds=3)}}}
    panels["div"]["s"]["scaffold"] = blow_up
    fig = curves_figure(panels)
    low, high = fig.axes[0].get_ylim()
    assert 0.3 < low < 0.35 and 0.65 < high < 0.7  # the steady runs' range, and a margin
    (above,) = [line for line in fig.axes[0].lines if line.get_marker() == "^"]
    assert list(above.get_xdata()) == [2, 3, 4, 5, 6, 7, 8]  # the thin line's rounds off scale
    (cross,) = [ln for ln in fig.axes[0].lines if ln.get_marker() == "x" and not ln.get_clip_on()]
    assert list(cross.get_xdata()) == [9] and list(cross.get_ydata()) == [high]
    texts = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "above the axis: drawn at its top" in texts


def test_a_diverged_runs_fall_below_the_others_stays_on_the_axis():
    """Values below the axis would have no mark: a run that diverged downwards is drawn whole."""
    falling = Curve(np.full(5, np.nan), np.full(5, np.nan), 0, (np.linspace(5.0, 1.0, 5),))
    steady = _curve(np.linspace(5.0, 5.5, 5))
    low, _ = curves_figure({"div": {"s": {"a": steady, "b": falling}}}).axes[0].get_ylim()
    assert low <= 1.0


def test_an_axis_without_an_outlier_fits_every_value():
    panels = {"div": {"s": {"a": _curve([1.0, 50.0]), "b": _curve([2.0, 3.0])}}}
    fig = curves_figure(panels)
    low, high = fig.axes[0].get_ylim()
    assert low <= 1.0 and high >= 50.0
    assert not [line for line in fig.axes[0].lines if line.get_marker() == "^"]


def test_a_heatmap_labels_every_client_and_class():
    fig = heatmaps_figure({"p": np.arange(12 * 10).reshape(12, 10)})
    (ax, _colorbar) = fig.axes
    fig.canvas.draw()
    assert _shown_ticks(ax.yaxis, ax.get_ylim()) == list(range(12))
    assert _shown_ticks(ax.xaxis, ax.get_xlim()) == list(range(10))
    shown = [t.get_text() for t in ax.get_yticklabels() if 0 <= t.get_position()[1] <= 11]
    assert shown == [str(client) for client in range(12)]


def test_a_heatmap_of_thousands_of_clients_labels_a_readable_integer_subset():
    fig = heatmaps_figure({"p": np.ones((3000, 10))})
    ax = fig.axes[0]
    fig.canvas.draw()
    ticks = _shown_ticks(ax.yaxis, ax.get_ylim())
    assert 10 <= len(ticks) <= 30 and all(0 <= t < 3000 for t in ticks)


def _shown_ticks(axis, limits) -> list[float]:
    low, high = sorted(limits)
    ticks = [t for t in axis.get_majorticklocs() if low <= t <= high]
    assert all(float(t).is_integer() for t in ticks), ticks  # never the cells' edges (-0.5)
    return [int(t) for t in ticks]


def test_identical_partitions_share_one_panel_titled_by_all():
    skew = np.eye(4) * 10
    fig = heatmaps_figure(
        {"d natural, 4 clients, seed 0": skew, "d natural, 4 clients, seed 1": skew.copy()}
        | {"d iid, 4 clients, seed 0": np.ones((4, 4))}
    )
    images = [ax for ax in fig.axes if any(isinstance(a, AxesImage) for a in ax.get_children())]
    assert [ax.get_title() for ax in images] == [
        "d natural, 4 clients, seed 0, 1",
        "d iid, 4 clients, seed 0",
    ]


@pytest.mark.parametrize(
    ("partitions", "rows"), [(3, [3]), (4, [2, 2]), (5, [3, 2]), (7, [3, 3, 1])]
)
def test_many_partitions_wrap_into_rows_of_at_most_three_panels(partitions, rows):
    fig = heatmaps_figure({f"p{i}": np.eye(4) * (i + 1) for i in range(partitions)})
    fig.canvas.draw()
    images = [ax for ax in fig.axes if any(isinstance(a, AxesImage) for a in ax.get_children())]
    assert [ax.get_title() for ax in images] == [f"p{i}" for i in range(partitions)]
    tops = [round(ax.get_position().y1, 3) for ax in images]
    assert [tops.count(top) for top in sorted(set(tops), reverse=True)] == rows
    assert len(fig.axes) == 2 * partitions  # a colorbar each, no empty panel left


def test_a_natural_partition_under_two_seeds_is_one_panel(tmp_path):
    rng = np.random.default_rng(0)
    sites = rng.integers(0, 3, 120)
    np.savez(
        tmp_path / "own.npz",
        x=rng.random((120, 4, 4), dtype=np.float32),
        y=rng.integers(0, 3, 120),
        client=sites,
    )
    data = {"dataset": "arrays", "path": str(tmp_path / "own.npz"), "test_fraction": 0.25}
    specs = [
        parse_spec({"seed": seed, "data": data, "partition": {"scheme": "natural"}})
        for seed in (0, 1)
    ]
    histograms = {f"natural, seed {s.seed}": spec_partition(s).histogram for s in specs}
    fig = heatmaps_figure(histograms)
    assert sum(any(isinstance(a, AxesImage) for a in ax.get_children()) for ax in fig.axes) == 1


def test_a_report_figure_is_written_in_every_format_at_once(tmp_path):
    panels = {"acc": {"s": {"a": _curve([0.1, 0.2])}}}
    written = metric_curves(panels, tmp_path / "c.png", formats=("png", "svg", "pdf"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.pdf", "c.png", "c.svg"]
    assert [p.suffix for p in written] == [".png", ".svg", ".pdf"]


def test_one_setting_keeps_legend_title_and_caption_apart_and_inside_the_figure():
    """A report of one setting (one panel column): a long method label and a caption longer than
    the figure is wide once drew the legend over the title and cut the caption at both edges."""
    label = "FedBR (tau=0.5/0.5, index pairs, momentum=0.9)"
    panels = {
        "test accuracy": {"alpha=0.1": {"FedAvg": _curve([0.1, 0.2]), label: _curve([0.2, 0.3])}},
        "weight divergence": {"alpha=0.1": {"FedAvg": _curve([1.0, 2.0]), label: _curve([1, 2])}},
    }
    caption = (
        "Weight divergence: the mean over a round's clients of the L2 distance between the "
        "client's model and the new global model."
    )
    fig = curves_figure(panels, title="fedbr_fmnist_skew_momentum", captions=(caption,))
    renderer = fig.canvas.get_renderer()
    fig.draw(renderer)
    (legend,) = fig.legends
    boxes = {
        "legend": legend.get_window_extent(renderer),
        "title": fig._suptitle.get_window_extent(renderer),
        "caption": fig._supxlabel.get_window_extent(renderer),
        **{f"panel {i}": ax.get_window_extent(renderer) for i, ax in enumerate(fig.axes)},
    }
    whole = fig.bbox
    for name, box in boxes.items():
        assert whole.x0 <= box.x0 and box.x1 <= whole.x1, name  # nothing cut at an edge
        assert whole.y0 <= box.y0 and box.y1 <= whole.y1, name
    names = list(boxes)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            assert not boxes[a].overlaps(boxes[b]), (a, b)
    assert fig.get_supxlabel().replace("\n", " ") == caption  # folded between words, all of it


def test_a_metric_that_is_never_negative_starts_its_axis_at_zero():
    # fedimpro_fmnist_weight's weight divergence: means near 0.3, a band of ± 2 below 0
    panels = {"div": {"s": {"a": _curve(np.full(10, 0.3), std=2.0, seeds=3)}}}
    assert curves_figure(panels).axes[0].get_ylim()[0] == 0.0
    signed = {"gain": {"s": {"a": _curve(np.linspace(-1.0, 1.0, 10), std=0.5, seeds=3)}}}
    assert curves_figure(signed).axes[0].get_ylim()[0] < -1.0


def test_long_setting_titles_fold_instead_of_running_into_each_other():
    # fednova_fmnist's two settings, side by side
    settings = [
        "system.local_epochs={low: 2, high: 5}",
        "system.local_epochs={low: 2, high: 5}, system.dropout=0.2",
    ]
    methods = ["FedAvg", "FedProx", "SCAFFOLD", "FedNova"]
    row = {m: _curve([0.1, 0.2], std=0.01, seeds=5) for m in methods}  # a band: its legend entry
    fig = curves_figure({"test accuracy": dict.fromkeys(settings, row)}, title="fednova_fmnist")
    renderer = fig.canvas.get_renderer()
    fig.draw(renderer)
    left, right = (ax.title.get_window_extent(renderer) for ax in fig.axes[:2])
    assert not left.overlaps(right)
    assert [ax.get_title().replace("\n", " ") for ax in fig.axes[:2]] == settings


def _row(algorithm, accuracy, divergence, diverged=None, undefined=frozenset()):
    """A report row (fedhet.reports.collection) with what the figure reads."""
    metrics = {
        "test_accuracy": np.asarray(accuracy, float),
        "divergence": np.asarray(divergence, float),
    }
    return {
        "algorithm": algorithm,
        "setting": "s",
        "group": algorithm,
        "metrics": metrics,
        "diverged": diverged,
        "undefined": undefined,
    }


def test_a_method_drawn_without_a_divergence_curve_is_named_in_the_caption():
    from fedhet.reports.report import curve_panels

    nan = [np.nan] * 3
    rows = [
        _row("FedAvg", [0.1, 0.2, 0.3], [1.0, 1.0, 1.0]),
        _row("Centralized", [0.5] * 3, nan, undefined=frozenset({"divergence"})),
        _row("Centralized", [0.5] * 3, nan, undefined=frozenset({"divergence"})),
        _row("Local", [0.2] * 3, nan, undefined=frozenset({"divergence"})),
        _row("TCT", [np.nan, 0.4, 0.6], nan),  # TCT's stage 2 records none
    ]
    panels, captions = curve_panels(rows)
    assert list(panels) == ["test accuracy", "weight divergence"]
    assert captions[2].startswith("No weight divergence for Centralized, Local: no client models")
    assert captions[3] == "No weight divergence for TCT: its runs record none."
    assert len(captions) == 4 and curve_panels(rows[:1])[1][2:] == []


def test_a_metric_no_run_records_has_no_row_and_no_caption():
    from fedhet.reports.report import LINES_CAPTION, curve_panels

    rows = [_row("TCT", [np.nan, 0.4, 0.6], [np.nan] * 3) for _ in range(2)]
    panels, captions = curve_panels(rows)
    assert list(panels) == ["test accuracy"] and captions == [LINES_CAPTION]
    fig = curves_figure(panels, captions=captions)
    assert [ax.get_ylabel() for ax in fig.axes] == ["test accuracy"]


def test_a_diverged_run_is_drawn_apart_and_left_out_of_the_mean():
    """tct_fmnist_paper's #C=1: one seed of three falls to chance and diverges at round 3; the
    mean of all seeds would jump up when its curve ends."""
    from fedhet.reports.report import LINES_CAPTION_DIVERGED, curve_panels, seed_curves

    rows = [
        _row("TCT", [0.5, 0.6, 0.7, 0.8], [1.0] * 4),
        _row("TCT", [0.6, 0.7, 0.8, 0.9], [1.0] * 4),
        _row("TCT", [0.5, 0.2, 0.1], [1.0, 5.0, 1e29], diverged=3),
    ]
    (curve,) = seed_curves(rows, "test_accuracy")["s"].values()
    np.testing.assert_allclose(curve.mean, [0.55, 0.65, 0.75, 0.85])
    np.testing.assert_allclose(curve.std, [0.05] * 4)
    assert curve.seeds == 2 and len(curve.diverged) == 1
    np.testing.assert_allclose(curve.diverged[0], [0.5, 0.2, 0.1])
    panels, captions = curve_panels(rows)
    assert captions[0] == LINES_CAPTION_DIVERGED
    fig = curves_figure(panels, captions=captions)
    thin = [line for line in fig.axes[0].lines if line.get_linewidth() < 1]
    (line,) = thin
    assert list(line.get_ydata()) == [0.5, 0.2, 0.1] and line.get_marker() == "x"
    assert list(line.get_markevery()) == [2]  # the cross at its last value
    texts = [t.get_text() for t in fig.legends[0].get_texts()]
    assert texts[0] == "TCT" and any(
        t.startswith("thin, ending in x: a run that diverged") for t in texts
    )
    # its 1e29 divergence ends it above an axis that fits the other runs: its cross at the top
    low, high = fig.axes[1].get_ylim()
    (cross,) = [ln for ln in fig.axes[1].lines if ln.get_marker() == "x" and not ln.get_clip_on()]
    assert high < 10 and list(cross.get_xdata()) == [3] and list(cross.get_ydata()) == [high]
    # and its 5.0 before, five times the others' 1.0, is marked above the axis
    (above,) = [ln for ln in fig.axes[1].lines if ln.get_marker() == "^"]
    assert list(above.get_xdata()) == [2]


def test_an_algorithm_is_named_in_its_mean_style_where_any_panel_draws_its_mean():
    """SCAFFOLD diverges on every seed of the first setting only: its legend entry is its
    mean's line (dashed, marked), not a diverged run's thin one."""
    from fedhet.reports.report import curve_panels

    rows = [_row("FedAvg", [0.5, 0.6], [1.0, 1.0])]
    rows += [_row("SCAFFOLD", [0.3, 0.2], [1.0, 2.0], diverged=2) for _ in range(2)]
    rows += [{**_row(a, [0.5, 0.7], [1.0, 1.0]), "setting": "t"} for a in ("FedAvg", "SCAFFOLD")]
    fig = curves_figure(curve_panels(rows)[0])
    entries = dict(zip(*fig.axes[0].get_legend_handles_labels(), strict=False))
    legend = fig.legends[0]
    (scaffold,) = [h for h, t in zip(legend.legend_handles, legend.get_texts(), strict=True)
                   if t.get_text() == "SCAFFOLD"]  # fmt: skip
    assert scaffold.get_linewidth() > 1 and scaffold.get_marker() != "x"
    assert "SCAFFOLD" not in entries  # the first panel names it by no diverged line


def test_runs_that_diverged_before_any_value_leave_a_caption_and_a_figure():
    from fedhet.reports.report import curve_panels

    empty = np.array([])
    rows = [_row("SCAFFOLD", empty, empty, diverged=1) for _ in range(2)]
    panels, captions = curve_panels(rows)
    assert list(panels) == ["test accuracy"]  # the first row stays: a figure, if an empty one
    assert captions[-1] == "No curve for SCAFFOLD: every run diverged before its first value."
    curves_figure(panels, captions=captions)  # draws without error
    rows.append(_row("FedAvg", [0.5, 0.6], [1.0, 1.0]))
    panels, captions = curve_panels(rows)
    assert list(panels) == ["test accuracy", "weight divergence"]
    assert not [c for c in captions if c.startswith("No weight divergence")]  # not "records none"


def test_a_cell_whose_every_run_diverged_still_names_its_algorithm():
    from fedhet.reports.report import curve_panels

    rows = [_row("FedAvg", [0.5, 0.6], [1.0, 1.0])]
    rows += [_row("SCAFFOLD", [0.3, 0.2], [1.0, 2.0], diverged=2) for _ in range(2)]
    panels, captions = curve_panels(rows)
    fig = curves_figure(panels, captions=captions)
    texts = [t.get_text() for t in fig.legends[0].get_texts()]
    assert texts[:2] == ["FedAvg", "SCAFFOLD"]
    assert len([ln for ln in fig.axes[0].lines if ln.get_linewidth() < 1]) == 2
