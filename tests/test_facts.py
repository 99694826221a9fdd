"""The one table of data-set facts (pbr/data/facts.py) against the data itself."""

import numpy as np

from conftest import REAL_CIFAR10, real_cifar10
from pbr.data.facts import DATASETS


@real_cifar10
def test_cifar10_facts_are_the_real_training_sets():
    """Classes, images per class, image side and the normalisation statistics, computed from the real
    CIFAR-10 (per-channel mean and std of the training pixels, to the 4 decimals the table keeps)."""
    from pbr.data.sources import load_raw

    raw = load_raw("cifar10", REAL_CIFAR10.parent)
    facts = DATASETS["cifar10"]
    counts = np.bincount(raw.train_labels, minlength=facts.n_classes)
    assert counts.size == facts.n_classes and counts.max() == facts.n_max == counts.min()
    assert raw.train_images.shape[1:] == (facts.side, facts.side, 3)
    pixels = raw.train_images.reshape(-1, 3)
    n = pixels.shape[0]
    s1 = pixels.sum(0, dtype=np.int64) / 255
    s2 = np.einsum("ij,ij->j", pixels, pixels, dtype=np.int64) / 255 ** 2
    mean = s1 / n
    assert np.allclose(mean, facts.mean, atol=1e-4)
    assert np.allclose(np.sqrt(s2 / n - mean ** 2), facts.std, atol=1e-4)
