"""A stage killed after logging its metrics, before its end, then run again: the next try joins the
killed one's run, and that run holds each (key, step) once, as an uninterrupted run does. The
prepare, score and evaluate stages logged theirs again (train counts its logged tasks)."""

import importlib
import os
import subprocess
import sys

import pytest

import fakedata
from conftest import ROOT
from test_bad_inputs import _copy, _copy_trained, _project, _run_stage_in


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    root = tmp_path_factory.mktemp("raw")
    fakedata.write_cifar(root, 10, 60, 6)
    return root


@pytest.fixture(scope="module")
def trained(tmp_path_factory, raw):
    """ER trained on a small prepared set, as test_bad_inputs' (no run recorded)."""
    from stages.pipeline import prepare, train

    prepared = _run_stage_in(_project(tmp_path_factory.mktemp("prepared"), raw), prepare)
    return _run_stage_in(_copy(prepared, tmp_path_factory.mktemp("trained"), method={"name": "er", "buffer_size": 20}),
                         train)


def _points(reader, run):
    return sorted((m.key, m.step, "nan" if m.value != m.value else m.value) for k in run.data.metrics
                  for m in reader.get_metric_history(run.info.run_id, k))


def _runs(reader):
    return sorted(reader.search_runs(["pbr"]), key=lambda r: r.info.start_time)


@pytest.mark.parametrize("stage", ["prepare", "score", "evaluate"])
def test_a_stage_killed_after_its_metrics_logs_each_once(tmp_path, raw, trained, records_to_files, monkeypatch,
                                                        stage):
    import yaml

    from stages.runtime import faults, tracking
    from stages.runtime.config import load_config

    repo = _copy_trained(trained, tmp_path / "repo")
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["data"]["root"] = str(raw)  # prepare reads it
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    monkeypatch.chdir(repo)
    monkeypatch.setenv("PBR_GIT_COMMIT", "c" * 40)
    cfg = load_config(repo / "params.yaml")
    module = importlib.import_module(f"stages.pipeline.{stage}")

    def once():
        with tracking.stage_run(stage, cfg.flat(), repo / "params.yaml") as run:
            module.run(cfg, log=lambda *_: None, tracker=run)

    once()  # uninterrupted
    [whole] = _runs(records_to_files)
    # The run names the libraries it ran with, as the modules imported here say their versions.
    import platform

    import mlflow
    import numpy
    import pyarrow
    import torch

    import dvc

    tags = {k: v for k, v in whole.data.tags.items() if k.startswith("pbr.version.")}
    tags["pbr.version.torch"] = tags["pbr.version.torch"].split("+")[0]  # its wheel's metadata may lack +cu130
    assert tags == {
        "pbr.version.torch": torch.__version__.split("+")[0], "pbr.version.numpy": numpy.__version__,
        "pbr.version.pyarrow": pyarrow.__version__, "pbr.version.mlflow": mlflow.__version__,
        "pbr.version.dvc": dvc.__version__, "pbr.version.python": platform.python_version()}

    def killed(point):  # as a SIGKILL there: the run left KILLED, the next try joins it
        if point == f"{stage}:logged":
            raise KeyboardInterrupt

    monkeypatch.setattr(faults, "point", killed)
    with pytest.raises(KeyboardInterrupt):
        once()
    monkeypatch.setattr(faults, "point", lambda point: None)
    once()
    first, resumed = _runs(records_to_files)
    assert first.info.run_id == whole.info.run_id and resumed.info.status == "FINISHED"
    got, want = _points(records_to_files, resumed), _points(records_to_files, whole)
    assert want and got == want
    assert len({(k, s) for k, s, _ in got}) == len(got)


def test_a_joined_run_with_other_values_gets_them(tmp_path, records_to_files):
    """The skip is for the same values only: another training's metrics are logged, not hidden."""
    from stages.runtime import journal, tracking

    rec = journal.Recorder(tmp_path / "journal", "pbr")
    run_id = rec.create({})
    tracking.StageRun(rec, run_id).log_once("pbr.score.logged", [(0, {"score.mean_mi": 0.25})])
    joined = records_to_files.search_runs(["pbr"])[0].data.tags
    tracking.StageRun(rec, run_id, joined).log_once("pbr.score.logged", [(0, {"score.mean_mi": 0.25})])
    tracking.StageRun(rec, run_id, joined).log_once("pbr.score.logged", [(0, {"score.mean_mi": 0.5})])
    [run] = records_to_files.search_runs(["pbr"])
    assert [(s, v) for _, s, v in _points(records_to_files, run)] == [(0, 0.25), (0, 0.5)]


def test_a_joined_run_holding_a_param_keeps_it(tmp_path):
    """MLflow refuses to change a param's value: a stage logging the resolved settings as params in a
    run a killed try (or an earlier stage) logged them in skips those it holds, rather than failing."""
    from mlflow import MlflowClient

    from stages.runtime import tracking

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    rec = tracking._MlflowRecorder(client, client.create_experiment("pbr"))
    run_id = rec.create({})
    tracking.StageRun(rec, run_id).log_new_params({"resolved.lr": 0.1})
    joined = tracking.StageRun(rec, run_id, {"pbr.stage": "train"})
    joined.log_new_params({"resolved.lr": 0.1, "resolved.head": "cosine"})
    joined.log_new_params({"resolved.lr": 0.2})
    assert client.get_run(run_id).data.params == {"resolved.lr": "0.1", "resolved.head": "cosine"}


def test_evaluate_sigkilled_after_its_metrics_logs_each_once_in_mlflow(tmp_path, trained, pbr_main):
    """The same through a real SIGKILL (PBR_KILL_AT) of `pbr evaluate`, recording to MLflow's sqlite store.
    The uninterrupted run and the try after the kill run in this process (the same main())."""
    from mlflow import MlflowClient

    repo = _copy_trained(trained, tmp_path / "repo")
    uri = f"sqlite:///{repo / 'mlflow.db'}"
    env = {"MLFLOW_TRACKING_URI": uri, "PBR_GIT_COMMIT": "c" * 40}

    assert pbr_main("evaluate", cwd=repo, env=env).returncode == 0
    killed = subprocess.run([sys.executable, "-m", "stages.cli", "evaluate"], cwd=repo, capture_output=True, text=True,
                            env={**os.environ, **env, "PYTHONPATH": str(ROOT), "PBR_KILL_AT": "evaluate:logged"},
                            timeout=300)
    assert killed.returncode == -9, killed.stderr[-2000:]
    r = pbr_main("evaluate", cwd=repo, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("pbr")
    whole, resumed = sorted(client.search_runs([exp.experiment_id]), key=lambda r: r.info.start_time)
    assert resumed.info.status == "FINISHED"
    got, want = _points(client, resumed), _points(client, whole)
    assert want and got == want
    assert len({(k, s) for k, s, _ in got}) == len(got)
