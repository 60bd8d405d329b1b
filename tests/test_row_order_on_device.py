"""Rows put in canonical order where they are fitted (a GPU's path, run here on the CPU):
the same hashes, the same order and the same fits, to the bit, as numpy's on the host."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from transformer_gmm import TransformerClusterer, TransformerGMM, fit_many
from transformer_gmm.engine import fit, row_order


@pytest.mark.parametrize("n_features", [5, row_order.WIDE_FROM_COLUMNS + 3])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_device_order_is_numpys(dtype, n_features):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(4, 300, n_features)).astype(dtype)
    big = 1e300 if dtype == np.float64 else 3e38
    X[0, :3] = [[0.0] * n_features, [-0.0] * n_features, [big] * n_features]
    weights = rng.uniform(0.5, 2.0, size=(4, 300))
    for w in (None, weights):
        on_host = row_order.canonical_order(X, w)
        on_device = row_order.canonical_order_on_device(
            torch.from_numpy(X), None if w is None else torch.from_numpy(w)
        )
        on_device = on_device.numpy()
        # The same rows in the same places; rows 0 and 1 of dataset 0 are equal in value
        # (0.0 and -0.0, which compare equal), and may come in either order.
        assert (on_device != on_host).sum() <= 2
        rows = [np.take_along_axis(X, order[..., None], axis=1) for order in (on_device, on_host)]
        np.testing.assert_array_equal(*rows)


@pytest.fixture
def hashed_on_device(monkeypatch):
    monkeypatch.setattr(fit, "hash_on_device", lambda device: True)


def _blobs(seed: int, n: int = 120) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 3)) + rng.choice([-5.0, 0.0, 5.0], size=(n, 1))


@pytest.mark.parametrize("checkpoint", [None, "default"])
def test_fits_are_the_hosts(hashed_on_device, checkpoint, monkeypatch):
    X, weights = _blobs(0), np.random.default_rng(1).uniform(0.5, 2.0, 120)
    estimators = [
        lambda: TransformerGMM(3, checkpoint=checkpoint, random_state=0),
        lambda: TransformerClusterer(3, checkpoint=checkpoint, random_state=0),
    ]
    on_device = [make().fit(X, sample_weight=weights) for make in estimators]
    many_on_device = fit_many(np.stack([X, _blobs(2)]), 3, checkpoint=checkpoint,
                              random_state=0, output="arrays")
    monkeypatch.undo()
    on_host = [make().fit(X, sample_weight=weights) for make in estimators]
    many_on_host = fit_many(np.stack([X, _blobs(2)]), 3, checkpoint=checkpoint,
                            random_state=0, output="arrays")
    np.testing.assert_array_equal(on_device[0].means_, on_host[0].means_)
    np.testing.assert_array_equal(on_device[0].covariances_, on_host[0].covariances_)
    np.testing.assert_array_equal(on_device[1].cluster_centers_, on_host[1].cluster_centers_)
    np.testing.assert_array_equal(on_device[1].labels_, on_host[1].labels_)
    np.testing.assert_array_equal(many_on_device.means, many_on_host.means)


def test_equal_rows_are_ordered_by_weight_alike():
    """Equal rows of different weights: by weight on both paths, and the same order when
    every weight is scaled by one constant."""
    rng = np.random.default_rng(3)
    X = np.repeat(rng.normal(size=(20, 3)), 3, axis=0)  # each row three times
    weights = rng.uniform(0.5, 2.0, size=len(X))
    on_host = row_order.canonical_order(X, weights)
    on_device = row_order.canonical_order_on_device(torch.from_numpy(X), torch.from_numpy(weights))
    np.testing.assert_array_equal(on_device.numpy(), on_host)
    np.testing.assert_array_equal(row_order.canonical_order(X, 0.37 * weights), on_host)
    ordered = weights[on_host].reshape(20, 3)  # equal rows are adjacent, by weight
    assert (np.diff(ordered, axis=1) > 0).all()
