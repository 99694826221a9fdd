import os
import shutil
import sys
from pathlib import Path

# One torch thread per test process (set before torch loads): pytest-xdist runs tests side by side,
# and oversubscribed OpenMP threads slow everything down many times over (stages/runtime/threads.py).
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The real CIFAR-10 archive for the real-data tests: $PBR_DATA_DIR, else the project's data/raw
# (where `dvc repro` downloads it); the tests skip when it is absent.
REAL_CIFAR10 = Path(os.environ.get("PBR_DATA_DIR") or ROOT / "data" / "raw") / "cifar-10-python.tar.gz"
sys.path.insert(0, str(Path(__file__).parent))  # tests/fakedata.py

real_cifar10 = pytest.mark.skipif(
    not REAL_CIFAR10.is_file(),
    reason=f"real CIFAR-10 not found at {REAL_CIFAR10} (only on development and CI machines)",
)


@pytest.fixture(autouse=True)
def _quiet_env(monkeypatch):
    # Keep DVC and MLflow from phoning home or picking up a user's settings.
    monkeypatch.setenv("DVC_NO_ANALYTICS", "1")
    monkeypatch.setenv("DVC_NO_UPDATE_CHECK", "1")


@pytest.fixture(scope="session")
def finished(tmp_path_factory):
    """One complete `dvc repro` (generated CIFAR-10, PBR, width 4, 2 epochs); copy it to change it.

    Built once per test session, also under pytest-xdist: the first worker builds it under a lock in
    the directory the workers share, the others wait and reuse it."""
    import fcntl

    from project import finished_project

    shared = tmp_path_factory.getbasetemp().parent if os.environ.get("PYTEST_XDIST_WORKER") else \
        tmp_path_factory.getbasetemp()
    with open(shared / "finished.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        where = shared / "finished-project"
        if not (where / "complete").is_file():
            shutil.rmtree(where, ignore_errors=True)
            where.mkdir()
            finished_project(where)
            (where / "complete").touch()
    return where / "finished"


@pytest.fixture
def records_to_files(tmp_path, monkeypatch):
    """The stages of this test, in this process and in the processes it starts, record their runs to
    plain files (`MLFLOW_TRACKING_URI=journal:<tmp_path>/journal`, stages/runtime/journal.py) rather
    than to MLflow: the same `stage_run` code, and a stage process then skips MLflow's imports (about
    2.8 of its 5 CPU s). For tests whose subject is not the record; MLflow's store is exercised end
    to end by the finished pipeline, test_methods_dvc's ER, the team walkthrough and the queue workers."""
    from stages.runtime import journal

    monkeypatch.setenv("MLFLOW_TRACKING_URI", journal.uri(tmp_path / "journal"))
    return journal.Reader(tmp_path / "journal")


@pytest.fixture
def pbr_main(monkeypatch, capfd):
    """`pbr ARGS` through the CLI's own run_command() in this process: the same output, one-line errors and exit
    status as the real command, without a process start (about 4.5 CPU s of torch and MLflow imports).
    Tests keep a real process where the process is the feature: a stage under DVC, a kill, a sweep's
    workers, and one CLI error of each kind."""
    import subprocess
    import sys

    from stages import cli

    def run(*args, cwd, env=None):
        monkeypatch.chdir(cwd)
        # run_command() sets it for its own process when unset: left unset here, so that the command sets
        # it as it does in its process, and goes with the test.
        monkeypatch.delenv("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", raising=False)
        for k, v in (env or {}).items():
            monkeypatch.setenv(k, v)
        monkeypatch.setattr(sys, "argv", ["pbr", *args])
        capfd.readouterr()
        try:
            cli.run_command()
            code = 0
        except SystemExit as e:
            code = e.code or 0
        said = capfd.readouterr()
        return subprocess.CompletedProcess(sys.argv, code, said.out, said.err)

    return run


def pytest_collection_modifyitems(items):
    # The longest test (two DVC queue workers) first, so pytest-xdist's workers finish together.
    items.sort(key=lambda item: item.get_closest_marker("longest") is None)


def pytest_xdist_auto_num_workers(config):
    # `-n auto`: one worker more than the cores. The end-to-end tests spend part of their time
    # waiting on other processes (DVC's queue polls, MLflow servers, git and dvc subprocesses), and a
    # third worker on CI's two cores runs other tests in those gaps (docs/benchmarks.md, CI time).
    return (os.cpu_count() or 1) + 1
