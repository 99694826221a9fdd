"""Fault injection for the kill tests: `PBR_KILL_AT=<point>` SIGKILLs the stage at that point.

A SIGKILL cannot be caught, so this is the same death as an OOM kill or a pulled plug, placed at
a chosen instant instead of a raced one. Points: `prepare:written` (shards written, not yet
renamed into place), `train:task<K>:epoch<E>` (inside task K, after its epoch E),
`train:after_task<K>` (task K saved and tracked, task K+1 not begun), `score:after_task<K>`
(task K scored and kept), `evaluate:partial`
(some reports written in reports/eval's temporary folder), `prepare:logged`, `score:logged`, `evaluate:logged`
(the stage's metrics in its run, the stage not ended). With `PBR_KILL_GROUP=1` the whole process group
dies: the stage and the `dvc repro` that started it (start that in its own session).
`PBR_PAUSE_AT=<point>` instead makes the stage touch the file `PBR_PAUSE_MARK` there and sleep for
two minutes: the test does something to it meanwhile (kills the dvc that started it).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

ENV = "PBR_KILL_AT"


def point(name: str) -> None:
    if os.environ.get("PBR_PAUSE_AT") == name:
        Path(os.environ["PBR_PAUSE_MARK"]).touch()
        time.sleep(120)
    if os.environ.get(ENV) == name:
        if os.environ.get("PBR_KILL_GROUP") == "1":
            os.killpg(os.getpgid(0), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)
