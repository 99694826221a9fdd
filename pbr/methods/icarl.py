"""iCaRL (Rebuffi et al. 2017), as Mammoth's `icarl`.

Training data of a task is the task's samples plus the whole memory (Mammoth's icarl_replay).
Loss: binary cross-entropy with logits over the classes seen so far; the targets of the current
task's classes are the one-hot labels, those of the old classes the sigmoid outputs of the frozen
network of the previous task (distillation). At the end of a task the memory keeps
capacity // classes-seen samples per class: the old classes their first ones, each new class its
herding choice (pbr/memory/herding.py). Prediction is the nearest mean of exemplars: the class whose
memory samples' mean feature is nearest (squared Euclidean, unnormalised features as Mammoth).
The class means are exact means over the class's exemplars; Mammoth's (compute_class_means
@5bb9275) folds in one batch_size chunk at a time as (running + chunk mean) / 2, which weighs later
chunks more: it differs from the mean whenever a class holds more than 32 exemplars (100 a class
after Seq-CIFAR-10's first task at buffer 200; every task at 5120).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F

from pbr.memory.herding import ClassHerding
from pbr.methods.base import (MAMMOTH, SEQ_CIFAR100, SEQ_CIFAR100_NO_200, SEQ_CIFAR100_SCHEDULE, WEIGHT_DECAY, Best,
                              ContinualMethod)


class ICaRL(ContinualMethod):
    name = "icarl"
    label = "iCaRL"
    memory = ClassHerding
    predicts_with_net = False
    settings = (WEIGHT_DECAY,)
    best = (
        Best("cifar10", 200, {"lr": 0.1, "weight_decay": 1e-5}, f"{MAMMOTH} seq-cifar10"),
        Best("cifar10", 500, {"lr": 0.1, "weight_decay": 1e-5}, f"{MAMMOTH} seq-cifar10"),
        Best("cifar10", 5120, {"lr": 0.03, "weight_decay": 1e-5}, f"{MAMMOTH} seq-cifar10"),
        Best("tinyimagenet", None, {"lr": 0.03, "weight_decay": 1e-5}, f"{MAMMOTH} seq-tinyimg"),
        Best("cifar100", 200, {"lr": 0.3, "weight_decay": 1e-5, **SEQ_CIFAR100_SCHEDULE}, SEQ_CIFAR100_NO_200),
        Best("cifar100", 500, {"lr": 0.3, "weight_decay": 1e-5, **SEQ_CIFAR100_SCHEDULE}, SEQ_CIFAR100),
        Best("cifar100", 2000, {"lr": 0.3, "weight_decay": 1e-5, **SEQ_CIFAR100_SCHEDULE}, SEQ_CIFAR100),
    )

    def __init__(self, net, ctx, opts) -> None:
        super().__init__(net, ctx, opts)
        self.teacher: torch.nn.Module | None = None
        self.class_means: torch.Tensor | None = None  # [n_classes, d]; NaN rows: no exemplars

    def task_data(self, task, seen):
        return self.with_memory(*seen[task])

    def observe(self, x: torch.Tensor, y: torch.Tensor, raw: torch.Tensor) -> torch.Tensor:
        seen = self.ctx.seen_classes(self.task)
        out = self.net(x)
        self.count(out, y)
        target = F.one_hot(y, self.ctx.n_classes).to(out.dtype)
        if self.teacher is not None:
            old = torch.cat(self.ctx.task_classes[: self.task])
            with torch.no_grad():
                target[:, old] = torch.sigmoid(self.teacher(x).index_select(1, old)).to(out.dtype)
        loss = self.step(F.binary_cross_entropy_with_logits(out.index_select(1, seen), target.index_select(1, seen)))
        self.offer(raw, y)  # kept by an online memory only (herding chooses at the task's end)
        return loss

    @torch.no_grad()
    def end_task(self, task: int, images: torch.Tensor, labels: torch.Tensor) -> None:
        was_training = self.net.training
        self.net.eval()
        self.teacher = copy.deepcopy(self.net).requires_grad_(False)
        mine = torch.isin(labels, self.ctx.task_classes[task])  # the task's own samples (the memory's were mixed in)
        self.update_memory(task, images[mine], labels[mine])
        n = len(self.buffer)
        feats = self.memory_features(self.buffer.images[:n])
        means = torch.full((self.ctx.n_classes, feats.shape[1]), float("nan"), device=feats.device)
        for c in self.buffer.labels[:n].unique().tolist():
            means[c] = feats[self.buffer.labels[:n] == c].mean(0)
        self.class_means = means
        self.net.train(was_training)

    def predict(self, x: torch.Tensor, task: int | None = None) -> torch.Tensor:
        """Nearest mean of exemplars: -||f(x) - mu_c||^2 (-inf for a class without exemplars)."""
        if self.class_means is None:
            return self.net(x)
        d = (self.net.features(x).unsqueeze(1) - self.class_means.unsqueeze(0)).pow(2).sum(2)
        return torch.nan_to_num(-d, nan=float("-inf"))

    def model_state(self) -> dict[str, Any]:
        return {**super().model_state(), "class_means": self.class_means}

    def load_model_state(self, state: dict[str, Any]) -> None:
        super().load_model_state(state)
        self.class_means = state.get("class_means")

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "class_means": self.class_means}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.class_means = state["class_means"]
        if self.task >= 0:  # the teacher is the network as saved at the end of that task
            self.teacher = copy.deepcopy(self.net).eval().requires_grad_(False)
