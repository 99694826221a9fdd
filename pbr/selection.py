"""The selection math the memory policies (pbr/memory/) rank and accept by: PBR's sample-in
probability and walk order (docs/method.md), iCaRL's herding.
"""

from __future__ import annotations

import torch


ORDERS = ("uncertain_first", "certain_first", "random", "uncertain_weighted", "certain_weighted")
RANKS = ("task", "class")
CANDIDATES = ("hold", "advance")
EVICTIONS = ("random", "certain", "uncertain")  # which stored sample an accepted one replaces
POOLS = ("task", "buffer_and_task")  # what the end-of-task walk runs over


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
    """The indices of `scores` in walk order (pbr/memory/walk.py: UncertaintyWalk.walk).

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
        # first: Eq. 3's arg min, drawn with odds instead of strictly); never a top-k.
        w = scores.double().clamp_min(0)
        if order == "certain_weighted":
            w = w.max() - w
        if power != 1.0:
            w = w.pow(power)
        keys = torch.log(torch.rand(b, dtype=torch.float64, generator=g, device=dev)) / (w + 1e-12)
        perm = torch.argsort(keys, descending=True, stable=True)
    else:
        # Ties (near-certain samples whose MI rounds to 0 at a large logit scale, or every sample of a
        # head without dropout) fall in a spread of positions, not in data order, which is class by
        # class on TinyImageNet: positions sorted by p * 2654435761 mod 2^32 (Knuth's multiplicative
        # hash, one key per position), with no draw from the generator.
        spread = torch.argsort(torch.arange(b, device=dev, dtype=torch.int64) * 2654435761 % 2**32)
        perm = spread[torch.argsort(scores[spread], descending=order == "uncertain_first", stable=True)]
    if rank == "class":
        if labels is None:
            raise ValueError("rank 'class' needs the labels")
        lab = labels.to(dev)[perm]
        same = lab.unsqueeze(0) == lab.unsqueeze(1)
        within = torch.tril(same, diagonal=-1).sum(1)  # earlier samples of the same class in the order
        perm = perm[torch.argsort(within, stable=True)]
    return perm


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
