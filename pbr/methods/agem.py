"""A-GEM (Chaudhry et al. 2019) and A-GEM-R, as the paper's Table 2 runs them.

A-GEM keeps GEM's constraint on average: one reference gradient g_ref from a random batch of the
whole memory, and where the current gradient g points against it (g . g_ref < 0) the step takes
g - (g . g_ref / g_ref . g_ref) g_ref, the closest gradient with no negative inner product.
A-GEM's memory holds equal shares per task, filled at each task's end (the A-GEM paper's episodic
memory; pbr/memory/per_task.py). A-GEM-R is the same step over ER's online reservoir
(Mammoth's `agem_r`). Mammoth's `agem` stores one batch per task through its reservoir instead;
the per-task memory is the A-GEM paper's. Both augment the memory batch of the reference gradient,
as Mammoth's `agem` does; Mammoth's `agem_r` replays its batch un-augmented (models/agem_r.py
@5bb9275 calls get_data without the transform), so A-GEM-R departs there, to match A-GEM's step.
"""

from __future__ import annotations

import torch

from pbr.memory.per_task import PerTask
from pbr.memory.reservoir import Reservoir
from pbr.methods.base import MAMMOTH, RESERVOIR, Best, ContinualMethod
from pbr.methods.gem import flat_grad, grad_of, set_flat_grad


def agem_project(g: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """g unchanged where g . ref >= 0, else g minus its component along ref (no host sync)."""
    dot = torch.dot(g, ref)
    return g - (dot.clamp(max=0) / torch.dot(ref, ref).clamp(min=1e-12)) * ref


class AGEM(ContinualMethod):
    name = "agem"
    label = "A-GEM"
    memory = PerTask
    best = (
        Best("cifar10", None, {"lr": 0.03}, f"{MAMMOTH} seq-cifar10 (buffer 200, 500, 5120)"),
        Best("tinyimagenet", None, {"lr": 0.01}, f"{MAMMOTH} seq-tinyimg (buffer 200, 500, 5120)"),
    )

    def __init__(self, net, ctx, opts) -> None:
        super().__init__(net, ctx, opts)
        self.params = [p for p in net.parameters() if p.requires_grad]
        self.reference: torch.Tensor | None = None

    def observe(self, x: torch.Tensor, y: torch.Tensor, raw: torch.Tensor) -> torch.Tensor:
        self.reference = None
        if self.has_replay():
            bx, by, _ = self.replay()
            self.reference = grad_of(self.ce(self.net(bx), by), self.params)
        out = self.net(x)
        self.count(out, y)
        loss = self.step(self.ce(out, y))
        self.offer(raw, y)  # A-GEM-R's reservoir; A-GEM's memory fills at the task's end
        return loss

    def after_backward(self) -> None:
        if self.reference is not None:
            set_flat_grad(self.params, agem_project(flat_grad(self.params), self.reference))


class AGEMR(AGEM):
    name = "agem_r"
    label = "A-GEM-R"
    memory = Reservoir
    settings = (RESERVOIR,)
