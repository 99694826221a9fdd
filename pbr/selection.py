"""Selection policies over the replay storage (pbr/buffer.py): Mammoth's online reservoir (ER,
DER, DER++), PBR's end-of-task uncertainty-guided walk (docs/method.md), equal per-task memories
(FDR) and iCaRL's herding. Each decides which samples go to which slots and writes them through
the storage's public `write` / `replace`.
"""

from __future__ import annotations

import torch

from pbr.buffer import Buffer
from pbr.rng import check_generator

ORDERS = ("uncertain_first", "certain_first", "random", "uncertain_weighted", "certain_weighted")
RANKS = ("task", "class")
CANDIDATES = ("hold", "advance")


def sample_in_probability(n_steps: int, class_counts: torch.Tensor, capacity: int, start: int = 0) -> torch.Tensor:
    """P_N = capacity / (N + sum_i s_i w_i), w = softmax(-s), for N = start+1..start+n_steps (float64).

    `start` = 0 counts the steps of this walk only (the paper's N_c read per walk); the number of
    samples walked in earlier tasks makes N count the whole stream (Mammoth's num_seen_examples).

    Raw P: the walk accepts with min(1, P). Empty `class_counts` (first task) gives sum 0.
    """
    if n_steps < 0:
        raise ValueError(f"n_steps must be >= 0, got {n_steps}")
    s = torch.as_tensor(class_counts).to(torch.float64).reshape(-1)
    # torch.softmax subtracts the max, so large counts do not underflow to 0/0.
    offset = (s * torch.softmax(-s, dim=0)).sum() if s.numel() else s.new_zeros(())
    n = torch.arange(start + 1, start + n_steps + 1, dtype=torch.float64, device=s.device)
    return capacity / (n + offset)


def walk_order(scores: torch.Tensor, order: str, generator: torch.Generator, power: float = 1.0,
               labels: torch.Tensor | None = None, rank: str = "task") -> torch.Tensor:
    """The indices of `scores` in walk order (see uncertainty_walk).

    `power` sharpens (> 1) or flattens (< 1) the weights of the weighted orders. `rank` "class"
    interleaves the classes: the order is taken over the task, then each class's k-th sample comes
    before any class's (k+1)-th, so every class reaches the front of the walk, the minority ones
    included, in the order's own preference within the class."""
    b, dev, g = scores.shape[0], scores.device, generator
    if order == "random":
        perm = torch.randperm(b, generator=g, device=dev)
    elif order in ("uncertain_weighted", "certain_weighted"):
        # Weighted random order (Efraimidis & Spirakis' A-Res keys u^(1/w), compared as
        # log(u) / w): sample i comes before j with odds w_i : w_j. w = the score (uncertain
        # samples first in priority), or its distance below the task's largest score (certain
        # first: Eq. 2's arg min, drawn with odds instead of strictly); never a top-k.
        w = scores.double().clamp_min(0)
        if order == "certain_weighted":
            w = w.max() - w
        if power != 1.0:
            w = w.pow(power)
        keys = torch.log(torch.rand(b, dtype=torch.float64, generator=g, device=dev)) / (w + 1e-12)
        perm = torch.argsort(keys, descending=True, stable=True)
    else:
        perm = torch.argsort(scores, descending=order == "uncertain_first", stable=True)
    if rank == "class":
        if labels is None:
            raise ValueError("rank 'class' needs the labels")
        lab = labels.to(dev)[perm]
        same = lab.unsqueeze(0) == lab.unsqueeze(1)
        within = torch.tril(same, diagonal=-1).sum(1)  # earlier samples of the same class in the order
        perm = perm[torch.argsort(within, stable=True)]
    return perm


def reservoir_add(
    buffer: Buffer,
    images: torch.Tensor,
    labels: torch.Tensor,
    tasks: torch.Tensor,
    logits: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> None:
    """Mammoth's online reservoir rule, applied to the batch in order, vectorised.

    Stream sample n (0-based) goes to slot n while n < capacity; otherwise
    j = floor(u * (n + 1)) with u = torch.rand(B, dtype=float64, generator) (one draw per
    sample of the batch, drawn for every sample) and slot j is replaced if j < capacity.
    """
    b = buffer.check_batch(images, labels, tasks, logits)
    g = check_generator(generator, buffer.device)
    u = torch.rand(b, dtype=torch.float64, generator=g, device=buffer.device)
    n = torch.arange(buffer.seen, buffer.seen + b, device=buffer.device)
    j = torch.minimum(torch.floor(u * (n + 1)).to(torch.int64), n)
    slot = torch.where(n < buffer.capacity, n, j)
    slot = torch.where(slot < buffer.capacity, slot, buffer.capacity)
    buffer.write(slot, images, labels, tasks, logits, None)
    buffer.seen += b
    buffer.size = min(buffer.capacity, buffer.seen)

def uncertainty_walk(
    buffer: Buffer,
    images: torch.Tensor,
    labels: torch.Tensor,
    tasks: torch.Tensor,
    scores: torch.Tensor,
    class_counts: torch.Tensor,
    generator: torch.Generator,
    order: str = "uncertain_first",
    logits: torch.Tensor | None = None,
    candidate: str = "advance",
    start: int = 0,
    power: float = 1.0,
    rank: str = "task",
    outliers: float = 0.0,
) -> torch.Tensor:
    """PBR's end-of-task walk over the task just learned. Returns the accept mask [B]
    (input order; an accepted sample may be overwritten later in the same walk).

    The samples are walked in `order` of `scores` ("uncertain_first": the paper's text;
    "certain_first": its Eq.'s arg min; "random": the Ours-Random ablation; "uncertain_weighted":
    a random order drawn with weights = scores, weighted reservoir sampling's priority). Step N
    (1-based) is accepted iff u_N < min(1, P_N), P from `sample_in_probability` with the
    running counts of the classes seen before this task. Accepted samples fill free slots
    in walk order, then each replaces a uniformly random slot.

    `candidate`: "advance" (every step moves on to the next
    sample) or "hold" (the paper's text: a rejected candidate stays the candidate for the
    next step, so the k-th acceptance stores the k-th sample in walk order). With "advance" and a full buffer the
    walk keeps each sample with probability capacity / (n + offset) whatever its position:
    the product of acceptance and survival telescopes, so the MI order has no effect.

    Draws from `generator` (on `scores`' device), in this order: the permutation (random
    and weighted orders only), u = torch.rand(B, float64), slots = torch.randint(capacity, (B,)).
    `power` and `rank` shape the order (walk_order); `outliers` leaves the given fraction of the
    task's highest scores out of the walk (the most uncertain samples of a task are often
    mislabelled or atypical ones), the walk running over the rest.
    """
    if not 0.0 <= outliers < 1.0:
        raise ValueError(f"outliers must be in [0, 1), got {outliers}")
    if outliers > 0.0:
        n_out = int(outliers * scores.shape[0])
        kept = torch.argsort(scores, stable=True)[: scores.shape[0] - n_out].sort().values
        idx = kept.to(images.device)
        sub = uncertainty_walk(buffer, images[idx], labels[kept.to(labels.device)], tasks[kept.to(tasks.device)],
                               scores[kept], class_counts, generator, order,
                               None if logits is None else logits[kept.to(logits.device)], candidate, start, power, rank)
        accepted = torch.zeros(scores.shape[0], dtype=torch.bool, device=scores.device)
        accepted[kept] = sub
        return accepted
    if rank not in RANKS:
        raise ValueError(f"rank must be one of {RANKS}, got {rank!r}")
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    if candidate not in CANDIDATES:
        raise ValueError(f"candidate must be one of {CANDIDATES}, got {candidate!r}")
    b = buffer.check_batch(images, labels, tasks, logits)
    if scores.shape != (b,):
        raise ValueError(f"scores must be [{b}], got {tuple(scores.shape)}")
    dev = scores.device
    g = check_generator(generator, dev)
    perm = walk_order(scores, order, g, power, labels, rank)
    p = sample_in_probability(b, torch.as_tensor(class_counts).to(dev), buffer.capacity, start)
    u = torch.rand(b, dtype=torch.float64, generator=g, device=dev)
    rand_slot = torch.randint(buffer.capacity, (b,), generator=g, device=dev)
    accept = u < p.clamp(max=1.0)  # walk order
    rank = torch.cumsum(accept, 0) - 1
    free = buffer.capacity - buffer.size
    slot = torch.where(rank < free, buffer.size + rank, rand_slot)
    slot = torch.where(accept, slot, buffer.capacity)
    # Once per task, so a host sync is fine: move only the accepted rows to the buffer.
    rows = torch.nonzero(accept).squeeze(1)
    src = perm[: rows.numel()] if candidate == "hold" else perm[rows]
    idx = src.to(images.device)
    buffer.write(
        slot[rows],
        images[idx],
        labels[src.to(labels.device)],
        tasks[src.to(tasks.device)],
        None if logits is None else logits[src.to(logits.device)],
        scores[src],
    )
    n_accepted = rows.numel()
    buffer.size = min(buffer.capacity, buffer.size + n_accepted)
    accepted = torch.zeros(b, dtype=torch.bool, device=dev)
    accepted[src] = True
    return accepted



def per_task_memory(
    buffer: Buffer,
    images: torch.Tensor,
    labels: torch.Tensor,
    task: int,
    logits: torch.Tensor,
    generator: torch.Generator,
) -> None:
    """Equal memories per task (FDR, as Mammoth's): after task t (0-based) every task keeps
    capacity // (t + 1) samples; the old tasks keep their first ones, the new task gets that many
    of its samples drawn at random (Mammoth: the first of its shuffled loader)."""
    per = buffer.capacity // (task + 1)
    n = buffer.size
    old_tasks = buffer.tasks[:n]
    # Each old sample's rank within its task, in slot order: kept when below `per`.
    same = old_tasks.unsqueeze(0) == old_tasks.unsqueeze(1)
    rank = torch.tril(same.long(), diagonal=-1).sum(1)
    keep = torch.nonzero(rank < per).squeeze(1)
    g = check_generator(generator, images.device)
    new = torch.randperm(labels.shape[0], generator=g, device=images.device)[:per]
    dev = buffer.device
    buffer.replace(torch.cat([buffer.images[keep], images[new].to(dev)]),
                   torch.cat([buffer.labels[keep], labels[new].to(dev)]),
                   torch.cat([old_tasks[keep], torch.full((new.numel(),), task, dtype=torch.int64, device=dev)]),
                   torch.cat([buffer.logits[keep], logits[new].to(dev, torch.float32)]))


def herding(features: torch.Tensor, m: int) -> torch.Tensor:
    """iCaRL's herding: the indices of m samples chosen one by one so that the mean of the chosen
    features stays nearest the mean of all (Mammoth's rule: each step takes the sample minimising
    ||mu - (S + f_i) / (k + 1)||, S the sum of the k chosen; a sample is chosen once)."""
    mu = features.mean(0)
    chosen: list[int] = []
    total = torch.zeros_like(mu)
    taken = torch.zeros(features.shape[0], dtype=torch.bool, device=features.device)
    for k in range(min(m, features.shape[0])):
        cost = (mu - (total + features) / (k + 1)).norm(dim=1)
        cost[taken] = float("inf")
        i = int(cost.argmin())
        chosen.append(i)
        taken[i] = True
        total += features[i]
    return torch.tensor(chosen, dtype=torch.int64, device=features.device)


def class_herding_memory(
    buffer: Buffer,
    images: torch.Tensor,
    labels: torch.Tensor,
    features: torch.Tensor,
    new_classes: torch.Tensor,
    n_classes_seen: int,
    task: int,
) -> None:
    """iCaRL's memory: capacity // n_classes_seen samples per class; each old class keeps its first
    ones (its herding order), each new class gets its herding choice among `features`."""
    per = buffer.capacity // n_classes_seen
    n = buffer.size
    old = buffer.labels[:n]
    same = old.unsqueeze(0) == old.unsqueeze(1)
    keep = torch.nonzero(torch.tril(same.long(), diagonal=-1).sum(1) < per).squeeze(1)
    parts_x, parts_y = [buffer.images[keep]], [buffer.labels[keep]]
    parts_t = [buffer.tasks[keep]]
    for c in new_classes.tolist():
        idx = torch.nonzero(labels == c).squeeze(1)
        pick = idx[herding(features[idx], per)]
        parts_x.append(images[pick].to(buffer.device))
        parts_y.append(labels[pick].to(buffer.device))
        parts_t.append(torch.full((pick.numel(),), task, dtype=torch.int64, device=buffer.device))
    buffer.replace(torch.cat(parts_x), torch.cat(parts_y), torch.cat(parts_t))
