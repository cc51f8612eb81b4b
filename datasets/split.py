"""Seeded splits for datasets that ship without a fixed one."""

from __future__ import annotations

import numpy as np


def per_class_split(
    y: np.ndarray, num_classes: int, train_per_class: int, val_per_class: int, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-class split as in Shchur et al. (2018): a fixed count per class, the rest test.

    For every class, its labelled nodes are shuffled with a generator seeded by ``seed``; the
    first ``train_per_class`` go to training, the next ``val_per_class`` to validation, the rest
    to test. A class with fewer nodes fills training first, then validation.

    Args:
        y: int64 [N] labels (``-1`` = unlabelled, never selected).
        num_classes: number of classes.
        train_per_class: training nodes per class (20 in Shchur et al.).
        val_per_class: validation nodes per class (30 in Shchur et al.).
        seed: seed of the shuffle.

    Returns:
        ``(train, val, test)`` bool masks [N], disjoint.
    """
    rng = np.random.default_rng(seed)
    n = y.shape[0]
    train = np.zeros(n, dtype=np.bool_)
    val = np.zeros(n, dtype=np.bool_)
    test = np.zeros(n, dtype=np.bool_)
    for c in range(num_classes):
        idx = rng.permutation(np.flatnonzero(y == c))
        train[idx[:train_per_class]] = True
        val[idx[train_per_class : train_per_class + val_per_class]] = True
        test[idx[train_per_class + val_per_class :]] = True
    return train, val, test
