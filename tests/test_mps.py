"""`pbr sweep --gpu-share`: a CUDA MPS server of the sweep's own, where one starts.

The daemon itself needs a GPU: its start and stop commands ran on an H100 in benchmarks/bench_routes.py,
before they moved into stages/runtime/mps.py, which benchmarks/bench_runs_gpu.py runs whole runs under
(not yet on a GPU). Here, what a machine without one, or with one whose daemon will not start, gets: the
runs as before, or a one-line error."""

import os
import sys

import pytest

from conftest import ROOT
from pbr.errors import UserError
from stages.runtime import mps


@pytest.fixture
def no_control(tmp_path, monkeypatch):
    """A PATH without nvidia-cuda-mps-control (CI's machines have no GPU driver)."""
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv(mps.PIPE, raising=False)
    return empty


def test_auto_falls_back_and_mps_insists(no_control):
    said = []
    with mps.shared("auto", True, log=said.append) as shared:
        assert shared is False and mps.PIPE not in os.environ
    assert said == ["--gpu-share auto: no MPS (nvidia-cuda-mps-control is not on PATH); the runs time-slice the GPU"]
    with pytest.raises(UserError, match=r"^--gpu-share mps: MPS did not start \(nvidia-cuda-mps-control is not on "
                                        r"PATH\); use --gpu-share off$"):
        with mps.shared("mps", True):
            pass
    # Not on a GPU: auto and off leave the runs alone without looking for a daemon; mps refuses.
    for mode in ("auto", "off"):
        with mps.shared(mode, False, log=said.append) as shared:
            assert shared is False
    assert len(said) == 1
    with pytest.raises(UserError, match="the runs do not use a CUDA GPU"):
        with mps.shared("mps", False):
            pass


def test_a_daemon_that_fails_to_start_is_reported(no_control):
    control = no_control / mps.CONTROL
    control.write_text("#!/bin/sh\necho 'An instance of this daemon is already running' >&2\nexit 1\n")
    control.chmod(0o755)
    said = []
    with mps.shared("auto", True, log=said.append) as shared:
        assert shared is False and mps.PIPE not in os.environ
    assert "-d exited 1: An instance of this daemon is already running" in said[0]


def test_a_sweep_interrupted_while_its_daemon_starts_quits_the_daemon(no_control, tmp_path, monkeypatch):
    """`nvidia-cuda-mps-control -d` forks the daemon off: an interrupt while it starts (a kill of the
    sweep: offline.kills_interrupt) must still send it `quit`."""
    import signal

    control = no_control / mps.CONTROL
    control.write_text('#!/bin/sh\nif [ "$1" = "-d" ]; then exec /bin/sleep 30; fi\n/bin/cat > "$MARK"\n')
    control.chmod(0o755)
    monkeypatch.setenv("MARK", str(tmp_path / "told"))

    def interrupt(*_):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    try:
        with pytest.raises(KeyboardInterrupt):
            with mps.daemon():
                pass
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert (tmp_path / "told").read_text() == "quit\n"


def test_a_cpu_run_records_no_sharing_whatever_the_environment(monkeypatch):
    import torch

    monkeypatch.setenv(mps.PIPE, "/tmp/somewhere")
    assert mps.sharing(torch.device("cpu")) == "none"
    assert mps.sharing(torch.device("cuda")) == "mps"
    monkeypatch.delenv(mps.PIPE)
    assert mps.sharing(torch.device("cuda")) == "none"


@pytest.mark.parametrize("args,needle", [
    (["--gpu-share", "often"], "--gpu-share often: give auto"),
    (["--gpu-share", "often", "--dry-run"], "--gpu-share often: give auto"),  # a plan it would not run
    (["--gpu-share", "mps"], "--gpu-share mps: MPS serves --offline sweeps only"),
    (["--record", "files"], "--record files: it says how an --offline sweep records; give --offline DIR too"),
    (["--record", "csv", "--offline", "o"], "--record csv: give one of auto, mlflow, files"),
])
def test_bad_gpu_share_is_a_one_line_error(args, needle, monkeypatch, capfd):
    from stages import cli

    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "argv", ["pbr", "sweep", "fidelity", "--budget", "quick", "--seeds", "1",
                                      "--only", "row=pbr", *args])
    with pytest.raises(SystemExit) as e:
        cli.run_command()
    err = [x for x in capfd.readouterr().err.splitlines() if x.strip()]
    assert e.value.code == 2 and len(err) == 1 and needle in err[0], err


def _daemon_and_client(no_control, tmp_path, monkeypatch, torch_py: str) -> None:
    """A control binary whose `-d` starts nothing and which keeps what it is told in $MARK; the
    client's python imports `torch_py` as torch."""
    control = no_control / mps.CONTROL
    control.write_text('#!/bin/sh\nif [ "$1" = "-d" ]; then exit 0; fi\n/bin/cat >> "$MARK"\n')
    control.chmod(0o755)
    monkeypatch.setenv("MARK", str(tmp_path / "told"))
    fake = tmp_path / "client"
    fake.mkdir()
    (fake / "torch.py").write_text(torch_py)
    monkeypatch.setenv("PYTHONPATH", str(fake))


def test_a_daemon_that_starts_but_serves_no_client_is_quit_and_the_runs_time_slice(no_control, tmp_path,
                                                                                  monkeypatch):
    """`-d` exits 0, yet a client through the pipe fails (here: no CUDA at all): every run of the sweep
    would fail at its first kernel. One client is tried first; the daemon is told to quit."""
    # The client's python: its `import torch` fails as a client refused by the daemon would.
    _daemon_and_client(no_control, tmp_path, monkeypatch,
                       "raise RuntimeError('CUDA error: all CUDA-capable devices are busy or unavailable')\n")
    said = []
    with mps.shared("auto", True, log=said.append) as shared:
        assert shared is False and mps.PIPE not in os.environ
    assert "a CUDA client through it failed: RuntimeError: CUDA error: all CUDA-capable devices are busy" in said[0]
    assert (tmp_path / "told").read_text() == "quit\n"


def test_a_client_that_hangs_is_given_up_at_the_timeout(no_control, tmp_path, monkeypatch):
    """A daemon whose first client hangs: the wait comes out of a device call's budget, then the runs
    time-slice. The client is stopped at CLIENT_TIMEOUT, not when it ends; the daemon quits."""
    import time

    # a client that never gets its kernel; the wait cut short here (45 s on a device)
    _daemon_and_client(no_control, tmp_path, monkeypatch, "import time\ntime.sleep(600)\n")
    monkeypatch.setattr(mps, "CLIENT_TIMEOUT", 2)
    said, t = [], time.time()
    with mps.shared("auto", True, log=said.append) as shared:
        assert shared is False
    assert time.time() - t < 30 and "a CUDA client through it did not finish within 2 s" in said[0], said
    assert (tmp_path / "told").read_text() == "quit\n"
