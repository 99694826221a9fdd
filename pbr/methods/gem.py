"""GEM: gradient episodic memory (Lopez-Paz and Ranzato 2017).

Each step first takes the gradient of the loss on each old task's memory (augmented, as Mammoth),
then the current batch's gradient g. Where g would raise an old task's loss (a negative inner
product with its gradient), g is replaced by the closest gradient that raises none:
min ||z - g||^2 subject to G z >= 0, solved in its dual

    min_v 1/2 v^T (G G^T) v + (G g)^T v   subject to v >= margin,   z = g + G^T v

with quadprog, as the GEM paper's code and Mammoth's `gem` do. `margin` (the code's memory
strength, Mammoth's gamma) > 0 pushes z further inside the cone; margin 0 is the exact projection.

The memory (`gem_memory`) is where this file departs from Mammoth's gem @5bb9275 by default:
- "per_task" (default): equal shares of the capacity per task, filled at each task's end
  (pbr/memory/per_task.py; after task t each task keeps capacity // (t + 1) samples,
  the new one a random draw of its data), the GEM paper's episodic memory within one budget.
- "one_batch": Mammoth's gem @5bb9275: at each task's end one random batch of the task
  (train.replay_batch_size samples, 32 as Mammoth's loader batch) goes into the memory through
  the online reservoir, whatever the capacity (pbr/memory/batch_per_task.py): in the fifth task of five it holds 4 x 32 = 128
  samples at buffer 200 as at 5120. (Later Mammoth versions fill equal shares per class.)
The default honours method.buffer_size: the paper's GEM rows differ between buffer 200 and 500
(Seq-CIFAR-100-LT: 16.15 and 22.47 Class-IL), which one batch per task would not explain. Its
memory gradients cover the whole memory every step, so at a large buffer its step costs more than
Mammoth's (at 200 on Seq-CIFAR-10, 200 memory samples a step against 32 to 128).
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch

from pbr.memory.batch_per_task import BatchPerTask
from pbr.memory.per_task import PerTask
from pbr.methods.base import MAMMOTH, Auto, Best, ContinualMethod, Setting, non_negative

MARGIN = Setting("margin", float | Auto, "auto", "GEM's memory strength: the QP's lower bound on its dual variables "
                 "(0: the exact projection)", non_negative, "a number >= 0 or auto")
MEMORY = Setting("gem_memory", Literal["per_task", "one_batch"], "per_task",
                 "GEM's memory: equal shares of the capacity per task, or one random batch per task through the "
                 "reservoir (Mammoth's gem @5bb9275, whatever the capacity)")


def flat_grad(params: list[torch.Tensor]) -> torch.Tensor:
    """Every parameter's .grad as one vector (zeros where a parameter got none)."""
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])


def set_flat_grad(params: list[torch.Tensor], flat: torch.Tensor) -> None:
    """Write a vector made by flat_grad back into the parameters' .grad."""
    i = 0
    for p in params:
        n = p.numel()
        p.grad = flat[i:i + n].view_as(p).to(p.dtype).clone()
        i += n


def grad_of(loss: torch.Tensor, params: list[torch.Tensor]) -> torch.Tensor:
    """The gradient of `loss` as one vector, leaving the parameters' .grad alone."""
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1) for g, p in zip(grads, params)])


def gem_project(g: torch.Tensor, G: torch.Tensor, margin: float = 0.0, eps: float = 1e-3) -> torch.Tensor:
    """The gradient closest to `g` with a non-negative inner product with every row of `G`
    (the dual QP above; `eps` keeps G G^T positive definite for the solver). Only the t x t
    products go to the solver on the host: the gradients stay where they are (a ResNet18's are
    11M numbers a task)."""
    import quadprog

    t = G.shape[0]
    with torch.autocast(G.device.type, enabled=False):  # the step's bf16 autocast would round P
        Gd, gd = G.double(), g.double()
        P = (Gd @ Gd.T).cpu().numpy()
        P = 0.5 * (P + P.T) + eps * np.eye(t)
        q = (Gd @ gd).cpu().numpy()
        v = quadprog.solve_qp(P, -q, np.eye(t), np.full(t, float(margin)))[0]
        return (gd + Gd.T @ torch.from_numpy(v).to(G.device)).to(g.dtype)


class GEM(ContinualMethod):
    name = "gem"
    label = "GEM"
    memory = PerTask
    settings = (MARGIN, MEMORY)
    defaults = {**ContinualMethod.defaults, "margin": 0.5}
    defaults_source = "the GEM paper's code (memory strength 0.5); the paper's common protocol otherwise"
    best = (Best("cifar10", None, {"lr": 0.03, "margin": 0.5}, f"{MAMMOTH} seq-cifar10 (buffer 200, 500, 5120)"),)

    def __init__(self, net, ctx, opts) -> None:
        super().__init__(net, ctx, opts)
        self.params = [p for p in net.parameters() if p.requires_grad]
        self.memory_grads: torch.Tensor | None = None  # [old tasks, P] for the step in progress
        self.groups: list[torch.Tensor] | None = None  # the memory's slots of each old task

    def _groups(self) -> list[torch.Tensor]:
        if self.groups is None:  # the memory changes only at a task's end (and on resume)
            tasks = self.buffer.tasks[: len(self.buffer)]
            self.groups = [torch.nonzero(tasks == t).squeeze(1) for t in tasks.unique().tolist()]
        return self.groups

    def observe(self, x: torch.Tensor, y: torch.Tensor, raw: torch.Tensor) -> torch.Tensor:
        self.memory_grads = None
        if self.has_replay():
            rows = []
            for idx in self._groups():
                images, labels, _, _ = self.buffer.get(idx)
                rows.append(grad_of(self.ce(self.net(self.ctx.augment(images, self.ctx.generator)), labels),
                                    self.params))
            self.memory_grads = torch.stack(rows)
        out = self.net(x)
        self.count(out, y)
        loss = self.step(self.ce(out, y))
        self.offer(raw, y)  # kept by an online memory only (GEM's fills at the task's end)
        return loss

    def after_backward(self) -> None:
        if self.memory_grads is None:
            return
        g = flat_grad(self.params)
        with torch.autocast(g.device.type, enabled=False):
            violated = bool((self.memory_grads @ g < 0).any())
        if violated:
            set_flat_grad(self.params, gem_project(g, self.memory_grads, self.opts.margin))

    def make_policy(self, buffer):
        if self.opts.gem_memory == "one_batch":
            return BatchPerTask(buffer, self.ctx.generator, self, batch=self.ctx.replay_batch_size)
        return super().make_policy(buffer)

    def end_task(self, task: int, images: torch.Tensor, labels: torch.Tensor) -> None:
        super().end_task(task, images, labels)
        self.groups = None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.groups = None
