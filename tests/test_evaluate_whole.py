"""`pbr evaluate` by hand (DVC deletes the outputs first; by hand nothing does) killed midway: the
reports were rewritten one by one, and the kill left the new training's CSVs beside the old
plots and metrics.json, nothing marking the mix. Now a kill leaves the old set whole, or the new
reports/eval without metrics.json."""

import os
import subprocess
import sys

import pytest

import test_records_once
from conftest import ROOT
from test_bad_inputs import _copy_trained, _run_stage_in

raw, trained = test_records_once.raw, test_records_once.trained  # the same fixtures


def _reports(repo):
    files = sorted((repo / "reports/eval").iterdir()) + [repo / "reports/metrics.json"]
    return {f.name: f.read_bytes() for f in files if f.exists()}


@pytest.fixture
def evaluated(tmp_path, trained):
    """The trained project evaluated, then each report made an older training's (other bytes)."""
    from stages.pipeline import evaluate

    repo = _run_stage_in(_copy_trained(trained, tmp_path / "repo"), evaluate)
    new = _reports(repo)
    for name in new:
        f = repo / ("reports/metrics.json" if name == "metrics.json" else f"reports/eval/{name}")
        f.write_bytes(b"old " + name.encode())
    return repo, new


def test_evaluate_killed_while_writing_its_reports_leaves_the_old_set_whole(evaluated, tmp_path):
    repo, _ = evaluated
    old = _reports(repo)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MLFLOW_TRACKING_URI": f"journal:{tmp_path / 'journal'}",
           "PBR_KILL_AT": "evaluate:partial"}  # the CSVs written, the plots not
    r = subprocess.run([sys.executable, "-m", "stages.cli", "evaluate"], cwd=repo, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == -9, r.stderr[-2000:]
    assert _reports(repo) == old


def test_evaluate_killed_before_metrics_json_leaves_none(evaluated, monkeypatch):
    """Killed after reports/eval is replaced: no metrics.json says the reports are not whole."""
    from stages.pipeline import evaluate
    from stages.runtime import artifacts, paths

    repo, new = evaluated
    write_text = artifacts.write_text

    def killed(path, *a, **k):
        if path == paths.METRICS:
            raise KeyboardInterrupt
        return write_text(path, *a, **k)

    monkeypatch.setattr(artifacts, "write_text", killed)
    with pytest.raises(KeyboardInterrupt):
        _run_stage_in(repo, evaluate)
    got = _reports(repo)
    assert sorted(got) == sorted(k for k in new if k != "metrics.json")
    assert all(got[k] == new[k] for k in got if k.endswith(".csv"))
    assert not [k for k, v in got.items() if v.startswith(b"old ")]  # the PNGs drawn anew too


def test_score_interrupted_while_drawing_its_reports_leaves_the_old_set_whole(tmp_path, trained, monkeypatch):
    """The same for reports/score: its CSVs were written, then the plots, one by one."""
    from stages.pipeline import score
    from stages.runtime import plots

    repo = _run_stage_in(_copy_trained(trained, tmp_path / "repo"), score)
    folder = repo / "reports/score"
    for f in folder.iterdir():
        f.write_bytes(b"old " + f.name.encode())
    old = {f.name: f.read_bytes() for f in folder.iterdir()}
    assert len(old) == 4

    def interrupted(*a, **k):  # the CSVs and the scatter written, the histogram not
        raise KeyboardInterrupt

    monkeypatch.setattr(plots, "histograms", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _run_stage_in(repo, score)
    assert {f.name: f.read_bytes() for f in folder.iterdir()} == old
    assert not list((repo / "reports").glob(".score.*"))


def test_a_run_trained_before_unlearned_tasks_went_unevaluated_reports_as_one_trained_after(trained, tmp_path):
    """Training scores no test set of a task not learned yet: null in accuracy.json. A run trained
    before that holds Class-IL's 0 and a Task-IL value there; evaluated, it gives the same bytes
    (metrics.json, the matrices' CSVs with "nan" above the diagonal, the plots)."""
    import json

    from stages.pipeline import evaluate

    new = _reports(_run_stage_in(_copy_trained(trained, tmp_path / "new"), evaluate))
    old = _copy_trained(trained, tmp_path / "old")
    record = old / "artifacts/train/accuracy.json"
    summary = json.loads(record.read_text())
    for scen, filler in (("class_il", 0.0), ("task_il", 50.0)):
        m = summary[scen]["matrix"]
        assert [r[k + 1:] for k, r in enumerate(m)] == [[None] * (4 - k) for k in range(5)]
        summary[scen]["matrix"] = [[filler if v is None else v for v in r] for r in m]
    record.write_text(json.dumps(summary, indent=1))
    assert _reports(_run_stage_in(old, evaluate)) == new
    for scen in ("class_il", "task_il"):
        after_task0 = new[f"{scen}_matrix.csv"].decode().splitlines()[1].split(",")
        assert after_task0[0] == "0" and float(after_task0[1]) >= 0 and after_task0[2:] == ["nan"] * 4
