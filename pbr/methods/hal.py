"""HAL: hindsight anchor learning (Chaudhry et al. 2021), as Mammoth's `hal` @5bb9275.

The memory (`hal_memory`):
- "reservoir" (default): one online reservoir over the whole stream, as ER's. It is what
  Mammoth's `hal` @5bb9275 runs: it asks its Buffer for mode='ring', but that Buffer's add_data
  always takes the reservoir's slot (the ring's index function is set and never called), and
  HAL's end_task never resets the count (it compares the task with n_tasks).
- "ring": a ring per task (pbr/memory/ring.py), each task keeping its latest capacity // tasks
  stream samples: the ring Mammoth's code asks for (and the HAL paper's episodic memory is a ring
  buffer). On a long-tailed stream it gives every task an equal share, where the reservoir's
  shares follow the tasks' sizes; a task smaller than its share holds repeats of its samples
  after several epochs. Runs recorded before this setting existed ran the ring.
Either memory is offered the batches `method.reservoir` says (every epoch's, or the task's first
epoch's), as every memory filled online is.
Each
step first takes ER's step to a temporary theta~ (CE on the current and a memory batch), then goes
back to theta and steps on CE + hal_lambda * mean ||f_theta(e) - f_theta~(e)||^2 over the anchors
e, so the update keeps the anchors' outputs where the plain step would leave them. phi, a running
mean (decay hal_beta, from zeros at each task's start) of the current batches' features, says
where the task's data lies. Under bf16 autocast the drift runs in fp32: one step's change of the
anchors' outputs is about bf16's rounding of them.

At the end of a task one anchor per class of the task is learned in input space: starting from
uniform noise, 100 SGD steps minimise  -CE(theta_m(e), c) + CE(theta(e), c)
+ hal_gamma * ||features_theta(e) - phi||^2,  theta_m the network after one step on a memory batch:
an anchor is a point of class c that a step on the memory would forget most, kept near the data.
The anchor search runs the networks in eval mode (Mammoth runs single images through train-mode
BatchNorm).
"""

from __future__ import annotations

import copy
from typing import Any, Literal

import torch
import torch.nn.functional as F

from pbr.errors import UserError
from pbr.memory.reservoir import Reservoir
from pbr.memory.ring import TaskRing
from pbr.methods.base import MAMMOTH, RESERVOIR, Auto, Best, ContinualMethod, Setting, non_negative

ANCHOR_STEPS = 100  # Mammoth's steps_on_anchors
SETTINGS = (
    Setting("hal_lambda", float | Auto, "auto", "HAL: weight of the anchors' output drift", non_negative,
            "a number >= 0 or auto"),
    Setting("hal_beta", float | Auto, "auto", "HAL: decay of the running mean feature phi",
            lambda v: 0 <= v <= 1, "a number in [0, 1] or auto"),
    Setting("hal_gamma", float | Auto, "auto", "HAL: weight of the anchors' distance to phi", non_negative,
            "a number >= 0 or auto"),
    Setting("hal_memory", Literal["reservoir", "ring"], "reservoir",
            "HAL's memory: one online reservoir (what Mammoth's hal @5bb9275 runs) or a ring per task, each "
            "keeping its latest capacity // tasks samples (the ring Mammoth's code asks for)", before="ring"),
    RESERVOIR,
)


def learn_anchor(theta: torch.nn.Module, spare: torch.nn.Module, c: int, phi: torch.Tensor | None, gamma: float,
                 lr: float, start: torch.Tensor, steps: int = ANCHOR_STEPS) -> torch.Tensor:
    """An anchor of class c: `steps` SGD steps from `start` on -CE(spare(e), c) + CE(theta(e), c)
    + gamma ||features_theta(e) - phi||^2, both networks in eval mode and left unchanged."""
    modes = [theta.training, spare.training]
    theta.eval()
    spare.eval()
    e = start.detach().clone().unsqueeze(0).requires_grad_(True)
    opt = torch.optim.SGD([e], lr=lr)
    target = torch.tensor([c], device=start.device)
    for _ in range(steps):
        opt.zero_grad()
        loss = -F.cross_entropy(spare(e), target) + F.cross_entropy(theta(e), target)
        if phi is not None:
            loss = loss + gamma * ((theta.features(e) - phi) ** 2).sum()
        (grad,) = torch.autograd.grad(loss, [e])
        e.grad = grad
        opt.step()
    theta.train(modes[0])
    spare.train(modes[1])
    return e.detach()[0]


class HAL(ContinualMethod):
    name = "hal"
    label = "HAL"
    memory = Reservoir  # or a ring per task (hal_memory: ring): make_policy
    settings = SETTINGS
    defaults = {**ContinualMethod.defaults, "hal_lambda": 0.1, "hal_beta": 0.5, "hal_gamma": 0.1}
    defaults_source = "Mammoth's hal defaults (lambda 0.1, beta 0.5, gamma 0.1); the paper's common protocol otherwise"
    best = (
        Best("cifar10", 200, {"lr": 0.03, "hal_lambda": 0.2, "hal_beta": 0.5, "hal_gamma": 0.1}, f"{MAMMOTH} seq-cifar10"),
        Best("cifar10", 500, {"lr": 0.03, "hal_lambda": 0.1, "hal_beta": 0.3, "hal_gamma": 0.1}, f"{MAMMOTH} seq-cifar10"),
        Best("cifar10", 5120, {"lr": 0.03, "hal_lambda": 0.1, "hal_beta": 0.3, "hal_gamma": 0.1}, f"{MAMMOTH} seq-cifar10"),
    )

    def __init__(self, net, ctx, opts) -> None:
        super().__init__(net, ctx, opts)
        if opts.hal_memory == "ring" and opts.buffer_size < len(ctx.task_classes):
            raise UserError(f"method.buffer_size = {opts.buffer_size} leaves HAL's per-task ring empty: use at least "
                            f"one slot per task ({len(ctx.task_classes)})")
        self.anchors: torch.Tensor | None = None  # [classes so far, C, H, W], normalised input space
        self.phi: torch.Tensor | None = None

    @classmethod
    def least_buffer(cls, n_classes: int, n_tasks: int, settings: dict[str, Any]) -> tuple[int, str]:
        if settings.get("hal_memory") == "ring":
            return TaskRing.least_capacity(n_classes, n_tasks)
        return super().least_buffer(n_classes, n_tasks, settings)

    def make_policy(self, buffer):
        if self.opts.hal_memory == "ring":
            return TaskRing(buffer, self.ctx.generator, self)
        return super().make_policy(buffer)

    def observe(self, x: torch.Tensor, y: torch.Tensor, raw: torch.Tensor) -> torch.Tensor:
        inputs, labels = x, y
        if self.has_replay():
            bx, by, _ = self.replay()
            inputs, labels = torch.cat([x, bx]), torch.cat([y, by])
        params = list(self.net.parameters())
        if self.anchors is None:
            out = self.net(inputs)
            self.count(out[: y.shape[0]], y)
            loss = self.step(self.ce(out, labels))
        else:
            theta = [p.detach().clone() for p in params]
            out = self.net(inputs)
            self.count(out[: y.shape[0]], y)
            loss = self.ce(out, labels)
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            self.opt.step()  # the temporary theta~
            with torch.autocast(x.device.type, enabled=False):
                with torch.no_grad():
                    target = self.net(self.anchors)
                    for p, t in zip(params, theta):
                        p.copy_(t)
                drift = self.opts.hal_lambda * ((target - self.net(self.anchors)) ** 2).mean()
            drift.backward()  # onto the CE gradient at theta, still in .grad
            self.opt.step()
            loss = loss.detach() + drift.detach()
        with torch.no_grad():
            mean = self.net.features(x).mean(0).float()
            phi = torch.zeros_like(mean) if self.phi is None else self.phi  # zeros at each task's start
            self.phi = self.opts.hal_beta * phi + (1 - self.opts.hal_beta) * mean
        self.offer(raw, y)
        return loss

    def end_task(self, task: int, images: torch.Tensor, labels: torch.Tensor) -> None:
        super().end_task(task, images, labels)  # a memory that chooses at a task's end does it first
        was_training = self.net.training
        spare = copy.deepcopy(self.net)
        opt = torch.optim.SGD(spare.parameters(), lr=self.opts.lr)
        bx, by, _ = self.replay()
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(spare(bx), by).backward()
        opt.step()
        self.net.eval()
        new = torch.stack([
            learn_anchor(self.net, spare, c, self.phi, self.opts.hal_gamma, self.opts.lr,
                         torch.rand(images.shape[1:], generator=self.ctx.generator, device=self.ctx.device))
            for c in self.ctx.task_classes[task].tolist()])
        self.net.train(was_training)
        self.anchors = new if self.anchors is None else torch.cat([self.anchors, new])
        self.phi = None  # the next task's mean feature starts again from zeros (Mammoth)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "anchors": self.anchors, "phi": self.phi}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.anchors, self.phi = state["anchors"], state["phi"]
