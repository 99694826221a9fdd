"""oEWC: online elastic weight consolidation (Schwarz et al. 2018), as Mammoth's `ewc_on`.

After each task the diagonal Fisher is estimated from the task's (augmented) training samples:
F = mean_i p(y_i | x_i) * (d log p(y_i | x_i) / d theta)^2, the true label's probability weighting
its squared per-sample gradient. The running Fisher decays: F <- gamma * F + F_task. Every later
step adds e_lambda * sum F * (theta - theta*)^2, theta* the weights at the end of the last task.
Per-sample gradients come from torch.func (vmap of grad), in eval mode (BatchNorm's running
statistics; Mammoth feeds single samples in train mode, which also moves those statistics).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from pbr.methods.base import MAMMOTH, Auto, Best, ContinualMethod, Setting, non_negative, positive


class OnlineEWC(ContinualMethod):
    name = "ewc_on"
    label = "oEWC"
    settings = (
        Setting("e_lambda", float | Auto, "auto", "oEWC: weight of the Fisher penalty", non_negative,
                "a number >= 0 or auto"),
        Setting("gamma", float | Auto, "auto", "oEWC: decay of the running Fisher", positive,
                "a positive number or auto"),
    )
    defaults = {**ContinualMethod.defaults, "e_lambda": 10.0, "gamma": 1.0}
    defaults_source = f"{MAMMOTH} seq-cifar10 (no published value for this dataset)"
    best = (
        Best("cifar10", None, {"lr": 0.03, "e_lambda": 10.0, "gamma": 1.0}, f"{MAMMOTH} seq-cifar10"),
        Best("tinyimagenet", None, {"lr": 0.03, "e_lambda": 25.0, "gamma": 1.0}, f"{MAMMOTH} seq-tinyimg"),
    )
    fisher_chunk = 16  # samples per vmap call: bounds the per-sample gradients' memory

    def __init__(self, net, ctx, opts) -> None:
        super().__init__(net, ctx, opts)
        self.fisher: dict[str, torch.Tensor] | None = None
        self.anchor: dict[str, torch.Tensor] | None = None

    def penalty(self) -> torch.Tensor | None:
        if self.fisher is None:
            return None
        return self.opts.e_lambda * self.quadratic_penalty(self.fisher, self.anchor)

    def end_task(self, task: int, images: torch.Tensor, labels: torch.Tensor) -> None:
        fisher = empirical_fisher(self.net, self.ctx.augment(images, self.ctx.generator), labels, self.fisher_chunk)
        if self.fisher is None:
            self.fisher = fisher
        else:
            self.fisher = {n: self.opts.gamma * self.fisher[n] + fisher[n] for n in fisher}
        self.anchor = {n: p.detach().clone() for n, p in self.net.named_parameters()}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "fisher": self.fisher, "anchor": self.anchor}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.fisher, self.anchor = state["fisher"], state["anchor"]


def empirical_fisher(net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, chunk: int = 16) -> dict[str, torch.Tensor]:
    """mean_i p(y_i|x_i) * g_i^2 with g_i the gradient of log p(y_i|x_i), per parameter."""
    from torch.func import functional_call, grad, vmap

    params = {n: p.detach() for n, p in net.named_parameters()}
    buffers = {n: b.detach() for n, b in net.named_buffers()}

    def log_p(p, xi, yi):
        logits = functional_call(net, (p, buffers), (xi.unsqueeze(0),))
        v = F.log_softmax(logits, 1)[0].gather(0, yi.unsqueeze(0))[0]
        return v, v.detach()

    def weighted_sq_grad(p, xi, yi):
        g, v = grad(log_p, has_aux=True)(p, xi, yi)
        return {n: v.exp() * t ** 2 for n, t in g.items()}

    was_training = net.training
    net.eval()
    total = {n: torch.zeros_like(p) for n, p in params.items()}
    try:
        for i in range(0, x.shape[0], chunk):
            per = vmap(weighted_sq_grad, in_dims=(None, 0, 0), randomness="different")(
                params, x[i:i + chunk], y[i:i + chunk])
            for n, v in per.items():
                total[n] += v.sum(0)
    finally:
        net.train(was_training)
    return {n: v / max(x.shape[0], 1) for n, v in total.items()}
