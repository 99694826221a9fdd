"""How many training processes one device takes before it saturates: N processes each loop a real
method step (width 64, batch 32 + 32 replay) over the same timed window; prints the images per
second summed over the processes, and the ratio against one process measured in the same run.

    python benchmarks/bench_parallel.py --device cuda --processes 1,4,8,16
    python benchmarks/bench_parallel.py --device cuda --processes 8 --precision bf16 --channels-last

`--precision bf16` and `--channels-last` train the step as `train.precision: bf16` and
`train.channels_last: true` do (stages/pipeline/trained.py): bf16 autocast around the method's
observe, the network and every batch in the channels_last memory format.

Use it to choose `pbr sweep ... --jobs J` on a GPU machine (docs/benchmarks.md: on one H200 the sum
stopped growing at about 4 processes).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import machine, ready_then_wait, row, start_together


def child(a) -> None:
    import torch

    from pbr.data.augment import Augment, normalize
    from pbr.methods import METHODS, Context, create
    from pbr.models import Net
    from pbr.memory.reservoir import Reservoir

    mean, std = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2615)
    torch.set_num_threads(1)
    dev = torch.device(a.device)
    g = torch.Generator(device=dev).manual_seed(0)
    raw = torch.randint(0, 256, (a.batch * 64, 3, 32, 32), dtype=torch.uint8, device=dev)
    labels = torch.randint(0, 2, (a.batch * 64,), device=dev)
    aug = Augment(mean, std)
    fmt = torch.channels_last if a.channels_last else torch.contiguous_format
    bf16 = a.precision == "bf16"
    ctx = Context(10, [torch.arange(0, 2, device=dev), torch.arange(2, 4, device=dev)], dev,
                  lambda x, gen: aug(x, gen).contiguous(memory_format=fmt),
                  lambda x: normalize(x, mean, std).contiguous(memory_format=fmt), g, replay_batch_size=a.batch,
                  autocast_dtype=torch.bfloat16 if bf16 else None)
    cls = METHODS[a.method]
    net = Net(10, a.width, cls.defaults["head"], dropout=cls.defaults["dropout"]).to(dev, memory_format=fmt)
    if a.compile != "none":  # as train.compile does: the network's forward and backward; the rest eager
        net.compile(mode=None if a.compile == "default" else a.compile)
    m = create(a.method, net, ctx, buffer_size=200)
    m.begin_task(0, raw, labels)
    if cls.uses_buffer:
        fill = m.policy if isinstance(m.policy, Reservoir) else Reservoir(m.buffer, g)
        fill.offer(raw[:200], labels[:200], torch.zeros_like(labels[:200]))
    m.end_task(0, raw[:256], labels[:256])
    m.begin_task(1, raw, labels + 2)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    def step(s):
        i = (s % 64) * a.batch
        r = raw[i:i + a.batch]
        if a.compile == "reduce-overhead" and dev.type == "cuda":  # as pbr.loop.fit_task does with graphs
            torch.compiler.cudagraph_mark_step_begin()
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):  # as fit_task wraps observe
            m.observe(ctx.augment(r, g), labels[i:i + a.batch] + 2, r)

    for s in range(20):
        step(s)
    sync()
    start = ready_then_wait(a.start_folder, a.warmup + 60)
    t0, s = time.time(), 0
    while time.time() < start + a.seconds:
        step(s)
        s += 1
        if s % 8 == 0:
            sync()
    sync()
    print(json.dumps({"img_s": s * a.batch / (time.time() - t0), "late": t0 > start + 0.5}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--processes", default="1,4,8,16")
    ap.add_argument("--method", default="er")
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--device", default=None, help="cuda where one is present, else cpu")
    ap.add_argument("--seconds", type=float, default=6)
    ap.add_argument("--warmup", type=float, default=60, help="seconds at most the processes get to start and warm "
                    "up; the window starts as soon as all have")
    ap.add_argument("--compile", default="none", choices=("none", "default", "reduce-overhead"),
                    help="torch.compile the network (reduce-overhead: CUDA graphs on a GPU); raise --warmup to "
                         "cover the compile")
    ap.add_argument("--precision", default="fp32", choices=("fp32", "bf16"), help="bf16: as train.precision: bf16")
    ap.add_argument("--channels-last", action="store_true", help="as train.channels_last: true")
    ap.add_argument("--start-folder", default=None, help=argparse.SUPPRESS)  # a child process
    a = ap.parse_args()
    if a.device is None:
        import torch

        a.device = "cuda" if torch.cuda.is_available() else "cpu"
    if a.start_folder is not None:
        return child(a)
    print(f"# {a.method} step, width {a.width}, batch {a.batch} (+{a.batch} replay), {a.device} ({machine()}), one thread a process"
          + ("" if a.compile == "none" else f", network compiled ({a.compile})")
          + f", {a.precision}" + (", channels_last" if a.channels_last else ""))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    base = None
    counts = [int(k) for k in a.processes.split(",")]
    if counts[0] != 1:  # every ratio is against one process, measured in this run: first
        counts = [1] + [n for n in counts if n != 1]
    for n in counts:
        with tempfile.TemporaryDirectory() as folder:
            cmd = [sys.executable, __file__, "--method", a.method, "--width", str(a.width), "--batch", str(a.batch),
                   "--device", a.device, "--seconds", str(a.seconds), "--compile", a.compile, "--warmup",
                   str(a.warmup), "--start-folder", folder, "--precision", a.precision] + \
                  (["--channels-last"] if a.channels_last else [])
            # stderr to a file each, read only for a process that failed (a pipe left unread could fill).
            errs = [Path(folder) / f"stderr-{i}" for i in range(n)]
            procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=open(e, "w"), text=True, env=env) for e in errs]
            start_together(Path(folder), procs, a.warmup)
            outs = [p.communicate()[0] for p in procs]
            for p, out, e in zip(procs, outs, errs):
                if p.returncode or not out.strip():  # one line of why, not an IndexError on its missing output
                    sys.exit(f"{n} process(es): one ended with exit status {p.returncode}: "
                             f"{(e.read_text().strip().splitlines() or ['no output'])[-1]}")
            rates = [json.loads(out.strip().splitlines()[-1]) for out in outs]
        total = sum(r["img_s"] for r in rates)
        base = base or total
        late = sum(r["late"] for r in rates)
        print(row(f"{n} process(es), summed", total, base) + (f"  ({late} started late: raise --warmup)" if late else ""))


if __name__ == "__main__":
    main()
