import os

from stages import threads


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
    monkeypatch.chdir(ws)
    assert threads.resolve("auto") == 4
    monkeypatch.chdir(tmp_path)
    assert threads.resolve("auto") == 8
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert threads.resolve("auto") == 3
    assert threads.resolve(5) == 5
