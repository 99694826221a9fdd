import os

from stages.runtime import threads


def _workspace(tmp_path, pids):
    celery = tmp_path / "repo" / ".dvc" / "tmp" / "exps" / "celery"
    celery.mkdir(parents=True)
    for i, pid in enumerate(pids, 1):
        (celery / f"dvc-exp-worker-{i}.pid").write_text(f"{pid}\n")
    ws = tmp_path / "repo" / ".dvc" / "tmp" / "exps" / "tmpabc123"
    ws.mkdir()
    return ws


def test_queue_workers_counts_the_live_ones(tmp_path):
    dead = 2**22 + 12345  # above the default pid_max: no such process
    ws = _workspace(tmp_path, [os.getpid(), os.getppid(), dead])
    assert threads.queue_workers(ws) == 2
    assert threads.queue_workers(tmp_path / "repo") == 0  # not in a queue workspace


def test_auto_shares_the_cores_among_queue_workers(tmp_path, monkeypatch):
    ws = _workspace(tmp_path, [os.getpid(), os.getppid()])
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: set(range(8)))
    monkeypatch.setattr(threads, "compute_pids", set)  # whatever else this machine runs
    monkeypatch.chdir(ws)
    assert threads.resolve("auto") == 4
    monkeypatch.chdir(tmp_path)
    assert threads.resolve("auto") == 8
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert threads.resolve("auto") == 3
    assert threads.resolve(5) == 5


def test_compute_processes_are_the_live_pbr_train_and_score_ones(tmp_path):
    """Real processes: a program named `pbr` run with `train` or `score` counts, with `report` not;
    so does `python -m stages.cli train`, the form an offline sweep's runs take (two such runs on two
    cores each took both cores' threads, and trained at a tenth of their speed)."""
    import subprocess
    import sys

    fake = tmp_path / "bin" / "pbr"
    fake.parent.mkdir()
    fake.write_text("import time\ntime.sleep(60)\n")
    (tmp_path / "pkg/stages").mkdir(parents=True)
    (tmp_path / "pkg/stages/__init__.py").write_text("")
    (tmp_path / "pkg/stages/cli.py").write_text("import time\ntime.sleep(60)\n")
    procs = {cmd: subprocess.Popen([sys.executable, str(fake), cmd]) for cmd in ("train", "score", "report")}
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "pkg")}
    procs |= {f"-m {cmd}": subprocess.Popen([sys.executable, "-m", "stages.cli", cmd], env=env)
              for cmd in ("train", "evaluate")}
    try:
        import time

        time.sleep(0.5)
        found = threads.compute_pids()
        assert procs["train"].pid in found and procs["score"].pid in found and procs["-m train"].pid in found
        assert procs["report"].pid not in found and procs["-m evaluate"].pid not in found and os.getpid() not in found
    finally:
        for p in procs.values():
            p.kill()
            p.wait()
    assert not {p.pid for p in procs.values()} & threads.compute_pids()


def test_auto_shares_the_cores_among_the_live_compute_processes(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: set(range(8)))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(threads, "compute_pids", lambda: {101, 102, 103})
    assert threads.resolve("auto") == 2  # 8 cores // 3 training processes
    monkeypatch.setattr(threads, "compute_pids", lambda: set(range(20)))
    assert threads.resolve("auto") == 1
