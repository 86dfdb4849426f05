"""Figures a person looks at: partition heatmaps, per-round metric curves, image grids.

Every figure is saved once per format asked for (PNG at `DPI`, SVG, PDF), next to each other.
Takes numpy arrays only, so every layer that draws (reports, a method's command) can use it.
"""

from __future__ import annotations

import io
import math
import os
import textwrap
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import MaxNLocator, MultipleLocator, PercentFormatter  # noqa: E402

from fedhet.core.errors import InputError  # noqa: E402
from fedhet.core.files import write_atomically  # noqa: E402

CAPTION_CHARS_PER_INCH = 14  # 8-point sans-serif text, with a margin
PANEL_TITLE_CHARS = 40  # a setting's title over a 4.5-inch panel at 12 points, with a margin

FORMATS = ("png", "svg", "pdf")
DPI = 200
# Overlapping curves stay visible: each algorithm has its own colour, dash and marker.
DASHES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
MARKS_PER_CURVE = 8
BAND_ALPHA = 0.15
# Up to this many clients (classes), a heatmap labels every one; beyond, about this many ticks.
LABELLED = 50
# Heatmaps of more partitions than this wrap into rows of panels as even as can be (4: 2 x 2).
PANELS_PER_ROW = 3
# A value whose magnitude is more than OFF_SCALE_SPREADS spreads (the interquartile range of the
# row's log10 magnitudes, at least one decade) above their upper quartile is off scale: the axis
# leaves it out, so a diverging run's 1e29 (and its ±1e29 band) is drawn clipped at the top,
# marked, instead of flattening every other curve.
OFF_SCALE_SPREADS = 3.0
# A diverged run's values more than DIVERGED_HEADROOM times the span of the other runs' means and
# bands above them are off scale too (drawn at the top, marked): tct_fmnist's SCAFFOLD blew up to
# a weight divergence of 32 before it diverged, which flattened means near 0.5 into the floor.
DIVERGED_HEADROOM = 1.0
OFF_SCALE_MARKER = "^"
DIVERGED_MARKER = "x"
DIVERGED_WIDTH = 0.8


@dataclass(frozen=True)
class Curve:
    """A metric per round over a group's seeds (NaN where it was not measured): the mean and
    spread of the runs that did not diverge, and each run that did, up to its divergence."""

    mean: np.ndarray
    std: np.ndarray  # spread over seeds (ddof=0); 0 with one seed, NaN with none
    seeds: int
    diverged: tuple[np.ndarray, ...] = ()

    def lines(self) -> list[np.ndarray]:
        """Every line drawn: the mean and each diverged run."""
        return [self.mean, *self.diverged]

    def steady(self) -> np.ndarray:
        """The values of the runs that did not diverge: the mean and mean ± std."""
        return np.concatenate([self.mean - self.std, self.mean + self.std, self.mean])

    def drawn(self) -> np.ndarray:
        """Every value drawn (the band's edges too), for the axis to span."""
        return np.concatenate([self.steady(), *self.diverged])


def figure_format(path: Path, option: str) -> str:
    """The format a figure file's suffix names; InputError naming `option` for any other."""
    fmt = path.suffix.lstrip(".").lower()
    if fmt not in FORMATS:
        raise InputError(f"{option} {path}: name a .png, .svg or .pdf file")
    return fmt


def save(fig: Figure, path: Path, formats: Sequence[str] = ("png",)) -> list[Path]:
    """Write `fig` as `path` with each format's suffix, each file complete or not at all (a full
    disk: RunError naming the file); the paths written."""
    written = [path.with_suffix(f".{fmt}") for fmt in formats]
    try:
        for target, fmt in zip(written, formats, strict=True):
            encoded = io.BytesIO()
            fig.savefig(encoded, format=fmt, dpi=DPI)
            write_atomically(target, encoded.getvalue())
    finally:
        plt.close(fig)
    return written


Caption = Callable[[np.ndarray], str]  # a histogram -> the lines under its panel's title


def partition_heatmaps(
    histograms: dict[str, np.ndarray],
    path: Path,
    formats: Sequence[str] = ("png",),
    caption: Caption | None = None,
) -> list[Path]:
    """`heatmaps_figure` saved as `path` in each of `formats`."""
    return save(heatmaps_figure(histograms, caption), path, formats)


def heatmaps_figure(histograms: dict[str, np.ndarray], caption: Caption | None = None) -> Figure:
    """One panel per distinct partition (title -> its clients x classes histogram), in one
    figure, at most PANELS_PER_ROW to a row; partitions with the same histogram (a natural
    partition under several seeds) share a panel, titled by all of them, and by `caption`'s
    lines (its heterogeneity) under that."""
    distinct = _distinct(histograms)
    shapes = [h.shape for h in distinct.values()]
    classes = max(c for _, c in shapes)
    height = max(3.0, min(max(n for n, _ in shapes), LABELLED) * 0.25 + 1.5)
    rows = math.ceil(len(distinct) / PANELS_PER_ROW)
    columns = math.ceil(len(distinct) / rows)
    fig, axes = plt.subplots(
        rows,
        columns,
        figsize=(max(4.0, min(classes, LABELLED // 2) * 0.4 + 2) * columns, height * rows),
        squeeze=False,
        layout="constrained",
    )
    for unused in axes.flat[len(distinct) :]:  # the last row's places left empty
        fig.delaxes(unused)
    for ax, (title, histogram) in zip(axes.flat, distinct.items(), strict=False):
        image = ax.imshow(histogram, aspect="auto", cmap="viridis", interpolation="nearest")
        _label_each(ax.xaxis, histogram.shape[1])
        _label_each(ax.yaxis, histogram.shape[0])
        ax.set_xlabel("class")
        ax.set_ylabel("client")
        if caption is None:
            ax.set_title(title)
        else:  # the title, then the caption's lines, smaller
            ax.set_title(f"{title}\n{caption(histogram)}", fontsize="small")
        fig.colorbar(image, ax=ax, label="samples")
    return fig


def _distinct(histograms: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The histograms once each, titled by every title that has it ("..., seed 0, 1, 2")."""
    titles: dict[bytes, list[str]] = {}
    arrays: dict[bytes, np.ndarray] = {}
    for title, histogram in histograms.items():
        content = np.asarray(histogram)
        identity = repr(content.shape).encode() + content.tobytes()
        titles.setdefault(identity, []).append(title)
        arrays.setdefault(identity, content)
    return {_joined_title(titles[i]): arrays[i] for i in arrays}


def _joined_title(titles: list[str]) -> str:
    """`a, seed 0` and `a, seed 1` -> `a, seed 0, 1`: the common start once (to a word), then
    where each title differs."""
    if len(titles) == 1:
        return titles[0]
    common = os.path.commonprefix(titles)
    common = common[: common.rfind(" ") + 1]
    return common + ", ".join(title[len(common) :] for title in titles)


def _label_each(axis, count: int) -> None:
    """A tick at every row (column) of a heatmap up to LABELLED of them, else about LABELLED
    integer ticks: never the edges between cells, never half the ids."""
    if count <= LABELLED:
        axis.set_major_locator(MultipleLocator(1))
        if count > 20:
            axis.set_tick_params(labelsize=7)
    else:
        axis.set_major_locator(MaxNLocator(nbins=LABELLED // 2, integer=True))


def metric_curves(
    panels: dict[str, dict[str, dict[str, Curve]]],
    path: Path,
    title: str = "",
    boundaries: dict[str, list[int]] | None = None,
    formats: Sequence[str] = ("png",),
    percent: Collection[str] = (),
    captions: Sequence[str] = (),
) -> list[Path]:
    """`curves_figure` saved as `path` in each of `formats`."""
    return save(curves_figure(panels, title, boundaries, percent, captions), path, formats)


def curves_figure(
    panels: dict[str, dict[str, dict[str, Curve]]],
    title: str = "",
    boundaries: dict[str, list[int]] | None = None,
    percent: Collection[str] = (),
    captions: Sequence[str] = (),
) -> Figure:
    """One row of panels per metric (one y axis per row), one column per setting.

    panels[metric label][setting][algorithm] = its Curve: the mean over the seeds that did not
    diverge, a band of ± one standard deviation where there are several, and each diverged run
    as a thin line ending in DIVERGED_MARKER. `boundaries[algorithm]` are the rounds after which
    a new stage starts (TCT's stage 2), drawn as dotted vertical lines. The rows named in
    `percent` hold fractions, drawn on a % axis; every other row's axis spans its values that
    are not off scale (`robust_limits`), a line's value above it drawn at its top, marked.
    Rounds are integers on the x axis, from 1. The legend names every algorithm (in its mean's
    style wherever one is drawn) and every other kind of mark drawn; `captions` are lines under
    the panels (what a metric is).
    """
    settings = list(next(iter(panels.values())))
    algorithms = list(dict.fromkeys(a for row in panels.values() for s in row.values() for a in s))
    with_mean = {
        a
        for row in panels.values()
        for setting in row.values()
        for a, curve in setting.items()
        if np.isfinite(curve.mean).any()
    }
    fig, axes = plt.subplots(
        len(panels),
        len(settings),
        figsize=(4.5 * len(settings) + 2.2, 3.2 * len(panels) + 0.6 + 0.2 * len(captions)),
        squeeze=False,
        sharex=True,
        sharey="row",
        layout="constrained",
    )
    marks: dict[str, object] = {}  # legend entries of what is not an algorithm's line
    for row, (label, curves) in zip(axes, panels.items(), strict=True):
        row[0].set_ylabel(label)
        if label in percent:
            row[0].yaxis.set_major_formatter(PercentFormatter(xmax=1))
        for ax, setting in zip(row, settings, strict=True):
            _draw_panel(ax, curves[setting], algorithms, with_mean, boundaries or {}, marks)
            ax.set_title(textwrap.fill(setting, PANEL_TITLE_CHARS))
        limits = None if label in percent else robust_limits(curves)
        if limits is not None and _clip(row, curves, settings, algorithms, limits):
            marks.setdefault("clipped", _clipped_entry())
        if label not in percent and _never_negative(curves):
            row[0].set_ylim(bottom=max(0.0, row[0].get_ylim()[0]))
    for ax in axes[-1]:
        ax.set_xlabel("round")
    axes[0, 0].set_xlim(left=0.5)  # rounds count from 1 (the axes share it): no round 0 tick
    handles, labels = _legend_entries(axes)
    fig.legend(
        handles + list(marks.values()),
        labels + [entry.get_label() for entry in marks.values()],
        loc="outside right upper",
        fontsize=8,
        frameon=False,
    )
    if captions:
        fig.supxlabel(_wrapped(captions, fig.get_figwidth()), fontsize=8)
    if title:  # at the left: centred, it runs into the legend above a single column
        fig.suptitle(title, x=0.01, horizontalalignment="left")
    return fig


def _wrapped(lines: Sequence[str], width_in: float) -> str:
    """`lines` folded between words to fit a figure `width_in` inches wide at 8 points."""
    chars = int(width_in * CAPTION_CHARS_PER_INCH)
    return "\n".join(textwrap.fill(line, chars) for line in lines)


def _draw_panel(
    ax,
    curves: dict[str, Curve],
    algorithms: list[str],
    with_mean: Collection[str],
    boundaries: dict[str, list[int]],
    marks,
) -> None:
    """One setting's curves, their bands and stage boundaries, on integer rounds; the legend
    entry of each kind of mark drawn goes into `marks`. An algorithm without a mean in any
    panel (`with_mean`: every run diverged) is named by its first diverged run's line."""
    for algorithm, curve in curves.items():
        index = algorithms.index(algorithm)
        if _draw(ax, curve, algorithm, index) and curve.seeds > 1:
            marks.setdefault("band", _band_entry())
        if _draw_diverged(ax, curve, algorithm, index, algorithm in with_mean):
            marks.setdefault("diverged", _diverged_entry())
        for stage_start in boundaries.get(algorithm, []):
            ax.axvline(stage_start + 0.5, color=f"C{index}", linestyle=":", linewidth=1)
            marks.setdefault("stage", _stage_entry())
    ax.grid(alpha=0.3)
    # as many round labels as the panel's width holds (a fixed count ran together in a panel
    # narrowed by a long legend)
    ax.xaxis.set_major_locator(MaxNLocator(nbins="auto", integer=True))


def _never_negative(curves: dict[str, dict[str, Curve]]) -> bool:
    """Whether every line of a row (means, diverged runs) is >= 0 (a distance, a loss): its axis
    starts at 0, where a band of mean - std below 0 would show values the metric never takes."""
    means = np.concatenate([line for c in _each(curves) for line in c.lines()])
    means = means[np.isfinite(means)]
    return bool(means.size) and bool((means >= 0).all())


def _each(curves: dict[str, dict[str, Curve]]) -> list[Curve]:
    return [c for setting in curves.values() for c in setting.values()]


def measured(curves: dict[str, dict[str, Curve]], algorithm: str | None = None) -> bool:
    """Whether a row has any value to draw (a metric no run records leaves it empty), of
    `algorithm` alone where one is named."""
    if algorithm is not None:
        curves = {s: {algorithm: row[algorithm]} for s, row in curves.items() if algorithm in row}
    return any(np.isfinite(line).any() for c in _each(curves) for line in c.lines())


def robust_limits(curves: dict[str, dict[str, Curve]]) -> tuple[float, float] | None:
    """The y range of a row's finite values (means, mean ± std, diverged runs) that are not off
    scale (see OFF_SCALE_SPREADS, on their magnitudes, and DIVERGED_HEADROOM); None when none is
    (the axis then fits them all)."""
    values = _finite(np.concatenate([c.drawn() for c in _each(curves)]))
    magnitudes = np.abs(values[values != 0])
    if not magnitudes.size:
        return None
    decades = np.log10(magnitudes)
    low, high = np.percentile(decades, [25, 75])
    fence = 10 ** (high + OFF_SCALE_SPREADS * max(high - low, 1.0))
    kept = values[np.abs(values) <= fence]
    steady = _finite(np.concatenate([c.steady() for c in _each(curves)]))
    steady = steady[np.abs(steady) <= fence]
    if steady.size:
        span = steady.max() - steady.min() or abs(steady.max()) or 1.0
        reach = DIVERGED_HEADROOM * span
        kept = kept[kept <= steady.max() + reach]  # below the axis nothing is marked: kept
    if kept.size == values.size or not kept.size:
        return None
    return float(kept.min()), float(kept.max())


def _finite(values: np.ndarray) -> np.ndarray:
    return values[np.isfinite(values)]


def _clip(row, curves, settings: list[str], algorithms: list[str], limits) -> bool:
    """Fix the row's y axis to `limits` (with a margin) and mark each value of a line (a mean
    or a diverged run) above them at the top, in its algorithm's colour; whether any was."""
    low, high = limits
    margin = 0.05 * (high - low) or 0.05 * abs(high) or 1.0
    top = high + margin
    row[0].set_ylim(low - margin, top)
    clipped = False
    for ax, setting in zip(row, settings, strict=True):
        for algorithm, curve in curves[setting].items():
            above, ends = _above(curve, top)
            color = f"C{algorithms.index(algorithm) % 10}"
            if above.size:
                clipped = True
                _mark_at_top(ax, above, top, OFF_SCALE_MARKER, color)
            if ends.size:  # a diverged run's last value: its cross, at the top
                _mark_at_top(ax, ends, top, DIVERGED_MARKER, color)
    return clipped


def _above(curve: Curve, top: float) -> tuple[np.ndarray, np.ndarray]:
    """The rounds (0-based) where a line of the curve is above `top`, and apart from them the
    last rounds of diverged runs that end above it."""
    above, ends = [np.flatnonzero(curve.mean > top)], []
    for values in curve.diverged:
        over = np.flatnonzero(values > top)
        finite = np.flatnonzero(np.isfinite(values))
        if finite.size and over.size and over[-1] == finite[-1]:
            ends.append(over[-1])
            over = over[:-1]
        above.append(over)
    return np.unique(np.concatenate(above)), np.unique(np.asarray(ends, dtype=int))


def _mark_at_top(ax, indices: np.ndarray, top: float, marker: str, color: str) -> None:
    """Marks at the axis' top over the rounds of `indices` (0-based), drawn past its edge."""
    ax.plot(
        indices + 1,
        np.full(indices.size, top),
        linestyle="none",
        marker=marker,
        color=color,
        clip_on=False,
        label="_off scale",
    )


def _band_entry() -> Patch:
    return Patch(color="grey", alpha=BAND_ALPHA * 2, label="shaded: ± 1 std over seeds")


def _diverged_entry() -> Line2D:
    return Line2D(
        [],
        [],
        color="grey",
        linewidth=DIVERGED_WIDTH,
        marker=DIVERGED_MARKER,
        label=f"thin, ending in {DIVERGED_MARKER}: a run that diverged (not in the mean)",
    )


def _stage_entry() -> Line2D:
    return Line2D([], [], color="grey", linestyle=":", label="dotted: next stage starts")


def _clipped_entry() -> Line2D:
    return Line2D(
        [],
        [],
        color="grey",
        linestyle="none",
        marker=OFF_SCALE_MARKER,
        label="above the axis: drawn at its top",
    )


def _draw(ax, curve: Curve, algorithm: str, index: int) -> bool:
    """Draw the curve (and its band over seeds); whether it had anything to draw."""
    finite = ~np.isnan(curve.mean)
    if not finite.any():  # a metric the method does not define, or every run diverged
        return False
    rounds = np.arange(1, len(curve.mean) + 1)[finite]
    mean, std = curve.mean[finite], curve.std[finite]
    color = f"C{index % 10}"
    step = max(2, len(rounds) // MARKS_PER_CURVE)
    ax.plot(
        rounds,
        mean,
        color=color,
        linestyle=DASHES[index % len(DASHES)],
        marker=MARKERS[index % len(MARKERS)],
        markevery=(index % step, step),  # markers of neighbouring curves apart
        markersize=4,
        linewidth=max(1.0, 2.6 - 0.3 * index),  # a curve drawn later is thinner: both show
        label=algorithm,
    )
    if curve.seeds > 1:
        ax.fill_between(rounds, mean - std, mean + std, color=color, alpha=BAND_ALPHA, linewidth=0)
    return True


def _draw_diverged(ax, curve: Curve, algorithm: str, index: int, named: bool) -> bool:
    """Each diverged run as a thin line to its last value, marked there; the first named after
    the algorithm unless its mean was (`named`). Whether any was drawn."""
    drawn = False
    for values in curve.diverged:
        finite = np.flatnonzero(np.isfinite(values))
        if not finite.size:
            continue
        ax.plot(
            finite + 1,
            values[finite],
            color=f"C{index % 10}",
            linewidth=DIVERGED_WIDTH,
            marker=DIVERGED_MARKER,
            markevery=[len(finite) - 1],
            label=algorithm if not (named or drawn) else "_diverged",
        )
        drawn = True
    return drawn


def _legend_entries(axes) -> tuple[list, list[str]]:
    """Each algorithm once, from whichever panel drew it."""
    entries: dict[str, object] = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            entries.setdefault(label, handle)
    return list(entries.values()), list(entries)


def image_grid(
    images: np.ndarray,
    labels: np.ndarray,
    path: Path,
    per_class: int = 8,
    title: str = "",
    formats: Sequence[str] = ("png",),
) -> list[Path]:
    """One labelled row per class (ascending), its first `per_class` images [N, C, H, W], min-max
    scaled over the grid; rows cut to the smallest class's count if it has fewer."""
    classes = np.unique(labels)
    rows = [images[labels == label] for label in classes]
    columns = min(per_class, *(len(row) for row in rows))
    low, high = float(images.min()), float(images.max())
    scale = (high - low) or 1.0
    fig, axes = plt.subplots(
        len(classes),
        columns,
        figsize=(0.75 * columns + 1.0, 0.75 * len(classes) + 0.6),
        squeeze=False,
        layout="constrained",
    )
    for row_axes, label, row in zip(axes, classes, rows, strict=True):
        for ax, image in zip(row_axes, row[:columns], strict=True):
            ax.imshow(
                _pixels((image - low) / scale), cmap="gray", vmin=0, vmax=1, interpolation="nearest"
            )
            ax.set_xticks([])
            ax.set_yticks([])
        row_axes[0].set_ylabel(f"class {int(label)}", rotation=0, ha="right", va="center")
    if title:
        fig.suptitle(title)
    return save(fig, path, formats)


def _pixels(image: np.ndarray) -> np.ndarray:
    """[C, H, W] -> what imshow draws: [H, W] for one channel, [H, W, 3] for colour."""
    return image[0] if image.shape[0] == 1 else np.moveaxis(image[:3], 0, -1)
