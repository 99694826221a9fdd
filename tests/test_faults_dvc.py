"""SIGKILL at chosen instants of prepare, train (inside a task, between tasks) and evaluate: re-running
finishes with results identical to the uninterrupted run, and the execution is one run in the store,
FINISHED (the next try joins the killed one), with every stage's records once.

The kills are placed by `PBR_KILL_AT` (stages/runtime/faults.py): a real SIGKILL, at a chosen instant
instead of a raced one.

The stages here record to plain files (conftest's `records_to_files`, some fifteen stage processes):
the same `stage_run` marks a dead stage's run KILLED and joins it again in either store. MLflow's store
goes through a real kill in test_methods_dvc (ER under `dvc exp run`)."""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time

import pytest

from project import BIN, copy_project, dvc, env, set_params, tree_bytes
pytestmark = pytest.mark.slow


def _killed_repro(repo, point, *args, group=False):
    """`dvc repro` with the stage killed at `point` (with group: dvc killed too); returns its result."""
    e = {**env(), "PBR_KILL_AT": point, "PBR_KILL_GROUP": "1" if group else "0"}
    return subprocess.run([str(BIN / "dvc"), "repro", *args], cwd=repo, env=e, capture_output=True, text=True,
                          start_new_session=True, timeout=600)


def _dvc_killed_under(repo, point):
    """`dvc repro` (under /bin/sh, which does not exec the stage's command) SIGKILLed while its stage
    pauses at `point`; returns once every process it started has ended (or fails after a minute)."""
    mark = repo / "paused"
    e = {k: v for k, v in env().items() if k != "SHELL"}
    e.update(PBR_PAUSE_AT=point, PBR_PAUSE_MARK=str(mark))
    proc = subprocess.Popen([str(BIN / "dvc"), "repro"], cwd=repo, env=e, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 300
        while not mark.exists():
            assert proc.poll() is None and time.time() < deadline, "the stage never reached " + point
            time.sleep(0.2)
        proc.kill()
        proc.wait()
        deadline = time.time() + 60
        while True:
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                break
            assert time.time() < deadline, "the stage outlived the dvc that started it"
            time.sleep(0.2)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    mark.unlink()


def _statuses(records):
    """The statuses of the runs the stages recorded (conftest's records_to_files)."""
    exp = records.get_experiment_by_name("pbr")
    return sorted(r.info.status for r in records.search_runs([exp.experiment_id])) if exp else []


def _assert_same_results(repo, finished, records, statuses):
    assert (repo / "reports/metrics.json").read_text() == (finished / "reports/metrics.json").read_text()
    assert tree_bytes(repo / "artifacts/train") == tree_bytes(finished / "artifacts/train")  # models, buffers, states
    assert (repo / "dvc.lock").read_text() == (finished / "dvc.lock").read_text()
    assert "up to date" in dvc(repo, "status").stdout
    assert _statuses(records) == statuses  # each killed try joined by the next, none left RUNNING


def _each_task_once(records, epochs=2, tasks=5):
    """The run's training records: every epoch's loss and every task's accuracy once, though the
    tries that logged them were killed and the last one resumed (it logs what they had not)."""
    exp = records.get_experiment_by_name("pbr")
    [run] = [r for r in records.search_runs([exp.experiment_id]) if r.info.status == "FINISHED"]
    loss = records.get_metric_history(run.info.run_id, "train.loss")
    assert sorted(m.step for m in loss) == list(range(epochs * tasks))
    assert sorted(m.step for m in records.get_metric_history(run.info.run_id, "class_il.seen_acc")) == list(range(tasks))
    return run


def test_kill_inside_a_task_and_between_tasks_of_train(tmp_path, finished, records_to_files):
    repo = copy_project(finished, tmp_path / "repo")
    shutil.rmtree(repo / "artifacts/train")
    assert _statuses(records_to_files) == []

    r = _killed_repro(repo, "train:task2:epoch0")  # inside task 2 (of 0..4), after its first epoch
    assert r.returncode != 0
    done = sorted(p.name for p in (repo / "artifacts/train").glob("task_*"))
    assert done == ["task_00", "task_01"], done
    assert not (repo / "artifacts/train/accuracy.json").exists()
    assert _statuses(records_to_files).count("RUNNING") == 1  # as the kill left it

    # dvc alone killed (`kill`, a container's stop) while the stage runs under its shell: the stage
    # stops too, as a SIGTERM stops it, rather than training on as an orphan.
    _dvc_killed_under(repo, "train:task3:epoch0")
    done = sorted(p.name for p in (repo / "artifacts/train").glob("task_*"))
    assert done == ["task_00", "task_01", "task_02"], done
    assert _statuses(records_to_files) == ["KILLED"]  # by the stage itself, the killed try before joined

    # Between tasks, and `dvc repro` itself killed with the stage.
    r = _killed_repro(repo, "train:after_task3", group=True)
    assert r.returncode != 0
    assert (repo / "artifacts/train/task_03/state.pt").is_file()
    assert not (repo / "artifacts/train/task_04").exists()

    r = dvc(repo, "repro")
    assert "resuming after task 4 of 5" in r.stdout + r.stderr
    _assert_same_results(repo, finished, records_to_files, ["FINISHED"])
    run = _each_task_once(records_to_files)
    assert run.data.tags["pbr.stage.train"] == "done"  # (score and evaluate: their inputs as before, not run)


def test_kill_during_prepare(tmp_path, finished, records_to_files):
    repo = copy_project(finished, tmp_path / "repo")
    shutil.rmtree(repo / "data/prepared")
    # --force: otherwise DVC restores the output from its run cache and prepare does not run.
    r = _killed_repro(repo, "prepare:written", "--force", "prepare")
    assert r.returncode != 0
    assert not (repo / "data/prepared").exists()  # the written shards were never renamed into place
    assert list((repo / "data").glob(".prepared.tmp-*"))  # what the kill left, under a temporary name
    dvc(repo, "repro", "--force", "prepare")
    dvc(repo, "repro")
    assert tree_bytes(repo / "data/prepared") == tree_bytes(finished / "data/prepared")
    assert not list((repo / "data").glob(".prepared.*"))
    _assert_same_results(repo, finished, records_to_files, ["FINISHED"])


def test_kill_during_evaluate(tmp_path, finished, records_to_files):
    repo = copy_project(finished, tmp_path / "repo")
    shutil.rmtree(repo / "reports/eval")
    os.unlink(repo / "reports/metrics.json")
    r = _killed_repro(repo, "evaluate:partial")
    assert r.returncode != 0
    # The CSVs written so far are in a temporary folder, which replaces reports/eval whole.
    assert list((repo / "reports").glob(".eval.tmp-*/class_il_matrix.csv")) and not (repo / "reports/eval").exists()
    assert not (repo / "reports/metrics.json").exists()
    dvc(repo, "repro")
    assert not list((repo / "reports").glob(".eval.*"))
    for f in ("class_il_matrix.csv", "task_il_matrix.csv", "weight_norms.csv", "buffer_histogram.csv"):
        assert (repo / "reports/eval" / f).read_bytes() == (finished / "reports/eval" / f).read_bytes(), f
    assert json.loads((repo / "reports/metrics.json").read_text()) == json.loads(
        (finished / "reports/metrics.json").read_text())
    assert _statuses(records_to_files) == ["FINISHED"]
    # DVC ran evaluate alone (prepare's output cached, score's inputs as before): the run held evaluate's
    # records only. The stages DVC skipped are recorded from their outputs, as the finished run has them.
    import hashlib

    from mlflow import MlflowClient

    [run] = records_to_files.search_runs(["pbr"])
    assert not any(run.data.tags.get(f"pbr.stage.{s}") for s in ("prepare", "train", "score"))
    client = MlflowClient(f"sqlite:///{repo / 'mlflow.db'}")  # the finished project's whole run
    [whole] = client.search_runs([client.get_experiment_by_name("pbr").experiment_id])
    for key in ("pbr.raw_sha256", "pbr.data_manifest", "pbr.score_sha256", "score.resolved.dropout",
                "score.resolved.temperature", "score.resolved.mc_samples", "score.resolved.backbone"):
        assert run.data.tags.get(key) == whole.data.tags[key], key
    assert run.data.tags["pbr.score_sha256"] == hashlib.sha256((repo / "artifacts/score/scores.parquet").read_bytes()
                                                              ).hexdigest()
    want, got = ({k: v for k, v in r.data.metrics.items() if k.startswith("score.")} for r in (whole, run))
    assert want and got == pytest.approx(want, rel=1e-6, nan_ok=True)
    counts = json.loads((repo / "data/prepared/manifest.json").read_text())["task_train_counts"]
    history = records_to_files.get_metric_history(run.info.run_id, "data.task_train_count")
    assert sorted((m.step, m.value) for m in history) == list(enumerate(counts))
    from pathlib import Path

    logged = {p.relative_to(run.info.artifact_uri).as_posix() for p in Path(run.info.artifact_uri).rglob("*")}
    assert {"prepare/class_counts.csv", "prepare/task_counts.csv", "score/by_class.csv",
            "score/forgotten_vs_kept.png"} <= logged, logged


def test_a_bf16_run_killed_inside_a_task_resumes_to_the_same_bytes(tmp_path, finished, records_to_files, monkeypatch):
    """bf16 autocast keeps the exact resume of fp32: every RNG, the optimizer and the buffer are
    restored, and the bf16 kernels are as deterministic on one machine as the fp32 ones. The
    uninterrupted run is the train stage in this process (the bytes `pbr train` writes)."""
    from stages.pipeline import train
    from stages.runtime.config import load_config

    base = copy_project(finished, tmp_path / "base")
    set_params(base, train__precision="bf16")
    shutil.rmtree(base / "artifacts/train")
    killed = copy_project(base, tmp_path / "killed")

    monkeypatch.chdir(base)
    train.run(load_config(base / "params.yaml"), log=lambda *_: None)
    run = json.loads((base / "artifacts/train/run.json").read_text())
    assert run["settings"]["precision"] == "bf16"

    r = _killed_repro(killed, "train:task2:epoch0", "train")
    assert r.returncode != 0
    assert sorted(p.name for p in (killed / "artifacts/train").glob("task_*")) == ["task_00", "task_01"]
    r = dvc(killed, "repro", "train")
    assert "resuming after task 2 of 5" in r.stdout + r.stderr
    assert tree_bytes(killed / "artifacts/train") == tree_bytes(base / "artifacts/train")
    # bf16 trained other weights than the fp32 run it was copied from: the comparison can fail.
    assert tree_bytes(base / "artifacts/train/task_04") != tree_bytes(finished / "artifacts/train/task_04")


def test_kill_during_score_resumes_at_the_next_task(tmp_path, finished, records_to_files):
    import pyarrow.parquet as pq

    repo = copy_project(finished, tmp_path / "repo")
    shutil.rmtree(repo / "artifacts/score")
    r = _killed_repro(repo, "score:after_task2")
    assert r.returncode != 0 and not (repo / "artifacts/score/scores.parquet").exists()
    r = dvc(repo, "repro")
    assert "took back tasks 1-3 of this scoring" in r.stdout + r.stderr and "scored task 3/5" not in r.stdout
    assert "scored task 4/5" in r.stdout
    assert pq.read_table(repo / "artifacts/score/scores.parquet").equals(
        pq.read_table(finished / "artifacts/score/scores.parquet"))
    assert (repo / "reports/score/by_class.csv").read_bytes() == (finished / "reports/score/by_class.csv").read_bytes()
    assert not list((repo / ".pbr/resume").rglob("score_*.npz"))  # a complete scoring keeps nothing there
    assert "up to date" in dvc(repo, "status").stdout
    assert _statuses(records_to_files) == ["FINISHED"]


def test_a_killed_pbr_ui_takes_its_server_with_it(tmp_path):
    """`pbr ui` runs MLflow's server in a session of its own (so a terminal's Ctrl-C does not reach its
    workers); SIGKILL of pbr ui, which no handler sees, still ends the server: the port closes."""
    import time
    import urllib.request

    from mlflow import MlflowClient

    from project import NO_SERVER_JOBS, free_port

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    MlflowClient(uri).create_experiment("pbr")
    port = free_port()
    ui = subprocess.Popen([str(BIN / "pbr"), "ui", "--port", str(port)], cwd=tmp_path, text=True,
                          env={**env(), **NO_SERVER_JOBS, "MLFLOW_TRACKING_URI": uri},
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def answers():
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            return True
        except OSError:
            return False

    try:
        deadline = time.time() + 120
        while not answers():
            assert ui.poll() is None and time.time() < deadline, "the UI server did not start"
            time.sleep(0.5)
        ui.kill()
        ui.wait(timeout=10)
        deadline = time.time() + 30
        while answers():
            assert time.time() < deadline, "the server outlived its pbr ui"
            time.sleep(0.5)
    finally:
        ui.kill()
        subprocess.run(["pkill", "-f", f"mlflow ui .*--port {port}"], check=False)


def test_a_store_that_cannot_grow_is_one_line_and_the_stage_reruns(tmp_path, finished, pbr_main):
    """A full disk under the MLflow store: sqlite's error came as MLflow's logged traceback and then
    400-600 lines of the CLI's, where a full disk under the outputs was one line. Here the store's
    file may not grow (RLIMIT_FSIZE at its size: sqlite's write fails as on a full disk)."""
    import resource
    import signal

    repo = copy_project(finished, tmp_path / "repo")
    size = (repo / "mlflow.db").stat().st_size

    def cannot_grow():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails (EFBIG) instead of the process dying
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))

    r = subprocess.run([str(BIN / "pbr"), "evaluate"], cwd=repo, env=env(), capture_output=True, text=True,
                       timeout=600, preexec_fn=cannot_grow)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-3000:]
    assert lines[0].startswith("error: the MLflow store (") and "could not be written" in lines[0], lines
    # Space again: the same command finishes (in this process: the same main()).
    r = pbr_main("evaluate", cwd=repo)
    assert r.returncode == 0, r.stderr[-2000:]


def test_the_restore_a_damaged_file_names_works_as_printed(tmp_path, finished, pbr_main):
    """The one line of a damaged task file names a command: run as printed, it restores the file
    (a plain `dvc checkout artifacts/train` refused: "Can't remove the following unsaved files")."""
    import re

    repo = copy_project(finished, tmp_path / "repo")
    state = sorted((repo / "artifacts/train").glob("task_*/state.pt"))[-1]
    whole = state.read_bytes()
    state.write_bytes(whole[:100])
    r = pbr_main("train", cwd=repo)  # in this process (the same main()); the restore, a shell's
    assert r.returncode == 2 and str(state.relative_to(repo)) in r.stderr, r.stderr[-2000:]
    command = re.search(r"restore it with `([^`]+)`", r.stderr).group(1)
    done = subprocess.run(command, shell=True, cwd=repo, env=env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and state.read_bytes() == whole, (command, done.stderr[-2000:])
