"""docs/gpu.md's call 2, sized to the device time call 1 left: bench_routes.py's baseline and its
mps-graphs rows (the ER step, 8 processes under MPS, each compiled with CUDA graphs), bf16 +
channels_last first, then fp32.

    python3 benchmarks/gpu_call2.py LEFT --out $OUT    # on the GPU machine; the run's timeout_s: min(LEFT - 30, 600)
    python3 benchmarks/gpu_call2.py LEFT --plan        # here: what that call would run

LEFT is call 1's reply's `lease.budget_left_s`: the reply says it, so call 2 follows at once (the
warm machine goes back after 30 s without a call; a `status` call or a commit between costs it).
From LEFT, by bench_routes.py's own arithmetic (`window_need`):

  timeout_s = min(LEFT - 30, 600)   the half minute from the reply to this call; a call's most
  --seconds = timeout_s - 60        before the budget starts: a left-behind daemon's quit, torch's
                                    import; after it: the MPS daemon's quit, the last write
  a graphs row starts only with its warm-up cap + window + 10 s of budget left: 136 s at the default
  --graphs-warmup 120, 96 at 80, after the baseline and the MPS daemon's start and one-client probe
  (about 15 s). So --seconds 151 or more (LEFT 241): the default warm-up; 111 to 150 (LEFT 201 to
  240): --graphs-warmup 80; below: nothing, and it says why (a baseline alone measures nothing
  docs/benchmarks.md lacks). The fp32 row runs where the budget still holds it after bf16 + cl's.
Anything after LEFT but --out and --plan goes to bench_routes.py as given (the tests: --device cpu).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
GAP = 30  # seconds from call 1's reply to this call's start: the warm machine's idle release
CALL_MAX = 600  # a call's most
OUTSIDE = 60  # the call's seconds outside bench_routes.py's budget
FIRST = 15  # the baseline row and the MPS daemon's start and probe, before the first graphs row
SHORT_WARMUP = 80  # --graphs-warmup where 120 does not fit: 8 processes compiling at once may not make it


def plan(left: float) -> tuple[int, list[str] | None, str]:
    """(the run's timeout_s, bench_routes.py's arguments or None for no call, a line saying which)."""
    sys.path.insert(0, str(HERE))
    import bench_routes

    timeout = int(min(left - GAP, CALL_MAX))
    seconds = timeout - OUTSIDE
    args = ["--routes", "baseline,mps-graphs", "--mps-processes", "8", "--process-formats", "bf16+cl,fp32",
            "--seconds", str(seconds)]
    for extra in ([], ["--graphs-warmup", str(SHORT_WARMUP)]):
        need = FIRST + bench_routes.window_need(bench_routes.parser().parse_args(extra), graphs=True)
        if seconds >= need:
            return timeout, args + extra, (f"call 2: {left:.0f} s left: timeout_s {timeout}, bench_routes.py --seconds "
                                           f"{seconds} (a graphs row needs {need:.0f} s of it with the baseline and "
                                           f"the MPS probe{', at --graphs-warmup ' + str(SHORT_WARMUP) if extra else ''})")
    return timeout, None, (f"call 2: {left:.0f} s left give bench_routes.py {max(seconds, 0)} s, under the {need:.0f} s "
                           f"one graphs row needs (at --graphs-warmup {SHORT_WARMUP}, with the baseline and the MPS "
                           "probe): no call 2; give the machine back")


def quit_left_behind() -> None:
    """An MPS daemon call 1 left (a call killed outright, SIGKILL, cannot quit its own) is told to quit
    and waited for: a second daemon on the GPU would refuse this call's clients."""
    sys.path.insert(0, str(HERE.parent))
    from stages.runtime import mps

    for pipe in sorted(Path(tempfile.gettempdir()).glob("pbr-mps-*/pipe")):
        if pipe.is_dir():
            print(f"call 2: quitting the MPS daemon left behind at {pipe}", flush=True)
            mps.stop({mps.PIPE: str(pipe), mps.LOG: str(pipe.parent / "log")})


def parser() -> argparse.ArgumentParser:
    """The call's options (tests/test_bench_runs_gpu.py parses docs/gpu.md's call 2 with it)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("left", help="device seconds left: call 1's reply's lease.budget_left_s")
    ap.add_argument("--out", default=os.environ.get("OUT") or "bench_routes_out")
    ap.add_argument("--plan", action="store_true", help="say what the call would run, and run nothing")
    return ap


def main() -> None:
    a, rest = parser().parse_known_args()
    try:
        left = float(a.left)
    except ValueError:
        sys.exit(f"LEFT {a.left}: give the device seconds left, a number (call 1's reply's lease.budget_left_s)")
    timeout, args, said = plan(left)
    print(said, flush=True)
    if args is None:
        return
    cmd = [sys.executable, str(HERE / "bench_routes.py"), *args, "--out", a.out, *rest]
    print("call 2: " + " ".join(cmd[1:]), flush=True)
    if a.plan:
        return
    quit_left_behind()
    os.execv(sys.executable, cmd)  # the same process: the call's SIGTERM reaches bench_routes.py, which quits its daemon


if __name__ == "__main__":
    main()
