"""LwF: learning without forgetting (Li & Hoiem 2016), as Mammoth's `lwf`.

At the start of each task after the first, the head alone is warmed up on the new task's classes
(features frozen, `warmup_epochs` passes over the task's features), then the network is frozen as
the teacher. Each step: cross-entropy over the classes seen so far, plus alpha times the
cross-entropy between the teacher's and the student's softmaxes over the old classes, both
sharpened to the power 1/tau2 and renormalised (Mammoth's `smooth` and `modified_kl_div`).
The teacher scores the same augmented batch on the fly (Mammoth stores its outputs on the
un-augmented images once, and compares them with the student's on augmented ones). Its inputs are
normalised, as the student's: Mammoth @5bb9275 takes its teacher's on the loader's
not_aug_transform, ToTensor() alone, un-normalised images the network (trained on normalised ones)
never sees otherwise (the effect is unmeasured). The warm-up
runs on the un-augmented images' features, computed once. A resumed run makes the teacher again at
the next task's start, from the saved network, as an uninterrupted one does.
"""

from __future__ import annotations

import copy
import torch
import torch.nn.functional as F

from pbr.methods.base import (ALPHA, MAMMOTH, SEQ_CIFAR100, SEQ_CIFAR100_SCHEDULE, TAU2, WEIGHT_DECAY, Best,
                              ContinualMethod, Setting)


def sharpened_log_softmax(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """log of softmax(logits) ** (1 / temperature) renormalised over the classes (dim 1): Mammoth's
    smooth(), taken in log space so that an underflowing probability has a finite gradient."""
    return F.log_softmax(F.log_softmax(logits, 1) / temperature, 1)


class LwF(ContinualMethod):
    name = "lwf"
    label = "LwF"
    settings = (
        ALPHA,  # weight of the distillation
        TAU2,  # temperature of the distillation
        WEIGHT_DECAY,
        Setting("warmup_epochs", int, 50, "LwF: epochs of the head's warm-up on a new task", lambda v: v >= 0,
                "an integer >= 0 (Mammoth: the task's epochs, 50)"),
    )
    defaults = {**ContinualMethod.defaults, "alpha": 1.0}
    defaults_source = "the LwF paper's lambda_o = 1 (Mammoth tuned no alpha for this dataset)"
    best = (
        Best("cifar10", None, {"lr": 0.01, "alpha": 3.0, "weight_decay": 5e-4}, f"{MAMMOTH} seq-cifar10"),
        Best("tinyimagenet", None, {"lr": 0.01, "alpha": 1.0, "weight_decay": 5e-4}, f"{MAMMOTH} seq-tinyimg"),
        # Mammoth's seq-cifar100 entry sets no alpha: it ran (and tuned lr and weight decay) at its
        # argparser's default, 0.5.
        Best("cifar100", None, {"lr": 0.03, "alpha": 0.5, "weight_decay": 5e-4, **SEQ_CIFAR100_SCHEDULE},
             f"{SEQ_CIFAR100}; alpha: its default, the entry sets none"),
    )

    def __init__(self, net, ctx, opts) -> None:
        super().__init__(net, ctx, opts)
        self.teacher: torch.nn.Module | None = None

    def begin_task(self, task: int, images: torch.Tensor, labels: torch.Tensor) -> None:
        super().begin_task(task, images, labels)
        if task > 0:
            self._warm_up_head(images, labels)
            self.teacher = copy.deepcopy(self.net).eval().requires_grad_(False)

    def _warm_up_head(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        ctx, net = self.ctx, self.net
        new = ctx.task_classes[self.task]
        with torch.no_grad():
            was_training = net.training
            net.eval()
            feats = torch.cat([net.features(ctx.preprocess(images[i:i + ctx.eval_batch_size]))
                               for i in range(0, images.shape[0], ctx.eval_batch_size)])
            net.train(was_training)
        # Targets as positions among the new classes (Mammoth: labels - task * classes per task).
        target = (labels.unsqueeze(1) == new.unsqueeze(0)).float().argmax(1)
        # At the task's lr whatever lr_milestones say: Mammoth's warm-up SGD, built in begin_task before
        # get_scheduler, is never scheduled (nor weight-decayed).
        opt = torch.optim.SGD(net.head.parameters(), lr=self.opts.lr)
        for _ in range(self.opts.warmup_epochs):
            perm = torch.randperm(feats.shape[0], generator=ctx.generator, device=ctx.device)
            for i in range(0, feats.shape[0], 32):
                idx = perm[i:i + 32]
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(net.classify(feats[idx]).index_select(1, new), target[idx]).backward()
                opt.step()

    def observe(self, x: torch.Tensor, y: torch.Tensor, raw: torch.Tensor) -> torch.Tensor:
        seen = self.ctx.seen_classes(self.task)
        out = self.net(x)
        self.count(out, y)
        # Cross-entropy over the classes seen so far, the labels as positions among them.
        target = (y.unsqueeze(1) == seen.unsqueeze(0)).float().argmax(1)
        loss = F.cross_entropy(out.index_select(1, seen), target)
        if self.teacher is not None:
            old = torch.cat(self.ctx.task_classes[: self.task])
            with torch.no_grad():
                p_old = sharpened_log_softmax(self.teacher(x).index_select(1, old), self.opts.tau2).exp()
            log_new = sharpened_log_softmax(out.index_select(1, old), self.opts.tau2)
            loss = loss + self.opts.alpha * -(p_old * log_new).sum(1).mean()
        return self.step(loss)
