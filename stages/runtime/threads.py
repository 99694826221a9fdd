"""CPU threads for torch: `train.threads`, with `auto` sized to the work sharing the machine.

Two processes each running torch with every core's worth of OpenMP threads slow each other down
badly (docs/benchmarks.md has the figures). `auto` therefore divides the cores among the project's
live training and scoring processes on the machine (`pbr train`, `pbr score`, however started:
queue workers, two terminals, a `dvc exp run` beside a `dvc repro`), or among the live DVC queue
workers when there are more of those. It is decided once, when the stage starts: a process
started later does not change an earlier one's threads. OMP_NUM_THREADS, when set, wins.
"""

from __future__ import annotations

import os
from pathlib import Path

from stages.runtime.paths import anchor
from stages.runtime.tracking import pid_alive


def queue_workers(cwd: Path | None = None) -> int:
    """Live `dvc queue` workers of this repository when running inside one of its workspaces, else 0."""
    cwd = (cwd or Path.cwd()).resolve()
    root = anchor(cwd)
    if root == cwd:
        return 0
    n = 0
    for f in (root / ".dvc" / "tmp" / "exps" / "celery").glob("dvc-exp-worker-*.pid"):
        try:
            text = f.read_text().strip()
        except OSError:  # the worker ended (and removed it) since the folder was listed
            continue
        n += text.isdigit() and pid_alive(int(text))
    return n


COMPUTE_COMMANDS = {"train", "score"}


def _is_compute(args: list[str]) -> bool:
    """`pbr train|score`, or `python -m stages.cli train|score` (how an offline sweep runs its stages)."""
    for i, (a, b) in enumerate(zip(args, args[1:])):
        if b in COMPUTE_COMMANDS and (os.path.basename(a) == "pbr" or (a == "stages.cli" and i and args[i - 1] == "-m")):
            return True
    return False


def compute_pids(proc: Path = Path("/proc")) -> set[int]:
    """Pids of the live `pbr train` / `pbr score` processes on this machine, however started (empty
    without /proc)."""
    pids: set[int] = set()
    if not proc.is_dir():
        return pids
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            args = [a.decode(errors="replace") for a in (d / "cmdline").read_bytes().split(b"\0") if a]
        except OSError:  # gone, or not ours to read
            continue
        if _is_compute(args):
            pids.add(int(d.name))
    return pids


def available_cores() -> int:
    """The cores this process may run on (its affinity where the OS says, else the machine's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _omp() -> int | None:
    env = os.environ.get("OMP_NUM_THREADS", "")
    return int(env) if env.isdigit() and int(env) > 0 else None


def given_by_environment() -> bool:
    """OMP_NUM_THREADS sets the count (it wins over `auto`)."""
    return _omp() is not None


def resolve(setting: int | str) -> int:
    if setting != "auto":
        return int(setting)
    return _omp() or max(1, available_cores() // max(1, queue_workers(), len(compute_pids())))


def of_a_run(setting: int | str) -> int:
    """The threads each of a sweep's runs will take (`--jobs auto` sizes the runs at once by it):
    auto divides the cores among the runs, so one each, unless OMP_NUM_THREADS says otherwise."""
    return int(setting) if setting != "auto" else (_omp() or 1)


def configure(setting: int | str) -> int:
    """Set torch's intra-op threads; returns how many."""
    import torch

    n = resolve(setting)
    torch.set_num_threads(n)
    return n
