"""Training-step throughput of sgd, er, derpp and pbr against the bare model's forward + backward + step.

    python benchmarks/bench_step.py --width 20 --batch 32

The bare step: ResNet18 + linear head, cross-entropy, SGD, on a ready float batch. The method
steps include their real work: batched augmentation of uint8 images, buffer draws, the teacher.
Targets: sgd (cosine head) >= 0.9x bare; a pbr step <= 2.2x an sgd step.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F

from common import machine, rate, row
from pbr.data.augment import Augment, normalize
from pbr.methods import METHODS, Context, create
from pbr.models import Net
from pbr.memory.reservoir import Reservoir

MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2615)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--width", type=int, default=20)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--variants", default="fp32,fp32+cl,bf16,bf16+cl",
                    help="comma list of fp32|bf16, '+cl' for channels_last, '+compile' for torch.compile "
                         "of the model (train.compile), '+graphs' for torch.compile with CUDA graphs "
                         "(mode reduce-overhead)")
    ap.add_argument("--methods", default="sgd,er,derpp,pbr", help="comma list of the method steps to time")
    a = ap.parse_args()
    first = None
    variants = a.variants.split(",")
    # Checked before anything is timed: an unknown variant ran as fp32 eager under its own name.
    for v in variants:
        base, *extras = v.split("+")
        if base not in ("fp32", "bf16") or set(extras) - {"cl", "compile", "graphs"}:
            sys.exit(f"--variants: {v} unknown; fp32 or bf16, each optionally with +cl, +compile or +graphs")
    unknown = [m for m in a.methods.split(",") if m not in METHODS]
    if unknown:
        sys.exit(f"--methods: {', '.join(unknown)} unknown; choose from {', '.join(METHODS)}")
    for variant in variants:
        # Every ratio "x bare [V]" is against the bare step of the first variant V, measured in this run.
        first = run_variant(a, variant, first, variants[0])


def run_variant(a, variant: str, first: float | None, first_name: str = "fp32") -> float:
    bf16, cl = variant.startswith("bf16"), "+cl" in variant
    compiled = {"mode": "reduce-overhead"} if "+graphs" in variant else {} if "+compile" in variant else None
    fmt = torch.channels_last if cl else torch.contiguous_format
    ac = lambda: torch.autocast(a.device.split(":")[0], dtype=torch.bfloat16, enabled=bf16)  # noqa: E731
    dev = torch.device(a.device)
    g = torch.Generator(device=dev).manual_seed(0)
    raw = torch.randint(0, 256, (a.batch * a.steps, 3, 32, 32), dtype=torch.uint8, device=dev)
    labels = torch.randint(0, 2, (a.batch * a.steps,), device=dev)
    print(f"# training step [{variant}], width {a.width}, batch {a.batch} (+{a.batch} replay), {machine()}")

    bare = Net(10, a.width, "linear", dropout=0.0).to(dev, memory_format=fmt)
    if compiled is not None:
        bare.compile(**compiled)
    opt = torch.optim.SGD(bare.parameters(), lr=0.03)
    x_ready = normalize(raw[: a.batch], MEAN, STD).contiguous(memory_format=fmt)

    def bare_steps():
        for s in range(a.steps):
            opt.zero_grad(set_to_none=True)
            if "+graphs" in variant:
                torch.compiler.cudagraph_mark_step_begin()
            with ac():
                loss = F.cross_entropy(bare(x_ready), labels[: a.batch])
            loss.backward()
            opt.step()
        if dev.type == "cuda":
            torch.cuda.synchronize()

    base = rate(bare_steps, a.batch * a.steps, a.repeats)
    first = first or base
    print(row("bare model fwd+bwd+step", base, base) + f"  ({base / first:.2f}x bare [{first_name}])")
    results = {}
    for name in a.methods.split(","):
        cls = METHODS[name]
        head = "cosine" if name in ("sgd", "pbr") else "linear"
        net = Net(10, a.width, head, dropout=0.1 if name == "pbr" else 0.0).to(dev, memory_format=fmt)
        if compiled is not None:
            net.compile(**compiled)
        aug = Augment(MEAN, STD)
        ctx = Context(10, [torch.arange(0, 2, device=dev), torch.arange(2, 4, device=dev)], dev,
                      lambda x, gen: aug(x, gen).contiguous(memory_format=fmt),
                      lambda x: normalize(x, MEAN, STD).contiguous(memory_format=fmt), g, replay_batch_size=a.batch)
        m = create(name, net, ctx, buffer_size=200, lr=0.03)
        ctx.cuda_graphs = "+graphs" in variant  # as train.compile: graphs sets it (the teacher's copy runs eager)
        # Put the method in its steady state: a filled buffer (and pbr's teacher) from a first task.
        m.begin_task(0, raw, labels)
        if cls.uses_buffer:
            fill = m.policy if isinstance(m.policy, Reservoir) else Reservoir(m.buffer, g)
            fill.offer(raw[:200], labels[:200], torch.zeros_like(labels[:200]))
        if name == "pbr":
            m.end_task(0, raw[:256], labels[:256])
        m.begin_task(1, raw, labels + 2)

        def steps():
            for s in range(a.steps):
                r = raw[s * a.batch:(s + 1) * a.batch]
                if ctx.cuda_graphs:  # each step a new graph replay, as pbr/loop.py's training loop marks it
                    torch.compiler.cudagraph_mark_step_begin()
                with ac():
                    m.observe(ctx.augment(r, g), labels[s * a.batch:(s + 1) * a.batch] + 2, r)
            if dev.type == "cuda":
                torch.cuda.synchronize()

        try:
            results[name] = rate(steps, a.batch * a.steps, a.repeats)
        except Exception as e:  # one unsupported combination (say CUDA graphs with a method) must not end the run
            print(f"{name} step: failed, {type(e).__name__}: {str(e).splitlines()[0][:200]}")
            continue
        print(row(f"{name} step (current-task images)", results[name], base) + f"  ({results[name] / first:.2f}x bare [{first_name}])")
    if "sgd" in results and "pbr" in results:
        print(f"pbr step / sgd step time: {results['sgd'] / results['pbr']:.2f}x (target <= 2.2x)")
    return first


if __name__ == "__main__":
    main()
