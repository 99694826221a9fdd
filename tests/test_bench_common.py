"""benchmarks/common.py's common window: processes timed together start as soon as the last is warmed
up (a GPU call's minutes are not spent waiting on a guessed start), and one that never got ready
within the cap times a window the others have left, which its row then reports as late."""

import json
import subprocess
import sys
import time

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import common  # noqa: E402
from common import start_together  # noqa: E402


def _children(folder, warmups):
    code = ("import json, sys, time; sys.path.insert(0, sys.argv[1]); from common import ready_then_wait; "
            "time.sleep(float(sys.argv[3])); s = ready_then_wait(sys.argv[2], 30); print(json.dumps([s, time.time()]))")
    return [subprocess.Popen([sys.executable, "-c", code, str(ROOT / "benchmarks"), str(folder), str(w)],
                             stdout=subprocess.PIPE, text=True) for w in warmups]


def test_the_window_starts_once_the_slowest_process_is_ready(tmp_path):
    t = time.time()
    procs = _children(tmp_path, [0.0, 0.5, 1.5])
    start = start_together(tmp_path, procs, cap_s=60, lead_s=0.5)
    got = [json.loads(p.communicate(timeout=60)[0]) for p in procs]
    assert start - t < 20  # the slowest was ready after about 1.5 s (plus Python's start), not the 60 s cap
    assert start - t > 1.5 + 0.5  # and none started before it was
    for s, t0 in got:
        assert s == start and start <= t0 < start + 0.5  # one start for all, and nobody late


def test_a_process_not_ready_within_the_cap_starts_late(tmp_path):
    procs = _children(tmp_path, [0.0, 4.0])
    start = start_together(tmp_path, procs, cap_s=1.5, lead_s=0.2)
    (s0, t0), (s1, t1) = (json.loads(p.communicate(timeout=60)[0]) for p in procs)
    assert s0 == s1 == start and start <= t0 < start + 0.5
    assert t1 > start + 0.5  # what bench_parallel's and bench_routes' children report as "late"


def test_the_machine_line_names_the_cpus_bf16_units():
    """The figures are told apart by machine (A: AVX2 only; B, C: bf16 units): the line said only
    x86_64 on Linux."""
    import re

    from stages.runtime.hardware import cpu_flags

    name = common.cpu_name()
    have = [f for f in ("amx_bf16", "avx512_bf16") if f in cpu_flags()]
    assert (", ".join(have) in name) if have else ("no bf16 units" in name)
    assert not re.fullmatch(r"x86_64|aarch64", name)
