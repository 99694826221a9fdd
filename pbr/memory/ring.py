"""HAL's memory with `hal_memory: ring` (the ring buffer Mammoth's hal asks for): a ring per task,
each task keeping its latest capacity // tasks stream samples (the learner's stream gives the
number of tasks)."""

from __future__ import annotations

import torch

from pbr.memory.base import Memory


class TaskRing(Memory):
    @classmethod
    def least_capacity(cls, n_classes: int, n_tasks: int) -> tuple[int, str]:
        return n_tasks, "a slot per task (a ring per task)"

    def __init__(self, buffer, generator, learner=None) -> None:
        super().__init__(buffer, generator, learner)
        self.per = buffer.capacity // len(learner.ctx.task_classes)
        if self.per < 1:
            raise ValueError(f"a buffer of {buffer.capacity} leaves each of {len(learner.ctx.task_classes)} rings empty")
        self.start = 0  # the first slot of the current task's ring
        self.task_seen = 0  # stream samples of the current task offered to its ring
        self.task = -1

    def begin_task(self, task: int) -> None:
        if task != self.task:  # a resumed task keeps its ring
            self.start, self.task_seen, self.task = self.buffer.size, 0, task

    def offer(self, images, labels, tasks, logits=None) -> None:
        b = labels.shape[0]
        k = torch.arange(self.task_seen, self.task_seen + b, device=self.buffer.device)
        self.buffer.write(self.start + k % self.per, images, labels, tasks, logits)
        self.task_seen += b
        self.seen += b
        self.buffer.size = self.start + min(self.task_seen, self.per)

    def state_dict(self):
        return {**super().state_dict(), "ring": [self.start, self.task_seen, self.task]}

    def load_state_dict(self, state) -> None:
        super().load_state_dict(state)
        self.start, self.task_seen, self.task = state["ring"]
