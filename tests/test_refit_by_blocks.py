"""Above REFIT_BY_BLOCKS_ROWS rows, the chosen start's run on every row reads them by
blocks (engine.blocks): the same fit as in memory, to rounding, in the data's own dtype."""

import numpy as np
import pytest

from transformer_gmm import TransformerClusterer, TransformerGMM
from transformer_gmm.engine import blocks
from transformer_gmm.engine import fit as engine_fit

N_ROWS = 12_000  # above SELECTION_ROWS: the starts compete on a subsample


def _blobs(dtype) -> np.ndarray:
    rng = np.random.default_rng(0)
    means = rng.uniform(-5, 5, (4, 3))
    labels = rng.integers(0, 4, N_ROWS)
    return (means[labels] + rng.standard_normal((N_ROWS, 3))).astype(dtype)


def _fit_both(make, X, monkeypatch):
    """The fit in memory, then by blocks (counting the passes by blocks)."""
    in_memory = make().fit(X)
    monkeypatch.setattr(engine_fit, "REFIT_BY_BLOCKS_ROWS", 10_000)
    calls = []
    for name in ("em_from", "lloyd_from"):
        original = getattr(blocks, name)
        monkeypatch.setattr(
            blocks, name, lambda *a, _f=original, **k: calls.append(_f) or _f(*a, **k)
        )
    by_blocks = make().fit(X)
    assert calls, "the fit did not read its rows by blocks"
    return in_memory, by_blocks


@pytest.mark.parametrize("covariance_type", ["full", "tied", "diag", "spherical"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_mixture_refit_by_blocks_matches_in_memory(covariance_type, dtype, monkeypatch):
    X = _blobs(dtype)
    a, b = _fit_both(
        lambda: TransformerGMM(4, covariance_type=covariance_type, random_state=0),
        X,
        monkeypatch,
    )
    assert b.means_.dtype == dtype and b.covariances_.dtype == dtype
    assert (a.n_iter_, a.converged_, a.init_method_) == (b.n_iter_, b.converged_, b.init_method_)
    tol = 1e-9 if dtype == np.float64 else 1e-5
    for name in ("weights_", "means_", "covariances_", "precisions_cholesky_"):
        np.testing.assert_allclose(getattr(b, name), getattr(a, name), rtol=tol, atol=tol)
    assert b.lower_bound_ == pytest.approx(a.lower_bound_, rel=1e-10)
    np.testing.assert_allclose(b.lower_bounds_, a.lower_bounds_, rtol=1e-10)
    np.testing.assert_array_equal(b.predict(X), a.predict(X))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_kmeans_refit_by_blocks_matches_in_memory(dtype, monkeypatch):
    X = _blobs(dtype)
    a, b = _fit_both(lambda: TransformerClusterer(4, random_state=0), X, monkeypatch)
    assert b.cluster_centers_.dtype == dtype
    assert a.n_iter_ == b.n_iter_
    np.testing.assert_array_equal(b.labels_, a.labels_)
    np.testing.assert_allclose(b.cluster_centers_, a.cluster_centers_, rtol=1e-6, atol=1e-6)
    assert b.inertia_ == pytest.approx(a.inertia_, rel=1e-9)


def test_weighted_or_traced_fits_stay_in_memory(monkeypatch):
    """Sample weights, and a traced (verbose) Lloyd, read every row in memory."""
    X = _blobs(np.float64)
    monkeypatch.setattr(engine_fit, "REFIT_BY_BLOCKS_ROWS", 10_000)
    monkeypatch.setattr(blocks, "em_from", None)  # a call would fail
    monkeypatch.setattr(blocks, "lloyd_from", None)
    weights = np.random.default_rng(1).uniform(0.5, 2.0, N_ROWS)
    TransformerGMM(4, random_state=0).fit(X, sample_weight=weights)
    TransformerClusterer(4, random_state=0, verbose=1).fit(X)
