"""PNG renderings of what a person would rather look at than read (matplotlib, no display)."""

from __future__ import annotations

import io
from pathlib import Path

from stages.runtime import artifacts


def _figure(*args, **kw):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt, plt.subplots(*args, **kw)


def _save(plt, fig, path: Path) -> None:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    artifacts.write_bytes(path, buf.getvalue())


def heatmaps(matrices: dict[str, list[list[float]]], path: Path) -> None:
    """R[j][i] for each scenario side by side: rows = after task j, columns = test task i."""
    import numpy as np

    plt, (fig, axes) = _figure(1, len(matrices), figsize=(4.8 * len(matrices), 4.2), layout="constrained")
    axes = np.atleast_1d(axes)
    for ax, (title, m) in zip(axes, matrices.items()):
        a = np.asarray(m, dtype=float)
        im = ax.imshow(a, vmin=0, vmax=100, cmap="viridis")
        for (j, i), v in np.ndenumerate(a):
            ax.text(i, j, f"{v:.0f}", ha="center", va="center", fontsize=8, color="w" if v < 60 else "k")
        ax.set_title(f"{title} accuracy (%)")
        ax.set_xlabel("test task i")
        ax.set_ylabel("after task j")
        ax.set_xticks(range(a.shape[1]))
        ax.set_yticks(range(a.shape[0]))
    fig.colorbar(im, ax=axes.tolist(), shrink=0.8, location="right")
    _save(plt, fig, path)


def task_curves(matrix: list[list[float]], title: str, path: Path) -> None:
    import numpy as np

    a = np.asarray(matrix, dtype=float)
    plt, (fig, ax) = _figure(figsize=(6, 4))
    for i in range(a.shape[1]):
        ax.plot(range(i, a.shape[0]), a[i:, i], marker="o", label=f"task {i}")
    ax.plot(range(a.shape[0]), [np.mean(a[j, : j + 1]) for j in range(a.shape[0])], "k--", label="mean (seen)")
    ax.set_xlabel("after task")
    ax.set_ylabel("accuracy (%)")
    ax.set_title(title)
    ax.legend(fontsize=7)
    _save(plt, fig, path)


def bars_by_task(values: list[list[float]], ylabel: str, title: str, path: Path) -> None:
    """One bar group per class, one bar per task snapshot (weight norms, buffer histogram)."""
    import numpy as np

    a = np.asarray(values, dtype=float)  # [tasks, classes]
    plt, (fig, ax) = _figure(figsize=(max(6, 0.35 * a.shape[1] * 1.5), 4))
    width = 0.8 / a.shape[0]
    for k in range(a.shape[0]):
        ax.bar(np.arange(a.shape[1]) + k * width, a[k], width, label=f"after task {k}")
    ax.set_xlabel("class (label)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if a.shape[1] <= 20:
        ax.set_xticks(np.arange(a.shape[1]) + 0.4 - width / 2, range(a.shape[1]))
    ax.legend(fontsize=7)
    _save(plt, fig, path)


def scatter(x, y, xlabel: str, ylabel: str, title: str, path: Path, logx: bool = True) -> None:
    plt, (fig, ax) = _figure(figsize=(6, 4))
    ax.scatter(x, y, s=18)
    if logx:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    _save(plt, fig, path)


def histograms(series: dict[str, list[float]], xlabel: str, title: str, path: Path, bins: int = 30) -> None:
    plt, (fig, ax) = _figure(figsize=(6, 4))
    for label, values in series.items():
        if len(values):
            ax.hist(values, bins=bins, density=True, alpha=0.5, label=f"{label} (n={len(values)})")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("density")
    ax.set_title(title)
    ax.legend()
    _save(plt, fig, path)
