"""Vitter's reservoir as Mammoth runs it, online (ER, DER, DER++, A-GEM-R, HAL by default, PBR's
`sampling: reservoir`)."""

from __future__ import annotations

import torch

from pbr.memory.base import Memory
from pbr.rng import check_generator


class Reservoir(Memory):
    def offer(self, images: torch.Tensor, labels: torch.Tensor, tasks: torch.Tensor,
              logits: torch.Tensor | None = None) -> None:
        self.add(images, labels, tasks, logits)

    def add(self, images: torch.Tensor, labels: torch.Tensor, tasks: torch.Tensor,
            logits: torch.Tensor | None = None) -> None:
        """Mammoth's rule, applied to the batch in order, vectorised.

        Stream sample n (0-based) goes to slot n while n < capacity; otherwise
        j = floor(u * (n + 1)) with u = torch.rand(B, dtype=float64, generator) (one draw per
        sample of the batch, drawn for every sample) and slot j is replaced if j < capacity.
        """
        buf = self.buffer
        b = buf.check_batch(images, labels, tasks, logits)
        g = check_generator(self.generator, buf.device)
        u = torch.rand(b, dtype=torch.float64, generator=g, device=buf.device)
        n = torch.arange(self.seen, self.seen + b, device=buf.device)
        j = torch.minimum(torch.floor(u * (n + 1)).to(torch.int64), n)
        slot = torch.where(n < buf.capacity, n, j)
        slot = torch.where(slot < buf.capacity, slot, buf.capacity)
        buf.write(slot, images, labels, tasks, logits, None)
        self.seen += b
        buf.size = min(buf.capacity, self.seen)
