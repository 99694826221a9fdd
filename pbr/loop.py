"""The training loop and the evaluation pass: tensors on one device, no per-sample Python,
one host sync per epoch (the epoch's loss and accuracy)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from pbr.methods.base import ContinualMethod


@dataclass
class EpochStats:
    epoch: int
    loss: float
    accuracy: float
    images: int


def fit_task(
    method: ContinualMethod,
    images: torch.Tensor,
    labels: torch.Tensor,
    epochs: int,
    batch_size: int,
    on_batch: Callable[[int], None] | None = None,
    on_epoch: Callable[[EpochStats], None] | None = None,
) -> list[EpochStats]:
    """Train `method` on one task's uint8 images for `epochs` passes in seeded random order."""
    ctx, net = method.ctx, method.net
    n = labels.shape[0]
    stats = []
    net.train()
    for epoch in range(epochs):
        total = torch.zeros((), device=ctx.device)
        method.correct.zero_()
        method.begin_epoch(epoch)
        perm = torch.randperm(n, generator=ctx.generator, device=ctx.device)
        for start in range(0, n, batch_size):
            idx = perm[start:start + batch_size]
            raw, y = images[idx], labels[idx]
            with torch.autocast(ctx.device.type, dtype=ctx.autocast_dtype or torch.bfloat16,
                                enabled=ctx.autocast_dtype is not None):
                loss = method.observe(ctx.augment(raw, ctx.generator), y, raw)
            total += loss * idx.shape[0]
            if on_batch is not None:
                on_batch(idx.shape[0])
        s = EpochStats(epoch, (total / max(n, 1)).item(), method.correct.item() / max(n, 1), n)
        stats.append(s)
        if on_epoch is not None:
            on_epoch(s)
    return stats


@torch.inference_mode()
def evaluate(
    net: torch.nn.Module,
    tests: list[tuple[torch.Tensor, torch.Tensor]],
    task_classes: list[torch.Tensor],
    seen_tasks: int,
    preprocess: Callable[[torch.Tensor], torch.Tensor],
    batch_size: int = 128,
) -> tuple[list[float], list[float]]:
    """Accuracy (%) on every task's test set: Class-IL (argmax over the classes of tasks
    0..seen_tasks-1) and Task-IL (argmax over the test task's own classes)."""
    was_training = net.training
    net.eval()
    device = task_classes[0].device
    seen = torch.cat(task_classes[:seen_tasks])
    n_out = None
    class_il, task_il = [], []
    for i, (images, labels) in enumerate(tests):
        c_correct = torch.zeros((), dtype=torch.int64, device=device)
        t_correct = torch.zeros((), dtype=torch.int64, device=device)
        for start in range(0, labels.shape[0], batch_size):
            logits = net(preprocess(images[start:start + batch_size]))
            y = labels[start:start + batch_size]
            if n_out is None:
                n_out = logits.shape[1]
                seen_mask = torch.full((n_out,), float("-inf"), device=device)
                seen_mask[seen] = 0
            task_mask = torch.full((n_out,), float("-inf"), device=device)
            task_mask[task_classes[i]] = 0
            c_correct += ((logits + seen_mask).argmax(1) == y).sum()
            t_correct += ((logits + task_mask).argmax(1) == y).sum()
        class_il.append(c_correct)
        task_il.append(t_correct)
    net.train(was_training)
    sizes = torch.tensor([t[1].shape[0] for t in tests], dtype=torch.float64)
    c = torch.stack(class_il).double().cpu() / sizes * 100  # one host sync for the whole row
    t = torch.stack(task_il).double().cpu() / sizes * 100
    return c.tolist(), t.tolist()
