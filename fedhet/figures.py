"""Figures a person looks at: partition heatmaps, per-round metric curves, image grids.

Every figure is saved once per format asked for (PNG at `DPI`, SVG, PDF), next to each other.
Takes numpy arrays only, so every layer that draws (reports, a method's command) can use it.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from fedhet.core.errors import InputError  # noqa: E402
from fedhet.core.files import write_atomically  # noqa: E402

FORMATS = ("png", "svg", "pdf")
DPI = 200
# Overlapping curves stay visible: each algorithm has its own colour, dash and marker.
DASHES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
MARKS_PER_CURVE = 8


@dataclass(frozen=True)
class Curve:
    """A metric per round over a group's seeds (NaN where it was not measured)."""

    mean: np.ndarray
    std: np.ndarray  # spread over seeds (ddof=0); 0 with one seed
    seeds: int


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


def partition_heatmaps(
    histograms: dict[str, np.ndarray], path: Path, formats: Sequence[str] = ("png",)
) -> list[Path]:
    """One panel per partition (title -> its clients x classes histogram), in one figure."""
    shapes = [h.shape for h in histograms.values()]
    classes = max(c for _, c in shapes)
    height = max(3.0, min(max(n for n, _ in shapes), 50) * 0.3 + 1.5)
    fig, axes = plt.subplots(
        1,
        len(histograms),
        figsize=(max(4.0, classes * 0.5 + 2) * len(histograms), height),
        squeeze=False,
        layout="constrained",
    )
    for ax, (title, histogram) in zip(axes[0], histograms.items(), strict=True):
        image = ax.imshow(histogram, aspect="auto", cmap="viridis", interpolation="nearest")
        ax.set_xlabel("class")
        ax.set_ylabel("client")
        ax.set_title(title)
        fig.colorbar(image, ax=ax, label="samples")
    return save(fig, path, formats)


def metric_curves(
    panels: dict[str, dict[str, dict[str, Curve]]],
    path: Path,
    title: str = "",
    boundaries: dict[str, list[int]] | None = None,
    formats: Sequence[str] = ("png",),
) -> list[Path]:
    """`curves_figure` saved as `path` in each of `formats`."""
    return save(curves_figure(panels, title, boundaries), path, formats)


def curves_figure(
    panels: dict[str, dict[str, dict[str, Curve]]],
    title: str = "",
    boundaries: dict[str, list[int]] | None = None,
) -> Figure:
    """One row of panels per metric (one y axis per row), one column per setting.

    panels[metric label][setting][algorithm] = its Curve: the mean over seeds, and a band of
    ± one standard deviation where there are several seeds. `boundaries[algorithm]` are the
    rounds after which a new stage starts (TCT's stage 2), drawn as dotted vertical lines.
    """
    settings = list(next(iter(panels.values())))
    algorithms = list(dict.fromkeys(a for row in panels.values() for s in row.values() for a in s))
    fig, axes = plt.subplots(
        len(panels),
        len(settings),
        figsize=(4.5 * len(settings) + 2.2, 3.2 * len(panels) + 0.6),
        squeeze=False,
        sharex=True,
        sharey="row",
        layout="constrained",
    )
    for row, (label, curves) in zip(axes, panels.items(), strict=True):
        row[0].set_ylabel(label)
        for ax, setting in zip(row, settings, strict=True):
            for algorithm, curve in curves[setting].items():
                index = algorithms.index(algorithm)
                _draw(ax, curve, algorithm, index)
                for stage_start in (boundaries or {}).get(algorithm, []):
                    ax.axvline(stage_start + 0.5, color=f"C{index}", linestyle=":", linewidth=1)
            ax.set_title(setting)
            ax.grid(alpha=0.3)
    for ax in axes[-1]:
        ax.set_xlabel("round")
    handles, labels = _legend_entries(axes)
    fig.legend(handles, labels, loc="outside right upper", fontsize=8, frameon=False)
    if title:
        fig.suptitle(title)
    return fig


def _draw(ax, curve: Curve, algorithm: str, index: int) -> None:
    measured = ~np.isnan(curve.mean)
    if not measured.any():  # a metric the method does not define: nothing to draw
        return
    rounds = np.arange(1, len(curve.mean) + 1)[measured]
    mean, std = curve.mean[measured], curve.std[measured]
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
        ax.fill_between(rounds, mean - std, mean + std, color=color, alpha=0.15, linewidth=0)


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
