"""`pbr report`'s figures: each table drawn as it is printed, one PNG per table.

A panel per (dataset, Class-IL / Task-IL); in each, a row per table row: every seed's value (grey
dots), the mean with the seeds' standard deviation (black bar), and the paper's number (red
diamond) where the table prints one. The artists carry gids ("seeds", "mean", "spread", "paper")
so what was drawn can be read back from the Figure. matplotlib is imported inside the functions,
with no pyplot (no global figure state, no display).
"""

from __future__ import annotations

import io
import re
import statistics
from pathlib import Path

from stages.runtime import artifacts

DEFAULT_DIR = Path("reports/report")
MODES = (("class_il", "Class-IL"), ("task_il", "Task-IL"))
SEED_OFFSET = 0.22  # the seeds' dots sit just under their row's mean bar, not hidden by it


def slug(title: str, metric: str) -> str:
    """A table title ("## ordered, IR 0.01 (proxy)") as a file name: ordered-ir-0.01-proxy-acc."""
    return re.sub(r"[^a-z0-9.]+", "-", f"{title.lstrip('# ')} {metric}".lower()).strip("-.")


def _row_name(label: str, buffer: int | None) -> str:
    return label if buffer is None else f"{label} · {buffer}"


def table_figure(title: str, groups, metric: str = "acc", paper: bool = True, seeds=None):
    """The matplotlib Figure of one table's groups (stages.experiments.report.Group, in the report's order).
    `paper`: mark the paper's numbers (the report prints them for acc on the full protocol)."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    from stages.experiments.report import _col_order, _dataset_header, _machine_rank, _row_order, machine_text

    cols = sorted({(g.dataset, g.n_tasks) for g in groups}, key=lambda c: _col_order(*c))
    rows = sorted({(g.method, g.buffer_size, g.device, g.precision, g.label) for g in groups},
                  key=lambda r: (_row_order(r[0], r[1]), _machine_rank(r[2], r[3])))
    by_key = {(g.method, g.buffer_size, g.device, g.precision, g.dataset, g.n_tasks): g for g in groups}
    names = [_row_name(r[4], r[1]) for r in rows]

    fig = Figure(figsize=(10, 0.9 + len(cols) * (0.8 + 0.32 * len(rows))), layout="constrained")
    axes = fig.subplots(len(cols), 2, squeeze=False, sharey=True)
    for (d, n), panel_row in zip(cols, axes):
        for (mode, mode_name), ax in zip(MODES, panel_row):
            seeds_x, seeds_y, means, paper_x, paper_y = [], [], [], [], []
            for y, (method, buf, device, precision, _) in enumerate(rows):
                g = by_key.get((method, buf, device, precision, d, n))
                if g is None:
                    continue
                v = list(g.by_seed(mode, metric).values())
                if v:
                    seeds_x += v
                    seeds_y += [y + SEED_OFFSET] * len(v)
                    means.append((y, statistics.fmean(v), statistics.stdev(v) if len(v) > 1 else 0.0))
                # Beside runs of the paper's task count only (the table says "[paper x, 10 tasks]" otherwise).
                alike = g.n_tasks in (None, g.paper_n_tasks())
                mark = g.paper()[0 if mode == "class_il" else 1] if paper and alike else None
                if mark is not None:
                    paper_x.append(mark)
                    paper_y.append(y)
            if means:
                ys, ms, sds = zip(*means)
                ax.hlines(ys, [m - s for m, s in zip(ms, sds)], [m + s for m, s in zip(ms, sds)],
                          colors="black", linewidth=2.2, gid="spread", zorder=2)
                ax.plot(ms, ys, "|", color="black", markersize=14, markeredgewidth=2.2, gid="mean", zorder=3)
            if seeds_x:
                ax.plot(seeds_x, seeds_y, "o", color="0.55", markersize=4, alpha=0.8, gid="seeds", zorder=1)
            if paper_x:
                ax.plot(paper_x, paper_y, "D", color="tab:red", markersize=6, markerfacecolor="none",
                        markeredgewidth=1.6, gid="paper", zorder=4)
            ax.set_title(f"{_dataset_header(d, n)}: {mode_name}", fontsize=10)
            ax.set_yticks(range(len(rows)), names)
            ax.set_ylim(len(rows) - 0.5, -0.5)  # the table's first row on top
            ax.grid(axis="x", alpha=0.3)
            ax.set_xlabel(f"{metric.upper()} (%)")
    legend = [Line2D([], [], ls="none", marker="o", color="0.55", markersize=4, label="each seed"),
              Line2D([], [], color="black", marker="|", markersize=12, markeredgewidth=2, lw=2,
                     label="mean ± std over seeds")]
    if paper:
        legend.append(Line2D([], [], ls="none", marker="D", color="tab:red", markerfacecolor="none",
                             markersize=6, label="paper (mean of 5 runs)"))
    fig.legend(handles=legend, loc="outside lower center", ncols=len(legend), fontsize=9, frameon=False)
    machines = {(g.device, g.precision) for g in groups}
    where = f", ran on {machine_text(*machines.pop())}" if len(machines) == 1 else ""
    from stages.experiments.report import seed_text

    # A report of some seeds (`--seeds`) writes the same files as the full one: its figures say so.
    only = f", seeds {seed_text(seeds)} only" if seeds is not None else ""
    fig.suptitle(f"{title.lstrip('# ')}: {metric.upper()}{where}{only}")
    return fig


def write_figures(tables, metric: str, folder: Path = DEFAULT_DIR, seeds=None) -> list[Path]:
    """One PNG per table ((title, groups, paper marks?) in report order), each written atomically;
    this metric's figures of tables no longer in the report are removed. Returns the paths."""
    written = []
    for title, groups, paper in tables:
        fig = table_figure(title, groups, metric, paper, seeds)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110)
        path = Path(folder) / f"{slug(title, metric)}.png"
        artifacts.write_bytes(path, buf.getvalue())
        written.append(path)
    for old in Path(folder).glob(f"*-{metric}.png"):
        if old not in written:
            old.unlink(missing_ok=True)
    return written
