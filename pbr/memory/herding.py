"""iCaRL's memory: equal shares per class, each new class's chosen by herding at the task's end
(iCaRL, PODNet+)."""

from __future__ import annotations

import torch

from pbr.memory.base import Memory, TaskEnd
from pbr.selection import herding


class ClassHerding(Memory):
    @classmethod
    def least_capacity(cls, n_classes: int, n_tasks: int) -> tuple[int, str]:
        return n_classes, "a slot per class (each class keeps capacity // classes seen)"

    def end_task(self, end: TaskEnd) -> None:
        """capacity // classes seen samples per class: each old class keeps its first ones (its
        herding order), each of the task's classes gets its herding choice among its samples in
        `end`, ranked by the learner's features (samples of other classes are passed over)."""
        buf = self.buffer
        per = buf.capacity // end.classes_seen.numel()
        n = buf.size
        old = buf.labels[:n]
        same = old.unsqueeze(0) == old.unsqueeze(1)
        keep = torch.nonzero(torch.tril(same.long(), diagonal=-1).sum(1) < per).squeeze(1)
        parts_x, parts_y = [buf.images[keep]], [buf.labels[keep]]
        parts_t = [buf.tasks[keep]]
        features = end.features
        for c in end.classes.tolist():
            idx = torch.nonzero(end.labels == c).squeeze(1)
            pick = idx[herding(features[idx], per)]
            parts_x.append(end.images[pick].to(buf.device))
            parts_y.append(end.labels[pick].to(buf.device))
            parts_t.append(torch.full((pick.numel(),), end.task, dtype=torch.int64, device=buf.device))
        self.rebuild(torch.cat(parts_x), torch.cat(parts_y), torch.cat(parts_t))
