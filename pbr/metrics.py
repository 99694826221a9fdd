"""Continual-learning metrics from the accuracy matrix R (R[j][i] = accuracy on task i after
training on task j; entries above the diagonal are never read: None, as training writes those it
does not evaluate, or NaN is fine). The masked per-batch accuracy that fills it is the training
loop's (pbr/loop.py task_accuracy): its code is the train stage's, this module the evaluate stage's."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

def _matrix(R: Any) -> np.ndarray:
    r = np.asarray(R, dtype=np.float64)
    if r.ndim != 2 or r.shape[0] != r.shape[1] or r.shape[0] == 0:
        raise ValueError(f"R must be a non-empty square T x T matrix, got shape {r.shape}")
    return r


def acc(R: Any) -> float:
    """Mean accuracy over all tasks after the last task: mean_i R[T-1][i]."""
    r = _matrix(R)
    return float(r[-1].mean())


def bwt(R: Any) -> float:
    """Backward transfer: mean over i < T-1 of R[T-1][i] - R[i][i] (0 for T = 1)."""
    r = _matrix(R)
    t = r.shape[0]
    if t == 1:
        return 0.0
    return float((r[-1, : t - 1] - np.diag(r)[: t - 1]).mean())


def forgetting(R: Any) -> float:
    """Mean over i < T-1 of max_{j = i..T-2} R[j][i] - R[T-1][i] (0 for T = 1).

    The max runs over the evaluations after tasks i to T-2, excluding the final one, as in the
    standard definition (Chaudhry et al. 2018), so forgetting can be negative.
    """
    r = _matrix(R)
    t = r.shape[0]
    if t == 1:
        return 0.0
    best = np.array([r[i : t - 1, i].max() for i in range(t - 1)])
    return float((best - r[-1, : t - 1]).mean())


def minority_tasks(task_sizes: list[int]) -> list[int]:
    """The smaller half of the tasks by training size (ceil(T/2) tasks): tasks 3-5 of
    Seq-CIFAR-10-LT ordered, as in the paper's Table 4; mixed tasks when shuffled."""
    k = math.ceil(len(task_sizes) / 2)
    return sorted(sorted(range(len(task_sizes)), key=lambda t: (task_sizes[t], -t))[:k])


def scenario_metrics(matrix: list[list[float]], minority: list[int]) -> dict[str, float]:
    """ACC, BWT, forgetting and the minority tasks' mean final accuracy of one scenario's matrix."""
    last = matrix[-1]
    return {"acc": acc(matrix), "bwt": bwt(matrix), "forgetting": forgetting(matrix),
            "minority_acc": sum(last[t] for t in minority) / len(minority)}
