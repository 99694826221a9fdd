"""Shared timing helpers: medians of repeated runs, ratios against a baseline measured in the same run."""

from __future__ import annotations

import statistics
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
