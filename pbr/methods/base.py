"""The interface every continual method shares: observe a batch, end a task.

In the spirit of Mammoth's ContinualModel: a method owns the network, its optimiser and
(when it has one) the replay buffer; the training loop only feeds it batches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar

import torch
import torch.nn.functional as F

from pbr.buffer import Buffer
from pbr.models import Net


@dataclass
class Context:
    """What a method needs to know about the stream and the machine."""

    n_classes: int
    task_classes: list[torch.Tensor]  # per task, its class indices (on the device)
    device: torch.device
    augment: Callable[[torch.Tensor, torch.Generator], torch.Tensor]  # uint8 -> augmented float batch
    preprocess: Callable[[torch.Tensor], torch.Tensor]  # uint8 -> normalised float batch (eval)
    generator: torch.Generator  # every draw of the method (buffer, order) comes from here
    replay_batch_size: int = 32
    eval_batch_size: int = 128
    autocast_dtype: torch.dtype | None = None  # e.g. torch.bfloat16 for the training step

    def seen_classes(self, task: int) -> torch.Tensor:
        """Classes of tasks 0..task."""
        return torch.cat(self.task_classes[: task + 1])


@dataclass
class Options:
    """Method hyper-parameters; "auto" values are resolved from the method's `defaults`."""

    lr: float = 0.03
    buffer_size: int = 200
    alpha: float = 0.0
    beta: float = 0.0
    tau1: float = 0.1
    tau2: float = 2.0
    mc_samples: int = 20
    buffer_order: str = "desc"
    candidate: str = "advance"
    walk_count: str = "task"
    offset: str = "class"  # s_i of the walk's offset: per-class or per-task sample counts
    mi_logits: str = "scaled"  # MI of softmax(s*cos/tau1) ("scaled") or softmax(cos/tau1) ("cosine")
    kl_classes: str = "old"  # KL softmaxes over the old classes only, or over all classes seen so far
    imprint: bool = False  # new classes' weights start at their samples' mean normalised feature
    reservoir: str = "every_epoch"  # online reservoir offered every epoch's batches, or the first epoch's
    replay_ce: bool = True


class ContinualMethod:
    name: ClassVar[str] = "base"
    uses_buffer: ClassVar[bool] = False
    # The method's documented best settings (Mammoth's for the baselines); "auto" picks these.
    defaults: ClassVar[dict[str, Any]] = {"lr": 0.03, "head": "linear", "dropout": 0.0}

    def __init__(self, net: Net, ctx: Context, opts: Options) -> None:
        self.net, self.ctx, self.opts = net, ctx, opts
        self.buffer: Buffer | None = None
        if self.uses_buffer and opts.buffer_size < 1:
            raise ValueError(f"{self.name} needs a replay buffer: buffer size must be >= 1")
        self.task = -1
        self.epoch = 0
        self.opt: torch.optim.Optimizer | None = None
        # Training accuracy on current-task samples, summed on the device (read once an epoch).
        self.correct = torch.zeros((), dtype=torch.int64, device=ctx.device)

    @classmethod
    def resolve(cls, key: str, value: Any, buffer_size: int) -> Any:
        """A setting's value, with "auto" replaced by this method's default."""
        if value != "auto":
            return value
        d = cls.defaults.get(key)
        return d(buffer_size) if callable(d) else d

    # --- the two calls the loop makes (plus begin_task) ---------------------------------------
    def begin_task(self, task: int, images: torch.Tensor, labels: torch.Tensor) -> None:
        self.task = task
        if self.uses_buffer and self.buffer is None:
            self.buffer = Buffer(self.opts.buffer_size, tuple(images.shape[1:]), self.ctx.n_classes,
                                 self.ctx.device)
        # Plain SGD as in the paper (no momentum, no weight decay), fresh for each task.
        self.opt = torch.optim.SGD(self.net.parameters(), lr=self.opts.lr)

    def begin_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def observe(self, x: torch.Tensor, y: torch.Tensor, raw: torch.Tensor) -> torch.Tensor:
        """One optimisation step on an augmented batch `x` (raw uint8 images in `raw`).
        Returns the detached loss (no host sync)."""
        raise NotImplementedError

    def end_task(self, task: int, images: torch.Tensor, labels: torch.Tensor) -> None:
        """Called once the task's epochs are done, with the task's raw training images."""

    def task_data(self, task: int, seen: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
        """The data trained on during `task` (default: that task's own data)."""
        return seen[task]

    # --- helpers shared by the methods ---------------------------------------------------------
    def step(self, loss: torch.Tensor) -> torch.Tensor:
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return loss.detach()

    def replay(self, n: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """An augmented buffer batch: (x, labels, stored logits)."""
        idx = self.buffer.sample(n or self.ctx.replay_batch_size, self.ctx.generator)
        images, labels, _, logits = self.buffer.get(idx)
        return self.ctx.augment(images, self.ctx.generator), labels, logits

    def offers_to_reservoir(self) -> bool:
        """Whether this epoch's batches go to the online reservoir (every epoch, as in Mammoth, or
        only the task's first, so each sample is offered once whatever the task's epochs)."""
        return self.opts.reservoir == "every_epoch" or self.epoch == 0

    def has_replay(self) -> bool:
        return self.buffer is not None and len(self.buffer) > 0

    def ce(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits, y)

    def count(self, logits: torch.Tensor, y: torch.Tensor) -> None:
        """Add the current batch's correct predictions to `correct` (no host sync)."""
        self.correct += (logits.detach().argmax(1) == y).sum()

    # --- exact resume ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"task": self.task, "buffer": self.buffer.state_dict() if self.buffer is not None else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.task = state["task"]
        if state["buffer"] is not None:
            buf = state["buffer"]
            self.buffer = Buffer(self.opts.buffer_size, tuple(buf["images"].shape[1:]), self.ctx.n_classes,
                                 self.ctx.device)
            self.buffer.load_state_dict(buf)
