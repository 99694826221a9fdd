"""DER and DER++ (dark experience replay): replay stored logits with an MSE term; DER++ adds
cross-entropy on a second, independent buffer draw. Mammoth's rules and best hyper-parameters."""

import torch
import torch.nn.functional as F

from pbr.methods.base import ContinualMethod


class DER(ContinualMethod):
    name = "der"
    uses_buffer = True
    defaults = {"lr": 0.03, "head": "linear", "dropout": 0.0, "alpha": 0.3, "beta": 0.0}

    def observe(self, x: torch.Tensor, y: torch.Tensor, raw: torch.Tensor) -> torch.Tensor:
        out = self.net(x)
        self.count(out, y)
        loss = self.ce(out, y)
        if self.has_replay():
            bx, _, blogits = self.replay()
            loss = loss + self.opts.alpha * F.mse_loss(self.net(bx), blogits)
            if self.opts.beta:
                bx2, by2, _ = self.replay()
                loss = loss + self.opts.beta * self.ce(self.net(bx2), by2)
        loss = self.step(loss)
        if self.offers_to_reservoir():
            self.buffer.reservoir_add(raw, y, torch.full_like(y, self.task), logits=out.detach(),
                                      generator=self.ctx.generator)
        return loss


class DERpp(DER):
    name = "derpp"
    # Mammoth's best on Seq-CIFAR-10: buffer 200 -> alpha 0.1, beta 0.5; buffer 500 -> 0.2, 0.5.
    defaults = {"lr": 0.03, "head": "linear", "dropout": 0.0,
                "alpha": lambda buffer_size: 0.1 if buffer_size < 500 else 0.2, "beta": 0.5}
