"""Figures a person looks at: partition heatmaps and per-round metric curves."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def partition_heatmap(histogram: np.ndarray, path: Path, title: str = "") -> None:
    clients, classes = histogram.shape
    fig, ax = plt.subplots(
        figsize=(max(4, classes * 0.5 + 2), max(3, min(clients, 50) * 0.3 + 1.5))
    )
    image = ax.imshow(histogram, aspect="auto", cmap="viridis", interpolation="nearest")
    ax.set_xlabel("class")
    ax.set_ylabel("client")
    ax.set_title(title or "samples per client and class")
    fig.colorbar(image, ax=ax, label="samples")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def metric_curves(
    panels: dict[str, dict[str, dict[str, np.ndarray]]], path: Path, title: str = ""
) -> None:
    """One row of plots per metric, one column per setting.

    panels[metric label][setting][algorithm] = the metric per round (NaN where not measured).
    """
    settings = list(next(iter(panels.values())))
    fig, axes = plt.subplots(
        len(panels), len(settings), figsize=(4.5 * len(settings), 3.4 * len(panels)), squeeze=False
    )
    for row, (label, curves) in zip(axes, panels.items(), strict=True):
        for ax, setting in zip(row, settings, strict=True):
            for algorithm, values in curves[setting].items():
                rounds = np.arange(1, len(values) + 1)
                ok = ~np.isnan(values)
                ax.plot(rounds[ok], values[ok], label=algorithm)
            ax.set_title(setting)
            ax.set_xlabel("round")
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
