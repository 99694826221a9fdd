"""PBR: Prior-free Balanced Replay (ACM MM 2024); docs/method.md gives every reading and default.

Loss at task c on a current batch and a buffer batch:
  CE(logits / tau1) over current and buffer samples                       (boundary constraint)
  + alpha * KL(p_old || p_new) on buffer samples at tau2, summed over the old classes, the
    softmaxes taken over the old classes (kl_classes=old), all classes seen so far (all, the
    paper preset's reading of its equation) or every class of the head (head); p_old from the
    frozen model of the end of task c-1
  + beta * sum_i ||w_hat_i - w_hat_i*|| over old classes                  (prototype constraint)
At the end of each task: MC-dropout mutual information of every training sample, then the
uncertainty-guided reservoir walk fills the buffer. Each open reading of the paper is an option;
docs/method.md gives what the paper says, the defaults and the evidence.
"""

from __future__ import annotations

import copy
from typing import Any, Literal

import torch
import torch.nn.functional as F

from pbr.memory.reservoir import Reservoir
from pbr.memory.walk import UncertaintyWalk
from pbr.methods.base import ALPHA, BETA, RESERVOIR, TAU2, Auto, ContinualMethod, Setting, positive
from pbr.uncertainty import score_images


class PBR(ContinualMethod):
    name = "pbr"
    role = "ours"
    row_order = ("random", "")  # the paper's: Ours - Random above Ours, the ablations after
    # "Ours - Random" read two ways: the walk in random order, or Vitter's online reservoir that the
    # walk is contrasted with (docs/method.md, point 10).
    ablations = {"random": {"buffer_order": "random"}, "reservoir": {"sampling": "reservoir"}}
    label = "PBR"
    memory = UncertaintyWalk  # or the online reservoir (sampling: reservoir): make_policy
    laned = True  # tests/test_lockstep.py (its teacher is laned too)
    # The readings of the paper's open points are settings; docs/method.md gives the evidence.
    # Declared in the order a table's row label names them.
    settings = (
        # Which readings "auto" takes for the paper's open points: the ones measured best on the
        # selection seeds (tuned), or the paper as written (paper). A key set in params.yaml wins.
        Setting("preset", Literal["tuned", "paper"], "tuned",
                "what auto means for the open points: the measured readings (tuned) or the paper as written (paper)",
                label=lambda v: "paper-literal" if v == "paper" else f"preset {v}", selects_defaults=True),
        # The paper's ablation "random reservoir sampling" read two ways: the walk in random order
        # (buffer_order: random) or Vitter's online reservoir that the walk is contrasted with.
        Setting("sampling", Literal["walk", "reservoir"], "walk",
                "the buffer is filled by the end-of-task walk, or by the online reservoir during training",
                label=lambda v: "online reservoir" if v == "reservoir" else v),
        Setting("buffer_order", Literal["auto", "uncertain_first", "certain_first", "random", "uncertain_weighted",
                                        "certain_weighted"],
                "auto", "the walk's order of the task's samples by MI", label=lambda v: v.replace("_", "-")),
        # Readings of "uncertainty-guided" never tried before (docs/method.md): sharper or flatter
        # weights, the order taken within each class, the most uncertain samples left out as outliers,
        # and the MI scored by the previous task's model instead of the one just fitted.
        Setting("mi_power", float, 1.0, "the weighted orders' weights are MI (or certainty) to this power",
                positive, "a positive number (1: the MI itself)", label=lambda v: f"MI^{float(v):g}"),
        Setting("walk_rank", Literal["task", "class"], "task",
                "the order is taken over the task, or interleaved class by class", label=lambda v: f"ranked per {v}"),
        Setting("mi_outliers", float, 0.0, "fraction of the task's most uncertain samples left out of the walk",
                lambda v: 0 <= v < 1, "a number in [0, 1)", label=lambda v: f"top {100 * float(v):g}% MI left out"),
        Setting("mi_model", Literal["final", "teacher"], "final",
                "the MI is scored by the model just fitted (final) or the previous task's (teacher)",
                label=lambda v: f"MI of the {v}"),
        # Which stored sample leaves a full buffer, what the walk runs over, the scoring's dropout.
        Setting("evict", Literal["random", "certain", "uncertain"], "random",
                "an accepted sample replaces a random slot, or the stored sample of lowest (certain) or highest "
                "(uncertain) stored MI", label=lambda v: f"evict {v}"),
        Setting("walk_pool", Literal["task", "buffer_and_task"], "task",
                "the walk runs over the task's samples, or over the buffer's and the task's, all re-scored",
                label=lambda v: "walk over " + v.replace("_", " ")),
        Setting("mc_dropout", float | Auto, "auto", "the head's dropout rate while the MI is scored",
                lambda v: 0 < v < 1, "a number in (0, 1) or auto (the trained model's dropout)",
                label=lambda v: f"MC dropout {v}"),
        # Which models the MI averages, and whether the backbone is sampled too.
        Setting("mi_epochs", int, 1, "the MI is the mean of the models' at the end of the task's last mi_epochs epochs",
                positive, "a positive integer (1: the final model only)", label=lambda v: f"MI over {v} epochs"),
        Setting("mc_backbone", bool, False, "the MI's passes drop elements of the backbone's last feature map too",
                label=lambda v: "MC dropout in the backbone" if str(v) == "True" else "MC dropout in the head only"),
        Setting("walk_candidate", Literal["auto", "advance", "hold"], "auto",
                "a rejected candidate is retried (hold, the paper's text) or passed over (advance)", label=str),
        Setting("walk_count", Literal["task", "stream"], "task", "N of the sample-in probability",
                label=lambda v: f"N over {v}"),
        Setting("offset", Literal["auto", "class", "task"], "auto", "what s_i of the sample-in offset counts",
                label=lambda v: f"per-{v} offset"),
        Setting("mi_logits", Literal["auto", "scaled", "cosine"], "auto", "the logit scale the MI is taken at",
                label=lambda v: f"MI at {v} scale"),
        Setting("kl_classes", Literal["auto", "old", "all", "head"], "auto",
                "the classes the KL's softmaxes run over: old, all seen so far, or the head's every class",
                label=lambda v: f"KL over {v}"),
        Setting("imprint", bool, False, "new classes' vectors start at their samples' mean feature (LUCIR)",
                label=lambda v: "imprint" if v == "True" else "no imprint"),
        Setting("tau1", float | Auto, "auto", "temperature of the CE (and of the MI, mi_logits)", positive,
                "a positive number or auto (0.1 in the paper; see docs/method.md)", label=lambda v: f"tau1 {v}"),
        TAU2,  # temperature of the KL
        ALPHA,  # weight of the KL on buffer samples
        BETA,  # weight of the prototype constraint
        Setting("replay_ce", bool, True, "cross-entropy on buffer samples too",
                label=lambda v: "no replay CE" if v == "False" else "replay CE"),
        # One sample's mutual information is 0 for every sample: the walk would have no order.
        Setting("mc_samples", int, 20, "T, MC-dropout samples of the head", lambda v: v >= 2,
                "an integer >= 2 (T, MC-dropout samples)", label=lambda v: f"T {v}"),
        RESERVOIR,  # sampling: reservoir only
    )
    # What "auto" means for the open points under each preset (docs/method.md gives the evidence).
    # tuned: tau1 1 (the MC equation's logit scale 10 instead of the CE's 100), lr 0.1, the per-task
    # offset, the MI-weighted order; every one chosen on the selection seeds 0-9.
    # paper: Eq. MCE's tau1 0.1, the one lr 0.03 of the paper's protocol, s_i as the running count
    # of each old class, Eq. 3's arg min (the most certain first), the KL's softmaxes over every
    # class seen, the text's held candidate, and the MC equation's softmax(w^T f / tau1) (no s).
    PRESETS: dict[str, dict[str, Any]] = {
        "tuned": {"lr": 0.1, "tau1": 1.0, "buffer_order": "uncertain_weighted", "walk_candidate": "hold",
                  "offset": "task", "mi_logits": "scaled", "kl_classes": "old"},
        "paper": {"lr": 0.03, "tau1": 0.1, "buffer_order": "certain_first", "walk_candidate": "hold",
                  "offset": "class", "mi_logits": "cosine", "kl_classes": "all"},
    }
    defaults = {**PRESETS["tuned"], "head": "cosine", "dropout": 0.1, "alpha": 1.0, "beta": 1.0}
    defaults_source = "docs/method.md (the tuned preset: lr 0.1 at tau1 = 1, ...; alpha = beta = 1; cosine head; dropout before the head)"

    @classmethod
    def options(cls, dataset: str = "cifar10", buffer_size: int = 200, **given: Any):
        preset = given.get("preset", "tuned")
        if preset != "tuned":
            own = cls.PRESETS[preset]
            given = {**given, **{k: v for k, v in own.items() if given.get(k, "auto") == "auto"}}
        opts, sources = super().options(dataset, buffer_size, **given)
        for k in cls.PRESETS[preset]:
            if sources[k] == "params" and preset != "tuned" and getattr(opts, k) == cls.PRESETS[preset][k]:
                sources[k] = f"preset {preset} (docs/method.md)"
        return opts, sources

    @classmethod
    def score_temperature(cls, settings: dict[str, Any]) -> float:
        # The walk's own (mi_temperature): tau1 on the head's logits, times s when the MI is taken on
        # the bare cosines; a linear head has no s.
        scale = settings["scale"] if settings.get("head") == "cosine" else 1.0
        return settings["tau1"] * (scale if settings["mi_logits"] == "cosine" else 1.0)

    @classmethod
    def score_samples(cls, settings: dict[str, Any]) -> int:
        return int(settings["mc_samples"])  # the T the walk scored with

    @classmethod
    def score_dropout(cls, settings: dict[str, Any]) -> float:
        # The rate the walk scored at; a head without dropout (the walk's MI all 0) at the base's 0.1.
        rate = settings.get("mc_dropout", "auto")
        return super().score_dropout(settings) if rate == "auto" else float(rate)

    @classmethod
    def score_backbone(cls, settings: dict[str, Any]) -> bool:
        return str(settings.get("mc_backbone", False)) == "True"  # where the walk's passes dropped

    @classmethod
    def refuse(cls, settings: dict[str, Any]) -> str | None:
        if settings.get("mi_epochs", 1) > 1 and settings.get("mi_model") == "teacher":
            return "mi_epochs averages the models being fitted, and the teacher is not one: set mi_epochs: 1 or mi_model: final"
        if settings.get("mi_epochs", 1) > 1 and settings.get("walk_pool") == "buffer_and_task":
            return "mi_epochs scores the task's samples at each epoch's end, not the buffer's: set mi_epochs: 1 or walk_pool: task"
        if (settings.get("sampling") != "reservoir" and settings.get("buffer_order") != "random"
                and settings.get("mc_dropout", "auto") == "auto" and float(settings.get("dropout", 0.1)) == 0):
            # Every MI 0: the uncertainty order would be no order (the data's, or a uniform draw).
            return ("model.dropout = 0 leaves the walk's MC dropout nothing to drop, so every MI is 0; set "
                    "model.dropout > 0 (0.1, the method's own), method.pbr.mc_dropout, or buffer_order: random")
        return super().refuse(settings)

    @classmethod
    def reads(cls, key: str, settings: dict[str, Any]) -> bool:
        if key == "reservoir":
            return settings.get("sampling") == "reservoir"
        return super().reads(key, settings)

    def __init__(self, net, ctx, opts) -> None:
        super().__init__(net, ctx, opts)
        self.teacher = None
        self.old_prototypes: torch.Tensor | None = None
        # mi_epochs: the running sum of the MI at the ends of the task's last epochs but the final
        # one, and how many it holds. Not saved: a run resumes at a task's start (a task is saved
        # only once finished), so the sum always starts again from zero with the task.
        self._task_images: torch.Tensor | None = None
        self._mi_sum: torch.Tensor | None = None
        self._mi_terms = 0

    def lane_refusal(self) -> str | None:
        if self.opts.imprint:  # it writes into the network at each task's start, outside the step
            return "pbr with imprint writes into its network at each task's start: it runs alone"
        return super().lane_refusal()

    def make_policy(self, buffer):
        o = self.opts
        if o.sampling == "reservoir":
            return Reservoir(buffer, self.ctx.generator, self)
        return UncertaintyWalk(buffer, self.ctx.generator, self, order=o.buffer_order, candidate=o.walk_candidate,
                               count=o.walk_count, offset=o.offset, power=o.mi_power, rank=o.walk_rank,
                               outliers=o.mi_outliers, evict=o.evict, pool=o.walk_pool)

    def _old_classes(self) -> torch.Tensor:
        return torch.cat(self.ctx.task_classes[: self.task])

    def observe(self, x: torch.Tensor, y: torch.Tensor, raw: torch.Tensor) -> torch.Tensor:
        o = self.opts
        if not self.has_replay():
            logits = self.net(x)
            self.count(logits, y)
            return self._stored(self.step(self.ce(logits / o.tau1, y)), raw, y)
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
                loss = loss + o.alpha * self._distill(bx, logits[n:], old)
            if o.beta:
                now = self.net.prototypes().index_select(0, old)
                loss = loss + o.beta * (now - self.old_prototypes.index_select(0, old)).norm(dim=1).sum()
        return self._stored(self.step(loss), raw, y)

    def _stored(self, loss: torch.Tensor, raw: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The batch is offered to the memory after the step (kept by sampling = reservoir only)."""
        self.offer(raw, y)
        return loss

    def _distill(self, bx: torch.Tensor, s_logits: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
        """KL(p_old || p_new) at tau2 on buffer samples, summed over the old classes, batch mean."""
        o = self.opts
        # "old": both softmaxes over the old classes. "all": over every class seen so far (the
        # paper's sum over j in Y), still summed over the old classes only, so the current task's
        # logits on buffer samples are pushed down as well. "head": over every class of the head,
        # later tasks' too (Y as the label space, the Y the CE's softmax runs over).
        last = self.task if o.kl_classes == "all" else len(self.ctx.task_classes) - 1
        cols = old if o.kl_classes == "old" else self.ctx.seen_classes(last)
        with torch.no_grad():
            t_log = F.log_softmax(self.teacher(bx).index_select(1, cols) / o.tau2, 1)
        s_log = F.log_softmax(s_logits.index_select(1, cols) / o.tau2, 1)
        k = old.numel()  # the old classes come first in `cols`
        t_log, s_log = t_log[:, :k], s_log[:, :k]
        return (t_log.exp() * (t_log - s_log)).sum(1).mean()

    def begin_task(self, task: int, images: torch.Tensor, labels: torch.Tensor) -> None:
        super().begin_task(task, images, labels)
        self._task_images, self._mi_sum, self._mi_terms = images, None, 0
        if self.opts.imprint and task > 0:
            imprint_weights(self.net, images, labels, self.ctx.task_classes[task], self._old_classes(),
                            self.ctx.preprocess, self.ctx.eval_batch_size)

    def mi_temperature(self) -> float:
        """The MI scores softmax(logits / t): t = tau1 on the head's logits s*cos ("scaled"), or
        tau1 * s so that the softmax sees cos / tau1 as in the paper's MC equation ("cosine")."""
        scale = getattr(self.net.head, "scale", 1.0)
        return self.opts.tau1 * (scale if self.opts.mi_logits == "cosine" else 1.0)

    @torch.no_grad()
    def end_task(self, task: int, images: torch.Tensor, labels: torch.Tensor) -> None:
        super().end_task(task, images, labels)  # the walk (sampling: walk)
        self.snapshot_teacher()

    def end_epoch(self, epoch: int, epochs: int) -> None:
        """mi_epochs K > 1: the model at the end of each of the task's last K epochs but the final
        one is scored now (the final one at the task's end, memory_scores), the MI summed on the
        device. Those scorings draw their masks from a copy of the generator's state, so training
        sees the same draws as under K = 1 and the two readings differ by the MI alone."""
        k = self.opts.mi_epochs
        if k == 1 or self.opts.sampling != "walk" or not epochs - k <= epoch < epochs - 1:
            return
        g = self.ctx.generator
        state = g.get_state()
        mi = self._mi(self.net, self.task, self._task_images)
        g.set_state(state)
        self._mi_sum = mi if self._mi_sum is None else self._mi_sum + mi
        self._mi_terms += 1

    @torch.no_grad()
    def memory_scores(self, task: int, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The walk's order: the MC-dropout MI of the task's samples (and of the buffer's, when the
        walk runs over both), at the head's trained dropout rate or at mc_dropout; under mi_epochs
        the mean with the earlier epochs' (end_epoch)."""
        o = self.opts
        # The first task has no earlier model: its own scores it under either reading.
        scorer = self.teacher if o.mi_model == "teacher" and self.teacher is not None else self.net
        mi = self._mi(scorer, task, images)
        if self._mi_terms:
            mi = (self._mi_sum + mi) / (self._mi_terms + 1)
            self._mi_sum, self._mi_terms = None, 0
        return mi

    def _mi(self, scorer, task: int, images: torch.Tensor) -> torch.Tensor:
        o = self.opts
        mi, _ = score_images(scorer, images, o.mc_samples, self.mi_temperature(), self.ctx.eval_batch_size,
                             self.ctx.preprocess, self.ctx.generator, classes=self.ctx.seen_classes(task),
                             dropout=None if o.mc_dropout == "auto" else float(o.mc_dropout),
                             backbone=o.mc_backbone)
        return mi

    def snapshot_teacher(self) -> None:
        self.teacher = copy.deepcopy(self.net).eval().requires_grad_(False)
        self.old_prototypes = self.net.prototypes().detach().clone()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        # The teacher is the network as it was at the end of the saved task: the loaded net.
        if self.task >= 0:
            self.snapshot_teacher()


@torch.no_grad()
def imprint_weights(net, images: torch.Tensor, labels: torch.Tensor, classes: torch.Tensor, old: torch.Tensor,
                    preprocess, batch_size: int) -> None:
    """Weight imprinting (Qi et al. 2018, as LUCIR uses it): each new class's weight vector
    becomes the mean normalised feature of its training samples, scaled to the mean norm of the
    old classes' vectors (the cosine head normalises it anyway); a linear head's new biases are
    set to the old classes' mean."""
    was_training = net.training
    net.eval()
    feats = torch.cat([F.normalize(net.features(preprocess(images[i:i + batch_size])), dim=1)
                       for i in range(0, images.shape[0], batch_size)])
    net.train(was_training)
    w, bias = net.head.weight, getattr(net.head, "bias", None)
    norm = w[old].norm(dim=1).mean()
    for c in classes.tolist():
        mask = labels == c
        if mask.any():
            w[c] = F.normalize(feats[mask].mean(0), dim=0) * norm
            if bias is not None:
                bias[c] = bias[old].mean()
