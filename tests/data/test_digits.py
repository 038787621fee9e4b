"""The digits loader reads scikit-learn's bundled CSV itself (no sklearn import on the driver's path): it must give
exactly load_digits' data, and a stratified, disjoint, seed-determined split."""

import numpy as np
import pytest

from raytrain.data import digits


def test_load_matches_sklearn_load_digits():
    from sklearn.datasets import load_digits

    images, labels = digits.load()
    reference = load_digits()
    assert images.shape == (1797, 1, 8, 8) and images.dtype == np.float32
    assert np.array_equal(images[:, 0] * 16.0, reference.images.astype(np.float32))
    assert np.array_equal(labels, reference.target)
    assert 0.0 <= images.min() and images.max() <= 1.0


@pytest.mark.parametrize("val_fraction", [0.1, 0.2, 0.5])
def test_split_is_stratified_disjoint_and_complete(val_fraction):
    _, labels = digits.load()
    train_idx, val_idx = digits.stratified_split(labels, val_fraction, seed=0)
    assert len(np.intersect1d(train_idx, val_idx)) == 0
    assert len(train_idx) + len(val_idx) == len(labels)
    counts, val_counts = np.bincount(labels), np.bincount(labels[val_idx], minlength=10)
    assert np.all(np.abs(val_counts - val_fraction * counts) <= 1)


def test_split_depends_on_the_seed_only():
    _, labels = digits.load()
    a, b, c = (digits.stratified_split(labels, 0.2, seed) for seed in (0, 0, 1))
    assert np.array_equal(a[1], b[1])
    assert not np.array_equal(a[1], c[1])
