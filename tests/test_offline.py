"""`pbr sweep NAME --offline DIR` on small generated data where MLflow cannot be imported (a GPU
box's bare image): the grid's runs without DVC or a server, each in its own folder and recorded to
plain files in DIR/journal; a second call (MLflow there) skips what finished and keeps recording
there; `pbr import DIR` brings them into the project's store, where `pbr report` counts them."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import fakedata

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning")


def _pbr(*args, cwd, env):
    return subprocess.run([sys.executable, "-m", "stages.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


def _small_project(tmp_path):
    """params.yaml and raw data in CIFAR-10's format, small enough for a width-4 run on a CPU."""
    fakedata.write_cifar(tmp_path / "raw", 10, 40, 6)
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["data"].update(root=str(tmp_path / "raw"), download=False)
    params["model"]["width"] = 4
    params["train"].update(device="cpu", precision="fp32", threads=1)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))


def test_an_offline_sweep_runs_records_resumes_and_imports(tmp_path, pbr_main):
    _small_project(tmp_path)
    out, store = tmp_path / "offline", tmp_path / "project.db"
    # As on a GPU box's bare image: MLflow cannot be imported by the sweep nor by its runs.
    blocked = tmp_path / "no-mlflow"
    blocked.mkdir()
    (blocked / "sitecustomize.py").write_text("import sys\nsys.modules['mlflow'] = None\n")
    env = {**os.environ, "PYTHONPATH": f"{blocked}{os.pathsep}{ROOT}", "MLFLOW_TRACKING_URI": f"sqlite:///{store}"}
    sweep = ["sweep", "fidelity", "--budget", "quick", "--seeds", "7-7", "--only", "row=er-lr0.1,er-lr0.03",
             "-S", "data.imbalance_ratio=0.5", "-S", "method.buffer_size=10", "--offline", str(out), "--jobs", "auto"]
    r = _pbr(*sweep, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    # --jobs auto on a CPU at one torch thread a run: a run per core.
    assert f"--jobs auto: {len(os.sched_getaffinity(0))} run(s) at once" in r.stderr, r.stderr[-2000:]
    names = sorted(p.name for p in (out / "runs").iterdir())
    assert len(names) == 2 and all((out / "runs" / n / "DONE").is_file() for n in names)
    # What DONE says is what the run's evaluate stage wrote.
    done = json.loads((out / "runs" / names[0] / "DONE").read_text())
    metrics = json.loads((out / "runs" / names[0] / "reports/metrics.json").read_text())
    assert done["class_il"] == metrics["class_il"]
    # Nothing went to the project's store yet: the runs recorded offline, to plain files.
    assert not store.exists()
    assert f"recording to plain files in {out / 'journal'}" in r.stderr and not (out / "mlflow.db").exists()

    # The sweep's own process above; the commands after it in this process (the same main()).
    uri = {"MLFLOW_TRACKING_URI": f"sqlite:///{store}"}
    again = pbr_main(*sweep, cwd=tmp_path, env=uri)
    assert again.returncode == 0 and "0 runs finished, 2 already done, 0 failed" in again.stderr
    assert f"records in {out / 'journal'}" in again.stderr and not (out / "mlflow.db").exists()

    imported = pbr_main("import", str(out), cwd=tmp_path, env=uri)
    assert imported.returncode == 0, imported.stderr[-2000:]
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{store}")
    runs = client.search_runs([client.get_experiment_by_name("pbr").experiment_id])
    assert sorted(r.data.tags["mlflow.runName"] for r in runs) == names
    for run in runs:
        d = out / "runs" / run.data.tags["mlflow.runName"]
        m = json.loads((d / "reports/metrics.json").read_text())
        assert run.data.metrics["class_il.acc"] == pytest.approx(m["class_il"]["acc"], abs=1e-4)
        assert run.data.params["seed"] == "7" and run.info.status == "FINISHED"
        # A CPU run shares no GPU, whatever --gpu-share (auto here) would do on one.
        assert run.data.tags["pbr.gpu_sharing"] == "none"
        assert json.loads((d / "artifacts/train/run.json").read_text())["gpu_sharing"] == "none"
        # The data, prepared once for both runs, is recorded in each: its tables too (the second run's
        # folder links data/prepared only, and its evaluate skipped the missing tables silently).
        tables = {a.path for a in client.list_artifacts(run.info.run_id, "prepare")}
        assert tables == {"prepare/class_counts.csv", "prepare/task_counts.csv"}, (run.info.run_name, tables)
    report = pbr_main("report", "--no-log", "--csv", str(tmp_path / "r.csv"), cwd=tmp_path, env=uri)
    assert report.returncode == 0, report.stderr[-2000:]
    rows = [line.split("|")[2].strip() for line in report.stdout.splitlines() if line.startswith("| ")]
    assert {"ER", "ER (lr 0.03)"} <= set(rows), report.stdout


def test_a_backwards_seed_range_is_a_one_line_error(tmp_path, pbr_main):
    (tmp_path / "params.yaml").write_text((ROOT / "params.yaml").read_text())
    r = pbr_main("sweep", "fidelity", "--seeds", "2-1", "--offline", str(tmp_path / "o"), cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.strip().startswith("error: --seeds 2-1:") and len(r.stderr.splitlines()) == 1


def test_the_record_follows_the_folder_then_mlflows_presence(tmp_path, monkeypatch):
    from pbr.errors import UserError
    from stages.experiments import offline
    from stages.experiments.offline import store_uri

    fresh, plain, db = tmp_path / "fresh", tmp_path / "plain", tmp_path / "db"
    for d in (fresh, plain, db):
        d.mkdir()
    (plain / "journal").mkdir()
    (db / "mlflow.db").touch()
    assert store_uri(fresh, "auto") == f"sqlite:///{fresh / 'mlflow.db'}"  # MLflow is installed here
    assert store_uri(fresh, "files") == f"journal:{fresh / 'journal'}"
    assert store_uri(plain, "auto") == f"journal:{plain / 'journal'}"
    assert store_uri(db, "auto") == f"sqlite:///{db / 'mlflow.db'}"
    with pytest.raises(UserError, match="already holds runs recorded to plain files; use another --offline folder"):
        store_uri(plain, "mlflow")
    with pytest.raises(UserError, match="--record sqlite: give one of auto, mlflow, files"):
        store_uri(fresh, "sqlite")
    # On a machine without MLflow: plain files by default, and a folder already in mlflow.db says why not.
    monkeypatch.setattr(offline, "mlflow_installed", lambda: False)
    assert store_uri(fresh, "auto") == f"journal:{fresh / 'journal'}"
    with pytest.raises(UserError, match="it records to mlflow.db, which needs MLflow, not installed here"):
        store_uri(db, "auto")


def test_without_raw_data_the_runs_use_the_projects_matching_prepared_data(tmp_path, monkeypatch):
    """A GPU box that pulled data/prepared (dvc pull) and not the archive: an offline sweep's runs use
    it where its data settings are the run's; with the archive there, or other settings, they prepare."""
    from stages.experiments import offline
    from stages.runtime.config import from_dict

    monkeypatch.chdir(tmp_path)
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["data"].update(root=str(tmp_path / "raw"), download=False)
    (tmp_path / "data/prepared").mkdir(parents=True)
    made = {**from_dict(params).to_dict()["data"], "root": "/where/it/was/prepared", "download": True}
    (tmp_path / "data/prepared/manifest.json").write_text(json.dumps({"params": made}))
    said = []
    link = offline._prepared(tmp_path / "out", params, {}, said.append)
    assert link.resolve() == (tmp_path / "data/prepared").resolve() and len(said) == 1 and "no raw data" in said[0]
    assert offline._prepared(tmp_path / "out", params, {}, said.append) == link and len(said) == 1  # said once
    other = {**params, "data": {**params["data"], "imbalance_ratio": 0.1}}
    assert offline._project_prepared(other) is None
    # prepared before data.subset existed: the seeded subset, so today's default matches, ldam does not
    (tmp_path / "data/prepared/manifest.json").write_text(json.dumps({"params": {
        k: v for k, v in made.items() if k != "subset"}}))
    assert offline._project_prepared(params) == tmp_path / "data/prepared"
    assert offline._project_prepared({**params, "data": {**params["data"], "subset": "ldam"}}) is None
    fakedata.write_cifar(tmp_path / "raw", 10, 4, 2)  # the archive is here: prepare from it, as before
    assert offline._project_prepared(params) is None

    # The offline folder moved, links and all: a run's link into the old place is made again.
    run = tmp_path / "out/runs/r"
    run.mkdir(parents=True)
    offline._link_data(run, tmp_path / "out", params, {}, said.append)
    shutil.move(tmp_path / "out", tmp_path / "moved")
    run = tmp_path / "moved/runs/r"
    assert not (run / "data/prepared").exists() and (run / "data/prepared").is_symlink()
    offline._link_data(run, tmp_path / "moved", params, {}, said.append)
    assert (run / "data/prepared/manifest.json").is_file()
    assert (run / "data/prepared").readlink() == tmp_path / "moved/data" / link.parent.parent.name / "data/prepared"


def test_a_bad_store_or_a_data_section_that_fails_starts_no_run(tmp_path, monkeypatch):
    """Every data section is prepared before the first run starts (a later one failing would leave
    the earlier runs training with nobody to watch them), and a store the runs cannot record to is
    the one-line reason."""
    from pbr.errors import UserError
    from stages.experiments import offline
    from stages.experiments.sweep import Run
    from stages.runtime.config import from_dict

    monkeypatch.chdir(tmp_path)
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["data"].update(root=str(tmp_path / "raw"), download=False)  # no archive there
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    # Seed 0's data section is the project's prepared data; seed 1's differs and has nothing to prepare from.
    (tmp_path / "data/prepared").mkdir(parents=True)
    (tmp_path / "data/prepared/manifest.json").write_text(json.dumps({"params": from_dict(params).to_dict()["data"]}))
    runs = [Run("first", {"seed": 0}), Run("second", {"seed": 1, "data.imbalance_ratio": 0.1})]
    out = tmp_path / "out"
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "team/pbr")
    with pytest.raises(UserError, match=r"the runs' store could not be made: MLFLOW_EXPERIMENT_NAME 'team/pbr'"):
        offline.run_all(runs, out, tmp_path / "params.yaml", record="files")
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME")
    with pytest.raises(UserError, match="pbr prepare failed for the data section"):
        offline.run_all(runs, out, tmp_path / "params.yaml", jobs=2, record="files", log=lambda _: None)
    assert list((out / "runs").iterdir()) == []


def test_stopping_a_run_interrupts_its_stage_not_only_its_shell(tmp_path):
    """What Ctrl-C on the sweep does to a run it started: the stage under the run's shell gets the
    interrupt (a stage records its run KILLED on it and exits), and nothing is left going; also when
    the sweep itself ignores SIGINT, as a script's background job does."""
    from stages.experiments import offline

    said = tmp_path / "said"
    stage = (f"import os, time\ntry:\n    open({str(said)!r}, 'w').write(f'{{os.getpid()}} started')\n    time.sleep(600)\n"
             f"except KeyboardInterrupt:\n    open({str(said)!r}, 'a').write(' interrupted')\n    raise\n")
    (tmp_path / "stage.py").write_text(stage)
    ignored = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        proc = offline._spawn(f"{sys.executable} stage.py && sleep 600", tmp_path, dict(os.environ), tmp_path / "run.log")
    finally:
        signal.signal(signal.SIGINT, ignored)
    deadline = time.time() + 60
    while not (said.is_file() and said.read_text().endswith("started")) and time.time() < deadline:
        time.sleep(0.05)
    pid = int(said.read_text().split()[0])
    offline._stop([proc])
    assert proc.returncode is not None and said.read_text() == f"{pid} started interrupted"
    assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] == "Z"


def test_a_killed_sweep_stops_its_runs_and_records_them_killed(tmp_path):
    """`kill` (SIGTERM) of `pbr sweep --offline` stops it as Ctrl-C does: its runs, each in a session of
    its own, are interrupted (not left running on their own) and their records say KILLED."""
    _small_project(tmp_path)
    out = tmp_path / "offline"
    sweep = subprocess.Popen(
        [sys.executable, "-m", "stages.cli", "sweep", "fidelity", "--budget", "quick", "--seeds", "1",
         "--only", "row=er-lr0.1", "-S", "train.epochs=500", "-S", "data.imbalance_ratio=0.5",
         "-S", "method.buffer_size=10", "--offline", str(out), "--jobs", "1"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.time() + 180
        while not any("task 1/5 epoch" in f.read_text() for f in out.glob("runs/*/run.log")):
            assert sweep.poll() is None and time.time() < deadline, sweep.communicate()[1][-2000:]
            time.sleep(0.2)
        sweep.terminate()
        _, err = sweep.communicate(timeout=120)
    finally:
        if sweep.poll() is None:
            os.killpg(sweep.pid, signal.SIGKILL)
    assert sweep.returncode == 130, err[-2000:]  # as Ctrl-C ends it
    # Nothing of the run is left going: no process works in its folder.
    run_dir = str(out / "runs")
    for proc in Path("/proc").iterdir():
        try:
            assert not os.readlink(proc / "cwd").startswith(run_dir), (proc / "cmdline").read_bytes()
        except (FileNotFoundError, PermissionError, NotADirectoryError, ProcessLookupError):
            continue
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    [run] = client.search_runs([client.get_experiment_by_name("pbr").experiment_id])
    assert run.info.status == "KILLED"


def test_a_sweep_killed_outright_leaves_its_run_to_its_stages_not_to_a_second_sweep(tmp_path):
    """`kill -9` of the sweep (an OOM killer, a lost login shell) leaves its run's stages going in their
    own session; the sweep's lock on the run died with it, so the same sweep started again ran the
    run a second time beside them (two trainings in one artifacts/train, two finished records)."""
    _small_project(tmp_path)
    out = tmp_path / "offline"
    args = [sys.executable, "-m", "stages.cli", "sweep", "fidelity", "--budget", "quick", "--seeds", "1", "--only",
            "row=er-lr0.1", "-S", "train.epochs=500", "-S", "data.imbalance_ratio=0.5", "-S", "method.buffer_size=10",
            "--offline", str(out), "--jobs", "1", "--record", "files"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    sweep = subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 180
        while not any("task 1/5 epoch" in f.read_text() for f in out.glob("runs/*/run.log")):
            assert sweep.poll() is None and time.time() < deadline, sweep.communicate()[1][-2000:]
            time.sleep(0.2)
        sweep.kill()
        sweep.wait()
        again = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert again.returncode == 0, again.stderr[-2000:]
        said = again.stdout + again.stderr
        assert "another sweep in" in said and "left to that one" in said and "started" not in said, said[-2000:]
    finally:  # the orphaned run's stages: their own session, named by the run folder they work in
        for proc in Path("/proc").iterdir():
            try:
                if os.readlink(proc / "cwd").startswith(str(out / "runs")):
                    os.killpg(int(proc.name), signal.SIGKILL)
            except (FileNotFoundError, PermissionError, NotADirectoryError, ProcessLookupError, ValueError):
                continue


def _finishing_at_once(offline, started):
    """offline._start for a run that ends at once with its metrics, as a finished one does."""
    metrics = json.dumps({"class_il": {"acc": 50.0}, "task_il": {"acc": 80.0}})

    def start(run, out, base, env, log, keep=()):
        started.append(run.name)
        d = out / "runs" / run.name
        (d / "reports").mkdir(parents=True)
        return offline._spawn(f"echo '{metrics}' > reports/metrics.json", d, dict(os.environ), d / "run.log")

    return start


def test_sweeps_sharing_a_folder_never_run_one_run_twice(tmp_path, monkeypatch):
    """Two sweeps in one folder (disjoint shards on two GPUs, or the same grid started twice): a run
    the other sweep is running (its folder's lock held, here by another process) is left to it."""
    from stages.experiments import offline
    from stages.experiments.sweep import Run

    out = tmp_path / "out"
    (out / "runs/r0").mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'a'); "
                               "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)",
                               str(out / "runs/r0/.lock")], stdout=subprocess.PIPE, text=True)
    started, said = [], []
    monkeypatch.setattr(offline, "_start", _finishing_at_once(offline, started))
    monkeypatch.setattr(offline, "_prepared", lambda *a, **k: None)
    runs = [Run("r0", {"seed": 0}), Run("r1", {"seed": 1})]
    try:
        assert holder.stdout.readline() == "held\n"
        assert offline.run_all(runs, out, ROOT / "params.yaml", jobs=2, record="files", log=said.append) == (1, 1, [])
    finally:
        holder.kill()
        holder.wait()
    assert started == ["r1"] and (out / "runs/r1/DONE").is_file() and not (out / "runs/r0/DONE").exists()
    assert "r0: another sweep in" in "\n".join(said) and "1 left to another sweep in this folder" in said[-1]
    # The other sweep gone (its lock with it), the run is this one's to run.
    assert offline.run_all(runs, out, ROOT / "params.yaml", record="files", log=said.append) == (1, 1, [])
    assert started == ["r1", "r0"]


def test_a_run_that_ended_as_the_sweep_was_interrupted_is_done(tmp_path, monkeypatch):
    """Ctrl-C in the second between a run's end and the sweep's look at it: the run finished, so it
    is DONE (a next call would otherwise run its stages again and record it twice)."""
    import types

    from stages.experiments import offline
    from stages.experiments.sweep import Run

    def sleep_then_ctrl_c(seconds):
        time.sleep(seconds)
        raise KeyboardInterrupt

    monkeypatch.setattr(offline, "_start", _finishing_at_once(offline, []))
    monkeypatch.setattr(offline, "_prepared", lambda *a, **k: None)
    monkeypatch.setattr(offline, "time", types.SimpleNamespace(time=time.time, sleep=sleep_then_ctrl_c))
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        offline.run_all([Run("r0", {"seed": 0})], out, ROOT / "params.yaml", record="files", log=lambda _: None)
    assert json.loads((out / "runs/r0/DONE").read_text())["class_il"] == {"acc": 50.0}


def test_a_python_in_a_folder_with_a_space_runs_the_stages(tmp_path, monkeypatch):
    """The runs' shell commands name the interpreter: a virtualenv under "My Projects/" must still run."""
    from stages.experiments import offline

    spaced = tmp_path / "my projects" / "python"
    spaced.parent.mkdir()
    spaced.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    spaced.chmod(0o755)
    monkeypatch.setattr(offline.sys, "executable", str(spaced))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = offline._spawn(offline._script("--help", "--help"), tmp_path, env, tmp_path / "log")  # as a run's two
    assert proc.wait(timeout=60) == 0, (tmp_path / "log").read_text()[-2000:]
    assert (tmp_path / "log").read_text().count("Usage: pbr ") == 2


def test_a_moved_folders_runs_write_their_artifacts_where_it_is_now(tmp_path):
    """MLflow records artifact folders as absolute paths: after the offline folder (or a checkout, with
    its mlflow.db) moved, a resumed run, and a new one, wrote into (or made again) the old place, and
    the runs' artifacts were not found in the new one. Any stage opening the store fixes the paths."""
    from stages.runtime import tracking

    # The run starts in another process (MLflow caches a run's artifact folder in the process that used it).
    (tmp_path / "a.txt").write_text("before the move")
    started = subprocess.run([sys.executable, "-c", (
        "import sys\nfrom stages.runtime import tracking\n"
        "client, exp_id = tracking.open_experiment(sys.argv[1], 'pbr')\nrun = client.create_run(exp_id)\n"
        "client.log_artifact(run.info.run_id, sys.argv[2])\nprint(exp_id, run.info.run_id)"),
        f"sqlite:///{tmp_path / 'old/mlflow.db'}", str(tmp_path / "a.txt")],
        env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120)
    assert started.returncode == 0, started.stderr[-2000:]
    exp_id, run_id = started.stdout.split()
    shutil.move(tmp_path / "old", tmp_path / "new")
    client, again = tracking.open_experiment(f"sqlite:///{tmp_path / 'new/mlflow.db'}", "pbr")
    assert again == exp_id
    here = (tmp_path / "new/mlartifacts").as_uri()
    assert client.get_experiment(exp_id).artifact_location == here
    uri = client.get_run(run_id).info.artifact_uri
    assert uri.startswith(f"{here}/") and uri.endswith(f"/{run_id}/artifacts"), uri
    (tmp_path / "b.txt").write_text("after the move")
    client.log_artifact(run_id, str(tmp_path / "b.txt"))
    assert sorted(a.path for a in client.list_artifacts(run_id)) == ["a.txt", "b.txt"]
    other = client.create_run(exp_id).info.run_id
    assert client.get_run(other).info.artifact_uri.startswith(f"{here}/")
    assert not (tmp_path / "old").exists()


def test_a_run_without_class_il_metrics_gets_its_done_line():
    """PNN's metrics.json has no Class-IL block: the sweep's line for it raised KeyError, and the sweep
    stopped every other run going."""
    from stages.experiments.offline import done_line

    pnn = {"task_il": {"acc": 61.234}}
    assert done_line("pnn-c10", 12.4, pnn) == "done pnn-c10 in 12 s: Class-IL -, Task-IL 61.23"
    both = {"class_il": {"acc": 20.5}, "task_il": {"acc": 61.0}}
    assert done_line("er-c10", 3, both) == "done er-c10 in 3 s: Class-IL 20.50, Task-IL 61.00"


def test_a_killed_sweep_takes_over_the_ctrl_c_handler_pbr_installs_and_leaves_nohup_alone():
    """pbr's main() maps SIGTERM/SIGHUP to Ctrl-C's handler; the sweep's own (which ignores a second
    kill while its runs stop) only took over the default action, so under main() it never did. And
    an ignored SIGHUP (`nohup`) stays ignored."""
    import signal

    from stages.experiments.offline import kills_interrupt

    old = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        with kills_interrupt():
            assert signal.getsignal(signal.SIGTERM) not in (signal.default_int_handler, signal.SIG_DFL)
            assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) == signal.default_int_handler
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def test_a_done_run_under_other_params_or_training_code_runs_again(tmp_path, monkeypatch):
    """DONE was read by name only: after a committed params.yaml edit (or a training code edit) a
    second sweep skipped every run as done with the old settings, where DVC's queue runs them again."""
    from stages.experiments import offline
    from stages.experiments.sweep import Run

    started = []
    metrics = json.dumps({"class_il": {"acc": 50.0}, "task_il": {"acc": 80.0}})

    def start(run, out, base, env, log, keep=()):
        started.append(run.name)
        d = out / "runs" / run.name
        (d / "reports").mkdir(parents=True, exist_ok=True)
        return offline._spawn(f"echo '{metrics}' > reports/metrics.json", d, dict(os.environ), d / "run.log")

    monkeypatch.setattr(offline, "_start", start)
    monkeypatch.setattr(offline, "_prepared", lambda *a, **k: None)
    out, said = tmp_path / "out", []
    sweep = lambda runs: offline.run_all(runs, out, ROOT / "params.yaml", record="files", log=said.append)  # noqa: E731
    assert sweep([Run("r0", {"seed": 0})]) == (1, 0, [])
    assert sweep([Run("r0", {"seed": 0})]) == (0, 1, []) and started == ["r0"]
    # Where the data lies is no part of a run.
    assert sweep([Run("r0", {"seed": 0, "data.root": str(tmp_path / "elsewhere")})]) == (0, 1, [])
    # The same name under another batch size: run again, and said.
    assert sweep([Run("r0", {"seed": 0, "train.batch_size": 16})]) == (1, 0, []) and started == ["r0", "r0"]
    assert "r0: finished under other params or training code; run again" in said
    # Another training code: likewise.
    monkeypatch.setattr("stages.runtime.paths.code_hash", lambda root=None: "edited")
    assert sweep([Run("r0", {"seed": 0, "train.batch_size": 16})]) == (1, 0, []) and len(started) == 3
    # A DONE from before stamps existed counts as done: nothing says it is stale.
    done = out / "runs/r0/DONE"
    done.write_text(json.dumps({k: v for k, v in json.loads(done.read_text()).items() if k != "stamp"}))
    assert sweep([Run("r0", {"seed": 0})]) == (0, 1, [])


def test_the_runs_record_the_codes_commit_not_the_starting_folders(tmp_path, monkeypatch):
    """The sweep's runs execute from --offline's folder with the project's code: their commit is the
    code's checkout's. It was the folder the sweep started from: "unknown" (and git.dirty "false",
    never asked) outside a checkout, or another repository's HEAD inside one."""
    from stages.experiments import offline
    from stages.runtime import tracking

    monkeypatch.delenv("PBR_GIT_COMMIT", raising=False)
    monkeypatch.delenv("PBR_GIT_DIRTY", raising=False)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    elsewhere = tmp_path / "proj X"
    elsewhere.mkdir()
    subprocess.run(["git", "init", "-q", str(elsewhere)], check=True)
    subprocess.run(["git", "-C", str(elsewhere), "-c", "user.name=x", "-c", "user.email=x@x", "commit", "-q",
                    "--allow-empty", "-m", "other"], check=True)
    for start in (tmp_path, elsewhere):  # not a checkout; another repository
        monkeypatch.chdir(start)
        env = offline._env(tmp_path, ROOT, "sqlite:///unused.db")
        assert head and env["PBR_GIT_COMMIT"] == head
        assert env["PBR_GIT_DIRTY"] in ("true", "false")
    monkeypatch.chdir(tmp_path)
    assert tracking.git_state() == {"git.commit": "unknown", "git.dirty": "unknown"}
