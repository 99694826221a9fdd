"""PODNet+ : PODNet (Douillard et al. 2020) with LT-CIL's second stage (Liu et al. 2022), the
previous state of the art in long-tailed class-incremental learning (the paper's Table 1). The
reference is LT-CIL's code (github xialeiliu/Long-Tailed-CIL, src/approach/podnet_2stage.py).

Stage 1, each task, on the task's data and the whole memory (as iCaRL):
- a local similarity classifier (LSC): `proxies` vectors per class; a class's similarity is the
  softmax-weighted mean of its proxies' cosines with the feature. Old classes' proxies are frozen
  in later tasks, as LT-CIL's code does.
- the classification loss (`nca`). "ltcil" (default): LT-CIL calls PODNet's nca() with its
  defaults, which take the margin off every class (the code subtracts the scalar, not the one-hot
  margins it builds), keep the positive in the denominator and do not hinge: plain cross-entropy
  on eta * similarity, so `nca_margin` has no effect. "podnet_paper": the PODNet paper's LSC loss,
  [-log(exp(eta (s_y - margin)) / sum_{c != y} exp(eta s_c))]_+ , the margin on the true class
  only. LT-CIL learns eta (one scalar shared by the heads, from 1); here eta is fixed at
  `nca_scale` (10, the scale of this project's cosine heads): with the paper's hinge and two
  classes a task (Seq-CIFAR-10) a learned eta only shrank (measured: -2.9 after five tasks, every
  prediction then inverted). A learned eta under the default loss was not measured.
- from the second task on, distillation from the network of the previous task, weighted by
  sqrt(classes seen / new classes): pod_spatial x POD-spatial (each ResNet stage's squared
  activations summed over width and over height, L2-normalised per sample; the mean over stages
  of the distance between the old and the new) + pod_flat x (1 - cosine) of the pooled features.
Memory: iCaRL's herding, capacity // classes seen per class (pbr/memory/herding.py).
Stage 2, after each task: the backbone and the proxies frozen, a learnable scale per class
(learnable weight scaling) trained on class-balanced draws of the task's data and the memory,
`lws_epochs` epochs of cross-entropy on eta * scale * similarity at lr / `lws_lr_factor`,
cosine-decayed. As in LT-CIL's code, the scales of every class seen so far are retrained after
each task, each starting from where the previous stage 2 left it (a new class's from 1), and at
the lr divided by its --lr-factor (10 in its CIFAR-100 script). LT-CIL builds that optimiser at
the full lr and applies the divisor from the second epoch on; here every epoch runs at the
divided lr. Prediction: the scaled similarities (the CNN classifier, not nearest-mean).
Unlike the authors' code: its stage 2 also trains the newest head's proxies and eta (at the full
lr) on augmented images with momentum 0.9 and weight decay; here only the scales move, with plain
SGD, on features computed once. Training uses the paper's common protocol (plain SGD at the run's
lr), not PODNet's schedule. New classes' proxies start random (PODNet imprints them from k-means
of the new classes' features), and herding runs on unnormalised features (as this project's iCaRL).
The distillation reads post-ReLU stage maps and pooled features (the ResNet18 every method shares,
whose blocks end in a ReLU), where LT-CIL's PODNet networks leave out the ReLU at a stage's end
(src/networks/resnet18_podnet.py builds each stage's last block with last_relu=False;
resnet32_podnet.py, its CIFAR-100 network, every block): its POD-spatial reads pre-ReLU maps, its
POD-flat and LSC pre-ReLU pooled features. Documented, not changed; the effect is unmeasured.
"""

from __future__ import annotations

import copy
import math
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from pbr.memory.herding import ClassHerding
from pbr.methods.base import ContinualMethod, Setting, non_negative, positive
from pbr.models.heads import without_autocast

SETTINGS = (
    Setting("pod_spatial", float, 3.0, "PODNet: weight of the POD-spatial distillation", non_negative, "a number >= 0"),
    Setting("pod_flat", float, 1.0, "PODNet: weight of the POD-flat distillation", non_negative, "a number >= 0"),
    Setting("proxies", int, 10, "PODNet: proxies per class of the local similarity classifier", positive,
            "a positive integer"),
    Setting("nca", Literal["ltcil", "podnet_paper"], "ltcil",
            "PODNet+: the classification loss, LT-CIL's call of the NCA (cross-entropy on eta x similarity) or the "
            "PODNet paper's (the margin on the true class, the positive out of the denominator, hinged)",
            before="podnet_paper"),
    Setting("nca_margin", float, 0.6, "PODNet: margin of the NCA loss (read with nca: podnet_paper only)",
            non_negative, "a number >= 0"),
    Setting("nca_scale", float, 10.0, "PODNet: scale eta of the similarities in the NCA loss", positive,
            "a positive number"),
    Setting("lws_epochs", int, 30, "PODNet+: epochs of the class-balanced weight-scaling stage (0: PODNet alone)",
            non_negative, "an integer >= 0"),
    Setting("lws_lr_factor", float, 10.0, "PODNet+: the weight-scaling stage trains at lr / lws_lr_factor (LT-CIL's "
            "--lr-factor, 10 in its CIFAR-100 script)", positive, "a positive number", before=1.0),
)


class LSC(nn.Module):
    """Local similarity classifier: [B, D] features -> [B, C] similarities in [-1, 1]."""

    def __init__(self, dim: int, n_classes: int, proxies: int) -> None:
        super().__init__()
        self.n_classes, self.proxies = n_classes, proxies
        # torch's seeded default generator on the host: the same proxies on every device.
        self.weight = nn.Parameter(torch.randn(n_classes * proxies, dim) / math.sqrt(dim))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        with without_autocast(h.device.type):  # in fp32, as pbr.models.heads' classifiers
            s = (F.normalize(h.to(self.weight.dtype), dim=1) @ F.normalize(self.weight, dim=1).T).view(h.shape[0], self.n_classes,
                                                                                       self.proxies)
            return (F.softmax(s, dim=2) * s).sum(2)


def nca_loss(sims: torch.Tensor, y: torch.Tensor, eta: float, margin: float, form: str = "ltcil") -> torch.Tensor:
    """Averaged over the batch. "ltcil": cross-entropy on eta * sims (LT-CIL's nca() call: the margin
    taken off every class cancels). "podnet_paper":
    max(0, -log(exp(eta (s_y - margin)) / sum_{c != y} exp(eta s_c)))."""
    if form == "ltcil":
        return F.cross_entropy(eta * sims, y)
    if form != "podnet_paper":
        raise ValueError(f"nca form must be ltcil or podnet_paper, got {form!r}")
    z = eta * (sims - margin * F.one_hot(y, sims.shape[1]).to(sims.dtype))
    pos = z.gather(1, y[:, None]).squeeze(1)
    neg = torch.logsumexp(z.masked_fill(F.one_hot(y, sims.shape[1]).bool(), float("-inf")), dim=1)
    return F.relu(neg - pos).mean()


def position(classes: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Each label's index in `classes`."""
    pos = torch.full((int(classes.max()) + 1,), -1, dtype=torch.int64, device=classes.device)
    pos[classes] = torch.arange(classes.numel(), device=classes.device)
    return pos[y]


def stage_maps(net: nn.Module, x: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The four ResNet stages' outputs and the pooled feature."""
    b = net.backbone
    out = F.relu(b.bn1(b.conv1(x)))
    maps = []
    for layer in (b.layer1, b.layer2, b.layer3, b.layer4):
        out = layer(out)
        maps.append(out)
    return maps, F.adaptive_avg_pool2d(out, 1).flatten(1)


def pod_spatial(new: list[torch.Tensor], old: list[torch.Tensor]) -> torch.Tensor:
    """Mean over stages of ||norm(pool(new^2)) - norm(pool(old^2))||, pool = [sum over width,
    sum over height] flattened, averaged over the batch."""
    total = 0.0
    for a, b in zip(new, old):
        a, b = a.pow(2), b.pow(2)
        pa = torch.cat([a.sum(3).flatten(1), a.sum(2).flatten(1)], 1)
        pb = torch.cat([b.sum(3).flatten(1), b.sum(2).flatten(1)], 1)
        total = total + (F.normalize(pa, dim=1) - F.normalize(pb, dim=1)).norm(dim=1).mean()
    return total / len(new)


class PODNetPlus(ContinualMethod):
    name = "podnet"
    label = "PODNet+"
    role = "ltcl"  # the paper's Table 1, not Table 2
    memory = ClassHerding
    predicts_with_net = False
    settings = SETTINGS

    @classmethod
    def reads(cls, key: str, settings: dict[str, Any]) -> bool:
        if key == "nca_margin":  # LT-CIL's loss takes the margin off every class: it cancels (runs
            return settings.get("nca") != "ltcil"  # recorded before `nca` existed had the paper's loss)
        return super().reads(key, settings)

    def __init__(self, net, ctx, opts) -> None:
        super().__init__(net, ctx, opts)
        self.lsc = LSC(net.feature_dim, ctx.n_classes, opts.proxies).to(ctx.device)
        self.scales = torch.ones(ctx.n_classes, device=ctx.device)
        self.teacher: nn.Module | None = None

    def networks(self) -> list[nn.Module]:
        return [self.net, self.lsc]

    def begin_task(self, task: int, images: torch.Tensor, labels: torch.Tensor) -> None:
        super().begin_task(task, images, labels)
        self.opt = torch.optim.SGD([*self.net.parameters(), *self.lsc.parameters()], lr=self.opts.lr)

    def task_data(self, task, seen):
        return self.with_memory(*seen[task])

    def observe(self, x: torch.Tensor, y: torch.Tensor, raw: torch.Tensor) -> torch.Tensor:
        seen = self.ctx.seen_classes(self.task)
        maps, h = stage_maps(self.net, x)
        sims = self.lsc(h)
        out = torch.full_like(sims, float("-inf")).index_copy(1, seen, sims.index_select(1, seen))
        self.count(out, y)
        loss = nca_loss(sims.index_select(1, seen), position(seen, y), self.opts.nca_scale, self.opts.nca_margin,
                        self.opts.nca)
        if self.teacher is not None:
            with torch.no_grad():
                old_maps, old_h = stage_maps(self.teacher, x)
            factor = math.sqrt(seen.numel() / self.ctx.task_classes[self.task].numel())
            loss = loss + factor * (self.opts.pod_spatial * pod_spatial(maps, old_maps)
                                    + self.opts.pod_flat * (1 - F.cosine_similarity(h, old_h, dim=1)).mean())
        loss = self.step(loss)
        self.offer(raw, y)  # kept by an online memory only (herding chooses at the task's end)
        return loss

    def after_backward(self) -> None:
        if self.task > 0 and self.lsc.weight.grad is not None:  # old classes' proxies stay
            old = torch.cat(self.ctx.task_classes[: self.task])
            rows = (old[:, None] * self.opts.proxies + torch.arange(self.opts.proxies, device=old.device)).flatten()
            self.lsc.weight.grad.index_fill_(0, rows, 0.0)

    def end_task(self, task: int, images: torch.Tensor, labels: torch.Tensor) -> None:
        was_training = self.net.training
        self.net.eval()
        self.lsc.eval()
        # Herding picks each new class's samples by their features; stage 2 reads the same features
        # of the task's data and the memory.
        end = self.update_memory(task, images, labels)
        with torch.no_grad():
            sims = self.lsc(end.features)
        self.scales = weight_scaling(sims, labels, self.ctx.seen_classes(task), self.scales, self.opts.nca_scale,
                                     self.opts.lws_epochs, self.opts.lr / self.opts.lws_lr_factor,
                                     self.ctx.replay_batch_size, self.ctx.generator)
        self.teacher = copy.deepcopy(self.net).requires_grad_(False).eval()  # BatchNorm on its running statistics
        self.net.train(was_training)
        self.lsc.train(was_training)

    def predict(self, x: torch.Tensor, task: int | None = None) -> torch.Tensor:
        return self.lsc(self.net.features(x)) * self.scales

    def classifier_norms(self) -> torch.Tensor:
        # A class's score is its stage-2 scale times a similarity in [-1, 1] (normalised proxies):
        # the scale is to the LSC what a row's norm is to a cosine head. The Net's head is never trained.
        return self.scales.detach().float().cpu()

    def mc_network(self) -> None:
        return None  # it predicts with the LSC: the Net's head (what MC dropout samples) is untrained

    def model_state(self) -> dict[str, Any]:
        return {"state_dict": self.net.state_dict(), "lsc": self.lsc.state_dict(), "scales": self.scales.clone()}

    def load_model_state(self, state: dict[str, Any]) -> None:
        self.net.load_state_dict(state["state_dict"])
        self.lsc.load_state_dict(state["lsc"])
        self.scales = state["scales"].to(self.ctx.device)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "teacher": None if self.teacher is None else self.teacher.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if state["teacher"] is not None:
            self.teacher = copy.deepcopy(self.net).requires_grad_(False).eval()
            self.teacher.load_state_dict(state["teacher"])


def weight_scaling(sims: torch.Tensor, labels: torch.Tensor, seen: torch.Tensor, scales: torch.Tensor,
                   eta: float, epochs: int, lr: float, batch: int, generator: torch.Generator) -> torch.Tensor:
    """LT-CIL's second stage on fixed similarities [N, C]: a scale per seen class, trained on
    class-balanced draws (a class uniformly, then one of its samples) with cross-entropy on
    eta * scale * similarity at a cosine-decayed lr; returns the new scales (the other classes'
    unchanged)."""
    w = scales.index_select(0, seen).clone().requires_grad_(True)
    opt = torch.optim.SGD([w], lr=lr)
    target = position(seen, labels)
    s = sims.index_select(1, seen)
    by_class = [torch.nonzero(target == k).squeeze(1) for k in range(seen.numel())]
    present = torch.tensor([k for k, idx in enumerate(by_class) if idx.numel() > 0], device=sims.device)
    steps = max(1, labels.shape[0] // batch)
    dev = generator.device
    for e in range(epochs):
        for group in opt.param_groups:
            group["lr"] = 0.5 * lr * (1 + math.cos(math.pi * e / epochs))
        for _ in range(steps):
            k = present[torch.randint(0, present.numel(), (batch,), generator=generator, device=dev).to(sims.device)]
            u = torch.rand(batch, generator=generator, device=dev).to(sims.device)
            idx = torch.stack([by_class[c][min(int(r * by_class[c].numel()), by_class[c].numel() - 1)]
                               for c, r in zip(k.tolist(), u.tolist())])
            opt.zero_grad()
            F.cross_entropy(eta * s[idx] * w, target[idx]).backward()
            opt.step()
    out = scales.clone()
    out[seen] = w.detach()
    return out
