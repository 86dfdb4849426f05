"""Figures a person looks at: partition heatmaps and accuracy curves."""

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


def accuracy_curves(curves: dict[str, dict[str, np.ndarray]], path: Path, title: str = "") -> None:
    """curves[setting][algorithm] = mean test accuracy per round (NaN where not evaluated)."""
    settings = list(curves)
    fig, axes = plt.subplots(1, len(settings), figsize=(4.5 * len(settings), 3.6), squeeze=False)
    for ax, setting in zip(axes[0], settings, strict=True):
        for algorithm, acc in curves[setting].items():
            rounds = np.arange(1, len(acc) + 1)
            ok = ~np.isnan(acc)
            ax.plot(rounds[ok], acc[ok], label=algorithm)
        ax.set_title(setting)
        ax.set_xlabel("round")
        ax.set_ylabel("test accuracy")
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
