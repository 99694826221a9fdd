"""A stage that DVC started stops when that dvc process dies.

DVC runs a stage's command under a shell (`$SHELL -c cmd`, /bin/sh where SHELL is unset) and waits
for it, ignoring Ctrl-C meanwhile (the terminal sends it to the stage too). A SIGTERM to dvc alone
(`kill <pid>`, a container stop or a scheduler that signals the main process only) ends dvc and
leaves the stage running: an orphan that goes on writing the outputs a new `dvc repro` writes too,
its MLflow run RUNNING until some later stage on the same host notices. dash does not exec the
command it runs (bash does), so the kernel's parent-death signal would watch the shell, which
outlives dvc: a thread here watches the dvc process itself and stops the stage as SIGTERM does.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

SHELLS = frozenset({"sh", "dash", "bash", "zsh", "fish", "ksh", "mksh"})


def _stat(pid: int) -> tuple[str, str, int, int] | None:
    """(name, state, parent pid, start time) of a process, None where it is gone (or no /proc)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The name is in parentheses and may hold spaces or parentheses itself.
    rest = text[text.rindex(")") + 2:].split()
    return text[text.index("(") + 1:text.rindex(")")], rest[0], int(rest[1]), int(rest[19])


def dvc_process() -> tuple[int, int] | None:
    """(pid, start time) of the process that started this stage: the parent, or the shell's parent
    where the parent is a shell. None outside DVC or where it cannot be told."""
    if not os.environ.get("DVC_STAGE"):
        return None
    pid = os.getppid()
    st = _stat(pid)
    if st is not None and st[0] in SHELLS:
        pid = st[2]
        st = _stat(pid)
    if st is None or pid <= 1:  # no /proc, or orphaned already: nothing to follow
        return None
    return pid, st[3]


def _alive(pid: int, start: int) -> bool:
    st = _stat(pid)
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
