"""On large data the transformer's starts run Lloyd from their means before their M-step
(``_fitting.LLOYD_FROM_ROWS``; docs/benchmarks.md, "Large real data"). The fits below
lower that threshold so that a few hundred rows take the large-data path."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from transformer_gmm import TransformerGMM, _fitting, fit_many
from transformer_gmm.engine import kmeans


@pytest.fixture
def overlapping() -> np.ndarray:
    """Three overlapping Gaussians, where soft responsibilities and Lloyd's hard labels
    give different means."""
    rng = np.random.default_rng(0)
    centers = np.array([[0.0, 0.0], [2.0, 0.5], [4.0, 0.0]])
    return np.vstack([rng.normal(c, 1.0, size=(100, 2)) for c in centers])


@pytest.fixture
def large_from_100_rows(monkeypatch) -> None:
    monkeypatch.setattr(_fitting, "LLOYD_FROM_ROWS", 100)


def _plan(X, n_rows=None, **params):
    model = TransformerGMM(3, **params)
    return _fitting.mixture_plan(
        model.get_params(), X, None, np.random.RandomState(0), n_rows=n_rows
    )


def test_the_plan_runs_lloyd_from_the_transformer_on_large_data_only(overlapping):
    small, large = overlapping[:50], np.tile(overlapping, (30, 1))  # 9,000 > 8,192 rows
    assert large.shape[0] > _fitting.LLOYD_FROM_ROWS >= small.shape[0]
    assert _plan(large).lloyd_from_transformer
    assert not _plan(small).lloyd_from_transformer
    assert _plan(small, n_rows=len(large)).lloyd_from_transformer  # fit_many: the largest
    # Without a transformer there is no transformer's start to polish.
    assert not _plan(large, checkpoint=None).lloyd_from_transformer
    assert not _plan(large, init_params="kmeans").lloyd_from_transformer


def test_a_large_fit_starts_where_lloyd_from_the_transformers_means_ends(
    overlapping, monkeypatch
):
    params = dict(covariance_type="diag", n_init=1, max_iter=0, random_state=0)
    own = TransformerGMM(3, **params).fit(overlapping)  # 300 rows: the transformer's own
    monkeypatch.setattr(_fitting, "LLOYD_FROM_ROWS", 100)
    polished = TransformerGMM(3, **params).fit(overlapping)
    X = torch.as_tensor(overlapping)[None]
    expected = kmeans.lloyd(X, torch.as_tensor(own.means_)[None], max_iter=300).centers[0]
    np.testing.assert_allclose(polished.means_, expected.numpy(), rtol=0, atol=1e-10)
    labels = kmeans.assign(X, expected[None])[0].numpy()
    np.testing.assert_allclose(polished.weights_, np.bincount(labels, minlength=3) / 300)
    assert np.abs(polished.means_ - own.means_).max() > 0.05  # the test can tell them apart


@pytest.mark.usefixtures("large_from_100_rows")
def test_the_default_fit_and_fit_many_take_the_same_path(overlapping):
    fitted = TransformerGMM(3, random_state=0).fit(overlapping)
    assert fitted.converged_ and np.isfinite(fitted.lower_bound_)
    many = fit_many([overlapping], 3, random_state=0)[0]
    np.testing.assert_allclose(many.means_, fitted.means_, rtol=1e-10, atol=1e-10)


@pytest.mark.usefixtures("large_from_100_rows")
def test_weights_scaled_by_a_constant_give_the_same_large_fit(overlapping):
    weights = np.random.default_rng(1).uniform(size=len(overlapping))
    reference = TransformerGMM(3, n_init=1, random_state=0).fit(overlapping, sample_weight=weights)
    scaled = TransformerGMM(3, n_init=1, random_state=0).fit(
        overlapping, sample_weight=3.0 * weights
    )
    np.testing.assert_array_equal(scaled.predict(overlapping), reference.predict(overlapping))
    np.testing.assert_allclose(scaled.means_, reference.means_, rtol=1e-9, atol=1e-9)
