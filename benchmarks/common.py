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


def cpu_name() -> str:
    """The CPU's model and its bf16 units (the flags docs/benchmarks.md tells the machines apart by):
    platform.processor() says only x86_64 on Linux."""
    import platform

    try:
        text = open("/proc/cpuinfo").read()
    except OSError:
        return platform.processor() or platform.machine()
    fields = dict(line.split(":", 1) for line in text.splitlines()[:40] if ":" in line)
    model = " ".join(fields.get("model name\t", fields.get("model name", platform.machine())).split())
    flags = set(next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), []))
    bf16 = [f for f in ("amx_bf16", "avx512_bf16") if f in flags]
    return f"{model} ({', '.join(bf16) if bf16 else 'no bf16 units' + (', AVX2' if 'avx2' in flags else '')})"


def machine() -> str:
    import torch

    dev = torch.cuda.get_device_name(0) if torch.cuda.is_available() else cpu_name()
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
