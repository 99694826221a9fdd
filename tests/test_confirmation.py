"""`pbr confirm`: the pre-registered comparisons on hand-made runs, checked against hand
computations (for 2 degrees of freedom Student's t has P(|T| <= t) = t / sqrt(2 + t^2))."""

import dataclasses
import math
import re

import pytest

from stages.experiments import confirmation, report
from stages.experiments.report import RunRecord

BASE = {"data.setting": "ordered", "data.imbalance_ratio": "0.01", "data.dataset": "cifar10", "data.n_tasks": "5",
        "method.buffer_size": "200", "model.width": "8", "train.epochs": "[4, 8, 16, 40, 80]",
        "method.reservoir": "first_epoch", "train.precision": "fp32", "train.lr": "auto", "train.threads": "1"}
# The head and dropout as the report reads real runs' auto (pin_auto: the resolved.* tags): each
# method's own, so ER's rows differ from PBR's in them as in their lr.
PBR, ER = {"model.head": "cosine", "model.dropout": "0.1"}, {"model.head": "linear", "model.dropout": "0.0"}
ROWS = {"pbr": ({"method.name": "pbr", **PBR}, [50, 52, 54]),
        "pbr-reservoir": ({"method.name": "pbr", "method.pbr.sampling": "reservoir", **PBR}, [48, 48, 48]),
        "pbr-random": ({"method.name": "pbr", "method.pbr.buffer_order": "random", **PBR}, [49, 51, 53]),
        "er-lr0.03": ({"method.name": "er", "train.lr": "0.03", **ER}, [40, 41, 42]),
        "er-lr0.1": ({"method.name": "er", "train.lr": "0.1", **ER}, [60, 61, 66]),
        "pbr-literal": ({"method.name": "pbr", "method.pbr.preset": "paper", **PBR}, [50, 52, 54])}


def _runs():
    runs = []
    for row, (params, values) in ROWS.items():
        for seed, v in zip((100, 101, 102), values):
            runs.append(RunRecord(f"{row}-{seed}", {**BASE, **params, "seed": str(seed)},
                                  {"class_il.acc": float(v), "task_il.acc": 80.0}, 0, {"pbr.device": "cpu"}))
    # Not the confirmation's: a selection seed, a GPU run, a run at another budget, a run of two
    # threads (the plan's runs have one; it would otherwise be averaged into seed 100).
    runs.append(RunRecord("two-threads", {**BASE, **ROWS["pbr"][0], "seed": "100", "train.threads": "2"},
                          {"class_il.acc": 0.0}, 0, {"pbr.device": "cpu"}))
    runs += [RunRecord("sel", {**BASE, **ROWS["pbr"][0], "seed": "3"}, {"class_il.acc": 0.0}, 0, {"pbr.device": "cpu"}),
             RunRecord("gpu", {**BASE, **ROWS["pbr"][0], "seed": "103"}, {"class_il.acc": 0.0}, 0, {"pbr.device": "cuda"}),
             RunRecord("full", {**BASE, **ROWS["pbr"][0], "seed": "104", "model.width": "64", "train.epochs": "50",
                                "method.reservoir": "every_epoch"}, {"class_il.acc": 0.0}, 0, {"pbr.device": "cpu"})]
    return runs


def _p2(mean, sd, n=3):
    t = abs(mean) / (sd / math.sqrt(n))
    return 1 - t / math.sqrt(2 + t * t)


def test_comparisons_intervals_p_holm_and_verdicts_by_hand():
    groups, _ = report.group_runs(_runs())
    comps = {c.name: c for c in confirmation.compare(groups)}
    assert {k: c.n for k, c in comps.items()} == {"C1": 3, "C2": 3, "C3": 3, "C4": 3, "C5": 3}
    c1 = comps["C1"]  # differences 2, 4, 6: mean 4, sd 2
    assert c1.diffs == [2.0, 4.0, 6.0]
    low, high = c1.interval()
    assert (low, high) == pytest.approx((4 - 4.302653 * 2 / math.sqrt(3), 4 + 4.302653 * 2 / math.sqrt(3)), abs=1e-5)
    assert c1.p == pytest.approx(_p2(4, 2), abs=1e-9) and c1.verdict() == "not resolved"
    assert comps["C3"].p == pytest.approx(_p2(11, 1), abs=1e-9) and comps["C3"].verdict() == "above"
    assert comps["C4"].mean == pytest.approx(-31 / 3) and comps["C4"].verdict() == "below"
    assert comps["C2"].p == 0.0 and comps["C5"].p == 1.0 and comps["C5"].verdict() == "not resolved"
    # Holm over the five: p sorted C2 0, C3, C4, C1, C5 get factors 5, 4, 3, 2, 1.
    assert comps["C3"].holm == pytest.approx(4 * _p2(11, 1))
    assert comps["C4"].holm == pytest.approx(3 * _p2(-31 / 3, math.sqrt(7 / 3)))
    assert comps["C1"].holm == pytest.approx(2 * _p2(4, 2)) and comps["C5"].holm == 1.0


def test_holm_is_step_down_and_monotone():
    assert confirmation.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert confirmation.holm([0.5, 0.9]) == [1.0, 1.0]


def test_an_interval_above_zero_that_holm_does_not_keep_says_so():
    c = confirmation.Comparison("Cx", "A", "B", "", [1.0, 1.2, 0.8, 1.1], holm=0.2)
    assert c.interval()[0] > 0 and c.verdict() == "above (not after Holm)"


def test_the_table_says_it_is_incomplete_until_ten_seeds():
    groups, _ = report.group_runs(_runs())
    text = confirmation.render(groups)
    assert "| PBR | `pbr` | 3 | 52.00 ± 2.00 |" in text and "INCOMPLETE" in text


def test_the_second_confirmation_compares_its_own_rows_on_its_own_seeds():
    """C6 reads only `pbr-out0.05` and `pbr` on seeds 200-209: the first plan's seeds and rows are
    not part of it, nor is a GPU run of its seeds."""
    out = {**BASE, "method.name": "pbr", "method.pbr.mi_outliers": "0.05"}
    pbr = {**BASE, "method.name": "pbr"}
    runs = _runs()  # seeds 100-102 of the first plan's rows
    for seed, a, b in ((200, 47.0, 45.0), (201, 44.0, 43.0), (202, 50.0, 46.0)):
        runs += [RunRecord(f"out-{seed}", {**out, "seed": str(seed)}, {"class_il.acc": a}, 0, {"pbr.device": "cpu"}),
                 RunRecord(f"pbr-{seed}", {**pbr, "seed": str(seed)}, {"class_il.acc": b}, 0, {"pbr.device": "cpu"})]
    runs.append(RunRecord("gpu", {**out, "seed": "203"}, {"class_il.acc": 0.0}, 0, {"pbr.device": "cuda"}))
    plan = confirmation.PLANS["outliers"]
    groups, _ = report.group_runs(runs)
    [c6] = confirmation.compare(groups, plan)
    assert (c6.name, c6.n, c6.diffs) == ("C6", 3, [2.0, 1.0, 4.0])  # mean 7/3, sd sqrt(7/3)
    half = 4.302653 * math.sqrt(7 / 3) / math.sqrt(3)
    assert c6.interval() == pytest.approx((7 / 3 - half, 7 / 3 + half), abs=1e-5)
    # One comparison: Holm leaves its p as it is.
    assert c6.holm == c6.p == pytest.approx(_p2(7 / 3, math.sqrt(7 / 3)), abs=1e-9)
    text = confirmation.render(groups, plan)
    assert "seeds 200-209" in text and "| PBR (top 5% MI left out) | `pbr-out0.05` | 3 | 47.00 ± 3.00 |" in text
    assert "| PBR | `pbr` | 3 | 44.67 ± 1.53 |" in text and "INCOMPLETE" in text and "C1" not in text


def test_the_third_confirmation_reads_the_walk_pool_rows_only():
    """C7 pairs `pbr-pool-buffer_and_task` with `pbr` by seed on 200-209; the second plan's reading on
    the same seeds is not part of it."""
    pool = {**BASE, "method.name": "pbr", "method.pbr.walk_pool": "buffer_and_task"}
    out = {**BASE, "method.name": "pbr", "method.pbr.mi_outliers": "0.05"}
    pbr = {**BASE, "method.name": "pbr"}
    runs = []
    for seed, a, b, c in ((200, 46.0, 47.0, 10.0), (201, 45.0, 43.0, 10.0)):
        runs += [RunRecord(f"pool-{seed}", {**pool, "seed": str(seed)}, {"class_il.acc": a}, 0, {"pbr.device": "cpu"}),
                 RunRecord(f"pbr-{seed}", {**pbr, "seed": str(seed)}, {"class_il.acc": b}, 0, {"pbr.device": "cpu"}),
                 RunRecord(f"out-{seed}", {**out, "seed": str(seed)}, {"class_il.acc": c}, 0, {"pbr.device": "cpu"})]
    groups, _ = report.group_runs(runs)
    [c7] = confirmation.compare(groups, confirmation.PLANS["walkpool"])
    assert (c7.name, c7.n, c7.diffs) == ("C7", 2, [-1.0, 2.0])
    text = confirmation.render(groups, confirmation.PLANS["walkpool"])
    assert "| PBR (walk over buffer and task) | `pbr-pool-buffer_and_task` | 2 | 45.50 ± 0.71 |" in text
    assert "top 5% MI" not in text and "INCOMPLETE" in text


def test_a_row_of_one_seed_shows_no_spread():
    """A spread of one seed is no figure (the report's CSV leaves it empty): the cell is the value and n=1."""
    pool = {**BASE, "method.name": "pbr", "method.pbr.walk_pool": "buffer_and_task"}
    runs = [RunRecord(f"pool-{s}", {**pool, "seed": str(s)}, {"class_il.acc": v, "task_il.acc": 80.0}, 0,
                      {"pbr.device": "cpu"}) for s, v in ((200, 46.0), (201, 45.0))]
    runs.append(RunRecord("pbr-200", {**BASE, "method.name": "pbr", "seed": "200"},
                          {"class_il.acc": 47.0, "task_il.acc": 81.0}, 0, {"pbr.device": "cpu"}))
    text = confirmation.render(report.group_runs(runs)[0], confirmation.PLANS["walkpool"])
    assert "| PBR | `pbr` | 1 | 47.00 (n=1) | 81.00 (n=1) | - |" in text
    assert "| PBR (walk over buffer and task) | `pbr-pool-buffer_and_task` | 2 | 45.50 ± 0.71 | 80.00 ± 0.00 | - |" in text


def test_an_unknown_confirmation_is_a_one_line_error():
    from pbr.errors import UserError

    with pytest.raises(UserError, match=re.escape("pbr confirm later: no such confirmation; use one of defaults | outliers | walkpool")):
        confirmation.run("sqlite:///nowhere.db", which="later")


def test_a_store_without_runs_says_to_run_the_confirmation_again(tmp_path):
    from pbr.errors import UserError

    with pytest.raises(UserError) as e:
        confirmation.run(f"sqlite:///{tmp_path}/mlflow.db", which="outliers")
    assert "No finished pipeline runs" in str(e.value) and str(e.value).endswith("then run `pbr confirm outliers` again.")


def test_holm_counts_every_planned_comparison_and_other_cells_stay_out():
    """C4 down to one seed and C5 to none still count in Holm's family of five (as p = 1), and a
    10-task stream's PBR runs, another cell, do not replace the 5-task ones."""
    keep = [r for r in _runs() if not (r.run_id.startswith("er-lr0.1") and r.run_id != "er-lr0.1-100")
            and not r.run_id.startswith("pbr-literal")]
    keep += [RunRecord(f"ten-{seed}", {**BASE, **ROWS["pbr"][0], "data.n_tasks": "10", "seed": str(seed)},
                       {"class_il.acc": 0.0}, 0, {"pbr.device": "cpu"}) for seed in (100, 101, 102)]
    comps = {c.name: c for c in confirmation.compare(report.group_runs(keep)[0])}
    assert comps["C1"].diffs == [2.0, 4.0, 6.0] and (comps["C4"].n, comps["C5"].n) == (1, 0)
    # p sorted: C2 (0), C3, C1, then C4 and C5 at 1: factors 5, 4, 3.
    assert comps["C3"].holm == pytest.approx(4 * _p2(11, 1))
    assert comps["C1"].holm == pytest.approx(3 * _p2(4, 2))
    assert math.isnan(comps["C4"].holm) and math.isnan(comps["C5"].p)


def test_runs_off_the_plans_settings_are_left_out_and_the_notes_say_which_and_how():
    """The plan runs one thread a run and every other key as params.yaml has it: a run of two
    threads, a compiled run, and a run on another data seed are not the plan's runs (they were
    averaged into their seeds, the data seed's into C1-C5 with only a note)."""
    runs = _runs() + [RunRecord("pbr-100-threads", {**BASE, **ROWS["pbr"][0], "seed": "100", "train.threads": "2"},
                                {"class_il.acc": 60.0, "task_il.acc": 80.0}, 1, {"pbr.device": "cpu"}),
                      RunRecord("pbr-101-compiled", {**BASE, **ROWS["pbr"][0], "seed": "101", "train.compile": "true"},
                                {"class_il.acc": 62.0, "task_il.acc": 80.0}, 1, {"pbr.device": "cpu"})]
    runs = [r for r in runs if r.run_id != "pbr-random-102"]
    runs.append(RunRecord("pbr-random-102", {**BASE, **ROWS["pbr-random"][0], "seed": "102", "data.seed": "7"},
                          {"class_il.acc": 99.0, "task_il.acc": 80.0}, 0, {"pbr.device": "cpu"}))
    text = confirmation.render(report.group_runs(runs)[0])
    assert "| PBR | `pbr` | 3 | 52.00 ± 2.00 |" in text  # 50, 52, 54: neither the 60 nor the 62 counted
    assert "| PBR (random) | `pbr-random` | 2 | 50.00 ± 1.41 |" in text  # 49, 51: the data seed 7 run out
    assert re.search(r"\| C2 \| PBR - PBR \(random\) \| 2 \| \+1\.00 \|", text)
    assert re.search(r"- note: .*: 1 run\(s\) not of one thread a run left out", text)
    assert re.search(r"- note: .*run pbr-101-compiled \(seed 101\) left out.*train\.compile true \(the plan's False\)", text)
    assert re.search(r"- note: .*run pbr-random-102 \(seed 102\) left out.*data\.seed 7 \(the plan's 1993\)", text)
    assert "differ in" not in text  # nothing was averaged together


def test_a_row_run_off_the_other_rows_settings_is_left_out():
    """A row whose every run used another batch size is not the plan's row, though its runs agree
    with each other: the rows share every key but their own."""
    runs = [r if not r.run_id.startswith("er-lr0.03") else
            RunRecord(r.run_id, {**r.params, "train.batch_size": "64"}, r.metrics, 0, r.tags) for r in _runs()]
    comps = {c.name: c for c in confirmation.compare(report.group_runs(runs)[0])}
    assert comps["C3"].n == 0 and comps["C1"].n == 3 and comps["C4"].n == 3
    assert re.search(r"ER \(lr 0\.03\).*: 3 runs \(seeds 100-102\) left out, off the plan's settings: "
                     r"train\.batch_size 64 \(the plan's 32\)$", confirmation.render(report.group_runs(runs)[0]), re.M)


def test_the_table_names_the_runs_commits_and_data_and_warns_of_uncommitted_code():
    tags = {"git.commit": "4491350aaaa", "git.dirty": "false", "pbr.data_manifest": "ab" * 32}
    runs = [RunRecord(r.run_id, r.params, r.metrics, 0, {**r.tags, **tags, **({"git.commit": "2ea9635bbbb", "git.dirty": "true"}
                                                                  if r.run_id.startswith("er-") else {})})
            for r in _runs()]
    text = confirmation.render(report.group_runs(runs)[0])
    # 18 plan runs: 6 rows x seeds 100-102, ER's 6 of them from another, dirty checkout.
    assert "Runs counted: 18; code commit: 4491350 (12), 2ea9635 (6); prepared data (pbr.data_manifest): abababababab (18)." in text
    assert "- note: 6 run(s) from a checkout with uncommitted code" in text


def test_the_table_resolves_each_runs_settings_a_few_times_not_per_cell(monkeypatch):
    """A render picked the plan's runs 26 times over and resolved every run's settings once per key of
    each regroup: 64,740 resolves for the 60 runs (a minute). Now the pick is made once."""
    runs = _runs()
    groups, _ = report.group_runs(runs)
    calls, real = [], report.resolved
    monkeypatch.setattr(report, "resolved", lambda p: calls.append(1) or real(p))
    assert "| PBR | `pbr` | 3 | 52.00 ± 2.00 |" in confirmation.render(groups)
    assert len(calls) <= 10 * len(runs)  # the old code: 19,422 for these 22 runs


def test_a_row_run_off_the_plan_in_its_own_keys_is_left_out_whatever_the_number_or_order_of_runs():
    """A row's own keys (lr, head, dropout) were checked against nothing: a row whose every run had
    another dropout counted, and beside as many runs of another dropout the plan's runs counted or
    not by the order of the runs. The plan's settings are known: ER's own lr and dropout are ER's."""
    def dropout(rows, value=99.0):
        return [RunRecord(f"{r.run_id}-d0.3", {**r.params, "model.dropout": "0.3"}, {**r.metrics, "class_il.acc": value},
                          0, r.tags) for r in _runs() if r.run_id.rsplit("-", 1)[0] in rows]

    runs = [r for r in _runs() if not r.run_id.startswith("pbr-random")] + dropout({"pbr-random"})
    comps = {c.name: c for c in confirmation.compare(report.group_runs(runs)[0])}
    assert comps["C2"].n == 0 and comps["C1"].n == 3
    assert re.search(r"PBR \(random\).*: 3 runs \(seeds 100-102\) left out, off the plan's settings: "
                     r"model\.dropout 0\.3 \(the plan's 0\.1\)$", confirmation.render(report.group_runs(runs)[0]), re.M)
    # As many off-plan runs as plan runs, first or last: the plan's count (C2: 50, 52, 54 - 49, 51, 53).
    for runs in (dropout({"pbr-random"}) + _runs(), _runs() + dropout({"pbr-random"})):
        comps = {c.name: c for c in confirmation.compare(report.group_runs(runs)[0])}
        assert comps["C2"].diffs == [1.0, 1.0, 1.0]
    # ER at PBR's dropout is not ER's row.
    runs = [r for r in _runs() if not r.run_id.startswith("er-lr0.1")] + dropout({"er-lr0.1"})
    assert {c.name: c.n for c in confirmation.compare(report.group_runs(runs)[0])}["C4"] == 0


def test_runs_recorded_in_the_old_spelling_are_the_plans():
    """The first confirmation's runs were recorded before each method's keys moved under its name,
    their auto values in their resolved.* tags: read as `pbr report` reads them, they count."""
    from stages.runtime.config import ADDED_LATER

    # As `pbr report` reads every run: the keys added since with the value before them.
    runs = [dataclasses.replace(r, params={**ADDED_LATER, **r.params}) for r in _runs()
            if not r.run_id.startswith(("pbr-random", "pbr-literal"))]
    for row, key, values in (("pbr-random", {"method.buffer_order": "random"}, (49, 51, 53)),
                             ("pbr-literal", {"method.preset": "paper"}, (50, 52, 54))):
        tags = {"pbr.device": "cpu", "resolved.head": "cosine", "resolved.dropout": "0.1"}
        tags.update({"resolved.tau1": "0.1", "resolved.lr": "0.03"} if row == "pbr-literal" else {"resolved.tau1": "1.0"})
        for seed, v in zip((100, 101, 102), values):
            old = {**BASE, "method.name": "pbr", "method.tau1": "auto", "method.reservoir": "first_epoch",
                   "model.head": "auto", "model.dropout": "auto", **key, "seed": str(seed)}
            runs.append(RunRecord(f"{row}-{seed}", report.pin_auto(report.respell({**ADDED_LATER, **old}), tags),
                                  {"class_il.acc": float(v)}, 0, tags))
    comps = {c.name: c for c in confirmation.compare(report.group_runs(runs)[0])}
    assert comps["C2"].diffs == [1.0, 1.0, 1.0] and comps["C5"].diffs == [0.0, 0.0, 0.0]


def test_runs_on_the_plans_seeds_left_out_for_their_machine_budget_or_row_are_counted_in_a_note():
    """Every run on a GPU: each row had n = 0 and the table said nothing but INCOMPLETE. Now each
    group of the plan's stream with runs on its seeds that it leaves out gets one note."""
    cuda = [dataclasses.replace(r, tags={"pbr.device": "cuda"}) for r in _runs() if r.params["seed"] != "3"]
    text = confirmation.render(report.group_runs(cuda)[0])
    assert "| PBR | `pbr` | 0 | - |" in text
    notes = [line for line in text.splitlines() if "left out: device cuda (the plan's cpu)" in line]
    assert len(notes) == 6  # one a row, the 'full' run's (another budget) beside them
    assert "- note: PBR, buffer 200, Seq-CIFAR-10-LT (5 tasks): 5 run(s) on seed(s) 100-103 left out: " \
           "device cuda (the plan's cpu)" in text  # 100-102, the 'gpu' 103 and the two-threads 100
    assert "PBR, buffer 200, Seq-CIFAR-10-LT (5 tasks): 1 run(s) on seed(s) 104 left out: budget full protocol " \
           "(the plan's proxy); device cuda (the plan's cpu)" in text
    # A row the plan does not have (PBR in random order with a linear head), on its seeds and stream.
    linear = RunRecord("lin", {**BASE, **ROWS["pbr-random"][0], "model.head": "linear", "seed": "101"},
                       {"class_il.acc": 1.0}, 0, {"pbr.device": "cpu"})
    text = confirmation.render(report.group_runs([*_runs(), linear])[0])
    assert re.search(r"- note: PBR \(random, linear\).*: 1 run\(s\) on seed\(s\) 101 left out: not one of the plan's rows$",
                     text, re.M)


def _ten(skip=()):
    """Every row on seeds 100-109, PBR 1 above each other row but for a tenth on odd seeds."""
    return [RunRecord(f"{row}-{s}", {**BASE, **params, "seed": str(s)},
                      {"class_il.acc": 50.0 + s % 3 - (0 if row == "pbr" else 1 - 0.1 * (s % 2)), "task_il.acc": 80.0},
                      0, {"pbr.device": "cpu"})
            for row, (params, _) in ROWS.items() for s in range(100, 110) if (row, s) not in skip]


def test_a_seed_not_run_is_named_and_no_verdict_is_printed_before_the_planned_n():
    """A seed never completed was only a smaller n, and a verdict printed at n = 3 or 9 read like the
    registered one. The plan: a seed that cannot be completed is reported as missing and its rows'
    comparisons use the seeds both have: `--missing` says which, and those verdicts are final."""
    text = confirmation.render(report.group_runs(_runs())[0])
    assert "| C3 | PBR - ER (lr 0.03) | 3 | +11.00 | [+8.52, +13.48] | 0.00274 | 0.011 | (progress) |" in text
    assert "Seeds missing: `pbr` 103-109; `pbr-random` 103-109; " in text
    groups = report.group_runs(_ten(skip={("pbr-random", 104)}))[0]
    text = confirmation.render(groups)
    assert "Seeds missing: `pbr-random` 104.\n" in text and "INCOMPLETE" in text
    assert re.search(r"\| C2 \| PBR - PBR \(random\) \| 9 \|.*\| \(progress\) \|", text)
    assert re.search(r"\| C1 \| PBR - PBR \(online reservoir\) \| 10 \|.*\| above \|", text)
    text = confirmation.render(groups, lost=confirmation.parse_missing(["pbr-random=104"]))
    assert "Seeds missing: `pbr-random` 104 (cannot be completed).\n" in text and "INCOMPLETE" not in text
    assert re.search(r"\| C2 \| PBR - PBR \(random\) \| 9 \|.*\| above \|", text)


def test_missing_seeds_given_wrong_are_one_line_errors():
    from pbr.errors import UserError

    with pytest.raises(UserError, match=re.escape("--missing pbr-randm=104: write it as ROW=SEEDS with ROW one of pbr, "
                                                  "pbr-random, pbr-reservoir, er-lr0.03, er-lr0.1, pbr-literal, "
                                                  "e.g. --missing pbr=103")):
        confirmation.parse_missing(["pbr-randm=104"])
    with pytest.raises(UserError, match=re.escape("--missing pbr=5: seed 5 is not one of the plan's (100-109)")):
        confirmation.parse_missing(["pbr=5"])
    with pytest.raises(UserError, match=re.escape("--missing pbr=101: seed 101 has a counted run; --missing names the "
                                                  "seeds that cannot be completed")):
        confirmation.render(report.group_runs(_runs())[0], lost=confirmation.parse_missing(["pbr=101"]))


def test_a_sweep_warns_of_cells_on_seeds_kept_for_a_confirmation_and_the_report_flags_their_rows():
    """`pbr sweep fidelity --budget proxy --seeds 100-109` planned 35 readings on the first
    confirmation's seeds without a word: a reading chosen by them would leave no unseen seeds."""
    from pathlib import Path

    from stages.experiments import sweep

    params = Path(__file__).resolve().parent.parent / "params.yaml"
    runs = sweep.plan("fidelity", [100], {}, {}, params, "proxy")
    assert sweep.reserved_seeds_warning("fidelity", runs, "proxy") == (
        f"{len(runs) - 6} of the {len(runs)} runs use seeds 100, kept for pre-registered confirmations "
        "(docs/preregistration.md), in cells that are none of their rows: a choice made on them spends those seeds "
        "(choices use the selection seeds 0-9)")  # the plan's six rows are its own
    rows = {"only": ["pbr", "pbr-random", "pbr-reservoir", "er-lr0.03", "er-lr0.1", "pbr-literal"]}
    assert sweep.reserved_seeds_warning("fidelity", [r for r in runs if r.row in rows["only"]], "proxy") is None
    assert sweep.reserved_seeds_warning("fidelity", [sweep.Run("a", {"seed": 3}, row="pbr-out0.05")], "proxy") is None
    assert sweep.reserved_seeds_warning("fidelity", [sweep.Run("a", {"seed": 304}, row="pbr")], "proxy").startswith(
        "1 of the 1 runs use seeds 304, kept")  # the next confirmation's block
    # The report: a reading on the first plan's seeds, and PBR on the next block's.
    out = {**BASE, **ROWS["pbr"][0], "method.pbr.mi_outliers": "0.05"}
    extra = [RunRecord(f"x-{s}", {**(out if s < 300 else {**BASE, **ROWS["pbr"][0]}), "seed": str(s)},
                       {"class_il.acc": 1.0}, 0, {"pbr.device": "cpu"}) for s in (100, 101, 300)]
    text = report.render_markdown(report.group_runs(_runs() + extra)[0])
    flagged = [line for line in text.splitlines() if "kept for pre-registered confirmations" in line]
    said = ": computed on seeds {}, kept for pre-registered confirmations (docs/preregistration.md) and not one of " \
           "their rows: a choice made by it spends those seeds"
    assert "- note: PBR (top 5% MI left out) [cpu, fp32], buffer 200, Seq-CIFAR-10-LT (5 tasks)" + said.format("100-101") \
        in flagged
    assert "- note: PBR [cpu, fp32], buffer 200, Seq-CIFAR-10-LT (5 tasks)" + said.format(300) in flagged
    assert "- note: PBR [cuda, fp32], buffer 200, Seq-CIFAR-10-LT (5 tasks)" + said.format(103) in flagged
    assert len(flagged) == 4  # and the full budget's 104; none for the plan's rows in its cell
    assert "seeds 3 averaged with a pre-registered confirmation's 100-109" in text  # 300 is no selection seed


def test_the_verdict_reads_the_holm_adjusted_p_not_the_raw_one():
    """docs/preregistration.md: a verdict whose Holm-adjusted p is above 0.05 is printed "(not after
    Holm)", whatever its own p."""
    diffs = [1.0, 1.2, 0.8, 1.1]
    assert confirmation.Comparison("Cx", "A", "B", "", diffs, p=0.01, holm=0.2).verdict() == "above (not after Holm)"
    assert confirmation.Comparison("Cx", "A", "B", "", diffs, p=0.01, holm=0.04).verdict() == "above"
    assert confirmation.Comparison("Cx", "A", "B", "", [-d for d in diffs], p=0.01, holm=0.3).verdict() == \
        "below (not after Holm)"


def test_a_seed_the_reference_row_cannot_complete_makes_every_comparison_final_at_nine():
    """PBR is A of every comparison of the first plan: its seed 104 named with --missing leaves each
    comparison its nine seeds both rows have, and those are the verdicts, not progress figures."""
    groups = report.group_runs(_ten(skip={("pbr", 104)}))[0]
    text = confirmation.render(groups, lost=confirmation.parse_missing(["pbr=104"]))
    assert "Seeds missing: `pbr` 104 (cannot be completed).\n" in text and "INCOMPLETE" not in text
    rows = [line for line in text.splitlines() if re.match(r"\| C\d \|", line)]
    assert len(rows) == 5 and all(" | 9 | " in r and "(progress)" not in r for r in rows), rows


def test_a_run_recording_a_setting_the_plan_does_not_have_is_left_out():
    """A key the plan does not know (a setting of other code) is not the plan's: the run is left out
    and the note names the key; the row keeps its three seeds."""
    extra = RunRecord("extra", {**BASE, **ROWS["pbr"][0], "seed": "103", "train.shiny": "1"},
                      {"class_il.acc": 0.0}, 0, {"pbr.device": "cpu"})
    text = confirmation.render(report.group_runs([*_runs(), extra])[0])
    assert "| PBR | `pbr` | 3 | 52.00 ± 2.00 |" in text
    assert "run extra (seed 103) left out, off the plan's settings: train.shiny 1 (the plan's <unset>)" in text


def test_a_cpu_run_in_bf16_on_the_plans_seeds_is_left_out_with_a_note():
    bf16 = RunRecord("bf", {**BASE, **ROWS["pbr"][0], "seed": "103", "train.precision": "bf16"},
                     {"class_il.acc": 0.0}, 0, {"pbr.device": "cpu"})
    text = confirmation.render(report.group_runs([*_runs(), bf16])[0])
    assert "| PBR | `pbr` | 3 | 52.00 ± 2.00 |" in text
    assert "PBR [cpu, bf16], buffer 200, Seq-CIFAR-10-LT (5 tasks): 1 run(s) on seed(s) 103 left out: " \
           "precision bf16 (the plan's fp32)" in text


def test_missing_seeds_as_a_range_include_both_ends():
    assert confirmation.parse_missing(["pbr-random=103-105", "pbr=109"]) == {"pbr-random": {"103", "104", "105"},
                                                                          "pbr": {"109"}}


def test_counted_runs_are_never_said_to_be_left_out():
    """Only runs the plan does not count get a "left out" note, each with its reason: the plan's rows'
    seeds 100-102 are counted (n = 3 each) and named in no such note."""
    text = confirmation.render(report.group_runs(_runs())[0])
    notes = [line for line in text.splitlines() if line.startswith("- note:") and "left out" in line]
    assert notes and not any(n.rstrip().endswith("left out:") for n in notes), notes
    assert not any("100-102" in n for n in notes), notes


def test_two_seeds_get_a_p_and_a_verdict():
    """C7 on two seeds (differences -1 and 2: mean 0.5, sd 3/sqrt 2, se 1.5, t = 1/3): Student's t
    with 1 degree of freedom is Cauchy, p = 1 - (2/pi) atan(1/3) = 0.7952; one comparison: Holm
    leaves it. A pair of seeds is enough for the interval, so for the p too."""
    pool = {**BASE, "method.name": "pbr", "method.pbr.walk_pool": "buffer_and_task"}
    runs = [RunRecord(f"{k}-{s}", {**(pool if k == "pool" else {**BASE, "method.name": "pbr"}), "seed": str(s)},
                      {"class_il.acc": v}, 0, {"pbr.device": "cpu"})
            for s, a, b in ((200, 46.0, 47.0), (201, 45.0, 43.0)) for k, v in (("pool", a), ("pbr", b))]
    [c7] = confirmation.compare(report.group_runs(runs)[0], confirmation.PLANS["walkpool"])
    assert c7.diffs == [-1.0, 2.0]
    assert c7.p == pytest.approx(1 - 2 / math.pi * math.atan(1 / 3), abs=1e-9) and c7.holm == c7.p
    assert c7.verdict() == "not resolved"
