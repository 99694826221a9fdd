"""Equal memories per task, rebuilt at each task's end (GEM, A-GEM, FDR; Mammoth's FDR rule)."""

from __future__ import annotations

import torch

from pbr.memory.base import Memory, TaskEnd
from pbr.rng import check_generator


class PerTask(Memory):
    def end_task(self, end: TaskEnd) -> None:
        """After task t (0-based) every task keeps capacity // (t + 1) samples: the old tasks their
        first ones, the new task that many of its samples drawn at random (Mammoth: the first of its
        shuffled loader), each with the learner's logits on it (zeros but for FDR)."""
        buf, images, labels, task = self.buffer, end.images, end.labels, end.task
        per = buf.capacity // (task + 1)
        n = buf.size
        old_tasks = buf.tasks[:n]
        # Each old sample's rank within its task, in slot order: kept when below `per`.
        same = old_tasks.unsqueeze(0) == old_tasks.unsqueeze(1)
        rank = torch.tril(same.long(), diagonal=-1).sum(1)
        keep = torch.nonzero(rank < per).squeeze(1)
        logits = end.logits
        g = check_generator(self.generator, images.device)
        new = torch.randperm(labels.shape[0], generator=g, device=images.device)[:per]
        dev = buf.device
        self.rebuild(torch.cat([buf.images[keep], images[new].to(dev)]),
                     torch.cat([buf.labels[keep], labels[new].to(dev)]),
                     torch.cat([old_tasks[keep], torch.full((new.numel(),), task, dtype=torch.int64, device=dev)]),
                     torch.cat([buf.logits[keep], logits[new].to(dev, torch.float32)]))
