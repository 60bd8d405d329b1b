"""fit_many: one forward pass and one batched EM give what a loop of fits gives."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import TINY_CHECKPOINT, make_blobs

from transformer_gmm import TransformerGMM, fit_many

ATTRIBUTES = ["weights_", "means_", "covariances_", "lower_bound_"]


def _datasets(sizes, n_features=3, seed=0):
    rng = np.random.default_rng(seed)
    return [
        make_blobs(n, rng.uniform(-6, 6, (3, n_features)), seed=seed + i)
        for i, n in enumerate(sizes)
    ]


@pytest.mark.parametrize("covariance_type", ["full", "spherical"])
def test_transformer_path_equals_a_loop_of_fits(covariance_type):
    # Sizes within the tiny model's context (64): nothing is subsampled, so each fit
    # is deterministic and the batch must reproduce it despite the padding.
    datasets = _datasets([7, 15, 21])  # 21, 45 and 63 points
    batch = fit_many(datasets, 3, covariance_type=covariance_type, checkpoint=TINY_CHECKPOINT)
    for X, fitted in zip(datasets, batch, strict=True):
        alone = TransformerGMM(3, covariance_type=covariance_type, checkpoint=TINY_CHECKPOINT)
        alone.fit(X)
        assert fitted.init_method_ == alone.init_method_ == "transformer"
        assert fitted.n_iter_ == alone.n_iter_
        for name in ATTRIBUTES:
            np.testing.assert_allclose(
                getattr(fitted, name), getattr(alone, name), rtol=1e-4, atol=1e-6, err_msg=name
            )
        np.testing.assert_array_equal(fitted.predict(X), alone.predict(X))


def test_fallback_path_finds_the_same_optima():
    datasets = _datasets([40, 60, 100], seed=3)
    batch = fit_many(datasets, 3, checkpoint=None, n_init=3, random_state=0)
    for X, fitted in zip(datasets, batch, strict=True):
        alone = TransformerGMM(3, checkpoint=None, n_init=3, random_state=0).fit(X)
        assert fitted.lower_bound_ == pytest.approx(alone.lower_bound_, abs=1e-6)
        assert fitted.n_features_in_ == 3


def test_a_three_dimensional_array_is_a_batch_of_equal_datasets():
    stacked = np.stack(_datasets([20, 20]))
    fits = fit_many(stacked, 3, checkpoint=TINY_CHECKPOINT)
    assert len(fits) == 2 and all(f.means_.shape == (3, 3) for f in fits)


def test_bad_batches_raise_clear_errors():
    with pytest.raises(ValueError, match="at least one dataset"):
        fit_many([], 2, checkpoint=None)
    with pytest.raises(ValueError, match="same number of features; got \\[2, 3\\]"):
        fit_many(
            [np.zeros((10, 2)) + np.arange(10)[:, None], _datasets([5])[0]], 2, checkpoint=None
        )
    with pytest.raises(ValueError, match="n_components"):
        fit_many(_datasets([5]), 0, checkpoint=None)
    with pytest.raises(ValueError, match="Input X contains NaN"):
        fit_many([np.full((10, 2), np.nan)], 2, checkpoint=None)
