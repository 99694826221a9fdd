"""ER: experience replay with an online reservoir buffer (Mammoth's rule and best lr)."""

import torch

from pbr.methods.base import ContinualMethod


class ER(ContinualMethod):
    name = "er"
    uses_buffer = True
    defaults = {"lr": 0.1, "head": "linear", "dropout": 0.0}

    def observe(self, x: torch.Tensor, y: torch.Tensor, raw: torch.Tensor) -> torch.Tensor:
        inputs, labels = x, y
        if self.has_replay():
            bx, by, _ = self.replay()
            inputs, labels = torch.cat([x, bx]), torch.cat([y, by])
        out = self.net(inputs)
        self.count(out[: y.shape[0]], y)
        loss = self.step(self.ce(out, labels))
        if self.offers_to_reservoir():
            self.buffer.reservoir_add(raw, y, torch.full_like(y, self.task), generator=self.ctx.generator)
        return loss
