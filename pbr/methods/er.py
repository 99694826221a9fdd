"""ER: experience replay with an online reservoir buffer (Mammoth's rule and best lr)."""

import torch

from pbr.methods.base import MAMMOTH, RESERVOIR, Best, ContinualMethod
from pbr.selection import reservoir_add


class ER(ContinualMethod):
    name = "er"
    label = "ER"
    uses_buffer = True
    settings = (RESERVOIR,)
    best = (
        Best("cifar10", None, {"lr": 0.1}, f"{MAMMOTH} seq-cifar10 (buffer 200, 500, 5120)"),
        Best("tinyimagenet", 200, {"lr": 0.1}, f"{MAMMOTH} seq-tinyimg"),
        Best("tinyimagenet", 500, {"lr": 0.03}, f"{MAMMOTH} seq-tinyimg"),
        Best("cifar100", 500, {"lr": 0.1}, f"{MAMMOTH} seq-cifar100"),
        Best("cifar100", 2000, {"lr": 0.1}, f"{MAMMOTH} seq-cifar100"),
    )

    def observe(self, x: torch.Tensor, y: torch.Tensor, raw: torch.Tensor) -> torch.Tensor:
        inputs, labels = x, y
        if self.has_replay():
            bx, by, _ = self.replay()
            inputs, labels = torch.cat([x, bx]), torch.cat([y, by])
        out = self.net(inputs)
        self.count(out[: y.shape[0]], y)
        loss = self.step(self.ce(out, labels))
        if self.offers_to_reservoir():
            self.store(raw, y)
        return loss

    def store(self, raw: torch.Tensor, y: torch.Tensor) -> None:
        """Offer the batch's raw images to the memory (ER: Mammoth's online reservoir). Methods that
        keep ER's step and change only what the memory keeps (GSS, PRS, CBRS) override this."""
        reservoir_add(self.buffer, raw, y, torch.full_like(y, self.task), generator=self.ctx.generator)
