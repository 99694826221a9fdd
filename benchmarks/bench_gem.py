"""GEM's step cost as old tasks accumulate, against ER's step and A-GEM's, measured in the same run.

    python benchmarks/bench_gem.py --width 20 --tasks 1,4,9 --classes 200 --buffer 200

GEM takes one gradient per old task's memory every step and, where the current gradient points
against one of them, solves a QP in as many variables as old tasks. Seq-CIFAR-10-LT has at most 4
old tasks, Seq-TinyImageNet-LT 9 (the paper left GEM out there).
"""

from __future__ import annotations

import argparse

import torch

from common import machine, rate, row
from pbr.data.augment import Augment, normalize
from pbr.methods import Context, create
from pbr.models import Net

MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2615)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--width", type=int, default=20)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--size", type=int, default=32, help="image side (TinyImageNet: 64)")
    ap.add_argument("--classes", type=int, default=200)
    ap.add_argument("--buffer", type=int, default=200)
    ap.add_argument("--tasks", default="1,4,9", help="old tasks in GEM's memory")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    dev = torch.device(a.device)
    n_tasks = max(int(k) for k in a.tasks.split(",")) + 1
    per = a.classes // n_tasks
    task_classes = [torch.arange(t * per, (t + 1) * per, device=dev) for t in range(n_tasks)]
    raw = torch.randint(0, 256, (a.batch * a.steps, 3, a.size, a.size), dtype=torch.uint8, device=dev)
    print(f"# step with k old tasks in memory, width {a.width}, batch {a.batch}, {a.size}x{a.size}, "
          f"{a.classes} classes, buffer {a.buffer}, {machine()}")

    def method(name: str, old: int):
        g = torch.Generator(device=dev).manual_seed(0)
        aug = Augment(MEAN, STD)
        ctx = Context(a.classes, task_classes, dev, lambda x, gen: aug(x, gen), lambda x: normalize(x, MEAN, STD), g,
                      replay_batch_size=a.batch)
        m = create(name, Net(a.classes, a.width, "linear", dropout=0.0).to(dev), ctx, buffer_size=a.buffer)
        for t in range(old):  # each old task leaves its memory (ER: its share of the reservoir)
            labels = task_classes[t][torch.arange(a.batch * a.steps, device=dev) % per]
            m.begin_task(t, raw, labels)
            if name == "er":
                m.policy.offer(raw, labels, torch.full_like(labels, t))  # ER's reservoir
            else:
                m.end_task(t, raw, labels)
        labels = task_classes[old][torch.arange(a.batch * a.steps, device=dev) % per]
        m.begin_task(old, raw, labels)
        return m, ctx, labels

    def steps_of(m, ctx, labels):
        def steps():
            for s in range(a.steps):
                r = raw[s * a.batch:(s + 1) * a.batch]
                m.observe(ctx.augment(r, ctx.generator), labels[s * a.batch:(s + 1) * a.batch], r)
            if dev.type == "cuda":
                torch.cuda.synchronize()
        return steps

    for k in (int(x) for x in a.tasks.split(",")):
        base = rate(steps_of(*method("er", k)), a.batch * a.steps, a.repeats)
        print(row(f"er step, {k} old task(s)", base, base))
        for name in ("agem", "gem"):
            value = rate(steps_of(*method(name, k)), a.batch * a.steps, a.repeats)
            print(row(f"{name} step, {k} old task(s)", value, base) + f"  ({base / value:.2f}x an er step's time)")


if __name__ == "__main__":
    main()
