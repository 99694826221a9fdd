"""`pbr confirm`: the pre-registered confirmations (docs/preregistration.md), computed as written
there and nothing else: the plan's rows at the proxy budget on its confirmation seeds, on a CPU in
fp32; its comparisons as paired differences of final Class-IL with a two-sided 95% t interval, a
paired t-test's p and its Holm adjustment over the plan's comparisons, and the verdict by the
page's rule. While any comparison has fewer seeds than planned (a seed that cannot be completed
named with --missing is not planned), its verdict reads "(progress)" and the table says it is no
verdict yet; the seeds each row lacks are listed.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from stages.experiments import report

CELL = {"budget": "proxy", "setting": "ordered", "imbalance_ratio": 0.01, "dataset": "cifar10",
        "n_tasks": 5, "buffer_size": 200, "device": "cpu", "precision": "fp32"}
# The -S values of the registered commands (docs/preregistration.md; train.device written there later).
REGISTERED = {"train.precision": "fp32", "train.threads": 1, "train.device": "cpu"}
STREAM = ("setting", "imbalance_ratio", "dataset", "n_tasks")  # CELL's keys that say the stream


@dataclass(frozen=True)
class Plan:
    """One pre-registered confirmation: its seeds, its rows (as `pbr report` labels them, with the
    fidelity grid's row names) and its comparisons (name, A, B, the paper's claim). Its runs are
    the fidelity grid's rows at `budget` with the registered -S values `settings`, every other key
    params.yaml's: a default changed after a plan ran goes into its `settings`, with the value its
    runs had, or every run of the plan would read as off it."""
    title: str
    seeds: tuple[str, ...]
    rows: dict[str, str]
    comparisons: tuple[tuple[str, str, str, str], ...]
    budget: str = "proxy"
    settings: dict[str, Any] = field(default_factory=lambda: dict(REGISTERED))


PLANS = {
    "defaults": Plan(
        "The pre-registered confirmation", tuple(str(s) for s in range(100, 110)),
        {"PBR": "pbr", "PBR (random)": "pbr-random", "PBR (online reservoir)": "pbr-reservoir",
         "ER (lr 0.03)": "er-lr0.03", "ER": "er-lr0.1", "PBR (paper-literal)": "pbr-literal"},
        (("C1", "PBR", "PBR (online reservoir)", "Ours > Ours-Random (+6.23)"),
         ("C2", "PBR", "PBR (random)", "Ours > Ours-Random (+6.23)"),
         ("C3", "PBR", "ER (lr 0.03)", "Ours > ER (+11.86)"),
         ("C4", "PBR", "ER", "Ours > ER, at ER's tuned lr"),
         ("C5", "PBR", "PBR (paper-literal)", "none"))),
    # A reading that passed the selection step (docs/preregistration.md, second confirmation).
    "outliers": Plan(
        "The second confirmation: the top 5% MI left out of the walk", tuple(str(s) for s in range(200, 210)),
        {"PBR": "pbr", "PBR (top 5% MI left out)": "pbr-out0.05"},
        (("C6", "PBR (top 5% MI left out)", "PBR", "none"),)),
    # The next reading to pass it (docs/preregistration.md, third confirmation): the default's runs
    # on these seeds are the second confirmation's, the reading's run after this plan was committed.
    "walkpool": Plan(
        "The third confirmation: the walk over buffer and task", tuple(str(s) for s in range(200, 210)),
        {"PBR": "pbr", "PBR (walk over buffer and task)": "pbr-pool-buffer_and_task"},
        (("C7", "PBR (walk over buffer and task)", "PBR", "none"),)),
}
FIRST = PLANS["defaults"]
ALPHA = 0.05
# The next confirmation's block (docs/preregistration.md, "Changing a default after this"): unseen
# like the plans' own until its plan is written, so no choice is to be made on it either.
NEXT_SEEDS = tuple(str(s) for s in range(300, 310))


def reserved_blocks() -> dict[tuple[str, ...], list[Plan]]:
    """Every block of seeds kept for a pre-registered confirmation, with the plans that run on it
    (none yet for the next): `pbr sweep` warns of a cell on them that is none of those plans' rows,
    and `pbr report` flags such rows and the ones pooling them with other seeds."""
    out: dict[tuple[str, ...], list[Plan]] = {}
    for p in PLANS.values():
        out.setdefault(p.seeds, []).append(p)
    out.setdefault(NEXT_SEEDS, [])
    return out


def in_cell(g: report.Group, plan: Plan) -> bool:
    """Whether `g` is one of the plan's rows in its cell."""
    return g.method in plan.rows and all(getattr(g, k) == v for k, v in CELL.items())


@dataclass
class Comparison:
    name: str
    a: str
    b: str
    claim: str
    diffs: list[float]
    p: float = float("nan")
    holm: float = float("nan")

    @property
    def n(self) -> int:
        return len(self.diffs)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.diffs)

    def interval(self) -> tuple[float, float]:
        half = report.t_quantile(self.n - 1) * statistics.stdev(self.diffs) / math.sqrt(self.n)
        return self.mean - half, self.mean + half

    def verdict(self) -> str:
        low, high = self.interval()
        side = "above" if low > 0 else "below" if high < 0 else None
        if side is None:
            return "not resolved"
        return side if self.holm <= ALPHA else f"{side} (not after Holm)"


def paired_p(diffs: list[float]) -> float:
    """Two-sided p of the paired t-test that the mean difference is 0."""
    n, sd = len(diffs), statistics.stdev(diffs)
    if sd == 0:
        return 1.0 if statistics.fmean(diffs) == 0 else 0.0
    t = abs(statistics.fmean(diffs)) / (sd / math.sqrt(n))
    return max(0.0, 1.0 - report._t_within(t, n - 1))


def holm(ps: list[float]) -> list[float]:
    """Holm's step-down adjustment: the k-th smallest of m p-values times (m - k + 1), made
    non-decreasing in that order, capped at 1."""
    m, out, running = len(ps), [0.0] * len(ps), 0.0
    for k, i in enumerate(sorted(range(m), key=lambda i: ps[i])):
        running = max(running, min(1.0, (m - k) * ps[i]))
        out[i] = running
    return out


def expected_settings(plan: Plan) -> dict[str, dict[str, str]]:
    """Each row's settings as `pbr report` reads its runs' (the signature: "auto"s as the run's
    `resolved.*` tags have them, resolved on a CPU as the plan runs): params.yaml's defaults, the
    plan's budget and -S values, and the row's cell of the fidelity grid."""
    import types

    from stages.experiments import sweep
    from stages.runtime.run_settings import RunSettings
    from stages.runtime.config import Config, from_dict

    base = Config().to_dict()  # params.yaml's values (the schema's defaults are the file's)
    cells = {c["_row"]: c for c in sweep.fidelity(base)}
    out = {}
    for label, row in plan.rows.items():
        over = {**sweep.BUDGETS[plan.budget], **plan.settings, **{k: v for k, v in cells[row].items() if k[0] != "_"}}
        cfg = from_dict(sweep._merged(base, over))
        tags = RunSettings.resolve(cfg, types.SimpleNamespace(type="cpu")).tags()
        params = report.pin_auto({k: str(v) for k, v in cfg.flat().items()}, {k: str(v) for k, v in tags.items()})
        out[label] = dict(report._signature(params))
    return out


def _off_the_plan(theirs: dict[str, str], plan: dict[str, str]) -> str:
    """The run's settings that are not the plan's, "" for none. A key the run does not record was
    added after it ran (what it did then is in its other keys); a key the plan does not know is not
    the plan's."""
    keys = sorted(k for k in theirs if theirs[k] != plan.get(k))
    return "; ".join(f"{k} {theirs[k]} (the plan's {plan.get(k, '<unset>')})" for k in keys)


def cell_groups(groups: list[report.Group], plan: Plan = FIRST) -> dict[str, report.Group]:
    """The group of each plan row in the confirmation's cell (CELL holds every key of a group but
    the row, so a row has one group at most), holding its runs on the plan's seeds of one thread a
    run, as the plan says (a thread count moves a CPU run's last digits, and those the walk's
    choices), with every other setting the plan's (expected_settings): no run is chosen by what
    most runs have, so runs off the plan never outvote it, whatever their number or order."""
    cell = [g for g in groups if in_cell(g, plan)]
    expected = expected_settings(plan)
    out = {}
    for g in cell:
        ran = [r for r in g.runs if r.params.get("seed") in plan.seeds]
        one = [r for r in ran if r.params.get("train.threads") == "1"]
        kept, off = [], {}
        for r in one:
            why = _off_the_plan(dict(report._signature(r.params)), expected[g.method])
            if why:
                off.setdefault(why, []).append(r)
            else:
                kept.append(r)
        # Grouped again, so that the notes speak of the runs counted.
        regrouped = report.group_runs(kept)[0] or [dataclasses.replace(g, runs=[], notes=[])]
        (h,) = regrouped
        if len(one) < len(ran):
            h.notes.append(f"{g.describe()}: {len(ran) - len(one)} run(s) not of one thread a run left out "
                           "(the plan runs one thread a run)")
        for why, rs in off.items():
            who = (f"run {rs[0].run_id} (seed {rs[0].params.get('seed')})" if len(rs) == 1 else
                   f"{len(rs)} runs (seeds {report.seed_text(r.params.get('seed') for r in rs)})")
            h.notes.append(f"{g.describe()}: {who} left out, off the plan's settings: {why}")
        out[g.method] = h
    return out


def left_out_elsewhere(groups: list[report.Group], plan: Plan = FIRST) -> list[str]:
    """One note per group of the plan's stream with runs on the plan's seeds that is none of its
    rows in its cell (a GPU or bf16 run, another budget or buffer, a row label the plan does not
    have): the plan leaves them out, and says so. Another plan's rows on the same seeds are expected."""
    others = {label for p in PLANS.values() if p is not plan and set(p.seeds) & set(plan.seeds) for label in p.rows}
    notes = []
    for g in groups:
        if any(getattr(g, k) != CELL[k] for k in STREAM) or (g.method in others and g.method not in plan.rows):
            continue
        why = [f"{k} {getattr(g, k)} (the plan's {v})" for k, v in CELL.items() if k not in STREAM and getattr(g, k) != v]
        if g.method not in plan.rows:
            why.append("not one of the plan's rows")
        on = [r for r in g.runs if r.params.get("seed") in plan.seeds]
        if why and on:
            seeds = report.seed_text(r.params["seed"] for r in on)
            notes.append(f"{g.describe()}: {len(on)} run(s) on seed(s) {seeds} left out: {'; '.join(why)}")
    return notes


def provenance(groups: dict[str, report.Group]) -> list[str]:
    """Where the counted runs come from: code commits, uncommitted code, prepared data. A plan may
    reuse an earlier one's runs from another commit (the third confirmation does), so mixed commits
    are said, not refused."""
    runs = [r for g in groups.values() for r in g.runs]
    if not runs:
        return []

    def tally(tag: str, width: int | None = None) -> str:
        c = Counter((r.tags.get(tag) or "unknown")[:width] for r in runs)
        return ", ".join(f"{k} ({n})" for k, n in sorted(c.items(), key=lambda kv: (-kv[1], kv[0])))

    lines = [f"Runs counted: {len(runs)}; code commit: {tally('git.commit', 7)}; prepared data "
             f"(pbr.data_manifest): {tally('pbr.data_manifest', 12)}."]
    dirty = sum(r.tags.get("git.dirty") != "false" for r in runs)
    if dirty:
        lines.append(f"- note: {dirty} run(s) from a checkout with uncommitted code (or unknown: git.dirty), "
                     "which no commit reproduces")
    if len({r.tags.get("pbr.data_manifest") for r in runs}) > 1:
        lines.append("- note: the runs were trained on more than one prepared data set (pbr.data_manifest)")
    return lines


def rows_by_seed(groups: list[report.Group], mode: str = "class_il", metric: str = "acc",
                 plan: Plan = FIRST) -> dict[str, dict[str, float]]:
    """Each row's value per confirmation seed, from the groups of the confirmation's cell."""
    return _by_seed(cell_groups(groups, plan), plan, mode, metric)


def _by_seed(counted: dict[str, report.Group], plan: Plan, mode: str = "class_il",
             metric: str = "acc") -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {label: {} for label in plan.rows}
    for label, g in counted.items():
        out[label] = {s: v for s, v in g.by_seed(mode, metric).items() if s in plan.seeds}
    return out


def compare(groups: list[report.Group], plan: Plan = FIRST) -> list[Comparison]:
    return _compare(cell_groups(groups, plan), plan)


def _compare(counted: dict[str, report.Group], plan: Plan) -> list[Comparison]:
    rows = _by_seed(counted, plan)
    out = []
    for name, a, b, claim in plan.comparisons:
        seeds = sorted(rows[a].keys() & rows[b].keys(), key=int)
        out.append(Comparison(name, a, b, claim, [rows[a][s] - rows[b][s] for s in seeds]))
    # The family is every comparison of the plan, as pre-registered: one without two pairs yet
    # counts with p = 1, so a missing comparison never makes the others' adjustment milder.
    ps = [paired_p(c.diffs) if c.n >= 2 else 1.0 for c in out]
    for c, p, adjusted in zip(out, ps, holm(ps)):
        if c.n >= 2:
            c.p, c.holm = p, adjusted
    return out


def parse_missing(items: list[str], plan: Plan = FIRST) -> dict[str, set[str]]:
    """`--missing ROW=SEEDS` (pbr-random=103,107 or 103-104): a row's seeds that cannot be completed."""
    from pbr.errors import UserError

    out: dict[str, set[str]] = {}
    for item in items:
        row, _, text = item.partition("=")
        try:
            seeds = {str(s) for part in text.split(",") for s in
                     (range(int(part.split("-")[0]), int(part.split("-")[1]) + 1) if "-" in part else [int(part)])}
        except (ValueError, IndexError):
            seeds = set()
        if row not in plan.rows.values() or not seeds:
            raise UserError(f"--missing {item}: write it as ROW=SEEDS with ROW one of {', '.join(plan.rows.values())}, "
                            f"e.g. --missing {next(iter(plan.rows.values()))}={plan.seeds[3]}")
        if seeds - set(plan.seeds):
            raise UserError(f"--missing {item}: seed {min(seeds - set(plan.seeds), key=int)} is not one of the plan's "
                            f"({report.seed_text(plan.seeds)})")
        out.setdefault(row, set()).update(seeds)
    return out


def render(groups: list[report.Group], plan: Plan = FIRST, lost: dict[str, set[str]] | None = None) -> str:
    """The plan's table. `lost`: the seeds of a row that cannot be completed (`--missing`), which the
    plan reports as missing, its comparisons then on the seeds both rows have (docs/preregistration.md)."""
    from pbr.errors import UserError

    lost = lost or {}
    # The plan's runs picked once: each pick resolves every run's settings again (seconds a pick).
    counted = cell_groups(groups, plan)
    comps = _compare(counted, plan)
    have = _by_seed(counted, plan)
    for label, row in plan.rows.items():
        if ran := lost.get(row, set()) & have[label].keys():
            raise UserError(f"--missing {row}={','.join(sorted(lost[row], key=int))}: seed {min(ran, key=int)} has a "
                            "counted run; --missing names the seeds that cannot be completed")
    lines = [f"# {plan.title} (docs/preregistration.md)", "",
             "Seq-CIFAR-10-LT, ordered, IR 0.01, buffer 200, proxy budget, CPU fp32, seeds "
             f"{plan.seeds[0]}-{plan.seeds[-1]}. Final Class-IL ACC (%).", "",
             "| row | grid row | n | Class-IL | Task-IL | minority tasks' Class-IL |", "|---|---|---|---|---|---|"]
    for label, row in plan.rows.items():
        cells = []
        for mode, metric in (("class_il", "acc"), ("task_il", "acc"), ("class_il", "minority_acc")):
            v = list(_by_seed(counted, plan, mode, metric)[label].values())
            # One seed has no spread: its mean and n, not "± 0.00".
            cells.append("-" if not v else f"{statistics.fmean(v):.2f} ± {statistics.stdev(v):.2f}" if len(v) > 1
                         else f"{v[0]:.2f} (n=1)")
        lines.append(f"| {label} | `{row}` | {len(have[label])} | " + " | ".join(cells) + " |")
    missing = []  # a seed never completed is named, not only counted (docs/preregistration.md)
    for label, row in plan.rows.items():
        cannot = lost.get(row, set())
        pending = set(plan.seeds) - have[label].keys() - cannot
        parts = [report.seed_text(pending)] * bool(pending) + [f"{report.seed_text(cannot)} (cannot be completed)"] * bool(cannot)
        if parts:
            missing.append(f"`{row}` {', '.join(parts)}")
    if missing:
        lines += ["", "Seeds missing: " + "; ".join(missing) + "."]
    lines += ["", "| # | A - B | n | mean | 95% interval | p | Holm p | verdict | the paper |",
              "|---|---|---|---|---|---|---|---|---|"]
    complete = []
    for c in comps:
        # The plan's n: its seeds but those a row of the pair cannot complete. Below it, no verdict yet.
        planned = set(plan.seeds) - lost.get(plan.rows[c.a], set()) - lost.get(plan.rows[c.b], set())
        complete.append(c.n == len(planned))
        if c.n < 2:
            lines.append(f"| {c.name} | {c.a} - {c.b} | {c.n} | - | - | - | - | - | {c.claim} |")
            continue
        low, high = c.interval()
        lines.append(f"| {c.name} | {c.a} - {c.b} | {c.n} | {c.mean:+.2f} | [{low:+.2f}, {high:+.2f}] | "
                     f"{c.p:.3g} | {c.holm:.3g} | {c.verdict() if complete[-1] else '(progress)'} | {c.claim} |")
    notes = [note for g in counted.values() for note in g.notes] + left_out_elsewhere(groups, plan)
    lines += [""] + provenance(counted) if any(g.runs for g in counted.values()) else []
    if notes:
        lines += ([] if lines[-1].startswith(("Runs counted", "- note")) else [""]) + [f"- note: {note}" for note in notes]
    if not all(complete):
        lines += ["", f"INCOMPLETE: the plan is n = {len(plan.seeds)} for every comparison; until then these are "
                      "progress figures, not the pre-registered verdicts. A seed that cannot be completed for a row "
                      "(run again, failed again) is reported as missing and its comparisons use the seeds both rows "
                      "have (docs/preregistration.md): name it with --missing ROW=SEEDS."]
    return "\n".join(lines) + "\n"


def run(tracking_uri: str | None = None, experiment: str = report.DEFAULT_EXPERIMENT, which: str = "defaults",
        missing: list[str] = ()) -> str:
    from pbr.errors import UserError

    if which not in PLANS:
        raise UserError(f"pbr confirm {which}: no such confirmation; use one of {' | '.join(PLANS)}")
    lost = parse_missing(list(missing), PLANS[which])
    uri = tracking_uri or report._default_uri()
    runs = report.collect_runs(uri, experiment, flag=tracking_uri is not None)
    if not runs:
        raise UserError(report.no_runs_message(uri, experiment, f"pbr confirm {which}"))
    groups, _ = report.group_runs(runs)
    return render(groups, PLANS[which], lost)
