"""Whole epochs: our loop (uint8 task tensor, batched tensor augmentation) against the loop people
commonly write (DataLoader over PIL images with per-image torchvision transforms).

    python benchmarks/bench_epoch.py --width 20 --n 2048

Same model (ResNet18 + cosine head), same images, batch 32, plain SGD; the reference takes the
best of num_workers 0, 1, 2. Target: ours >= 2x faster.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.nn.functional as F

from common import machine
from pbr.data.augment import Augment, normalize
from pbr.loop import fit_task
from pbr.methods import Context, create
from pbr.models import Net

MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2615)


class PILDataset(torch.utils.data.Dataset):
    def __init__(self, images: np.ndarray, labels: np.ndarray):
        import torchvision.transforms as T

        self.images, self.labels = images, labels
        self.tf = T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(),
                             T.Normalize(MEAN, STD)])

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        from PIL import Image

        return self.tf(Image.fromarray(self.images[i])), int(self.labels[i])


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def reference_epoch(images, labels, width, workers, dev: torch.device) -> float:
    net = Net(10, width, "cosine", dropout=0.0, generator=torch.Generator().manual_seed(0)).to(dev)
    opt = torch.optim.SGD(net.parameters(), lr=0.03)
    loader = torch.utils.data.DataLoader(PILDataset(images, labels), batch_size=32, shuffle=True,
                                         num_workers=workers, persistent_workers=False,
                                         pin_memory=dev.type == "cuda")
    def step(x, y):
        x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(net(x) / 0.1, y).backward()
        opt.step()

    # Warm-up, as our loop has: two steps on the first images (allocator, kernels), not timed.
    warm = PILDataset(images[:64], labels[:64])
    for x, y in torch.utils.data.DataLoader(warm, batch_size=32):
        step(x, y)
    sync(dev)
    t = time.perf_counter()
    for x, y in loader:
        step(x, y)
    sync(dev)
    return len(labels) / (time.perf_counter() - t)


def our_epoch(images, labels, width, channels_last: bool, compiled: bool, dev: torch.device) -> float:
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    net = Net(10, width, "cosine", dropout=0.0, generator=torch.Generator().manual_seed(0)).to(dev, memory_format=fmt)
    if compiled:
        net.compile()
    g = torch.Generator(device=dev).manual_seed(0)
    aug = Augment(MEAN, STD)
    ctx = Context(10, [torch.arange(10, device=dev)], dev, lambda x, gen: aug(x, gen).contiguous(memory_format=fmt),
                  lambda x: normalize(x, MEAN, STD).contiguous(memory_format=fmt), g)
    m = create("sgd", net, ctx, lr=0.03)
    x = torch.from_numpy(images).permute(0, 3, 1, 2).to(dev)
    y = torch.from_numpy(labels).to(dev)
    m.begin_task(0, x, y)
    fit_task(m, x[:64], y[:64], 1, 32)  # warm-up: the compile (train.compile) is not timed
    t = time.perf_counter()
    fit_task(m, x, y, 1, 32)
    sync(dev)
    return len(labels) / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--width", type=int, default=20)
    ap.add_argument("--n", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True,
                    help="also time our loop with train.compile (each compile takes a while)")
    a = ap.parse_args()
    dev = torch.device(a.device)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (a.n, 32, 32, 3), dtype=np.uint8)
    labels = rng.integers(0, 10, a.n).astype(np.int64)
    print(f"# one epoch of {a.n} images, width {a.width}, batch 32, {machine()}")
    ref = {w: float(np.median([reference_epoch(images, labels, a.width, w, dev) for _ in range(a.repeats)]))
           for w in (0, 1, 2)}
    for w, r in ref.items():
        print(f"reference loop, DataLoader num_workers={w:<2}        {r:8.1f} img/s")
    best = max(ref.values())
    for cl, compiled in ((False, False), (True, False), (False, True), (True, True))[: 4 if a.compile else 2]:
        ours = float(np.median([our_epoch(images, labels, a.width, cl, compiled, dev) for _ in range(a.repeats)]))
        name = "our loop, " + ("channels_last" if cl else "contiguous") + (" + compile" if compiled else "")
        print(f"{name:<46} {ours:8.1f} img/s  {ours / best:.2f}x the best reference")


if __name__ == "__main__":
    main()
