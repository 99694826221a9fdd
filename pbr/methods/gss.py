"""GSS: gradient-based sample selection (Aljundi et al. 2019), the greedy variant, with ER's step.

Each step is ER's (CE on the current batch and a memory batch). Then each incoming sample's
gradient g (un-augmented, the network in eval mode, as Mammoth's `gss`) is compared with the
gradients G_j of a random subset of `gss_subset` stored samples: its score is
c = max_j cos(g, G_j) + 1, in [0, 2]; low when the sample's gradient points away from the stored
ones. So the memory drifts toward samples whose gradients are diverse. Per-sample gradients come
from torch.func (vmap). Who is stored (`gss_rule`):

- "paper" (default): the GSS paper's greedy rule (its Algorithm 2), sample by sample on each
  sample's own score. While the memory has room a sample is stored with its c. Once it is full, a
  sample with c < 1 draws a stored sample i with probability C_i / sum C and replaces it with
  probability C_i / (C_i + c) (keeping its c as C_i); a sample with c >= 1 is never stored.
- "mammoth": Mammoth's gss (utils/gss_buffer.py @5bb9275), which departs from the paper: it also
  scores the gradient of the batch's mean loss, c_batch. While the memory has room a sample is
  stored with c_batch, not its own c. Once it is full, a batch with c_batch >= 1 stores nothing,
  and in a batch with c_batch < 1 every sample enters the lottery above on its own c, whatever it
  is: a sample scoring >= 1 may be stored.

The paper's rule is the default: it is the method GSS publishes, and it judges each sample by its
own gradient, where a batch-mean gradient can hide one sample's redundancy behind the others.
Both rules give the first batch offered to an empty memory the score 0.1 (Mammoth's).
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

from pbr.memory import Memory
from pbr.methods.base import MAMMOTH, RESERVOIR, Best, Setting, positive
from pbr.methods.er import ER

SUBSET = Setting("gss_subset", int, 32, "GSS: stored samples whose gradients a new sample is compared with",
                 positive, "a positive integer")
RULE = Setting("gss_rule", Literal["paper", "mammoth"], "paper",
               "GSS: who is stored, the GSS paper's greedy rule on each sample's own score or Mammoth's, gated by "
               "the batch-mean gradient's score")
FIRST_SCORE = 0.1  # Mammoth's score of the samples stored while the memory is still empty


def per_sample_grads(net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, chunk: int = 16) -> torch.Tensor:
    """[B, P]: each sample's gradient of its own cross-entropy, the network in eval mode."""
    from torch.func import functional_call, grad, vmap

    params = {k: v.detach() for k, v in net.named_parameters()}
    buffers = dict(net.named_buffers())

    def loss(p, xi, yi):
        return F.cross_entropy(functional_call(net, (p, buffers), (xi.unsqueeze(0),)), yi.unsqueeze(0))

    was_training = net.training
    net.eval()
    rows = []
    for i in range(0, x.shape[0], chunk):
        g = vmap(grad(loss), in_dims=(None, 0, 0))(params, x[i:i + chunk], y[i:i + chunk])
        rows.append(torch.cat([g[k].reshape(g[k].shape[0], -1) for k in params], 1))
    net.train(was_training)
    return torch.cat(rows)


def scores(new: torch.Tensor, stored: torch.Tensor) -> torch.Tensor:
    """c_i = max_j cos(new_i, stored_j) + 1."""
    return (F.normalize(new, dim=1) @ F.normalize(stored, dim=1).T).max(1).values + 1


class GSS(ER):
    name = "gss"
    label = "GSS"
    memory = Memory  # its policy still in this file (being moved to pbr/memory/)
    settings = (RESERVOIR, SUBSET, RULE)
    best = (Best("cifar10", None, {"lr": 0.03}, f"{MAMMOTH} seq-cifar10 (buffer 200, 500, 5120)"),)

    def offer(self, raw: torch.Tensor, y: torch.Tensor, logits=None) -> None:
        if self.offers_this_epoch():
            with torch.autocast(self.ctx.device.type, enabled=False):  # scores near 1 decide: no bf16
                self.add(raw, y)

    def add(self, raw: torch.Tensor, y: torch.Tensor) -> None:
        buf, g, b = self.buffer, self.ctx.generator, y.shape[0]
        mammoth = self.opts.gss_rule == "mammoth"
        if len(buf) == 0:
            c, batch_c = [FIRST_SCORE] * b, FIRST_SCORE
        else:
            idx = buf.sample(self.opts.gss_subset, g)
            images, labels, _, _ = buf.get(idx)
            stored = per_sample_grads(self.net, self.ctx.preprocess(images), labels)
            new = per_sample_grads(self.net, self.ctx.preprocess(raw), y)
            c = scores(new, stored).tolist()
            # The gradient of the batch's mean loss is the mean of the per-sample ones (eval mode).
            batch_c = scores(new.mean(0, keepdim=True), stored).item() if mammoth else None
        u = torch.rand(b, 2, dtype=torch.float64, generator=g, device=self.ctx.device).tolist()
        held = buf.scores[: len(buf)].tolist()
        targets, kept = [], []
        for ci, ui in zip(c, u):
            filling = len(held) < self.opts.buffer_size
            targets.append(self.place(held, ci, ui, batch_c if mammoth else None))
            kept.append(batch_c if mammoth and filling else ci)  # the score place() gave the slot
        t = torch.tensor(targets, device=buf.device)
        buf.write(t, raw, y, torch.full_like(y, self.task), scores=torch.tensor(kept, device=buf.device))
        # A write dropped (slot = capacity) must not change the kept scores: write() left them alone.
        self.policy.seen += b
        buf.size = len(held)

    def place(self, held: list[float], c: float, u: list[float], batch_c: float | None = None) -> int:
        """The slot for a sample of score c (capacity: not stored); `held` is the stored scores.
        `batch_c` None: the paper's rule; else Mammoth's, gated by the batch's score batch_c."""
        cap = self.opts.buffer_size
        if len(held) < cap:
            held.append(c if batch_c is None else batch_c)
            return len(held) - 1
        if (c if batch_c is None else batch_c) >= 1:
            return cap
        r, acc, i = u[0] * sum(held), 0.0, cap - 1
        for j, s in enumerate(held):
            acc += s
            if r < acc:
                i = j
                break
        if u[1] < held[i] / (held[i] + c):
            held[i] = c
            return i
        return cap
