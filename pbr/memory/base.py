"""The replay memory's interface: a policy decides what a Buffer (storage only) keeps.

A policy is fed in one or both of two ways, and ignores the one it does not use, so a method
offers every batch and ends every task alike whatever policy it names:
- `offer`: a training batch, after the step (the online policies: reservoir, PRS, CBRS, GSS, HAL's ring);
- `end_task`: the task just learned (the policies that choose at a task's end: PBR's walk, the
  per-task memories, herding).
A policy owns every counter of its memory (samples offered, per-class counts, ring positions) and
the buffer's filled size; `state_dict` holds the storage and the counters, so a resumed run goes on
exactly where it stopped.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

import torch

from pbr.buffer import Buffer


class TaskEnd:
    """The task just learned, as a policy reads it at the task's end: its raw samples, and what a
    policy ranks them by, computed by the learner (the method) on first use and then kept, so a
    method that needs the same numbers afterwards (PODNet's features) does not compute them twice."""

    def __init__(self, learner: Any, task: int, images: torch.Tensor, labels: torch.Tensor) -> None:
        self.learner, self.task, self.images, self.labels = learner, task, images, labels

    @property
    def classes(self) -> torch.Tensor:
        """The task's own classes."""
        return self.learner.ctx.task_classes[self.task]

    @property
    def classes_seen(self) -> torch.Tensor:
        """The classes of this task and every earlier one."""
        return self.learner.ctx.seen_classes(self.task)

    @cached_property
    def features(self) -> torch.Tensor:
        return self.learner.memory_features(self.images)

    @cached_property
    def logits(self) -> torch.Tensor:
        return self.learner.memory_logits(self.images)

    @cached_property
    def scores(self) -> torch.Tensor:
        return self.learner.memory_scores(self.task, self.images, self.labels)


class Memory:
    """A memory policy over `buffer`. Every draw comes from `generator`; `learner` is the method,
    for a policy that reads its network or its stream (GSS's gradients, HAL's number of tasks)."""

    def __init__(self, buffer: Buffer, generator: torch.Generator, learner: Any = None) -> None:
        self.buffer = buffer
        self.generator = generator
        self.learner = learner
        self.seen = 0  # stream samples offered to the policy (Mammoth's num_seen_examples)

    @classmethod
    def least_capacity(cls, n_classes: int, n_tasks: int) -> tuple[int, str]:
        """The smallest capacity the policy keeps something of every part of the stream with, and what
        it needs that for."""
        return 1, "a slot"

    def begin_task(self, task: int) -> None:
        """Before the task's first batch."""

    def offer(self, images: torch.Tensor, labels: torch.Tensor, tasks: torch.Tensor,
              logits: torch.Tensor | None = None) -> None:
        """A training batch (raw uint8 images), with the network's outputs on it for a policy that
        keeps them (DER's)."""

    def end_task(self, end: TaskEnd) -> None:
        """The task just learned."""

    def rebuild(self, images: torch.Tensor, labels: torch.Tensor, tasks: torch.Tensor,
                logits: torch.Tensor | None = None, scores: torch.Tensor | None = None) -> None:
        """Make these rows the whole content (the policies that rebuild the memory at a task's end)."""
        n = self.buffer.check_batch(images, labels, tasks, logits)
        if n > self.buffer.capacity:
            raise ValueError(f"{n} rows do not fit a buffer of {self.buffer.capacity}")
        self.buffer.write(torch.arange(n, device=self.buffer.device), images, labels, tasks, logits, scores)
        self.buffer.size = n

    def state_dict(self) -> dict[str, Any]:
        return {**self.buffer.state_dict(), "seen": self.seen}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.buffer.load_state_dict(state)
        self.seen = int(state["seen"])
