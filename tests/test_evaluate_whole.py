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
