"""Scaling every sample weight by one positive constant leaves the fit as it is, labels
included (scikit-learn's ``test_scaled_weights``, over 20 seeds and three constants): the
canonical row order breaks ties between equal rows by the weights' order, not by their
values."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.datasets import make_blobs

from transformer_gmm import TransformerClusterer, TransformerGMM


@pytest.mark.parametrize("make", [
    lambda: TransformerGMM(3, n_init=1, random_state=0),
    lambda: TransformerGMM(3, random_state=0),
    lambda: TransformerClusterer(3, n_init=1, random_state=0),
])
def test_scaled_weights_give_the_same_fit(make):
    X, _ = make_blobs(n_samples=100, n_features=5, centers=3, random_state=42)
    X = np.vstack([X, X[:10]])  # equal rows, of different weights below
    for seed in range(20):
        weights = np.random.RandomState(seed).uniform(size=len(X))
        reference = make().fit(X, sample_weight=weights)
        for constant in (0.5, 3.0, 1e3):
            scaled = make().fit(X, sample_weight=constant * weights)
            np.testing.assert_array_equal(scaled.predict(X), reference.predict(X))
            if hasattr(reference, "means_"):
                np.testing.assert_allclose(scaled.means_, reference.means_, rtol=1e-9, atol=1e-9)
            else:
                np.testing.assert_allclose(scaled.cluster_centers_, reference.cluster_centers_,
                                           rtol=1e-9, atol=1e-9)
