"""`pbr import` and the offline fallback: runs recorded by the stage code into one sqlite store (or
an unreachable server's offline store), copied into another, compared field by field."""

import contextlib
import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pbr.errors import UserError
from stages.experiments import report, sync
from stages.runtime import journal, tracking

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning")

PARAMS = {"method.name": "er", "method.buffer_size": 200, "data.dataset": "cifar10", "data.setting": "ordered",
          "data.imbalance_ratio": 0.01, "data.n_tasks": 5, "train.epochs": 2, "seed": 0}
STEPS = 1234  # train.loss points of the complete run: more than one log_batch of 1000
ARTIFACT = bytes(range(256)) * 5


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """An empty sqlite store: MLflow takes seconds to create its tables, a copy takes milliseconds."""
    from mlflow import MlflowClient

    db = tmp_path_factory.mktemp("template") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{db}").search_experiments()
    return db


def _store(template: Path, folder: Path) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(template, folder / "mlflow.db")
    return f"sqlite:///{folder / 'mlflow.db'}"


def _record(repo: Path) -> None:
    """Three runs through tracking.stage_run in `repo`: a complete one (train then evaluate, a long
    loss history, an artifact), a failed one, and one whose stage is still running."""
    params_file = repo / "params.yaml"
    params_file.write_text("seed: 0\n")
    (repo / "accuracy.json").write_bytes(ARTIFACT)
    with tracking.stage_run("train", PARAMS, params_file) as run:
        run.log_series([(s, {"train.loss": 2.0 / (s + 1), "train.accuracy": s % 97}) for s in range(STEPS)])
        run.log_artifact(repo / "accuracy.json", "train")
    with tracking.stage_run("evaluate", PARAMS, params_file) as run:
        run.log_metrics({"class_il.acc": 41.5, "task_il.acc": 80.25})
        run.log_series([(t, {"class_il.final_task_acc": 10.0 * t}) for t in range(5)])
        run.set_tags({"pbr.complete": "true"})
    params_file.write_text("seed: 1\n")  # another pipeline key: a new run
    with pytest.raises(RuntimeError), tracking.stage_run("train", {**PARAMS, "seed": 1}, params_file) as run:
        run.log_metrics({"train.loss": 3.0}, step=0)
        raise RuntimeError("out of memory")
    tracking.recorder().create({"pbr.stage": "train", "mlflow.runName": "still-going"})


@pytest.fixture(scope="module")
def source(template, tmp_path_factory):
    """The offline folder of a node, copied back to another path (so its stored artifact paths,
    which are absolute, point to where it no longer is)."""
    node = tmp_path_factory.mktemp("node") / "offline"
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path_factory.mktemp("elsewhere"))
        mp.setenv("MLFLOW_TRACKING_URI", _store(template, node))
        _record(node)
    home = tmp_path_factory.mktemp("home") / "offline"
    shutil.move(node, home)
    return home


def _by_origin(uri: str) -> dict:
    from mlflow import MlflowClient

    c = MlflowClient(tracking_uri=uri)
    exp = c.get_experiment_by_name("pbr")
    return {r.data.tags[sync.ORIGIN_TAG]: r for r in c.search_runs([exp.experiment_id], max_results=1000)}


def _history(uri: str, run) -> dict:
    from mlflow import MlflowClient

    c = MlflowClient(tracking_uri=uri)
    return {k: sorted((m.value, m.timestamp, m.step) for m in c.get_metric_history(run.info.run_id, k))
            for k in run.data.metrics}


def _files(uri: str, run, where: Path) -> dict[str, bytes]:
    from mlflow import MlflowClient

    return _tree(Path(MlflowClient(tracking_uri=uri).download_artifacts(run.info.run_id, "", dst_path=str(where))))


def _tree(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in d.rglob("*") if p.is_file()}


def _source_runs(folder: Path) -> list:
    from mlflow import MlflowClient

    c = MlflowClient(tracking_uri=f"sqlite:///{folder / 'mlflow.db'}")
    return c.search_runs([c.get_experiment_by_name("pbr").experiment_id], max_results=1000)


def test_import_copies_every_field_and_report_counts_it(source, template, tmp_path):
    target = _store(template, tmp_path / "project")
    lines = []
    t0 = time.time()
    out = sync.import_runs(str(source), target, "pbr", log=lines.append)
    seconds = time.time() - t0
    assert out.summary().startswith("imported 2 runs (0 already present, 1 skipped)")
    assert any(line.startswith("skipped still-going") and "RUNNING" in line for line in lines)
    src_uri = f"sqlite:///{source / 'mlflow.db'}"
    copies = _by_origin(target)
    src = {r.info.run_id: r for r in _source_runs(source)}
    assert set(copies) == {i for i, r in src.items() if r.info.status != "RUNNING"}
    for origin, copy in copies.items():
        s = src[origin]
        assert copy.info.run_id != origin
        assert copy.data.params == s.data.params
        extra = {sync.ORIGIN_TAG, sync.VERSION_TAG, sync.SOURCE_TAG, sync.BARE_TAG}
        assert {k: v for k, v in copy.data.tags.items() if k not in extra} == s.data.tags
        # The failed run logged no artifact: its copy says it was made without (a later import replaces it if some come)
        assert (sync.BARE_TAG in copy.data.tags) == (not (source / "mlartifacts" / origin).exists())
        assert copy.data.tags[sync.SOURCE_TAG] == str(source)
        assert (copy.info.status, copy.info.start_time, copy.info.end_time, copy.info.run_name) == \
               (s.info.status, s.info.start_time, s.info.end_time, s.info.run_name)
        assert _history(target, copy) == _history(src_uri, s)
        # The source's stored artifact paths name the node's folder: read them where they were copied.
        assert _files(target, copy, tmp_path / "dst" / origin) == _tree(source / "mlartifacts" / origin / "artifacts")
    done = next(c for c in copies.values() if c.info.status == "FINISHED")
    assert len(_history(target, done)["train.loss"]) == STEPS
    assert _files(target, done, tmp_path / "check") == {"train/accuracy.json": ARTIFACT}
    # The artifacts now live beside the project's store, not in the copied-back folder.
    assert (tmp_path / "project" / "mlartifacts").is_dir()
    assert [r.metrics["class_il.acc"] for r in report.collect_runs(target, "pbr")] == [41.5]
    assert "41.50" in report.run(tracking_uri=target, csv_path=None).text
    print(f"imported 2 runs ({STEPS * 2 + 12} metric points, 1 artifact) in {seconds:.2f} s")


def test_a_second_import_copies_nothing_new(source, template, tmp_path):
    target = _store(template, tmp_path / "project")
    sync.import_runs(str(source), target, "pbr", log=lambda m: None)
    before = _by_origin(target)
    # The same folder, copied once more to another place, is still the same runs.
    again = tmp_path / "copy2"
    shutil.copytree(source, again)
    out = sync.import_runs(str(again / "mlflow.db"), target, "pbr", log=lambda m: None)
    assert out.summary().startswith("imported 0 runs (2 already present, 1 skipped)")
    assert out.summary().endswith("nothing new")
    after = _by_origin(target)
    assert {o: r.info.run_id for o, r in after.items()} == {o: r.info.run_id for o, r in before.items()}


def test_a_run_that_changed_in_the_source_replaces_its_copy(source, template, tmp_path):
    from mlflow import MlflowClient
    from mlflow.entities import Metric

    folder = tmp_path / "offline"
    shutil.copytree(source, folder)
    target = _store(template, tmp_path / "project")
    sync.import_runs(str(folder), target, "pbr", log=lambda m: None)
    stale = shutil.copytree(folder, tmp_path / "laptop")  # a store that took its copies before the change
    failed = next(r for r in _source_runs(folder) if r.info.status == "FAILED")
    # Its stage is run again on the node and records more (the next import happens after that).
    c = MlflowClient(tracking_uri=f"sqlite:///{folder / 'mlflow.db'}")
    c.log_batch(failed.info.run_id, metrics=[Metric("train.loss", 1.5, 1, 1)])
    c.set_terminated(failed.info.run_id, "FINISHED", end_time=failed.info.end_time + 1000)
    out = sync.import_runs(str(folder), target, "pbr", log=lambda m: None)
    assert (out.imported, out.replaced, out.present) == (1, 1, 1)
    copy = _by_origin(target)[failed.info.run_id]  # active runs only: the old copy is deleted
    now = c.get_run(failed.info.run_id)
    assert (copy.info.status, copy.info.end_time) == ("FINISHED", failed.info.end_time + 1000)
    assert _history(target, copy) == _history(f"sqlite:///{folder / 'mlflow.db'}", now)
    assert len(_history(target, copy)["train.loss"]) == 2
    # The store that copied the run before it changed, imported later, does not bring the old copy back.
    out = sync.import_runs(str(stale), target, "pbr", log=lambda m: None)
    assert (out.imported, out.replaced, out.present) == (0, 0, 2)
    assert _by_origin(target)[failed.info.run_id].info.end_time == failed.info.end_time + 1000
    # A stage here went on in the copy (the server back mid-pipeline: evaluate joined it) and the
    # source changed too: the copy was replaced, and evaluate's records went with it.
    copy = _by_origin(target)[failed.info.run_id]
    t = MlflowClient(tracking_uri=target)
    t.update_run(copy.info.run_id, status="RUNNING")
    t.log_batch(copy.info.run_id, metrics=[Metric("class_il.acc", 40.0, 2, 0)])
    t.set_terminated(copy.info.run_id, "FINISHED", end_time=failed.info.end_time + 5000)
    c.log_batch(failed.info.run_id, metrics=[Metric("train.loss", 1.25, 3, 2)])
    c.set_terminated(failed.info.run_id, "FINISHED", end_time=failed.info.end_time + 9000)
    lines = []
    out = sync.import_runs(str(folder), target, "pbr", log=lines.append)
    assert (out.imported, out.replaced) == (0, 0) and any(line.startswith("kept ") for line in lines)
    assert _by_origin(target)[failed.info.run_id].data.metrics["class_il.acc"] == 40.0


def test_an_import_cut_short_is_deleted_and_copied_again(source, template, tmp_path):
    from mlflow import MlflowClient
    from mlflow.entities import Metric

    target = _store(template, tmp_path / "project")
    done = next(r for r in _source_runs(source) if r.info.status == "FINISHED")
    # What an import killed after the first metric batch leaves: a copy without its origin tag.
    c, exp_id = tracking.open_experiment(target, "pbr")
    part = c.create_run(exp_id, tags={sync.PENDING_TAG: done.info.run_id}, run_name=done.info.run_name)
    c.log_batch(part.info.run_id, metrics=[Metric("train.loss", 2.0, 1, 0)])
    lines = []
    out = sync.import_runs(str(source), target, "pbr", log=lines.append)
    assert out.imported == 2 and any(line.startswith(f"deleted {done.info.run_name}") for line in lines)
    assert MlflowClient(tracking_uri=target).get_run(part.info.run_id).info.lifecycle_stage == "deleted"
    copy = _by_origin(target)[done.info.run_id]
    assert len(_history(target, copy)["train.loss"]) == STEPS and sync.PENDING_TAG not in copy.data.tags
    assert sync.BY_TAG not in copy.data.tags


def test_a_copy_another_import_is_making_is_left_alone(source, template, tmp_path):
    """Two teammates import into one server at once: a part copy whose importer is alive is not an
    import cut short (deleting it failed the other import, or lost its copy)."""
    import socket
    import subprocess
    import sys
    import time

    from mlflow import MlflowClient

    target = _store(template, tmp_path / "project")
    c, exp_id = tracking.open_experiment(target, "pbr")

    def import_beside(importer, age_s=0.0):
        """A part copy by `importer`'s pid on this machine, `age_s` old; an import; its state after."""
        by = f"{socket.gethostname()} {importer.pid} {time.time() - age_s:.0f}"
        part = c.create_run(exp_id, tags={sync.PENDING_TAG: "elsewhere", sync.BY_TAG: by}).info.run_id
        sync.import_runs(str(source), target, "pbr", log=lambda m: None)
        return part, MlflowClient(tracking_uri=target).get_run(part).info.lifecycle_stage

    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # the other import
    try:
        making, state = import_beside(other)
        assert state == "active"
        # Two hours old under a live pid of this machine: a pid taken since by another process (it
        # held the import back for as long as that process lived).
        assert import_beside(other, age_s=7200)[1] == "deleted"
    finally:
        other.kill()
        other.wait()
    lines = []  # that importer gone, its part copy is what an import cut short leaves
    sync.import_runs(str(source), target, "pbr", log=lines.append)
    assert MlflowClient(tracking_uri=target).get_run(making).info.lifecycle_stage == "deleted"
    assert any(line.startswith("deleted ") for line in lines)


def test_an_old_file_store_imports_too(template, tmp_path, monkeypatch):
    from mlflow import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    old = tmp_path / "mlruns"
    c = MlflowClient(tracking_uri=old.as_uri())
    run = c.create_run(c.create_experiment("pbr"), run_name="old")
    for step in range(3):
        c.log_metric(run.info.run_id, "train.loss", 1.0 / (step + 1), step=step, timestamp=100 + step)
    (tmp_path / "a.txt").write_text("x")
    c.log_artifact(run.info.run_id, str(tmp_path / "a.txt"))
    c.set_terminated(run.info.run_id)
    target = _store(template, tmp_path / "project")
    assert sync.import_runs(str(old), target, "pbr", log=lambda m: None).imported == 1
    copy = _by_origin(target)[run.info.run_id]
    assert _history(target, copy) == {"train.loss": [(1 / 3, 102, 2), (0.5, 101, 1), (1.0, 100, 0)]}
    assert _files(target, copy, tmp_path / "dl") == {"a.txt": b"x"}


def test_mistakes_are_one_line_errors(source, template, tmp_path):
    target = _store(template, tmp_path / "project")
    with pytest.raises(UserError, match="is the store it would import into"):
        sync.import_runs(str(tmp_path / "project"), target, "pbr")
    with pytest.raises(UserError, match="has no experiment 'other' \\(it has: .*pbr"):
        sync.import_runs(str(source), target, "other")
    bare = tmp_path / "bare"
    shutil.copytree(source, bare, ignore=shutil.ignore_patterns("mlartifacts"))
    with pytest.raises(UserError, match="mlartifacts.*--no-artifacts"):
        sync.import_runs(str(bare), target, "pbr")
    assert sync.import_runs(str(bare), target, "pbr", with_artifacts=False, log=lambda m: None).imported == 2


def _journal_folder(tmp_path_factory) -> Path:
    """The same three runs as `source`, recorded to plain files (journal:, as on a machine without
    MLflow), then copied back to another path."""
    node = tmp_path_factory.mktemp("node") / "offline"
    node.mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path_factory.mktemp("elsewhere"))
        mp.setenv("MLFLOW_TRACKING_URI", journal.uri(node / sync.JOURNAL_DIR))
        _record(node)
    home = tmp_path_factory.mktemp("home") / "offline"
    shutil.move(node, home)
    return home


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    return _journal_folder(tmp_path_factory)


def _comparable(uri: str, run) -> tuple:
    """What a run records, less what differs between two recordings of it (ids, times, its origin, the
    folder it ran in, the process's start; the heartbeat, which MLflow stores only get)."""
    extra = {sync.ORIGIN_TAG, sync.VERSION_TAG, sync.SOURCE_TAG, sync.BARE_TAG, "pbr.checkout", "pbr.workdir",
             "pbr.pid_start", "pbr.heartbeat"}
    history = {k: sorted((v, step) for v, _, step in h) for k, h in _history(uri, run).items()}
    return (run.info.run_name, run.info.status, run.data.params, {k: v for k, v in run.data.tags.items()
                                                                  if k not in extra}, history)


def test_runs_recorded_to_plain_files_import_as_the_mlflow_ones(source, plain, template, tmp_path):
    """Recorded by the same stage calls to sqlite and to plain files, then imported: the same runs
    (name, status, params, tags, every metric's history, artifacts), the unfinished one skipped."""
    a, b = _store(template, tmp_path / "a"), _store(template, tmp_path / "b")
    sync.import_runs(str(source), a, "pbr", log=lambda m: None)
    lines = []
    out = sync.import_runs(str(plain), b, "pbr", log=lines.append)
    assert out.summary().startswith("imported 2 runs (0 already present, 1 skipped)")
    assert any(line.startswith("skipped still-going") for line in lines)
    mlflow_runs = sorted(_comparable(a, r) for r in _by_origin(a).values())
    plain_runs = sorted(_comparable(b, r) for r in _by_origin(b).values())
    assert [r[:2] for r in plain_runs] == [r[:2] for r in mlflow_runs] and len(plain_runs) == 2
    assert plain_runs == mlflow_runs
    done = next(r for r in _by_origin(b).values() if r.info.status == "FINISHED")
    assert len(_history(b, done)["train.loss"]) == STEPS
    assert _files(b, done, tmp_path / "dl") == {"train/accuracy.json": ARTIFACT}
    assert [r.metrics["class_il.acc"] for r in report.collect_runs(b, "pbr")] == [41.5]
    # Imported once: a second import copies nothing new.
    assert sync.import_runs(str(plain / sync.JOURNAL_DIR), b, "pbr", log=lambda m: None).imported == 0


def test_plain_files_mark_a_dead_stage_killed_and_skip_a_torn_line(tmp_path, template, monkeypatch):
    import socket as so

    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "j"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", journal.uri(folder))
    rec = tracking.recorder()
    dead = subprocess.Popen(["true"])
    dead.wait()
    host = so.gethostname()
    gone = rec.create({"pbr.host": host, "pbr.pid": str(dead.pid), "mlflow.runName": "gone"})
    going = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # a stage still going
    rec.create({"pbr.host": host, "pbr.pid": str(going.pid), "pbr.pid_start": tracking.process_start(going.pid),
                "mlflow.runName": "alive"})
    rec.log(gone, metrics=[("train.loss", 2.0, 1, 0), ("train.loss", 1.0, 2, 1)])
    with open(folder / "pbr" / gone / journal.METRICS, "a") as f:
        f.write('{"key": "train.loss", "val')  # the kill came mid-line
    (tmp_path / "params.yaml").write_text("seed: 3\n")
    with tracking.stage_run("train", {"seed": 3}, tmp_path / "params.yaml") as run:
        run.log_metrics({"train.loss": 0.5})
    reader = journal.Reader(folder)
    status = {r.info.run_name: r.info.status for r in reader.search_runs(["pbr"])}
    assert (status.pop("gone"), status.pop("alive"), list(status.values())) == ("KILLED", "RUNNING", ["FINISHED"])
    assert [(m.value, m.step) for m in reader.get_metric_history(gone, "train.loss")] == [(2.0, 0), (1.0, 1)]
    # Read again before it is marked: a run whose stage finished since the scan stays as it is.
    [done] = [r.info.run_id for r in reader.search_runs(["pbr"]) if r.info.status == "FINISHED"]
    assert not rec.kill_if_running(done, "1")
    # Nor one the next stage joined since the scan (RUNNING again, under that stage's pid).
    rec.set_status(done, "RUNNING")
    rec.log(done, tags={"pbr.pid": str(os.getpid())})
    assert not rec.kill_if_running(done, "1")
    rec.set_status(done, "FINISHED")
    assert {r.info.run_id: r.info.status for r in reader.search_runs(["pbr"])}[done] == "FINISHED"
    target = _store(template, tmp_path / "project")
    try:
        out = sync.import_runs(str(folder), target, "pbr", log=lambda m: None)
    finally:
        going.kill()
        going.wait()
    assert (out.imported, out.skipped) == (2, 1)  # the live one is still running there
    copies = {r.info.run_name: r for r in _by_origin(target).values()}
    assert copies["gone"].info.status == "KILLED" and copies["gone"].data.metrics["train.loss"] == 1.0
    # Its process dead since, and no stage recording there any more (the server back): the import
    # marks it as a stage would have, and takes it (it said "still RUNNING" to every import).
    out = sync.import_runs(str(folder), target, "pbr", log=lambda m: None)
    assert (out.imported, out.skipped) == (1, 0)
    assert {r.info.run_name: r.info.status for r in _by_origin(target).values()}["alive"] == "KILLED"


def test_a_stray_or_broken_entry_stops_neither_a_stage_nor_an_import(plain, template, tmp_path, monkeypatch):
    """What a copy can bring into a journal (a desktop's dotfile, a run.json cut short, a folder of
    someone else's): skipped by the stages' scan and by the import, which still takes every run."""
    folder = tmp_path / "offline"
    shutil.copytree(plain, folder)
    runs = folder / sync.JOURNAL_DIR / "pbr"
    (runs / ".DS_Store").write_bytes(b"\0\1")
    (runs / "cut-short").mkdir()
    (runs / "cut-short" / journal.RUN).write_text('{"run_id": "cut-sh')
    (runs / "not-a-run").mkdir()
    (runs / "not-a-run" / journal.RUN).write_text('{"status": "FINISHED"}')
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", journal.uri(folder / sync.JOURNAL_DIR))
    (tmp_path / "params.yaml").write_text("seed: 9\n")
    with tracking.stage_run("train", {"seed": 9}, tmp_path / "params.yaml") as run:
        run.log_metrics({"train.loss": 0.25})
    target = _store(template, tmp_path / "project")
    out = sync.import_runs(str(folder), target, "pbr", log=lambda m: None)
    assert (out.imported, out.skipped) == (3, 1)  # the two complete ones, the new one; still-going skipped
    # A folder whose only "runs" are not this module's is no journal: the usual one-line error.
    (tmp_path / "other" / "x" / "y").mkdir(parents=True)
    (tmp_path / "other" / "x" / "y" / journal.RUN).write_text("{}")
    with pytest.raises(UserError, match="holds no mlflow.db"):
        sync.import_runs(str(tmp_path / "other"), target, "pbr")


@pytest.mark.parametrize("store", ["journal", "sqlite"])
def test_a_stage_joins_its_own_executions_run_only(tmp_path, monkeypatch, store):
    """The stages of one execution share a run; a later execution of the same settings gets its own,
    also when its first stage is one the earlier execution skipped (DVC had it cached) or the two
    share no DVC experiment name. A killed or failed try is joined by the next (one run an execution)."""
    folder = tmp_path / "journal"
    uri = journal.uri(folder) if store == "journal" else f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text("seed: 4\n")

    def execution(name, *stages):
        monkeypatch.setenv("DVC_EXP_NAME", name)
        for stage in stages:
            with tracking.stage_run(stage, {"seed": 4}, tmp_path / "params.yaml"):
                pass

    def all_runs():
        if store == "journal":
            return journal.Reader(folder).search_runs(["pbr"])
        from mlflow import MlflowClient

        client = MlflowClient(uri)
        return client.search_runs([client.get_experiment_by_name("pbr").experiment_id])

    def runs():
        return sorted((r.data.tags["dvc.exp_name"], sorted(k.removeprefix("pbr.stage.") for k, v in r.data.tags.items()
                                               if k.startswith("pbr.stage.") and v == "done"))
                      for r in all_runs())

    execution("kept", "train", "score", "evaluate")  # prepare cached, skipped
    execution("forced", "prepare", "train", "score", "evaluate")  # dvc exp run -f: every stage
    assert runs() == [("forced", ["evaluate", "prepare", "score", "train"]), ("kept", ["evaluate", "score", "train"])]
    # Two at once (a queue's two workers) with the same settings: each stage finds its own execution's run.
    execution("a", "prepare")
    execution("b", "prepare")
    execution("a", "train")
    execution("b", "train")
    assert runs()[:2] == [("a", ["prepare", "train"]), ("b", ["prepare", "train"])]
    # Ctrl-C in a stage: its run is KILLED, as one whose process died is marked (FAILED is for errors).
    monkeypatch.setenv("DVC_EXP_NAME", "stopped")
    with pytest.raises(KeyboardInterrupt), tracking.stage_run("prepare", {"seed": 4}, tmp_path / "params.yaml"):
        raise KeyboardInterrupt
    assert {r.data.tags["dvc.exp_name"]: r.info.status for r in all_runs()}["stopped"] == "KILLED"
    # Run again: the same execution goes on in the same run; a stage that fails, and its try after the
    # fix, the same.
    execution("stopped", "prepare")
    with pytest.raises(UserError), tracking.stage_run("train", {"seed": 4}, tmp_path / "params.yaml"):
        raise UserError("data/prepared is missing")
    assert {r.data.tags["dvc.exp_name"]: r.info.status for r in all_runs()}["stopped"] == "FAILED"
    execution("stopped", "train", "score", "evaluate")
    stopped = [r for r in all_runs() if r.data.tags["dvc.exp_name"] == "stopped"]
    assert [r.info.status for r in stopped] == ["FINISHED"]
    assert ("stopped", ["evaluate", "prepare", "score", "train"]) in runs()
    # A teammate's killed try on the team server, of the same commit and params: theirs, not joined.
    import socket

    monkeypatch.setenv("DVC_EXP_NAME", "")
    with monkeypatch.context() as m:
        m.setattr(socket, "gethostname", lambda: "their-node")
        with pytest.raises(KeyboardInterrupt), tracking.stage_run("prepare", {"seed": 4}, tmp_path / "params.yaml"):
            raise KeyboardInterrupt
    with tracking.stage_run("prepare", {"seed": 4}, tmp_path / "params.yaml"):
        pass
    mine = {(r.data.tags["pbr.host"], r.info.status) for r in all_runs() if r.data.tags["dvc.exp_name"] == ""}
    assert mine == {(socket.gethostname(), "FINISHED"), ("their-node", "KILLED")}


@pytest.mark.parametrize("store", ["journal", "sqlite"])
def test_the_next_dvc_exp_run_of_a_killed_one_joins_its_run(tmp_path, monkeypatch, store):
    """`dvc exp run` names each try anew: the try after a kill while scoring skips train (DVC kept it)
    and its stages went on in a second run, without train's records. They join the killed try's run,
    in this folder only (queue workers run in copies of their own) and while its training is the one
    on disk. (A real `dvc exp run` killed and run again: test_methods_dvc.)"""
    folder = tmp_path / "journal"
    uri = journal.uri(folder) if store == "journal" else f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    params = tmp_path / "params.yaml"
    params.write_text("seed: 4\n")
    trained = tmp_path / "ws" / "artifacts" / "train" / "run.json"
    trained.parent.mkdir(parents=True)
    trained.write_text('{"fingerprint": "f1"}')

    def execution(name, *stages, where="ws", killed=False):
        monkeypatch.chdir(tmp_path / where)
        monkeypatch.setenv("DVC_EXP_NAME", name)
        for stage in stages:
            with contextlib.suppress(KeyboardInterrupt), tracking.stage_run(stage, {"seed": 4}, params,
                                                                             {"pbr.fingerprint": "f1"}):
                if killed and stage == stages[-1]:
                    raise KeyboardInterrupt

    def runs():
        if store == "journal":
            found = journal.Reader(folder).search_runs(["pbr"])
        else:
            from mlflow import MlflowClient

            client = MlflowClient(uri)
            found = client.search_runs([client.get_experiment_by_name("pbr").experiment_id])
        return sorted((r.data.tags["dvc.exp_name"], r.info.status, sorted(k.removeprefix("pbr.stage.") for k, v in
                                                              r.data.tags.items() if v == "done"))
                      for r in found)

    execution("first", "prepare", "train", "score", killed=True)
    execution("second", "score", "evaluate")
    assert runs() == [("second", "FINISHED", ["evaluate", "prepare", "score", "train"])]
    # Killed again after train, then run with other training on disk (code edited, uncommitted): theirs.
    execution("third", "train", "score", killed=True)
    trained.write_text('{"fingerprint": "f2"}')
    execution("fourth", "score")
    assert runs() == [("fourth", "FINISHED", ["score"]), ("second", "FINISHED", ["evaluate", "prepare", "score", "train"]),
                      ("third", "KILLED", ["train"])]
    # Two queue workers (copies under .dvc/tmp/exps, one checkout) of these settings: one between train
    # and score, the other scoring (its train kept): each has its own run.
    for w in ("a", "b"):
        (tmp_path / "ws/.dvc/tmp/exps" / w / "artifacts/train").mkdir(parents=True)
        (tmp_path / "ws/.dvc/tmp/exps" / w / "artifacts/train/run.json").write_text('{"fingerprint": "f1"}')
    execution("qa", "train", where="ws/.dvc/tmp/exps/a")
    execution("qb", "score", where="ws/.dvc/tmp/exps/b")
    execution("qa", "score", where="ws/.dvc/tmp/exps/a")
    assert [r for r in runs() if r[0].startswith("q")] == [("qa", "FINISHED", ["score", "train"]),
                                                          ("qb", "FINISHED", ["score"])]


@pytest.mark.parametrize("store", ["journal", "sqlite"])
def test_a_run_killed_before_its_params_or_under_a_reused_pid_is_marked_and_joined(tmp_path, monkeypatch, store,
                                                                                  template):
    """Killed between creating its run and logging the params: the next try joined a run without
    them, and the execution, complete, was left out of the report (no seed). And a dead stage's pid
    taken by another process (or by the next stage itself, a restarted container) kept its run
    RUNNING for as long as that process lived: the next stage went on in a new run."""
    uri = journal.uri(tmp_path / "journal") if store == "journal" else _store(template, tmp_path / "s")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text("seed: 4\n")
    real = tracking.recorder

    def dying():  # the stage dies as its run is made: SystemExit stands for the kill, the run stays RUNNING
        rec = real()
        create = rec.create
        rec.create = lambda tags: (create(tags), (_ for _ in ()).throw(SystemExit(9)))[0]
        return rec

    monkeypatch.setattr(tracking, "recorder", dying)
    with pytest.raises(SystemExit):
        with tracking.stage_run("prepare", PARAMS, tmp_path / "params.yaml"):
            pass
    monkeypatch.setattr(tracking, "recorder", real)
    # Its pid is this process's own (alive): only a reused pid can say so, as in a restarted container.
    for stage in ("prepare", "train", "evaluate"):
        with tracking.stage_run(stage, PARAMS, tmp_path / "params.yaml") as run:
            run.log_metrics({f"{stage}.x": 1.0})
    if store == "journal":
        runs = journal.Reader(tmp_path / "journal").search_runs(["pbr"])
    else:
        from mlflow import MlflowClient

        client = MlflowClient(uri)
        runs = client.search_runs([client.get_experiment_by_name("pbr").experiment_id])
    assert [(r.info.status, r.data.params.get("seed"), sorted(r.data.metrics)) for r in runs] == [
        ("FINISHED", "0", ["evaluate.x", "prepare.x", "train.x"])]
    # A live process under a dead run's pid, but not the one that started: its start time says so.
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert tracking.runs_still(sleeper.pid, tracking.process_start(sleeper.pid))
        assert not tracking.runs_still(sleeper.pid, "1")  # started at another time: another process
        assert tracking.runs_still(sleeper.pid)  # nothing recorded to compare (an older run): the pid says
    finally:
        sleeper.kill()
        sleeper.wait()
    assert not tracking.runs_still(sleeper.pid)


def test_a_run_of_another_machine_whose_heartbeat_stopped_is_marked_killed(tmp_path, monkeypatch, template):
    """A stage killed outright on another machine (an OOM kill in a pod, a crashed node) left its run
    RUNNING on the team's server for good: only its own host could see its pid was gone. A stage
    beats while it runs; a beat older than STALE_S is a dead run's, whatever machine reads it."""
    from mlflow import MlflowClient

    uri = _store(template, tmp_path / "s")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text("seed: 4\n")
    monkeypatch.setattr(tracking, "HEARTBEAT_S", 0.05)
    beats = []
    with tracking.stage_run("train", PARAMS, tmp_path / "params.yaml") as run:
        for _ in range(100):  # the beat comes from its own thread while the stage works
            beats.append(MlflowClient(uri).get_run(run.run_id).data.tags.get("pbr.heartbeat"))
            if beats[-1]:
                break
            time.sleep(0.05)
    assert beats[-1] and abs(int(beats[-1]) - time.time()) < 30
    c, exp_id = tracking.open_experiment(uri, "pbr")
    now = time.time()
    runs = {name: c.create_run(exp_id, tags={"pbr.host": "pod-7f3a", "pbr.pid": "12", **beat}).info.run_id
            for name, beat in (("stale", {"pbr.heartbeat": str(int(now - tracking.STALE_S - 60))}),
                               ("beating", {"pbr.heartbeat": str(int(now - 30))}), ("old version", {}))}
    tracking.close_dead_runs(uri, exp_id)
    assert {name: c.get_run(rid).info.status for name, rid in runs.items()} == {
        "stale": "KILLED", "beating": "RUNNING", "old version": "RUNNING"}
    # A store copied from a node is no store its stages beat in: its beats stopped at the copy, and an
    # import an hour later killed every run still going there (and kept that copy over the finished one).
    node = tmp_path / "from-node"
    shutil.copytree(tmp_path / "s", node)
    going = c.create_run(exp_id, tags={"pbr.host": "node-3", "pbr.pid": "4242",
                                       "pbr.heartbeat": str(int(now - tracking.STALE_S - 60))}).info.run_id
    shutil.copy(tmp_path / "s" / "mlflow.db", node / "mlflow.db")
    out = sync.import_runs(str(node), _store(template, tmp_path / "team"), "pbr", log=lambda m: None)
    assert out.skipped >= 1 and MlflowClient(f"sqlite:///{node / 'mlflow.db'}").get_run(going).info.status == "RUNNING"
    # A stage joining a killed try's run beats at once (not only when its thread first runs): the old
    # beat, seen meanwhile by another machine, had it marked KILLED while it ran.
    monkeypatch.setattr(tracking, "heartbeat", lambda rec, run: contextlib.nullcontext())
    monkeypatch.setenv("DVC_EXP_NAME", "killed-yesterday")
    with tracking.stage_run("train", PARAMS, tmp_path / "params.yaml") as first:
        pass
    c.set_tag(first.run_id, "pbr.heartbeat", str(int(now - 10 * tracking.STALE_S)))  # its try killed long ago
    c.set_terminated(first.run_id, "KILLED")
    c.delete_tag(first.run_id, "pbr.stage.train")
    with tracking.stage_run("train", PARAMS, tmp_path / "params.yaml") as run:
        assert run.run_id == first.run_id
        assert int(c.get_run(run.run_id).data.tags["pbr.heartbeat"]) >= int(now)
    # Plain files get no beat at all: one set at the start would go stale while the stage runs, and a
    # stage of another machine sharing the folder (an offline sweep's) would mark it KILLED.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", journal.uri(tmp_path / "journal"))
    with tracking.stage_run("train", PARAMS, tmp_path / "params.yaml") as run:
        pass
    (plain,) = journal.Reader(tmp_path / "journal").search_runs(["pbr"])
    assert "pbr.heartbeat" not in plain.data.tags


def test_the_part_of_a_split_run_the_report_counts_says_where_it_ran(finished, template, tmp_path, pbr_main):
    """Its server back (or gone) mid-pipeline, a run's evaluate stage recorded to another store than its
    train stage. That part, the complete one, still says where the run trained and in which number
    format, so `pbr report` puts it on its machine's row, not on one of unknown device."""
    import yaml

    project = tmp_path / "project"
    shutil.copytree(finished, project, symlinks=True)
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["train"].update(device="auto", precision="auto")  # as params.yaml has them: only the run knows
    (project / "params.yaml").write_text(yaml.safe_dump(params))
    trained = json.loads((project / "artifacts/train/run.json").read_text())
    folder = tmp_path / "offline" / sync.JOURNAL_DIR
    r = pbr_main("evaluate", cwd=project, env={"MLFLOW_TRACKING_URI": journal.uri(folder)})
    assert r.returncode == 0, r.stderr
    target = _store(template, tmp_path / "store")
    assert sync.import_runs(str(folder.parent), target, "pbr", log=lambda m: None).imported == 1
    [run] = report.collect_runs(target, "pbr")
    assert report.device_of(run) == trained["device"] == "cpu"
    assert report.precision_of(run.params) == trained["settings"]["precision"] == "fp32"


def test_plain_files_are_read_by_import_only(plain, tmp_path):
    uri = journal.uri(plain / sync.JOURNAL_DIR)
    for call in (lambda: report.collect_runs(uri, "pbr"), lambda: tracking.existing_experiment_id(uri, "pbr"),
                 lambda: sync.import_runs(str(plain), journal.uri(tmp_path / "other"), "pbr")):
        with pytest.raises(UserError, match="holds runs recorded to plain files, which only `pbr import` reads"):
            call()


def test_a_relative_plain_file_record_is_the_repositorys(plain, tmp_path, monkeypatch):
    """`journal:REL` names the folder the stages record to, the repository's, also from inside a DVC
    experiment's workspace (a queued run's copy under .dvc/tmp/exps/)."""
    repo = tmp_path / "repo"
    shutil.copytree(plain, repo)
    monkeypatch.chdir((repo / ".dvc/tmp/exps/run-1").mkdir(parents=True) or repo / ".dvc/tmp/exps/run-1")
    uri = journal.SCHEME + sync.JOURNAL_DIR
    assert sync.resolve_source(uri).uri == journal.uri((repo / sync.JOURNAL_DIR).resolve())
    with pytest.raises(UserError, match=f"`pbr import {repo / sync.JOURNAL_DIR}` into an MLflow store"):
        tracking.refuse_journal(uri)


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.parametrize("make, says", [
    (lambda d: d / "missing", "no such file or folder"),
    (lambda d: d, "holds no mlflow.db"),
    (lambda d: (d / "journal" / "pbr").mkdir(parents=True) or d, "its journal/ holds no run yet"),
    (lambda d: _write(d / "notes.db", "not a database"), "is not an sqlite MLflow store"),
])
def test_cli_names_a_bad_source_in_one_line(tmp_path, make, says, pbr_main):
    bad = make(tmp_path)
    r = pbr_main("import", str(bad), cwd=tmp_path, env={"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/target.db"})
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and str(bad) in r.stderr and says in r.stderr
    assert not (tmp_path / "target.db").exists()  # nothing created for a bad SOURCE


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def fresh_process(monkeypatch):
    """This process has not yet checked a server nor said anything (a stage's process is new)."""
    monkeypatch.setattr(tracking, "_UNREACHABLE", {})
    monkeypatch.setattr(tracking, "_ANNOUNCED", set())


def test_report_and_ui_refuse_an_unreachable_server_at_once(tmp_path, pbr_main, fresh_process):
    """Where a stage falls back to the offline store, the report and the UI have nothing to fall back
    to: one line at once, not MLflow's minutes of retries."""
    server = f"http://127.0.0.1:{_closed_port()}"
    for cmd in ("report", "ui"):
        t0 = time.time()
        r = pbr_main(cmd, cwd=tmp_path, env={"MLFLOW_TRACKING_URI": server})
        assert r.returncode == 2 and time.time() - t0 < 30, r.stderr
        assert r.stderr == f"error: MLflow server {server} is unreachable (connection refused): start it, or check " \
                           "--tracking-uri / MLFLOW_TRACKING_URI\n"


def test_an_unreachable_server_records_offline_then_imports(template, tmp_path, monkeypatch, capsys,
                                                            fresh_process):
    repo = tmp_path / "repo"
    repo.mkdir()
    monkeypatch.chdir(repo)
    server = f"http://127.0.0.1:{_closed_port()}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server)
    _store(template, repo / tracking.OFFLINE_DIR)
    t0 = time.time()
    _record(repo)
    seconds = time.time() - t0
    err = capsys.readouterr().err.splitlines()
    said = [line for line in err if "unreachable" in line]
    assert len(said) == 1  # four stage runs, one line
    assert server in said[0] and "connection refused" in said[0] and "pbr import mlflow-offline" in said[0]
    assert seconds < 30  # not MLflow's minutes of retries against the dead server
    assert {r.info.status for r in _source_runs(repo / tracking.OFFLINE_DIR)} == {"FINISHED", "FAILED", "RUNNING"}
    assert (repo / tracking.OFFLINE_DIR / "mlartifacts").is_dir()  # the folder holds the whole record
    target = _store(template, tmp_path / "server")  # the server's store, reachable again
    assert sync.import_runs(tracking.OFFLINE_DIR, target, "pbr", log=lambda m: None).imported == 2
    assert [r.metrics["class_il.acc"] for r in report.collect_runs(target, "pbr")] == [41.5]


def test_offline_switches(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    offline = f"sqlite:///{tmp_path / tracking.OFFLINE_DIR / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "offline")
    assert tracking.tracking_uri() == offline
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.example:5000")
    monkeypatch.setenv("PBR_OFFLINE", "1")
    assert tracking.tracking_uri() == offline == tracking.recording_uri()
    # A local store named explicitly (`pbr sweep --offline DIR` sets one) is kept.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/elsewhere.db")
    assert tracking.tracking_uri() == f"sqlite:///{tmp_path}/elsewhere.db"


class _Refuses(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(401)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_POST = do_GET

    def log_message(self, *args):
        pass


class _GuardsItsHostHeader(_Refuses):
    """What MLflow 3.17's server answers a Host it does not allow (seen from a real one started with
    --allowed-hosts naming another host): 403 with this body, to every API request."""
    def do_GET(self):
        body = b"Invalid Host header - possible DNS rebinding attack detected"
        self.send_response(403)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET


def test_a_server_that_refuses_the_name_it_was_reached_by_says_so(tmp_path, monkeypatch, fresh_process):
    """A teammate reaching the server by its hostname, which the documented command did not allow:
    told their account was refused (on a server without accounts), they chased the wrong fix."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "bob")
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _GuardsItsHostHeader)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    uri = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        with pytest.raises(UserError) as e:
            tracking.init_store()
    finally:
        httpd.shutdown()
    netloc = uri.removeprefix("http://")
    assert f"refused the name it was reached by ({netloc}): add it to the server's --allowed-hosts" in str(e.value)
    assert "keep localhost:PORT there" in str(e.value)
    assert "bob" not in str(e.value)


def test_a_server_that_refuses_credentials_stays_an_error(tmp_path, monkeypatch, fresh_process):
    monkeypatch.chdir(tmp_path)
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Refuses)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{httpd.server_address[1]}")
        with pytest.raises(UserError, match="MLFLOW_TRACKING_USERNAME"):
            tracking.init_store()
    finally:
        httpd.shutdown()
    assert not (tmp_path / tracking.OFFLINE_DIR).exists()


@pytest.mark.slow  # a real `mlflow server` takes 10-20 s to start
def test_through_a_real_server_both_ways(source, template, tmp_path, monkeypatch, capfd):
    """The usual sync: the copied-back folder into the team's server (`pbr import`, REST batches,
    artifacts uploaded through the server), then from the server into another store (artifacts
    downloaded), every history and file intact."""
    from project import mlflow_server

    shutil.copy(template, tmp_path / "server.db")
    with mlflow_server(tmp_path) as server:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "MLFLOW_TRACKING_URI": server}
        r = subprocess.run([sys.executable, "-m", "stages.cli", "import", str(source)], capture_output=True,
                           text=True, env=env, cwd=tmp_path, timeout=300)
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith("imported 2 runs (0 already present, 1 skipped)") and r.stdout.count("\n") == 1
        back = _store(template, tmp_path / "back")
        capfd.readouterr()
        assert sync.import_runs(server, back, "pbr", log=lambda m: None).imported == 2
        said = capfd.readouterr()
        assert "Downloading artifacts" not in said.out + said.err  # MLflow's progress bar, a run's files each
        again = sync.import_runs(str(source), server, "pbr", log=lambda m: None)
        assert (again.imported, again.present, again.skipped) == (0, 2, 1)

        # The server gone while a stage records to it: one line once MLflow's own retries give up (none
        # here), not its traceback and a second round of retries for the run's status.
        stage = tmp_path / "stage"
        stage.mkdir()
        monkeypatch.chdir(stage)
        (stage / "params.yaml").write_text("seed: 5\n")
        monkeypatch.setenv("MLFLOW_TRACKING_URI", server)
        monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        with pytest.raises(UserError, match=rf"^MLflow server {server} stopped answering during the train stage "
                                            r"\(connection refused\); what the stage finished is kept: run it again"):
            with tracking.stage_run("train", {"seed": 5}, stage / "params.yaml") as run:
                server.stop()
                run.log_metrics({"train.loss": 1.0})
    src_uri = f"sqlite:///{source / 'mlflow.db'}"
    src = {r.info.run_id: r for r in _source_runs(source)}
    for origin, copy in _by_origin(back).items():  # the origin survives the second hop
        assert _history(back, copy) == _history(src_uri, src[origin])
        assert _files(back, copy, tmp_path / "dl" / origin) == _tree(source / "mlartifacts" / origin / "artifacts")
        assert copy.data.params == src[origin].data.params


def test_a_deleted_experiment_is_one_line_naming_the_restore(tmp_path):
    """Deleted in the UI, the experiment stays in MLflow's trash under its name: every stage then
    failed with MLflow's 116-line traceback ("must be in the 'active' state")."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client, exp_id = tracking.open_experiment(uri, "pbr")
    client.delete_experiment(exp_id)
    for call in (tracking.open_experiment, tracking.existing_experiment_id):
        with pytest.raises(UserError, match=rf"^MLflow experiment 'pbr' at {uri} is deleted .*restore --experiment-id "
                                            rf"{exp_id}`.* or record to another with MLFLOW_EXPERIMENT_NAME$"):
            call(uri, "pbr")
    MlflowClient(uri).restore_experiment(exp_id)
    assert tracking.open_experiment(uri, "pbr")[1] == exp_id


def _journal_runs(folder: Path) -> dict[str, Path]:
    """Status -> run folder of a copied journal's runs."""
    home = folder / sync.JOURNAL_DIR / "pbr"
    return {json.loads((d / journal.RUN).read_text())["status"]: d for d in home.iterdir() if (d / journal.RUN).is_file()}


@pytest.mark.parametrize("damage", ["params", "tags", "metric line", "run.json"])
def test_a_damaged_journal_run_is_skipped_by_name_and_comes_with_a_later_whole_copy(plain, template, tmp_path, damage):
    """A file cut short by a partial copy: the run was imported whole-looking (params {} or a random
    name, no pbr.complete) and a later import of the intact copy saw it as present; an edited metric
    line gave a traceback and left a RUNNING part copy. Now it is skipped with its folder named."""
    folder = shutil.copytree(plain, tmp_path / "copied back")
    run = _journal_runs(folder)["FINISHED"]
    if damage in ("params", "tags", "run.json"):
        f = run / {"params": journal.PARAMS, "tags": journal.TAGS, "run.json": journal.RUN}[damage]
        f.write_bytes(f.read_bytes()[:20])
    else:
        lines = (run / journal.METRICS).read_text().splitlines(keepends=True)
        lines[3] = json.dumps({"key": "train.loss", "value": "abc", "timestamp": 1, "step": 3}) + "\n"
        (run / journal.METRICS).write_text("".join(lines))
    target = _store(template, tmp_path / "project")
    said = []
    out = sync.import_runs(str(folder), target, "pbr", log=said.append)
    assert (out.imported, out.skipped) == (1, 2), said  # the failed run; the damaged and the unfinished ones
    assert any(line.startswith(f"skipped {run.name}: ") and "copied in part?" in line for line in said), said
    assert run.name not in _by_origin(target)
    from mlflow import MlflowClient
    assert not MlflowClient(tracking_uri=target).search_runs(
        [tracking.open_experiment(target, "pbr")[1]], filter_string=f"tags.`{sync.PENDING_TAG}` LIKE '%'")
    # The whole copy, imported next, brings it.
    out = sync.import_runs(str(plain), target, "pbr", log=lambda m: None)
    assert (out.imported, out.present) == (1, 1)
    assert _by_origin(target)[run.name].data.tags["pbr.complete"] == "true"


def test_a_copy_made_without_artifacts_is_replaced_once_they_are_here(source, template, tmp_path):
    """`--no-artifacts` (or a store whose runs' artifact folders were not copied yet) was final: the
    copy never got them, a later import saw it as present."""
    target = _store(template, tmp_path / "project")
    sync.import_runs(str(source), target, "pbr", with_artifacts=False, log=lambda m: None)
    done = next(r for r in _source_runs(source) if r.info.status == "FINISHED")
    assert _by_origin(target)[done.info.run_id].data.tags[sync.BARE_TAG] == "true"
    said = []
    out = sync.import_runs(str(source), target, "pbr", log=said.append)
    assert (out.imported, out.replaced, out.present) == (1, 1, 1), said  # the failed run has none: it stays
    assert any(line == f"replacing {done.info.run_name}: its artifacts are here now" for line in said), said
    copy = _by_origin(target)[done.info.run_id]
    assert sync.BARE_TAG not in copy.data.tags
    assert _files(target, copy, tmp_path / "check") == {"train/accuracy.json": ARTIFACT}
    out = sync.import_runs(str(source), target, "pbr", log=lambda m: None)
    assert (out.imported, out.present) == (0, 2)


def test_two_copies_of_one_run_become_one_and_a_failed_copy_is_not_left(source, template, tmp_path, monkeypatch):
    """Two imports into one server at once both copied a run; every later import kept both. And a
    copy that fails midway (a value MLflow refuses, a server gone) is deleted, not left RUNNING."""
    from mlflow import MlflowClient

    target = _store(template, tmp_path / "project")
    sync.import_runs(str(source), target, "pbr", log=lambda m: None)
    done = next(r for r in _source_runs(source) if r.info.status == "FINISHED")
    c, exp_id = tracking.open_experiment(target, "pbr")
    # What the second import of two at once made: a second whole copy of the same run.
    sync._copy_run(MlflowClient(tracking_uri=f"sqlite:///{source / 'mlflow.db'}"), c, exp_id, done, done.info.run_id,
                   f"{done.info.status}:{done.info.end_time}", "other import", None)

    def copies():
        return [r.info.run_id for r in c.search_runs([exp_id], f"tags.`{sync.ORIGIN_TAG}` = '{done.info.run_id}'")]

    first = copies()
    assert len(first) == 2
    said = []
    sync.import_runs(str(source), target, "pbr", log=said.append)
    # One stays, with its artifacts (the second copy was made without: kept, it is replaced by a whole one).
    [left] = copies()
    assert sync.BARE_TAG not in c.get_run(left).data.tags
    assert any(line.startswith(f"deleted a second copy of {done.info.run_name}") for line in said), said

    def fails(*args):
        raise RuntimeError("the server went away")

    monkeypatch.setattr(sync, "_fill", fails)
    other = _store(template, tmp_path / "other")
    with pytest.raises(RuntimeError, match="went away"):
        sync.import_runs(str(source), other, "pbr", log=lambda m: None)
    c2, exp2 = tracking.open_experiment(other, "pbr")
    assert c2.search_runs([exp2]) == []  # active runs: the part copy was deleted at once


def test_a_torn_metrics_line_in_the_middle_and_a_run_without_artifacts_import(plain, template, tmp_path):
    """A try killed mid-line, then joined by the next try: its points went on the torn line (now a
    line of their own, and an older journal's glued line still reads). A KILLED run packed by
    bench_runs_gpu (files only: its empty artifacts/ dropped) imports, without artifacts."""
    rec = journal.Recorder(tmp_path / "j", "pbr")
    rid = rec.create({"mlflow.runName": "torn"})
    rec.log(rid, metrics=[("train.loss", 2.0, 1, 0), ("train.loss", 1.5, 2, 1)])
    metrics = tmp_path / "j/pbr" / rid / journal.METRICS
    metrics.write_bytes(metrics.read_bytes()[:-20])  # the kill, mid-line
    rec.log(rid, metrics=[("train.loss", 1.0, 3, 1)])  # the next try
    glued = tmp_path / "glued.jsonl"  # what the older writer left
    glued.write_text(metrics.read_text().replace('\n{"key": "train.loss", "value": 1.0', '{"key": "train.loss", "value": 1.0'))
    rec.set_status(rid, "KILLED")
    shutil.rmtree(tmp_path / "j/pbr" / rid / journal.ARTIFACTS)
    reader = journal.Reader(tmp_path / "j")
    for text in (metrics.read_text(), glued.read_text()):
        metrics.write_text(text)
        [run] = reader.search_runs(["pbr"])
        assert not reader.damaged and run.data.metrics == {"train.loss": 1.0}
        assert [(m.step, m.value) for m in reader.get_metric_history(rid, "train.loss")] == [(0, 2.0), (1, 1.0)]
    out = sync.import_runs(str(tmp_path / "j"), _store(template, tmp_path / "project"), "pbr", log=lambda m: None)
    assert out.imported == 1
