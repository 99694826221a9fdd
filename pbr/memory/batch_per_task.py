"""One random batch of each task through the reservoir at the task's end (Mammoth's gem @5bb9275:
GEM's `gem_memory: one_batch`), whatever the capacity."""

from __future__ import annotations

import torch

from pbr.memory.base import TaskEnd
from pbr.memory.reservoir import Reservoir


class BatchPerTask(Reservoir):
    def __init__(self, buffer, generator, learner=None, batch: int = 32) -> None:
        super().__init__(buffer, generator, learner)
        self.batch = batch  # samples of each task (Mammoth: its loader's batch)

    def offer(self, images, labels, tasks, logits=None) -> None:
        pass  # filled at the task's end only

    def end_task(self, end: TaskEnd) -> None:
        g, labels = self.generator, end.labels
        batch = torch.randperm(labels.shape[0], generator=g, device=g.device)[: self.batch].to(labels.device)
        self.add(end.images[batch], labels[batch], torch.full_like(labels[batch], end.task))
