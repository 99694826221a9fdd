"""One table of what the pipeline knows about each data set: how the paper's tables name it, the
short name runs carry, its classes, its largest class's training images, its image side and its
normalisation statistics. Everything else (configuration, sweeps, the report, augmentation)
reads it from here; a new data set is one row here and one reader in sources.py."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DatasetFacts:
    key: str  # data.dataset
    title: str  # as the paper's tables name its long-tailed continual version
    short: str  # in run names
    n_classes: int
    n_max: int  # training images of each class before the long tail is cut
    side: int  # images are side x side
    mean: tuple[float, float, float]  # per-channel normalisation of the training set
    std: tuple[float, float, float]


DATASETS: dict[str, DatasetFacts] = {d.key: d for d in (
    DatasetFacts("cifar10", "Seq-CIFAR-10-LT", "c10", 10, 5000, 32,
                 (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2615)),
    DatasetFacts("cifar100", "Seq-CIFAR-100-LT", "c100", 100, 500, 32,
                 (0.5071, 0.4867, 0.4408), (0.2675, 0.2565, 0.2761)),
    DatasetFacts("tinyimagenet", "Seq-TinyImageNet-LT", "tin", 200, 500, 64,
                 (0.4802, 0.4480, 0.3975), (0.2770, 0.2691, 0.2821)),
)}
