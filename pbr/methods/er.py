"""ER: experience replay with an online reservoir buffer (Mammoth's rule and best lr)."""

import torch

from pbr.memory.reservoir import Reservoir
from pbr.methods.base import (MAMMOTH, RESERVOIR, SEQ_CIFAR100, SEQ_CIFAR100_NO_200, SEQ_CIFAR100_SCHEDULE, Best,
                              ContinualMethod)


class ER(ContinualMethod):
    name = "er"
    grids = ("fidelity",)  # the confirmation's comparator, at the paper's lr and Mammoth's
    label = "ER"
    memory = Reservoir
    laned = True  # tests/test_lockstep.py
    settings = (RESERVOIR,)
    best = (
        Best("cifar10", None, {"lr": 0.1}, f"{MAMMOTH} seq-cifar10 (buffer 200, 500, 5120)"),
        Best("tinyimagenet", 200, {"lr": 0.1}, f"{MAMMOTH} seq-tinyimg"),
        Best("tinyimagenet", 500, {"lr": 0.03}, f"{MAMMOTH} seq-tinyimg"),
        Best("cifar100", 200, {"lr": 0.1, **SEQ_CIFAR100_SCHEDULE}, SEQ_CIFAR100_NO_200),
        Best("cifar100", 500, {"lr": 0.1, **SEQ_CIFAR100_SCHEDULE}, SEQ_CIFAR100),
        Best("cifar100", 2000, {"lr": 0.1, **SEQ_CIFAR100_SCHEDULE}, SEQ_CIFAR100),
    )

    def observe(self, x: torch.Tensor, y: torch.Tensor, raw: torch.Tensor) -> torch.Tensor:
        inputs, labels = x, y
        if self.has_replay():
            bx, by, _ = self.replay()
            inputs, labels = torch.cat([x, bx]), torch.cat([y, by])
        out = self.net(inputs)
        self.count(out[: y.shape[0]], y)
        loss = self.step(self.ce(out, labels))
        self.offer(raw, y)
        return loss
