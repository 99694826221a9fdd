"""The long-tailed continual stream: per-class counts, class order, task cuts, kept images."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pbr.errors import UserError


def class_counts(n_max: int, n_classes: int, imbalance_ratio: float) -> np.ndarray:
    """LDAM-DRW's "exp" profile: n_c = floor(n_max * IR ** (c / (C - 1))), indexed by original label."""
    if n_classes < 2:
        return np.full(n_classes, n_max, dtype=np.int64)
    # The same float expression as LDAM-DRW's get_img_num_per_cls, so counts match theirs exactly.
    return np.array(
        [int(n_max * (imbalance_ratio ** (c / (n_classes - 1.0)))) for c in range(n_classes)], dtype=np.int64
    )


def class_order(n_classes: int, setting: str, seed: int) -> np.ndarray:
    if setting == "ordered":
        return np.arange(n_classes)
    if setting == "shuffled":
        # Legacy RandomState on purpose: LT-CIL's class order is np.random.seed(1993) + permutation.
        return np.random.RandomState(seed).permutation(n_classes)
    raise ValueError(f"setting must be 'ordered' or 'shuffled', not {setting!r}")


def least_ratio(n_max: int) -> float:
    """The smallest ratio of three significant digits that keeps an image of the last class (whose
    count is int(n_max * IR)); 1 / n_max printed with %g can round below it."""
    import math

    scale = 10 ** (2 - math.floor(math.log10(1 / n_max)))
    r = math.ceil(scale / n_max) / scale
    while int(n_max * r) < 1:
        r += 1 / scale
    return r


@dataclass
class Stream:
    class_order: np.ndarray  # [C] original labels in the order that cuts tasks
    counts: np.ndarray  # [C] kept training images per original label
    task_classes: list[np.ndarray]  # per task, its original labels
    train_indices: list[np.ndarray]  # per task, indices into the raw training set (sorted)
    test_indices: list[np.ndarray]  # per task, every raw test image of its classes (sorted)

    @property
    def n_tasks(self) -> int:
        return len(self.task_classes)


def build_stream(
    train_labels: np.ndarray,
    test_labels: np.ndarray,
    n_classes: int,
    setting: str,
    imbalance_ratio: float,
    n_tasks: int,
    seed: int,
    class_names: list[str] | None = None,
    subset: str = "seeded",
) -> Stream:
    """The stream. `subset` picks which images a class keeps: "seeded", a choice drawn from `seed`;
    "ldam", LDAM-DRW's and LT-CIL's own rule (the images their code trains on; `seed` then orders
    the classes only)."""
    available = np.bincount(train_labels, minlength=n_classes)
    # n_max is the balanced per-class count (5000 on CIFAR-10); the sources refuse a short class.
    n_max = int(available.min())
    counts = class_counts(n_max, n_classes, imbalance_ratio)
    if counts.min() < 1:
        c = int(np.argmin(counts))
        name = f" ({class_names[c]!r})" if class_names else ""
        raise UserError(
            f"imbalance ratio {imbalance_ratio:g} leaves class {c}{name} with no training image "
            f"(n_max = {n_max}); use a ratio >= {least_ratio(n_max):g}"
        )
    if n_classes % n_tasks:
        raise UserError(f"{n_tasks} tasks do not divide {n_classes} classes")

    kept = np.empty(n_classes, dtype=object)
    if subset == "seeded":
        rng = np.random.default_rng(seed)
        for c in range(n_classes):  # per class, not per sample: C iterations
            kept[c] = np.sort(rng.choice(np.flatnonzero(train_labels == c), size=counts[c], replace=False))
    elif subset == "ldam":
        # IMBALANCECIFAR's gen_imbalanced_data: numpy's legacy generator seeded 0 (rand_number), then
        # per class in label order its indices shuffled in place and the first n kept.
        legacy = np.random.RandomState(0)
        for c in range(n_classes):
            idx = np.flatnonzero(train_labels == c)
            legacy.shuffle(idx)
            kept[c] = np.sort(idx[:counts[c]])
    else:
        raise ValueError(f"subset must be 'seeded' or 'ldam', not {subset!r}")

    order = class_order(n_classes, setting, seed)
    per_task = n_classes // n_tasks
    task_classes = [order[t * per_task:(t + 1) * per_task] for t in range(n_tasks)]
    train_idx = [np.sort(np.concatenate([kept[c] for c in cls])) for cls in task_classes]
    test_idx = [np.flatnonzero(np.isin(test_labels, cls)) for cls in task_classes]
    return Stream(order, counts, task_classes, train_idx, test_idx)
