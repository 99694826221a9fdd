"""PNN: progressive neural networks (Rusu et al. 2016), as Mammoth's `pnn`.

A ResNet18 column per task. Column t learns task t; the columns before it are frozen (weights and
BatchNorm statistics) and feed it laterally: before each of its stages 2-4, the earlier columns'
activations, scaled by a learnt per-channel alpha (0.1 x uniform at start), pass a 1x1 conv, a
ReLU and a ResNet stage of their own, and are added to the column's stage output; their pooled
features reach its logits through a linear adaptor and a lateral classifier. Task-IL predicts with
the test task's column. There is no Class-IL prediction (the task picks the column), so Class-IL
is reported as not applicable, as in the paper; the evaluation rows still hold the last column's
accuracies. The earlier columns enter with their own lateral inputs (the paper's architecture;
Mammoth feeds copies of their bare stages), the lateral sum follows each stage's final ReLU, and
alpha is per channel (Mammoth's is per position too, which ties it to one image size).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from pbr.methods.base import MAMMOTH, Best, ContinualMethod
from pbr.models.net import init_parameters
from pbr.models.resnet import BasicBlock, ResNet18


class Column(nn.Module):
    def __init__(self, n_classes: int, width: int, n_old: int) -> None:
        super().__init__()
        self.body = ResNet18(width)
        self.classifier = nn.Linear(8 * width, n_classes)
        self.n_old = n_old
        if n_old:
            ins = [width * f for f in (1, 2, 4)]
            self.alphas = nn.ParameterList([nn.Parameter(torch.zeros(1, n_old * c, 1, 1)) for c in ins])
            self.adaptors = nn.ModuleList([nn.Conv2d(n_old * c, c, 1) for c in ins])
            self.laterals = nn.ModuleList([nn.Sequential(BasicBlock(c, 2 * c, 2), BasicBlock(2 * c, 2 * c, 1))
                                           for c in ins])
            self.alpha4 = nn.Parameter(torch.zeros(1, n_old * 8 * width))
            self.adaptor4 = nn.Linear(n_old * 8 * width, 8 * width)
            self.lateral_classifier = nn.Linear(8 * width, n_classes)

    def reset_alphas(self, generator: torch.Generator) -> None:
        with torch.no_grad():
            for a in [*getattr(self, "alphas", []), *([self.alpha4] if self.n_old else [])]:
                a.copy_(torch.rand(a.shape, generator=generator) * 0.1)

    def forward(self, x: torch.Tensor, old: list[list[torch.Tensor]]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Logits and the activations later columns read: stages 1-3 and the pooled feature."""
        b = self.body
        acts = [b.layer1(F.relu(b.bn1(b.conv1(x))))]
        for i, stage in enumerate((b.layer2, b.layer3, b.layer4)):
            h = stage(acts[-1])
            if self.n_old:
                side = torch.cat([o[i] for o in old], 1) * self.alphas[i]
                h = F.relu(h + self.laterals[i](F.relu(self.adaptors[i](side))))
            acts.append(h)
        feat = F.adaptive_avg_pool2d(acts.pop(), 1).flatten(1)
        logits = self.classifier(feat)
        if self.n_old:
            side = torch.cat([o[3] for o in old], 1) * self.alpha4
            logits = logits + self.lateral_classifier(F.relu(self.adaptor4(side)))
        return logits, [*acts, feat]


class Columns(nn.Module):
    """All columns; the last one trains, the others stay frozen in eval mode."""

    def __init__(self) -> None:
        super().__init__()
        self.columns = nn.ModuleList()

    def forward(self, x: torch.Tensor, column: int | None = None) -> torch.Tensor:
        last = len(self.columns) - 1 if column is None else column
        acts: list[list[torch.Tensor]] = []
        for i in range(last + 1):
            with torch.set_grad_enabled(torch.is_grad_enabled() and i == len(self.columns) - 1):
                logits, a = self.columns[i](x, acts)
            acts.append(a)
        return logits

    def train(self, mode: bool = True) -> "Columns":
        super().train(mode)
        for c in self.columns[:-1]:
            c.eval()
        return self


class PNN(ContinualMethod):
    name = "pnn"
    label = "PNN"
    uses_task_identity = True
    class_il = False
    predicts_with_net = False
    best = (
        Best("cifar10", None, {"lr": 0.03}, f"{MAMMOTH} seq-cifar10"),
        Best("tinyimagenet", None, {"lr": 0.03}, f"{MAMMOTH} seq-tinyimg"),
    )

    @classmethod
    def refuse(cls, settings):
        if settings["head"] != "linear" or settings["dropout"]:
            return ("its columns end in linear classifiers without dropout; set model.head: auto (or linear) and "
                    "model.dropout: auto (or 0)")
        return None

    def __init__(self, net, ctx, opts) -> None:
        super().__init__(net, ctx, opts)
        self.width, self.n_classes = net.backbone.width, net.n_classes
        self.net = Columns().to(ctx.device)
        # The first column starts from the seeded network the run built (its linear head included).
        first = Column(self.n_classes, self.width, 0).to(ctx.device)
        first.body.load_state_dict(net.backbone.state_dict())
        with torch.no_grad():
            first.classifier.weight.copy_(net.head.weight)
            bias = getattr(net.head, "bias", None)
            first.classifier.bias.copy_(bias if bias is not None else torch.zeros_like(first.classifier.bias))
        self.net.columns.append(first)

    def _add_column(self) -> None:
        for c in self.net.columns:
            c.requires_grad_(False).eval()
        # Column k's weights from the run's seed and k: other seeds, other columns; the same on resume.
        g = torch.Generator().manual_seed(self.ctx.generator.initial_seed() * 1009 + len(self.net.columns))
        col = Column(self.n_classes, self.width, len(self.net.columns))
        init_parameters(col, g)
        col.reset_alphas(g)
        self.net.columns.append(col.to(self.ctx.device))

    def begin_task(self, task: int, images: torch.Tensor, labels: torch.Tensor) -> None:
        while len(self.net.columns) < task + 1:
            self._add_column()
        super().begin_task(task, images, labels)

    def predict(self, x: torch.Tensor, task: int | None = None) -> torch.Tensor:
        # A task not learned yet has no column: the newest one answers (train_tasks asks none such).
        return self.net(x, None if task is None else min(task, len(self.net.columns) - 1))

    def classifier_norms(self) -> torch.Tensor:
        return self.net.columns[-1].classifier.weight.detach().float().norm(dim=1)  # the newest column's

    def mc_network(self) -> None:
        return None  # a column per task, no single head to sample

    def model_state(self) -> dict[str, Any]:
        return {"state_dict": self.net.state_dict(), "n_columns": len(self.net.columns)}

    def load_model_state(self, state: dict[str, Any]) -> None:
        while len(self.net.columns) < state["n_columns"]:
            self._add_column()
        self.net.load_state_dict(state["state_dict"])
