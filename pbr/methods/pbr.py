"""PBR: Prior-free Balanced Replay (ACM MM 2024), as pinned down in the project notes.

Loss at task c on a current batch and a buffer batch:
  CE(logits / tau1) over current and buffer samples                       (boundary constraint)
  + alpha * KL(p_old || p_new) on buffer samples, softmax(./tau2) over old classes,
    p_old from the frozen model of the end of task c-1
  + beta * sum_i ||w_hat_i - w_hat_i*|| over old classes                  (prototype constraint)
At the end of each task: MC-dropout mutual information of every training sample, then the
uncertainty-guided reservoir walk fills the buffer (most uncertain first by default).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F

from pbr.methods.base import ContinualMethod
from pbr.uncertainty import score_images


class PBR(ContinualMethod):
    name = "pbr"
    uses_buffer = True
    defaults = {"lr": 0.03, "head": "cosine", "dropout": 0.1, "alpha": 1.0, "beta": 1.0}

    def __init__(self, net, ctx, opts) -> None:
        super().__init__(net, ctx, opts)
        self.teacher = None
        self.old_prototypes: torch.Tensor | None = None
        # Running class frequencies s_i, observed from the stream itself (no prior).
        self.class_counts = torch.zeros(ctx.n_classes, dtype=torch.float64)

    def _old_classes(self) -> torch.Tensor:
        return torch.cat(self.ctx.task_classes[: self.task])

    def observe(self, x: torch.Tensor, y: torch.Tensor, raw: torch.Tensor) -> torch.Tensor:
        o = self.opts
        if not self.has_replay():
            logits = self.net(x)
            self.count(logits, y)
            return self.step(self.ce(logits / o.tau1, y))
        bx, by, _ = self.replay()
        n = x.shape[0]
        logits = self.net(torch.cat([x, bx]))
        self.count(logits[:n], y)
        if o.replay_ce:
            loss = self.ce(logits / o.tau1, torch.cat([y, by]))
        else:
            loss = self.ce(logits[:n] / o.tau1, y)
        if self.teacher is not None and (o.alpha or o.beta):
            old = self._old_classes()
            if o.alpha:
                with torch.no_grad():
                    t_logits = self.teacher(bx).index_select(1, old)
                s_logits = logits[n:].index_select(1, old)
                loss = loss + o.alpha * F.kl_div(
                    F.log_softmax(s_logits / o.tau2, 1), F.log_softmax(t_logits / o.tau2, 1),
                    reduction="batchmean", log_target=True)
            if o.beta:
                now = self.net.prototypes().index_select(0, old)
                loss = loss + o.beta * (now - self.old_prototypes.index_select(0, old)).norm(dim=1).sum()
        return self.step(loss)

    @torch.no_grad()
    def end_task(self, task: int, images: torch.Tensor, labels: torch.Tensor) -> None:
        before = self.class_counts[self.class_counts > 0]  # classes seen before this task
        seen = self.ctx.seen_classes(task)
        mi, _ = score_images(self.net, images, self.opts.mc_samples, self.opts.tau1, self.ctx.eval_batch_size,
                             self.ctx.preprocess, self.ctx.generator, classes=seen)
        # N of the sample-in probability: this walk's steps ("task") or the whole stream so far.
        start = int(self.class_counts.sum()) if self.opts.walk_count == "stream" else 0
        self.buffer.uncertainty_walk(images, labels, torch.full_like(labels, task), mi, before,
                                     self.ctx.generator, order=self.opts.buffer_order,
                                     candidate=self.opts.candidate, start=start)
        self.class_counts += torch.bincount(labels.cpu(), minlength=self.ctx.n_classes).double()
        self.snapshot_teacher()

    def snapshot_teacher(self) -> None:
        self.teacher = copy.deepcopy(self.net).eval().requires_grad_(False)
        self.old_prototypes = self.net.prototypes().detach().clone()

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "class_counts": self.class_counts.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.class_counts = state["class_counts"].clone()
        # The teacher is the network as it was at the end of the saved task: the loaded net.
        if self.task >= 0:
            self.snapshot_teacher()
