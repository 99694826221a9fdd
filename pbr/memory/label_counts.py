"""The policies that balance classes from the stream's label counts (PRS, CBRS).

They read the running count of each label seen in the stream: the label distribution that PBR
claims not to need, so the report marks them "label counts". Each sample's fate depends on the
ones before it, so the policy decides the batch in stream order on the host, then writes it with
one Buffer.write.
"""

from __future__ import annotations

from typing import Any

import torch

from pbr.memory.base import Memory


class LabelCounts(Memory):
    uniforms = 3  # draws per sample the policy reads

    def __init__(self, buffer, generator, learner=None) -> None:
        super().__init__(buffer, generator, learner)
        self.class_seen = [0] * buffer.n_classes  # stream samples of each class offered so far
        self.slots: list[int] = []  # the label in each filled slot (a host copy of buffer.labels)

    def place(self, label: int, u: list[float]) -> int:
        """The slot for a sample of `label` (capacity: not stored); updates class_seen and slots."""
        raise NotImplementedError

    def take_free_slot(self, label: int) -> int | None:
        """The next free slot, now holding `label`; None once the memory is full."""
        if len(self.slots) < self.buffer.capacity:
            self.slots.append(label)
            return len(self.slots) - 1
        return None

    def stored(self) -> list[int]:
        """The samples of each class the memory holds."""
        counts = [0] * len(self.class_seen)
        for c in self.slots:
            counts[c] += 1
        return counts

    def offer(self, images, labels, tasks, logits=None) -> None:
        u = torch.rand(labels.shape[0], self.uniforms, dtype=torch.float64, generator=self.generator,
                       device=self.buffer.device).tolist()
        targets = [self.place(label, draws) for label, draws in zip(labels.tolist(), u)]
        self.buffer.write(torch.tensor(targets, device=self.buffer.device), images, labels, tasks, logits)
        self.seen += labels.shape[0]
        self.buffer.size = len(self.slots)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "class_seen": list(self.class_seen)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.class_seen = list(state["class_seen"])
        self.slots = self.buffer.labels[: self.buffer.size].tolist()


def pick(items: list[int], u: float) -> int:
    """The item at the uniform draw u in [0, 1)."""
    return items[min(int(u * len(items)), len(items) - 1)]
