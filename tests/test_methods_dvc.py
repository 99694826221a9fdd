"""Methods through the real pipeline and across processes, SIGKILLed between two tasks and run again:
each ends with the bytes of the uninterrupted run (the train stage run once more in this process:
the same code on the same files writes the bytes `pbr train` writes).

ER goes the whole way: `dvc exp run -S method.name=er` killed and run again takes its finished tasks
back from .pbr/resume (dvc exp run checks the baseline's outputs out over them), runs every stage and
leaves MLflow the finished run; none of that depends on the method. The other kinds of saved state
cross processes through `pbr train` killed and run again, and their score and evaluate stages (a
path of their own: PNN's columns have no single head to sample, iCaRL predicts by class means) run
in this process. Every method's save, reload and resume is checked in-process in test_train_stage;
PBR's kills through `dvc repro`, inside a task too, are in test_faults_dvc."""

import json
import re
import subprocess

import pytest

from project import BIN, assert_links_this_execution, copy_project, env, set_params, tree_bytes

pytestmark = pytest.mark.slow


def _exp_run(repo, name, kill_at=None):
    e = {**env(), **({"PBR_KILL_AT": kill_at} if kill_at else {})}
    return subprocess.run([str(BIN / "dvc"), "exp", "run", "-S", f"method.name={name}", "-S", "train.epochs=1"],
                          cwd=repo, env=e, capture_output=True, text=True, timeout=600)


# The kinds of state that take their own path through score and evaluate (CI's time is finite): a
# reservoir (ER, through dvc exp run), exemplars with class means for its own classifier (iCaRL),
# grown columns (PNN). Tensors kept beside the network (oEWC's Fisher and old weights) go the way
# of every method's state, resumed to the bytes in-process for all twenty (test_train_stage).
ACROSS_PROCESSES = ["icarl", "pnn"]


def _uninterrupted(finished, where, name, monkeypatch, **params):
    """The train stage's output of an uninterrupted run of `name` on the finished project's data."""
    import shutil

    from stages.pipeline import train
    from stages.runtime.config import load_config

    ref = copy_project(finished, where)
    shutil.rmtree(ref / "artifacts/train")
    set_params(ref, method__name=name, **params)
    monkeypatch.chdir(ref)
    train.run(load_config(ref / "params.yaml"), log=lambda *_: None)
    return tree_bytes(ref / "artifacts/train")


def test_er_runs_through_dvc_exp_run_and_resumes_after_sigkill(tmp_path, finished, monkeypatch):
    name = "er"
    repo = copy_project(finished, tmp_path / "repo")
    # Killed once every task and accuracy.json are written, before DVC commits the stage: the run must
    # not be lost to the next dvc exp run's checkout of the baseline. (A kill inside the training,
    # resumed from the tasks before it, is test_faults_dvc's, under dvc repro.)
    r = _exp_run(repo, name, kill_at="train:done")
    # DVC runs the command through $SHELL: bash execs it (DVC reports -9), dash forks it and reports
    # the killed child as 137.
    said = r.stdout + r.stderr
    assert r.returncode != 0 and re.search(r"pbr train, exited with (-9|137)\b", said), said[-3000:]
    assert len(list((repo / "artifacts/train").glob("task_*/state.pt"))) == 5
    r = _exp_run(repo, name)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    said = r.stdout + r.stderr
    assert "took back the 5 finished task(s)" in said and "trained 0 task(s)" in said, said[-3000:]
    assert all(f"Running stage '{s}'" in said for s in ("train", "score", "evaluate")), said[-3000:]
    assert not any((repo / ".pbr/resume").iterdir())  # a complete run keeps nothing there

    settings = json.loads((repo / "artifacts/train/run.json").read_text())["settings"]
    assert settings["method"] == name and all(v != "auto" for v in settings.values())
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{repo / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("pbr").experiment_id],
                              filter_string=f"params.`method.name` = '{name}'")
    # One run: the try after the kill (another exp name) went on in the killed try's.
    [done] = runs
    assert done.info.status == "FINISHED"
    assert sorted(m.step for m in client.get_metric_history(done.info.run_id, "train.loss")) == list(range(5))
    assert done.data.metrics["class_il.acc"] == pytest.approx(
        json.loads((repo / "reports/metrics.json").read_text())["class_il"]["acc"], abs=1e-3)
    # Its hashes are the experiment's outputs, not those of the PBR run its dvc.lock started from.
    assert_links_this_execution(done.data.tags, repo)
    # DVC skipped prepare (its output cached): the evaluate stage recorded prepare's part from it.
    assert "pbr.stage.prepare" not in done.data.tags and done.data.tags["pbr.raw_sha256"]
    assert len(client.get_metric_history(done.info.run_id, "data.task_train_count")) == 5
    assert {a.path for a in client.list_artifacts(done.info.run_id, "prepare")} == {
        "prepare/class_counts.csv", "prepare/task_counts.csv"}
    assert re.fullmatch(r"er-cifar10-b200-s0 \(.+\)", done.info.run_name), done.info.run_name  # DVC's name after

    # The experiment and the finished PBR run it started from are two rows of one table, each once.
    from stages.experiments import report

    rep = report.run(tracking_uri=f"sqlite:///{repo / 'mlflow.db'}", csv_path=tmp_path / "report.csv")
    assert sorted((g.runs[0].params["method.name"], len(g.runs)) for g in rep.groups) == [("er", 1), ("pbr", 1)]

    assert tree_bytes(repo / "artifacts/train") == _uninterrupted(finished, tmp_path / "ref", name, monkeypatch,
                                                                  train__epochs=1)


@pytest.mark.parametrize("name", ACROSS_PROCESSES)
def test_method_state_crosses_processes_after_sigkill_and_scores(tmp_path, finished, name, monkeypatch, records_to_files,
                                                                  pbr_main):
    import shutil

    from stages.pipeline import evaluate, score
    from stages.runtime.config import load_config

    repo = copy_project(finished, tmp_path / "repo")
    set_params(repo, method__name=name, train__epochs=1)  # the kill lands between tasks: one epoch will do
    shutil.rmtree(repo / "artifacts/train")
    r = subprocess.run([str(BIN / "pbr"), "train"], cwd=repo, env={**env(), "PBR_KILL_AT": "train:after_task2"},
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == -9, r.stderr[-2000:]
    assert sorted(p.name for p in (repo / "artifacts/train").glob("task_*")) == ["task_00", "task_01", "task_02"]
    # The state crossed processes with the kill; the resume runs the CLI's main in this process.
    r = pbr_main("train", cwd=repo)
    assert r.returncode == 0 and "resuming after task 3 of 5" in r.stdout + r.stderr, r.stderr[-2000:]
    assert tree_bytes(repo / "artifacts/train") == _uninterrupted(finished, tmp_path / "ref", name, monkeypatch,
                                                                  train__epochs=1)

    monkeypatch.chdir(repo)
    cfg = load_config(repo / "params.yaml")
    score.run(cfg, log=lambda *_: None)
    evaluate.run(cfg, log=lambda *_: None)
    from pbr.methods import METHODS

    metrics = json.loads((repo / "reports/metrics.json").read_text())
    mode = "class_il" if METHODS[name].class_il else "task_il"  # PNN predicts with the task's id only
    assert ("class_il" in metrics) == METHODS[name].class_il
    acc = json.loads((repo / "artifacts/train/accuracy.json").read_text())[mode]["matrix"][-1]
    assert metrics[mode]["acc"] == pytest.approx(sum(acc) / len(acc), abs=1e-4)  # the final row's mean
    # The two `pbr train` tries' records (to plain files: conftest's records_to_files): one run, the
    # killed try's, joined by the next, which finished training and logged each task once.
    [done] = records_to_files.search_runs(["pbr"])
    assert done.info.status == "FINISHED" and done.data.tags["pbr.stage.train"] == "done"
    steps = sorted(m.step for m in records_to_files.get_metric_history(done.info.run_id, "class_il.seen_acc"))
    assert steps == [0, 1, 2, 3, 4]


def test_joint_has_no_backward_transfer_or_forgetting(tmp_path, finished, monkeypatch):
    """JOINT learns nothing before the last task: its earlier rows are an untrained network's, so a
    BWT or forgetting read off them (42.5 on a plain matrix) would be a number that means nothing."""
    import shutil

    from stages.pipeline import evaluate, train
    from stages.runtime.config import load_config

    repo = copy_project(finished, tmp_path / "repo")
    set_params(repo, method__name="joint", train__epochs=1)
    shutil.rmtree(repo / "artifacts/train")
    monkeypatch.chdir(repo)
    cfg = load_config(repo / "params.yaml")
    train.run(cfg, log=lambda *_: None)
    said, figs = [], {}
    from stages.runtime import plots

    save = plots._save
    monkeypatch.setattr(plots, "_save", lambda plt, fig, path: (figs.setdefault(path.name, fig), save(plt, fig, path)))
    evaluate.run(cfg, log=said.append)
    metrics = json.loads((repo / "reports/metrics.json").read_text())
    for scen in ("class_il", "task_il"):
        assert {"acc", "minority_acc"} <= set(metrics[scen]) and not {"bwt", "forgetting"} & set(metrics[scen])
    assert "BWT - forgetting -" in said[-1], said[-1]
    # Its figures draw the last row only: the earlier ones are no results.
    for ax in figs["matrices.png"].axes[:2]:
        assert {round(t.get_position()[1]) for t in ax.texts} == {4}, ax.get_title()
    import math

    assert {x for line in figs["class_il_curves.png"].axes[0].get_lines()
            for x, y in zip(line.get_xdata(), line.get_ydata()) if not math.isnan(y)} == {4}
    # DVC's accuracy plot reads the curve's CSV: the last task's row only has values (NaN, which its
    # Vega plot drops; an empty cell it would draw at 0).
    curve = (repo / "reports/eval/accuracy_curve.csv").read_text().splitlines()
    assert curve[0] == "after_task,class_il,task_il" and curve[1:5] == [f"{j},nan,nan" for j in range(4)]
    assert all(math.isfinite(float(v)) for v in curve[5].split(","))
    # Scoring: an earlier task's "own" model is the untrained network, whose right guesses were counted
    # as learned samples and 95.8% of them "forgotten", its MI as the class's uncertainty.
    from stages.pipeline import score

    summary = score.run(cfg, log=lambda *_: None)
    assert all(math.isnan(summary[k]) for k in ("score.forgotten_rate", "score.mi_forgotten", "score.mi_kept"))
    assert math.isfinite(summary["score.mean_mi"])
    import csv

    with open(repo / "reports/score/by_class.csv") as f:
        by_class = list(csv.DictReader(f))
    assert {r["task"] for r in by_class if r["mean_mi"] != "nan"} == {"4"}
    assert all(r["forgotten_rate"] == "nan" for r in by_class)
