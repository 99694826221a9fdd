"""ER's step over a memory whose policy reads the stream's label counts (PRS, CBRS).

These buffers balance classes from the running count of each label seen in the stream: the label
distribution that PBR claims not to need, so the report marks them "label counts". The policy
decides each sample in stream order on the host (a sample's fate depends on the ones before it)
and the batch is written with one Buffer.write.
"""

from __future__ import annotations

from typing import Any

import torch

from pbr.memory import Memory
from pbr.methods.base import Best
from pbr.methods.er import ER


class LabelCountReplay(ER):
    # The same replay step as ER, so its tuned lr: the memories differ, nothing else.
    best = tuple(Best(b.dataset, b.buffer_size, b.values, f"ER's ({b.source})") for b in ER.best)
    uniforms = 3  # draws per sample the policy reads
    memory = Memory  # its policy still in this file (being moved to pbr/memory/)

    def __init__(self, net, ctx, opts) -> None:
        super().__init__(net, ctx, opts)
        self.seen = [0] * ctx.n_classes  # stream samples of each class offered so far
        self.slots: list[int] = []  # the label in each filled slot (a host copy of buffer.labels)

    def place(self, label: int, u: list[float]) -> int:
        """The slot for a sample of `label` (capacity: not stored); updates seen and slots."""
        raise NotImplementedError

    def offer(self, raw: torch.Tensor, y: torch.Tensor, logits=None) -> None:
        if self.offers_this_epoch():
            self.store(raw, y)

    def store(self, raw: torch.Tensor, y: torch.Tensor) -> None:
        u = torch.rand(y.shape[0], self.uniforms, dtype=torch.float64, generator=self.ctx.generator,
                       device=self.ctx.device).tolist()
        targets = [self.place(label, draws) for label, draws in zip(y.tolist(), u)]
        self.buffer.write(torch.tensor(targets, device=self.buffer.device), raw, y, torch.full_like(y, self.task))
        self.policy.seen += y.shape[0]
        self.buffer.size = len(self.slots)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "seen_counts": list(self.seen)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.seen = list(state["seen_counts"])
        self.slots = self.buffer.labels[: len(self.buffer)].tolist() if self.buffer is not None else []


def pick(items: list[int], u: float) -> int:
    """The item at the uniform draw u in [0, 1)."""
    return items[min(int(u * len(items)), len(items) - 1)]
