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


def heatmaps(matrices: dict[str, list[list[float]]], path: Path, note: str = "") -> None:
    """R[j][i] for each scenario side by side: rows = after task j, columns = test task i. A task not
    yet learned (i > j: not evaluated, None; a run trained before that holds Class-IL's 0 and Task-IL's
    chance there) and a NaN entry (a row that means nothing) are grey, without a number."""
    import numpy as np

    plt, (fig, axes) = _figure(1, len(matrices), figsize=(4.8 * len(matrices), 4.2), layout="constrained")
    axes = np.atleast_1d(axes)
    cmap = plt.get_cmap("viridis").with_extremes(bad="0.85")
    for ax, (title, m) in zip(axes, matrices.items()):
        a = np.asarray(m, dtype=float)
        a[np.triu_indices(a.shape[0], 1, a.shape[1])] = np.nan
        im = ax.imshow(np.ma.masked_invalid(a), vmin=0, vmax=100, cmap=cmap)
        for (j, i), v in np.ndenumerate(a):
            if not np.isnan(v):
                ax.text(i, j, f"{v:.0f}", ha="center", va="center", fontsize=8, color="w" if v < 60 else "k")
        ax.set_title(f"{title} accuracy (%)")
        ax.set_xlabel("test task i")
        ax.set_ylabel("after task j")
        ax.set_xticks(range(a.shape[1]))
        ax.set_yticks(range(a.shape[0]))
    fig.colorbar(im, ax=axes.tolist(), shrink=0.8, location="right")
    fig.suptitle("grey: a task not learned yet" + (f"; {note}" if note else ""), fontsize=8, y=0.02, va="bottom")
    _save(plt, fig, path)


def task_curves(matrix: list[list[float]] | None, title: str, path: Path) -> None:
    """Each task's accuracy after each task from its own on; None: a figure that says `title` only
    (the file is a declared output, also for a method with no such accuracies)."""
    import numpy as np

    plt, (fig, ax) = _figure(figsize=(6, 4))
    if matrix is None:
        ax.set_axis_off()
        ax.set_title(title)
        _save(plt, fig, path)
        return
    a = np.asarray(matrix, dtype=float)
    for i in range(a.shape[1]):
        ax.plot(range(i, a.shape[0]), a[i:, i], marker="o", label=f"task {i}")
    ax.plot(range(a.shape[0]), [np.mean(a[j, : j + 1]) for j in range(a.shape[0])], "k--", label="mean (seen)")
    ax.set_xlabel("after task")
    ax.set_ylabel("accuracy (%)")
    ax.set_title(title)
    ax.legend(fontsize=7)
    _save(plt, fig, path)


def bars_by_task(values: list[list[float]], ylabel: str, title: str, path: Path) -> None:
    """One bar group per class, one bar per task snapshot (weight norms, buffer histogram); a NaN
    value (a class not seen yet) draws no bar."""
    import numpy as np

    a = np.asarray(values, dtype=float)  # [tasks, classes]
    if a.shape[1] > 20:
        # CIFAR-100's 100 or TinyImageNet's 200 classes: bar groups would make a figure metres wide
        # (and a task's bars a pixel each); one line per snapshot across the classes instead.
        plt, (fig, ax) = _figure(figsize=(10, 4))
        colors = plt.get_cmap("viridis")(np.linspace(0, 0.9, a.shape[0]))
        for k in range(a.shape[0]):
            ax.plot(np.arange(a.shape[1]), a[k], lw=1, color=colors[k], label=f"after task {k}")
    else:
        plt, (fig, ax) = _figure(figsize=(max(6, 0.35 * a.shape[1] * 1.5), 4))
        width = 0.8 / a.shape[0]
        for k in range(a.shape[0]):
            ax.bar(np.arange(a.shape[1]) + k * width, a[k], width, label=f"after task {k}")
        ax.set_xticks(np.arange(a.shape[1]) + 0.4 - width / 2, range(a.shape[1]))
    ax.set_xlabel("class (label)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=7, ncol=1 + a.shape[0] // 11)
    _save(plt, fig, path)


def scatter(x, ys: dict[str, list[float]], xlabel: str, ylabel: str, title: str, path: Path, logx: bool = True) -> None:
    """One point series per entry of `ys` over the same x, each with its legend label; a series with
    no finite value (a method without an MC-dropout score) is left out, and with none left the
    figure says so (a log axis over no point cannot be drawn)."""
    import math

    plt, (fig, ax) = _figure(figsize=(6, 4))
    drawn = {label: y for label, y in ys.items() if any(math.isfinite(v) for v in y)}
    for label, y in drawn.items():
        ax.scatter(x, y, s=18, label=label)
    if len(drawn) > 1:
        ax.legend(fontsize=7)
    if not drawn:
        ax.text(0.5, 0.5, "no finite values to draw", ha="center", va="center", transform=ax.transAxes)
    elif logx:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    _save(plt, fig, path)


def histograms(series: dict[str, list[float]], xlabel: str, title: str, path: Path, bins=30) -> None:
    """`bins`: a count, or the edges every series shares (else each is binned over its own range, and
    two samples of one distribution look different)."""
    plt, (fig, ax) = _figure(figsize=(6, 4))
    for label, values in series.items():
        if len(values):
            ax.hist(values, bins=bins, density=True, alpha=0.5, label=f"{label} (n={len(values)})")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("density")
    ax.set_title(title)
    if any(len(v) for v in series.values()):
        ax.legend()
    else:  # none to draw (JOINT's forgotten and kept): said, not an empty legend
        ax.text(0.5, 0.5, "no samples in " + " or ".join(series), ha="center", va="center", transform=ax.transAxes)
    _save(plt, fig, path)
