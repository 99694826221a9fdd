"""A stage that DVC started stops when that dvc process dies.

DVC runs a stage's command under a shell (`$SHELL -c cmd`, /bin/sh where SHELL is unset) and waits
for it, ignoring Ctrl-C meanwhile (the terminal sends it to the stage too). A SIGTERM to dvc alone
(`kill <pid>`, a container stop or a scheduler that signals the main process only) ends dvc and
leaves the stage running: an orphan that goes on writing the outputs a new `dvc repro` writes too,
its MLflow run RUNNING until some later stage on the same host notices. dash does not exec the
command it runs (bash does), and a stage's command may be a script that runs pbr, so the kernel's
parent-death signal would watch a process that outlives dvc: a thread here watches the dvc process
itself, the nearest ancestor without the stage's DVC_STAGE in its environment (DVC sets it for the
command only), and stops the stage as SIGTERM does.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

GONE = (FileNotFoundError, ProcessLookupError)


def _stat(pid: int) -> tuple[str, str, int, int] | None:
    """(name, state, parent pid, start time) of a process, None where it is gone. Any other error
    (no /proc, too many open files) raises: the caller must not read it as a death."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except GONE:
        return None
    # The name is in parentheses and may hold spaces or parentheses itself.
    rest = text[text.rindex(")") + 2:].split()
    return text[text.index("(") + 1:text.rindex(")")], rest[0], int(rest[1]), int(rest[19])


def _in_the_stage(pid: int, stage: bytes) -> bool:
    """Whether process `pid` runs inside the stage (a shell or script DVC started it through)."""
    try:
        return b"DVC_STAGE=" + stage in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:  # another user's process, or gone: not one of the stage's own
        return False


def dvc_process() -> tuple[int, int] | None:
    """(pid, start time) of the dvc process that started this stage, None outside DVC or where it
    cannot be told (no /proc, or already orphaned)."""
    stage = os.environ.get("DVC_STAGE")
    if not stage:
        return None
    try:
        pid = os.getppid()
        for _ in range(16):  # shells and scripts between dvc and the stage
            if not _in_the_stage(pid, os.fsencode(stage)):
                break
            st = _stat(pid)
            if st is None:
                return None
            pid = st[2]
        st = _stat(pid)
    except OSError:
        return None
    if st is None or pid <= 1:
        return None
    return pid, st[3]


def _alive(pid: int, start: int) -> bool:
    try:
        st = _stat(pid)
    except OSError:  # cannot tell now (too many open files): not a death
        return True
    # A zombie has died; another start time is another process that took the pid.
    return st is not None and st[1] not in ("Z", "X") and st[3] == start


def follow_dvc(interval: float = 1.0) -> None:
    """Under a DVC stage, a daemon thread that sends this process SIGTERM (which the CLI turns into
    the interrupt's clean stop: finished tasks kept, the MLflow run KILLED) once dvc has died."""
    parent = dvc_process()
    if parent is None:
        return

    def watch() -> None:
        while _alive(*parent):
            time.sleep(interval)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="pbr-follow-dvc", daemon=True).start()
