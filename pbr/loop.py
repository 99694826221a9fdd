"""The task loop, the epoch loop and the evaluation pass: tensors on one device, no per-sample
Python, one host sync per epoch (the epoch's loss and accuracy)."""

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
    ctx = method.ctx
    n = labels.shape[0]
    stats = []
    for m in method.networks():
        m.train()
    for epoch in range(epochs):
        total = torch.zeros((), device=ctx.device)
        method.correct.zero_()
        method.begin_epoch(epoch, epochs)
        perm = torch.randperm(n, generator=ctx.generator, device=ctx.device)
        for start in range(0, n, batch_size):
            idx = perm[start:start + batch_size]
            raw, y = images[idx], labels[idx]
            if ctx.cuda_graphs:
                torch.compiler.cudagraph_mark_step_begin()
            with torch.autocast(ctx.device.type, dtype=ctx.autocast_dtype or torch.bfloat16,
                                enabled=ctx.autocast_dtype is not None):
                loss = method.observe(ctx.augment(raw, ctx.generator), y, raw)
            total += loss * idx.shape[0]
            if on_batch is not None:
                on_batch(idx.shape[0])
        method.end_epoch(epoch, epochs)
        s = EpochStats(epoch, (total / max(n, 1)).item(), method.correct.item() / max(n, 1), n)
        stats.append(s)
        if on_epoch is not None:
            on_epoch(s)
    return stats


MODES = ("class_il", "task_il")


def task_accuracy(logits: torch.Tensor, labels: torch.Tensor, task_classes: torch.Tensor, mode: str) -> torch.Tensor:
    """Number of correct predictions (int64 scalar tensor, no host sync).

    `task_classes` holds the allowed class indices: for "class_il" the classes seen so far,
    for "task_il" the classes of the task being evaluated. Logits of all other classes are
    set to -inf before the argmax; both modes mask the same way, the mode states the intent.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if logits.dim() != 2 or labels.shape != logits.shape[:1]:
        raise ValueError(f"logits must be [B, C] and labels [B], got {tuple(logits.shape)} and {tuple(labels.shape)}")
    cls = task_classes.to(logits.device)
    allowed = torch.zeros(logits.shape[1], dtype=torch.bool, device=logits.device)
    allowed[cls] = True
    masked = logits.masked_fill(~allowed, float("-inf"))
    return (masked.argmax(1) == labels.to(logits.device)).sum()


def evaluate(
    method: ContinualMethod,
    tests: list[tuple[torch.Tensor, torch.Tensor]],
    seen_tasks: int,
    batch_size: int = 128,
) -> tuple[list[float], list[float]]:
    """Accuracy (%) on each test set of `tests` (task i's at i) through the method's own prediction:
    Class-IL (argmax over the classes of tasks 0..seen_tasks-1, no task identity) and Task-IL (argmax
    over the test task's own classes, the task given)."""
    # Under CUDA graphs, no_grad rather than inference_mode: inference tensors in the graphs' memory
    # pool break the training graphs recorded after them (pytorch/pytorch#135892).
    with torch.no_grad() if method.ctx.cuda_graphs else torch.inference_mode():
        return _evaluate(method, tests, seen_tasks, batch_size)


def _evaluate(method: ContinualMethod, tests: list[tuple[torch.Tensor, torch.Tensor]], seen_tasks: int,
              batch_size: int) -> tuple[list[float], list[float]]:
    ctx = method.ctx
    task_classes, device = ctx.task_classes, ctx.device
    modes = [(m, m.training) for m in method.networks()]
    for m, _ in modes:
        m.eval()
    seen = torch.cat(task_classes[:seen_tasks])
    class_il, task_il = [], []
    for i, (images, labels) in enumerate(tests):
        c_correct = torch.zeros((), dtype=torch.int64, device=device)
        t_correct = torch.zeros((), dtype=torch.int64, device=device)
        for start in range(0, labels.shape[0], batch_size):
            x = ctx.preprocess(images[start:start + batch_size])
            if ctx.cuda_graphs:  # each batch's scores are read before the next replay
                torch.compiler.cudagraph_mark_step_begin()
            scores = method.predict(x)
            y = labels[start:start + batch_size]
            c_correct += task_accuracy(scores, y, seen, "class_il")
            # A method that uses the task identity predicts again with it; others reuse the scores.
            t_scores = method.predict(x, task=i) if method.uses_task_identity else scores
            t_correct += task_accuracy(t_scores, y, task_classes[i], "task_il")
        class_il.append(c_correct)
        task_il.append(t_correct)
    for m, was_training in modes:
        m.train(was_training)
    sizes = torch.tensor([t[1].shape[0] for t in tests], dtype=torch.float64)
    c = torch.stack(class_il).double().cpu() / sizes * 100  # one host sync for the whole row
    t = torch.stack(task_il).double().cpu() / sizes * 100
    return c.tolist(), t.tolist()


class Observer:
    """What a caller of train_tasks watches; every call is optional."""

    def task_started(self, task: int, n_images: int, epochs: int) -> None: ...

    def batch_done(self, n_images: int) -> None: ...

    def epoch_done(self, task: int, stats: EpochStats) -> None: ...

    def task_done(self, task: int, stats: list[EpochStats], class_il: list[float | None],
                  task_il: list[float | None]) -> None: ...


def train_tasks(
    method: ContinualMethod,
    train_sets: list[tuple[torch.Tensor, torch.Tensor]],
    test_sets: list[tuple[torch.Tensor, torch.Tensor]],
    epochs: list[int],
    batch_size: int,
    start: int = 0,
    eval_batch_size: int = 128,
    observer: Observer | None = None,
) -> None:
    """The tasks start..T-1 one after another: begin_task, the epochs, end_task, then the accuracy
    row on the test sets of tasks 0..k (None for the tasks not learned yet, which are not evaluated),
    reported to `observer.task_done` (which saves, when the caller wants a resumable run)."""
    obs = observer or Observer()
    for k in range(start, len(train_sets)):
        images, labels = method.task_data(k, train_sets)
        method.begin_task(k, images, labels)
        obs.task_started(k, labels.shape[0], epochs[k])
        stats = fit_task(method, images, labels, epochs[k], batch_size, obs.batch_done,
                         lambda e, k=k: obs.epoch_done(k, e))
        method.end_task(k, images, labels)
        # The tasks learned so far only: R[k][i] for i > k is read by no metric and drawn grey (Class-IL
        # 0 by its mask, Task-IL chance), and was 40-45% of the evaluation's passes at 5-10 tasks.
        c_row, t_row = evaluate(method, test_sets[: k + 1], k + 1, eval_batch_size)
        unseen = [None] * (len(test_sets) - k - 1)  # JSON null; NaN would make equal rows compare unequal
        obs.task_done(k, stats, c_row + unseen, t_row + unseen)
