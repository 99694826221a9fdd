"""MC-dropout scoring of a task (T = 20) against one plain inference pass, with the naive T-pass loop.

    python benchmarks/bench_scoring.py --width 20 --n 2048

Target: scoring <= 1.3x one inference pass (only the head is sampled T times).
"""

from __future__ import annotations

import argparse

import torch

from common import machine, rate, row
from pbr.data.augment import normalize
from pbr.models import Net
from pbr.uncertainty import mutual_information, score_images

MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2615)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--width", type=int, default=20)
    ap.add_argument("--n", type=int, default=2048)
    ap.add_argument("--T", type=int, default=20)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    dev = torch.device(a.device)
    net = Net(10, a.width, "cosine", dropout=0.1).to(dev).eval()
    images = torch.randint(0, 256, (a.n, 3, 32, 32), dtype=torch.uint8, device=dev)
    pre = lambda x: normalize(x, MEAN, STD)  # noqa: E731
    g = torch.Generator(device=dev).manual_seed(0)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    print(f"# scoring {a.n} images, width {a.width}, T = {a.T}, batch {a.batch}, {machine()}")

    @torch.inference_mode()
    def plain():
        for s in range(0, a.n, a.batch):
            net(pre(images[s:s + a.batch]))
        sync()

    def ours():
        score_images(net, images, a.T, 0.1, a.batch, pre, g)
        sync()

    @torch.inference_mode()
    def naive():  # the common way: T full forward passes with dropout on
        net.head.train()
        for s in range(0, a.n, a.batch):
            x = pre(images[s:s + a.batch])
            probs = torch.stack([torch.softmax(net(x) / 0.1, 1) for _ in range(a.T)])
            mutual_information(probs)
        net.head.eval()
        sync()

    base = rate(plain, a.n, a.repeats)
    print(row("one inference pass", base, base))
    r = rate(ours, a.n, a.repeats)
    print(row(f"MC scoring, head sampled T={a.T}", r, base))
    print(f"  scoring time / inference time: {base / r:.2f}x (target <= 1.3x)")
    n = rate(naive, a.n, 1, warmup=1)  # T times the others' cost: one timed pass (after a warm-up one)
    print(row(f"naive loop, {a.T} full passes (one timed pass)", n, base))


if __name__ == "__main__":
    main()
