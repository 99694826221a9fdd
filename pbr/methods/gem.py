"""GEM: gradient episodic memory (Lopez-Paz and Ranzato 2017).

The memory holds equal shares per task (pbr/selection.py: per_task_memory, filled at the end of
each task, as Mammoth's `gem`). Each step first takes the gradient of the loss on each old task's
memory (augmented, as Mammoth), then the current batch's gradient g. Where g would raise an old
task's loss (a negative inner product with its gradient), g is replaced by the closest gradient
that raises none: min ||z - g||^2 subject to G z >= 0, solved in its dual

    min_v 1/2 v^T (G G^T) v + (G g)^T v   subject to v >= margin,   z = g + G^T v

with quadprog, as the GEM paper's code does. `margin` (the code's memory strength, Mammoth's
gamma) > 0 pushes z further inside the cone; margin 0 is the exact projection.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from pbr.methods.base import MAMMOTH, Auto, Best, ContinualMethod, Setting, non_negative
from pbr.selection import per_task_memory

MARGIN = Setting("margin", float | Auto, "auto", "GEM's memory strength: the QP's lower bound on its dual variables "
                 "(0: the exact projection)", non_negative, "a number >= 0 or auto")


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
    uses_buffer = True
    settings = (MARGIN,)
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
        return self.step(self.ce(out, y))

    def after_backward(self) -> None:
        if self.memory_grads is None:
            return
        g = flat_grad(self.params)
        with torch.autocast(g.device.type, enabled=False):
            violated = bool((self.memory_grads @ g < 0).any())
        if violated:
            set_flat_grad(self.params, gem_project(g, self.memory_grads, self.opts.margin))

    def end_task(self, task: int, images: torch.Tensor, labels: torch.Tensor) -> None:
        per_task_memory(self.buffer, images, labels, task,
                        torch.zeros(labels.shape[0], self.ctx.n_classes, device=images.device), self.ctx.generator)
        self.groups = None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.groups = None
