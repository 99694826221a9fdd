"""Shared timing helpers: medians of repeated runs, ratios against a baseline measured in the same run."""

from __future__ import annotations

import signal
import statistics
import sys
import time


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


def exit_on_sigterm() -> None:
    """SIGTERM (a device call stopped at its limit) unwinds as Ctrl-C does, so `finally` blocks stop
    child runs and quit an MPS daemon; a second SIGTERM is ignored rather than cutting that short."""
    def stop(*_):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        sys.exit(143)

    signal.signal(signal.SIGTERM, stop)
