"""DER and DER++ (dark experience replay): replay stored logits with an MSE term; DER++ adds
cross-entropy on a second, independent buffer draw. Mammoth's rules and best hyper-parameters."""

import torch
import torch.nn.functional as F

from pbr.memory.reservoir import Reservoir
from pbr.methods.base import (ALPHA, BETA, MAMMOTH, RESERVOIR, SEQ_CIFAR100, SEQ_CIFAR100_NO_200, SEQ_CIFAR100_SCHEDULE,
                              Best, ContinualMethod)


class DER(ContinualMethod):
    name = "der"
    label = "DER"
    memory = Reservoir
    settings = (ALPHA, RESERVOIR)  # alpha: weight of the logit MSE
    defaults = {**ContinualMethod.defaults, "alpha": 0.3}
    defaults_source = f"{MAMMOTH} seq-cifar10, buffer 200 (no published value for this dataset and buffer)"
    best = (
        Best("cifar10", None, {"lr": 0.03, "alpha": 0.3}, f"{MAMMOTH} seq-cifar10 (buffer 200, 500, 5120)"),
        Best("tinyimagenet", None, {"lr": 0.03, "alpha": 0.1}, f"{MAMMOTH} seq-tinyimg (buffer 200, 500, 5120)"),
        Best("cifar100", 200, {"lr": 0.03, "alpha": 0.3, **SEQ_CIFAR100_SCHEDULE}, SEQ_CIFAR100_NO_200),
        Best("cifar100", 500, {"lr": 0.03, "alpha": 0.3, **SEQ_CIFAR100_SCHEDULE}, SEQ_CIFAR100),
        Best("cifar100", 2000, {"lr": 0.03, "alpha": 0.3, **SEQ_CIFAR100_SCHEDULE}, SEQ_CIFAR100),
    )

    def observe(self, x: torch.Tensor, y: torch.Tensor, raw: torch.Tensor) -> torch.Tensor:
        out = self.net(x)
        self.count(out, y)
        loss = self.ce(out, y)
        if self.has_replay():
            bx, _, blogits = self.replay()
            loss = loss + self.opts.alpha * F.mse_loss(self.net(bx), blogits)
            if getattr(self.opts, "beta", 0.0):
                bx2, by2, _ = self.replay()
                loss = loss + self.opts.beta * self.ce(self.net(bx2), by2)
        loss = self.step(loss)
        self.offer(raw, y, out.detach())
        return loss


class DERpp(DER):
    name = "derpp"
    grids = ("table3",)  # the paper's shuffled Table 3: DER++ against PBR
    label = "DER++"
    settings = (ALPHA, BETA, RESERVOIR)  # beta: weight of the second draw's cross-entropy
    defaults = {**ContinualMethod.defaults, "alpha": 0.1, "beta": 0.5}
    best = (
        Best("cifar10", 200, {"lr": 0.03, "alpha": 0.1, "beta": 0.5}, f"{MAMMOTH} seq-cifar10"),
        Best("cifar10", 500, {"lr": 0.03, "alpha": 0.2, "beta": 0.5}, f"{MAMMOTH} seq-cifar10"),
        Best("cifar10", 5120, {"lr": 0.03, "alpha": 0.1, "beta": 1.0}, f"{MAMMOTH} seq-cifar10"),
        Best("tinyimagenet", 200, {"lr": 0.03, "alpha": 0.1, "beta": 1.0}, f"{MAMMOTH} seq-tinyimg"),
        Best("tinyimagenet", 500, {"lr": 0.03, "alpha": 0.2, "beta": 0.5}, f"{MAMMOTH} seq-tinyimg"),
        Best("tinyimagenet", 5120, {"lr": 0.03, "alpha": 0.1, "beta": 0.5}, f"{MAMMOTH} seq-tinyimg"),
        Best("cifar100", 200, {"lr": 0.03, "alpha": 0.1, "beta": 0.5, **SEQ_CIFAR100_SCHEDULE}, SEQ_CIFAR100_NO_200),
        Best("cifar100", 500, {"lr": 0.03, "alpha": 0.1, "beta": 0.5, **SEQ_CIFAR100_SCHEDULE}, SEQ_CIFAR100),
        Best("cifar100", 2000, {"lr": 0.03, "alpha": 0.1, "beta": 0.5, **SEQ_CIFAR100_SCHEDULE}, SEQ_CIFAR100),
    )
