"""SI: synaptic intelligence (Zenke et al. 2017), as Mammoth's `si`.

During a task each parameter's path integral accumulates omega += lr * g^2 (the product of the
gradient and the SGD update -lr * g, with the clipped gradient); at the task's end
Omega += omega / ((theta - theta*)^2 + xi) and theta* moves to the current weights. Every step
adds c * sum Omega * (theta - theta*)^2; gradients are clipped to [-1, 1] before the update.
Under lr_milestones, lr is the step's own (a tenth after each milestone); Mammoth multiplies by
its args.lr whatever its scheduler did (it publishes no SI setting for its one scheduled data set).
"""

from __future__ import annotations

from typing import Any

import torch

from pbr.methods.base import MAMMOTH, Auto, Best, ContinualMethod, Setting, non_negative, positive


class SI(ContinualMethod):
    name = "si"
    label = "SI"
    settings = (
        Setting("c", float | Auto, "auto", "SI: weight of the surrogate loss", non_negative, "a number >= 0 or auto"),
        Setting("xi", float | Auto, "auto", "SI: damping of the importance", positive, "a positive number or auto"),
    )
    defaults = {**ContinualMethod.defaults, "c": 0.5, "xi": 1.0}
    defaults_source = f"{MAMMOTH} seq-cifar10 (no published value for this dataset)"
    best = (
        Best("cifar10", None, {"lr": 0.03, "c": 0.5, "xi": 1.0}, f"{MAMMOTH} seq-cifar10"),
        Best("tinyimagenet", None, {"lr": 0.03, "c": 0.5, "xi": 1.0}, f"{MAMMOTH} seq-tinyimg"),
    )

    def __init__(self, net, ctx, opts) -> None:
        super().__init__(net, ctx, opts)
        self.anchor = {n: p.detach().clone() for n, p in net.named_parameters()}
        self.small_omega = {n: torch.zeros_like(p) for n, p in net.named_parameters()}
        self.big_omega: dict[str, torch.Tensor] | None = None

    def penalty(self) -> torch.Tensor | None:
        if self.big_omega is None:
            return None
        return self.opts.c * self.quadratic_penalty(self.big_omega, self.anchor)

    def after_backward(self) -> None:
        torch.nn.utils.clip_grad_value_(self.net.parameters(), 1.0)

    @torch.no_grad()
    def after_step(self) -> None:
        lr = self.opt.param_groups[0]["lr"]  # the step's (under lr_milestones, not opts.lr)
        for n, p in self.net.named_parameters():
            if p.grad is not None:
                self.small_omega[n] += lr * p.grad ** 2

    @torch.no_grad()
    def end_task(self, task: int, images: torch.Tensor, labels: torch.Tensor) -> None:
        if self.big_omega is None:
            self.big_omega = {n: torch.zeros_like(p) for n, p in self.net.named_parameters()}
        for n, p in self.net.named_parameters():
            self.big_omega[n] += self.small_omega[n] / ((p - self.anchor[n]) ** 2 + self.opts.xi)
            self.anchor[n] = p.detach().clone()
            self.small_omega[n].zero_()

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "anchor": self.anchor, "small_omega": self.small_omega,
                "big_omega": self.big_omega}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.anchor, self.small_omega, self.big_omega = state["anchor"], state["small_omega"], state["big_omega"]
