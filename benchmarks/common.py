"""Shared timing helpers: medians of repeated runs, ratios against a baseline measured in the same run."""

from __future__ import annotations

import os
import signal
import statistics
import sys
import time
from pathlib import Path


def rate(fn, n_items: int, repeats: int = 5, warmup: int = 1) -> float:
    """Median items/s of `fn()` (which processes n_items) over `repeats` timed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return n_items / statistics.median(times)


def row(name: str, value: float, base: float | None = None, unit: str = "img/s") -> str:
    ratio = f"  {value / base:5.2f}x" if base else ""
    return f"{name:<44} {value:10.1f} {unit}{ratio}"


def machine() -> str:
    import platform

    import torch

    dev = torch.cuda.get_device_name(0) if torch.cuda.is_available() else platform.processor() or platform.machine()
    return f"{dev}, torch {torch.__version__}, {torch.get_num_threads()} threads"


def compile_threads(n_processes: int) -> dict[str, str]:
    """The environment for n processes compiling at once: inductor's default pool (a worker a core)
    in each would be n x cores workers. Empty where TORCHINDUCTOR_COMPILE_THREADS is already set."""
    if "TORCHINDUCTOR_COMPILE_THREADS" in os.environ:
        return {}
    return {"TORCHINDUCTOR_COMPILE_THREADS": str(max(1, (os.cpu_count() or 1) // n_processes))}


def exit_on_sigterm() -> None:
    """SIGTERM (a device call stopped at its limit) unwinds as Ctrl-C does, so `finally` blocks stop
    child runs and quit an MPS daemon; a second SIGTERM is ignored rather than cutting that short."""
    def stop(*_):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        sys.exit(143)

    signal.signal(signal.SIGTERM, stop)


# Several processes timed over one common window. A fixed start time has to be guessed: too soon and a
# slow starter (a compile) times a window the others have left; too late and a short GPU call waits.
# So each child says when it is warmed up, and the parent sets the start as soon as all have.
def start_together(folder: Path, procs, cap_s: float, lead_s: float = 1.0) -> float:
    """Parent: wait until every child in `procs` has called `ready_then_wait` with `folder` (or one has
    exited, or cap_s has passed), then give them one start time, lead_s ahead; returns it."""
    deadline = time.time() + cap_s
    while (time.time() < deadline and len(list(folder.glob("ready-*"))) < len(procs)
           and all(p.poll() is None for p in procs)):
        time.sleep(0.05)
    start = time.time() + lead_s
    tmp = folder / "start.tmp"
    tmp.write_text(repr(start))
    tmp.replace(folder / "start")
    return start


def ready_then_wait(folder: str | Path, patience_s: float) -> float:
    """Child, warmed up: say so in `folder`, then sleep until the common start time and return it; 0.0
    (every window then reads late) if none came within patience_s or the parent is gone."""
    folder, parent = Path(folder), os.getppid()
    (folder / f"ready-{os.getpid()}").touch()
    deadline = time.time() + patience_s
    while not (folder / "start").exists():
        if time.time() > deadline or os.getppid() != parent:
            return 0.0
        time.sleep(0.01)
    start = float((folder / "start").read_text())
    while time.time() < start:
        time.sleep(0.005)
    return start
