"""`train.precision: auto` and `train.channels_last: auto`: the training step's number format and
memory layout, decided from what the device is, never from a timing taken at run start.

bf16 autocast where the device has bf16 arithmetic units (a CUDA GPU of compute capability 8.0 or
newer; a CPU whose flags list AMX, amx_bf16, or AVX-512 BF16, avx512_bf16), on the kinds of device
where bf16 was measured to keep fp32's accuracy and to run the step faster. Without the units bf16
is emulated and slower than fp32, so auto stays fp32; on a GPU the units are there but the step at
our batch size is bound by kernel launches, not arithmetic, and bf16 was no faster
(docs/benchmarks.md and docs/results.md), so auto stays fp32 there too.

channels_last on a CPU from width 20 up, the widths at which it was measured faster on the CPUs we
run on; below that it stays off (tiny widths are pathologically slow in it). On a GPU it stays off
until a measurement there says otherwise.
"""

from __future__ import annotations

from pathlib import Path

CHANNELS_LAST_MIN_WIDTH = 20
CPU_BF16_FLAGS = ("amx_bf16", "avx512_bf16")
# The device types on which bf16 was shown to keep fp32's accuracy (docs/results.md: 3 seeds of er
# and pbr on the real Seq-CIFAR-10-LT) and measured faster than fp32 (docs/benchmarks.md). cuda
# passed the first (an H200, the proxy budget) but not the second. Elsewhere auto stays fp32.
BF16_PAYS_ON = ("cpu",)


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    """The CPU's feature flags (empty where /proc/cpuinfo is not there or not readable)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return set(value.split())
    return set()


def bf16_units(device, flags: set[str] | None = None) -> str | None:
    """What gives `device` bf16 arithmetic (a phrase for run.json), or None when it has none."""
    import torch

    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return f"CUDA compute capability {major}.{minor}" if major >= 8 else None
    if device.type == "cpu":
        found = [f for f in CPU_BF16_FLAGS if f in (cpu_flags() if flags is None else flags)]
        return "CPU flags " + ", ".join(found) if found else None
    return None


def resolve(precision: str, channels_last, width: int, device, flags: set[str] | None = None) -> tuple[str, bool, str]:
    """(precision, channels_last, why): the values to train with, and why `auto` chose them."""
    why = []
    if precision == "auto":
        units = bf16_units(device, flags)
        pays = device.type in BF16_PAYS_ON
        precision = "bf16" if units and pays else "fp32"
        why.append(f"precision {precision}: " + (
            f"no bf16 units on {device.type}" if not units else f"bf16 units ({units})" if pays else
            f"bf16 units ({units}), but bf16 was not measured to pay on {device.type}"))
    if channels_last == "auto":
        channels_last = device.type == "cpu" and width >= CHANNELS_LAST_MIN_WIDTH
        why.append(f"channels_last {str(channels_last).lower()}: " + (
            f"{device.type}" if device.type != "cpu" else f"width {width} {'>=' if channels_last else '<'} "
                                                             f"{CHANNELS_LAST_MIN_WIDTH} on a cpu"))
    return precision, bool(channels_last), "; ".join(why)
