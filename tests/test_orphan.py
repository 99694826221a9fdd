"""A stage DVC started follows the dvc process above it (stages/runtime/orphan.py): real processes,
a stand-in for dvc that starts the stage's command as DVC does (under /bin/sh, DVC_STAGE set for the
command only), the command a script that runs the stage through bash, as a user's `cmd:` may."""

import errno
import os
import signal
import subprocess
import sys
import textwrap
import time

from stages.runtime import orphan

STAGE = textwrap.dedent("""
    import pathlib, signal, sys, time
    from stages.runtime.orphan import dvc_process, follow_dvc
    out = pathlib.Path(sys.argv[1])
    signal.signal(signal.SIGTERM, lambda *_: (out.with_suffix(".stopped").write_text("SIGTERM"), sys.exit(0)))
    follow_dvc(0.1)
    out.write_text(str(dvc_process()[0]))
    time.sleep(60)
""")

# dvc's part: the command under /bin/sh with DVC_STAGE set for it, waited for (dvc/stage/run.py).
DVC = textwrap.dedent("""
    import os, subprocess, sys
    p = subprocess.Popen(["/bin/sh", "-c", sys.argv[1]], env={**os.environ, "DVC_STAGE": "train"})
    p.wait()
""")


def test_a_stage_under_a_script_follows_dvc_not_the_shells_between(tmp_path):
    """The watcher followed the stage's parent, or its parent past one shell: under `bash run.sh` it
    watched DVC's /bin/sh, which outlived dvc, and the stage trained on as an orphan."""
    (tmp_path / "stage.py").write_text(STAGE)
    (tmp_path / "run.sh").write_text(f'"{sys.executable}" "{tmp_path / "stage.py"}" "{tmp_path / "watched"}"\nexit $?\n')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("DVC_STAGE", None)
    dvc = subprocess.Popen([sys.executable, "-c", DVC, f"bash {tmp_path / 'run.sh'}"], env=env, start_new_session=True)
    try:
        deadline = time.time() + 60
        while not (tmp_path / "watched").exists() or not (tmp_path / "watched").read_text():
            assert dvc.poll() is None and time.time() < deadline, "the stage never started"
            time.sleep(0.1)
        assert int((tmp_path / "watched").read_text()) == dvc.pid  # dvc itself, not /bin/sh or bash
        dvc.kill()
        dvc.wait()
        deadline = time.time() + 20
        while not (tmp_path / "watched.stopped").exists():
            assert time.time() < deadline, "the stage outlived the dvc that started it"
            time.sleep(0.1)
    finally:
        try:
            os.killpg(dvc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_a_process_that_cannot_be_read_now_is_not_taken_for_dead(monkeypatch):
    """Too many open files (or any error but "no such process") while reading /proc said "dvc died",
    and the watcher stopped a healthy run."""
    start = orphan._stat(os.getpid())[3]
    assert orphan._alive(os.getpid(), start)

    def full(*_, **__):
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(orphan.Path, "read_text", full)
    assert orphan._alive(os.getpid(), start)
    monkeypatch.setattr(orphan.Path, "read_text", lambda *_: (_ for _ in ()).throw(FileNotFoundError()))
    assert not orphan._alive(os.getpid(), start)
