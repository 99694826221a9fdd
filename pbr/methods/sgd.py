"""SGD: plain fine-tuning on each task in turn, the lower bound."""

import torch

from pbr.methods.base import ContinualMethod


class SGD(ContinualMethod):
    name = "sgd"
    role = "bound"
    label = "SGD"

    def observe(self, x: torch.Tensor, y: torch.Tensor, raw: torch.Tensor) -> torch.Tensor:
        out = self.net(x)
        self.count(out, y)
        return self.step(self.ce(out, y))
