"""`pbr sweep` through the real DVC queue with two workers at once on one machine: no run lost, the
MLflow sqlite store intact, and `pbr report` builds the table from the finished runs."""

import time

import pytest

import fakedata
from project import BIN, dvc, make_project, run
from project import queue_states as _queue

pytestmark = [pytest.mark.slow, pytest.mark.longest]


def _finished_in_store(repo, failed: bool = False) -> int:
    """Runs of the store that every stage has finished, or with `failed` that a stage ended FAILED
    (read with sqlite3: no MLflow import)."""
    import sqlite3

    query = ("SELECT count(*) FROM runs WHERE status = 'FAILED'" if failed else
             "SELECT count(*) FROM tags WHERE key = 'pbr.complete' AND value = 'true'")
    try:
        with sqlite3.connect(f"file:{repo / 'mlflow.db'}?mode=ro", uri=True, timeout=5) as db:
            return db.execute(query).fetchone()[0]
    except sqlite3.Error:  # written to at this instant, or not yet created
        return 0


def test_two_queue_workers_lose_no_run(tmp_path, pbr_main):
    raw = tmp_path / "raw"
    fakedata.write_cifar(raw, 100, 20, 2)
    repo = make_project(tmp_path / "repo", data__root=str(raw), data__download=False, data__dataset="cifar100",
                        model__width=4, train__epochs=1, train__device="cpu", train__eval_batch_size=256,
                        method__pbr__mc_samples=4)
    sweep = [str(BIN / "pbr"), "sweep", "table3", "--seeds", "1", "--only", "data.imbalance_ratio=0.1"]
    r = run([*sweep, "--jobs", "2"], repo)
    assert "2 runs queued, 0 already finished or queued" in r.stderr
    # The sweep returned once the workers started, not when they finished (its output is not theirs to
    # hold open): a run takes a minute or more here.
    assert _finished_in_store(repo) == 0 and "follow them with: dvc queue status" in r.stderr, r.stderr
    assert (repo / "mlflow.db").is_file()  # created before the workers start
    assert "$ dvc queue start -j 2" in (repo / ".dvc/tmp/pbr-queue.log").read_text()
    try:
        deadline = time.time() + 900
        # Each `dvc queue status` costs about 0.7 CPU s on CI's two cores, a look into the store almost
        # nothing: the queue is asked only once both runs have ended in MLflow (or every minute, should
        # a worker die without a word to the store).
        asked = time.time()
        while time.time() < deadline and _finished_in_store(repo) + _finished_in_store(repo, failed=True) < 2:
            if time.time() - asked > 60:
                asked = time.time()
                states = _queue(repo)
                if len(states) == 2 and all(s in ("Success", "Failed") for _, s in states):
                    break
            time.sleep(2)
        while time.time() < deadline:
            states = _queue(repo)
            if len(states) == 2 and all(s in ("Success", "Failed") for _, s in states):
                break
            time.sleep(5)
        else:
            raise AssertionError(f"the queue did not finish: {_queue(repo)}")
    finally:
        dvc(repo, "queue", "stop", check=False)
    names = {n for n, _ in states}
    assert all(s == "Success" for _, s in states), states
    assert set(dvc(repo, "exp", "ls", "--name-only").stdout.split()) == names

    from mlflow import MlflowClient

    c = MlflowClient(f"sqlite:///{repo / 'mlflow.db'}")
    runs = c.search_runs([c.get_experiment_by_name("pbr").experiment_id])
    assert len(runs) == 2 and all(x.info.status == "FINISHED" for x in runs), [x.info.status for x in runs]
    assert {x.data.tags["dvc.exp_name"] for x in runs} == names
    assert all(x.data.tags.get("pbr.complete") == "true" for x in runs)
    # Two at once: some runs overlapped in time.
    spans = sorted((x.info.start_time, x.info.end_time) for x in runs)
    assert any(b[0] < a[1] for a, b in zip(spans, spans[1:])), spans

    # The report and a second sweep in this process (the same main(); the first sweep above was its own).
    rep = pbr_main("report", cwd=repo).stdout
    assert "shuffled, IR 0.1" in rep and "DER++" in rep and "PBR" in rep and "(n=1)" in rep
    # A second sweep queues nothing: every run is finished.
    assert "0 runs queued, 2 already finished or queued" in pbr_main(*sweep[1:], cwd=repo).stderr


def _kill_everything_under(folder) -> int:
    """SIGKILL every process working in `folder` (a queue worker in the repository, its run in a
    workspace under .dvc/tmp/exps): a node lost, as far as this repository can tell."""
    import os
    import signal
    from pathlib import Path

    killed = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
        except OSError:
            continue
        if cwd == folder or folder in cwd.parents:
            try:
                os.kill(int(pid), signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
    return killed


def test_a_run_whose_worker_was_killed_is_queued_again(tmp_path):
    """DVC lists a task as Running forever once its worker is killed (a lost node, a SLURM time
    limit): the sweep run again skipped it as running, and examples/slurm_sweep.sh waited on it."""
    raw = tmp_path / "raw"
    fakedata.write_cifar(raw, 100, 20, 2)
    repo = make_project(tmp_path / "repo", data__root=str(raw), data__download=False, data__dataset="cifar100",
                        model__width=4, train__epochs=1, train__device="cpu", method__pbr__mc_samples=4)
    sweep = [str(BIN / "pbr"), "sweep", "table3", "--seeds", "1", "--only", "data.imbalance_ratio=0.1",
             "--only", "method.name=pbr"]
    assert "1 run queued" in run([*sweep, "--jobs", "1"], repo).stderr
    try:
        deadline = time.time() + 300
        while time.time() < deadline and [s for _, s in _queue(repo)] != ["Running"]:
            time.sleep(1)
        assert [s for _, s in _queue(repo)] == ["Running"]
        assert _kill_everything_under(repo.resolve()) >= 1
        time.sleep(1)
        assert [s for _, s in _queue(repo)] == ["Running"]  # DVC's listing: no worker, never to end
        r = run(sweep, repo)
        assert "listed as running, but no queue worker is alive (killed?): marked failed, queued again" in r.stderr
        assert "1 run queued, 0 already finished or queued" in r.stderr, r.stderr
        assert sorted(s for _, s in _queue(repo)) == ["Failed", "Queued"]
    finally:
        dvc(repo, "queue", "stop", check=False)
        _kill_everything_under(repo.resolve())


def _queued_roots(repo) -> list[str]:
    """data.root in the params.yaml of each experiment waiting in the queue."""
    import subprocess

    import yaml
    from dvc.repo import Repo

    with Repo(str(repo)) as r:
        revs = [e.stash_rev for e in r.experiments.celery_queue.iter_queued()]
    return [yaml.safe_load(subprocess.run(["git", "show", f"{rev}:params.yaml"], cwd=repo, capture_output=True,
                                          text=True, check=True).stdout)["data"]["root"] for rev in revs]


def test_an_awkward_data_root_queues_one_experiment_with_it(tmp_path, pbr_main, monkeypatch):
    """-S data.root=PATH reaches DVC's -S (Hydra's grammar) quoted: a ~, # or = in the path failed to
    parse (a 96-line traceback), and a comma queued two experiments (roots /x/raw and 2) while pbr
    said one. The --dry-run line pasted into a shell queues the same."""
    repo = make_project(tmp_path / "repo", data__download=True)
    sweep = ["sweep", "families", "--budget", "quick", "--seeds", "1", "--only", "method.name=sgd",
             "--only", "data.imbalance_ratio=1.0"]
    # Through the real queue, three that failed in three ways; tests/test_sweep.py takes 14 through DVC's own
    # apply_overrides (every other character a path may hold).
    for root in ["~/raw", "/x/raw,2", "/x/bob's"]:
        r = pbr_main(*sweep, "-S", f"data.root={root}", cwd=repo)
        assert r.returncode == 0 and "families: 1 run queued" in r.stderr, r.stderr
        assert _queued_roots(repo) == [root]
        line = pbr_main(*sweep, "-S", f"data.root={root}", "--dry-run", cwd=repo).stdout.strip()
        run(line, repo)  # through bash, as pasted: the same experiment again (DVC queues it twice)
        assert _queued_roots(repo) == [root, root], line
        dvc(repo, "queue", "remove", "--queued")  # pbr's sweep skips an experiment of the same name queued
    # Whatever else DVC's queueing raises is one line, not its traceback.
    from stages.experiments import sweep as stage

    monkeypatch.setattr(stage.Run, "set_params", lambda self: ["data.root=~/raw"])  # the old unquoted value
    r = pbr_main(*sweep, cwd=repo)
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1] == (
        "error: dvc could not queue c10-sgd-ord-ir1-s0-quick: OverrideParseException: LexerNoViableAltException: "
        "data.root=~/raw (its -S values: pbr sweep --dry-run)"), r.stderr
