"""GSS's greedy memory (Aljundi et al. 2019): samples whose gradients point away from the stored ones.

Each incoming sample's gradient g (un-augmented, the learner's network in eval mode, as Mammoth's
`gss`; normalised, where Mammoth @5bb9275 takes it on the images as its buffer stores them, its
`not_aug_inputs` of ToTensor() alone: un-normalised images the network, trained and replaying
normalised ones, never sees otherwise, so ours is the gradient of what it trains on; the effect is
unmeasured) is compared with the gradients G_j of a random subset of `subset` stored samples: its score
is c = max_j cos(g, G_j) + 1, in [0, 2]; low when the sample's gradient points away from the
stored ones. So the memory drifts toward samples whose gradients are diverse. Per-sample gradients
come from torch.func (vmap). Who is stored (`rule`):

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

import torch
import torch.nn.functional as F

from pbr.memory.base import Memory

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


class GradientDiversity(Memory):
    """Reads the learner's network (`net`) and image preprocessing (`ctx.preprocess`)."""

    def __init__(self, buffer, generator, learner=None, subset: int = 32, rule: str = "paper") -> None:
        super().__init__(buffer, generator, learner)
        if rule not in ("paper", "mammoth"):
            raise ValueError(f"rule must be paper or mammoth, got {rule!r}")
        self.subset, self.rule = subset, rule

    def offer(self, images, labels, tasks, logits=None) -> None:
        with torch.autocast(self.buffer.device.type, enabled=False):  # scores near 1 decide: no bf16
            self._offer(images, labels, tasks, logits)

    def _offer(self, images, labels, tasks, logits) -> None:
        buf, g, b = self.buffer, self.generator, labels.shape[0]
        mammoth = self.rule == "mammoth"
        if len(buf) == 0:
            c, batch_c = [FIRST_SCORE] * b, FIRST_SCORE
        else:
            net, preprocess = self.learner.net, self.learner.ctx.preprocess
            idx = buf.sample(self.subset, g)
            stored_images, stored_labels, _, _ = buf.get(idx)
            stored = per_sample_grads(net, preprocess(stored_images), stored_labels)
            new = per_sample_grads(net, preprocess(images), labels)
            c = scores(new, stored).tolist()
            # The gradient of the batch's mean loss is the mean of the per-sample ones (eval mode).
            batch_c = scores(new.mean(0, keepdim=True), stored).item() if mammoth else None
        u = torch.rand(b, 2, dtype=torch.float64, generator=g, device=buf.device).tolist()
        held = buf.scores[: len(buf)].tolist()
        targets, kept = [], []
        for ci, ui in zip(c, u):
            filling = len(held) < buf.capacity
            targets.append(self.place(held, ci, ui, batch_c if mammoth else None))
            kept.append(batch_c if mammoth and filling else ci)  # the score place() gave the slot
        t = torch.tensor(targets, device=buf.device)
        buf.write(t, images, labels, tasks, logits, scores=torch.tensor(kept, device=buf.device))
        # A write dropped (slot = capacity) must not change the kept scores: write() left them alone.
        self.seen += b
        buf.size = len(held)

    def place(self, held: list[float], c: float, u: list[float], batch_c: float | None = None) -> int:
        """The slot for a sample of score c (capacity: not stored); `held` is the stored scores.
        `batch_c` None: the paper's rule; else Mammoth's, gated by the batch's score batch_c."""
        cap = self.buffer.capacity
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
