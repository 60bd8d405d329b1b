"""The order of the rows never changes a fit: each dataset's rows are put in a canonical
order (transformer_gmm.engine.row_order) before anything reads them by position."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from conftest import TINY_CHECKPOINT, make_blobs

from transformer_gmm import TransformerClusterer, TransformerGMM, fit_many
from transformer_gmm.engine import fit
from transformer_gmm.engine.plan import GivenStarts, MixturePlan
from transformer_gmm.engine.row_order import WIDE_FROM_COLUMNS, canonical_order, row_hashes

FITTED = ["weights_", "means_", "covariances_", "precisions_cholesky_", "lower_bound_"]
CENTERS = [[-5.0, 0.0], [0.0, 5.0], [4.0, -1.0]]


def _fit_both(X, permutation, **params):
    """The same estimator fitted on X and on X's rows permuted."""
    fits = []
    for data in (X, X[permutation]):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # ConvergenceWarning at max_iter=1
            fits.append(TransformerGMM(**params).fit(data))
    return fits


def _assert_same_fit(a, b, X, permutation):
    for name in FITTED:
        np.testing.assert_allclose(getattr(a, name), getattr(b, name), rtol=0, atol=1e-10)
    assert (a.n_iter_, a.init_method_) == (b.n_iter_, b.init_method_)
    np.testing.assert_array_equal(a.predict(X)[permutation], b.predict(X[permutation]))


# --- the canonical order ---------------------------------------------------------------


@pytest.mark.parametrize("shape", [(1000, 3), (40, 2000)])
def test_the_canonical_order_undoes_any_permutation(shape):
    X = np.random.default_rng(0).normal(size=shape)
    permutation = np.random.default_rng(1).permutation(shape[0])
    np.testing.assert_array_equal(
        X[canonical_order(X)], X[permutation][canonical_order(X[permutation])]
    )


@pytest.mark.parametrize("n_features", [2, WIDE_FROM_COLUMNS])
def test_equal_numbers_hash_equally_and_weights_travel_with_their_rows(n_features):
    rows = np.zeros((4, n_features))
    rows[:, :2] = [[1.5, 0.0], [1.5, -0.0], [0.0, 1.5], [-1.5, 0.0]]
    rows[1, 2:] = -0.0
    h = row_hashes(rows)
    assert h[0] == h[1] and len(set(h[[0, 2, 3]].tolist())) == 3  # -0.0 is 0.0
    np.testing.assert_array_equal(row_hashes(rows.astype(np.float32)), h)
    # Equal rows of different weights sort apart, each with its weight.
    weights = np.array([1.0, 3.0, 1.0, 1.0])
    order = canonical_order(rows, weights)
    flipped = canonical_order(rows[[1, 0, 2, 3]], weights[[1, 0, 2, 3]])
    np.testing.assert_array_equal(weights[order], weights[[1, 0, 2, 3]][flipped])


@pytest.mark.parametrize("n_features", [3, WIDE_FROM_COLUMNS + 1])
def test_rows_hash_the_same_in_blocks_of_any_size(monkeypatch, n_features):
    # Narrow rows chain their columns, wide ones mix them at once: both block by rows.
    from transformer_gmm.engine import row_order

    X = np.random.default_rng(0).normal(size=(3, 50, n_features))
    monkeypatch.setattr(row_order, "_BLOCK_VALUES", 1 << 30)  # one block
    whole = row_hashes(X)
    for rows_per_block in (7, 1):
        values = rows_per_block * (n_features if n_features >= WIDE_FROM_COLUMNS else 1)
        monkeypatch.setattr(row_order, "_BLOCK_VALUES", values)
        blocks = row_order._row_blocks(150, values // rows_per_block)
        assert len(blocks) == -(-150 // rows_per_block)
        np.testing.assert_array_equal(row_hashes(X), whole)
    assert len(set(whole.ravel().tolist())) == whole.size


def test_a_batch_is_ordered_dataset_by_dataset():
    batch = np.random.default_rng(0).normal(size=(4, 50, 2))
    order = canonical_order(batch)
    for X, o in zip(batch, order, strict=True):
        np.testing.assert_array_equal(o, canonical_order(X))


# --- fits: the same to rounding, whatever the order ----------------------------------
# 200 rows exceed the tiny model's context (64) and the default's (128), so the
# transformer reads a subsample; 10^5 exceed SELECTION_ROWS, so several starts compete
# on a subsample too. k-means++ draws rows by position at any size.


@pytest.mark.parametrize("checkpoint", ["default", TINY_CHECKPOINT, None])
@pytest.mark.parametrize("max_iter", [0, 100])
def test_permuted_rows_give_the_same_fit(checkpoint, max_iter):
    X = make_blobs(67, CENTERS, seed=2)[:200]
    permutation = np.random.default_rng(3).permutation(len(X))
    params = dict(n_components=3, checkpoint=checkpoint, max_iter=max_iter, random_state=0)
    _assert_same_fit(*_fit_both(X, permutation, n_init=4, **params), X, permutation)


@pytest.mark.parametrize("checkpoint", ["default", None])
@pytest.mark.parametrize("max_iter", [0, 5])
def test_permuted_rows_give_the_same_fit_on_many_rows(checkpoint, max_iter):
    X = make_blobs(33_334, CENTERS, seed=4)[:100_000]
    assert len(X) > fit.SELECTION_ROWS
    permutation = np.random.default_rng(5).permutation(len(X))
    params = dict(n_components=3, checkpoint=checkpoint, max_iter=max_iter, random_state=0)
    _assert_same_fit(*_fit_both(X, permutation, n_init=3, **params), X, permutation)


@pytest.mark.parametrize("init_params", ["kmeans", "k-means++"])
def test_weights_and_scikit_learn_starts_follow_their_rows(init_params):
    X = make_blobs(67, CENTERS, seed=6)[:200]
    weights = np.random.default_rng(7).integers(1, 4, len(X)).astype(float)
    weights[:20] = 0.0
    permutation = np.random.default_rng(8).permutation(len(X))
    fits = []
    for p in (np.arange(len(X)), permutation):
        gmm = TransformerGMM(3, init_params=init_params, n_init=3, random_state=0)
        fits.append(gmm.fit(X[p], sample_weight=weights[p]))
    _assert_same_fit(*fits, X, permutation)


def test_given_responsibilities_stay_with_their_rows():
    X = make_blobs(50, CENTERS, seed=9)
    resp = np.random.default_rng(10).dirichlet(np.ones(3), size=(2, len(X)))  # (R, N, K)
    permutation = np.random.default_rng(11).permutation(len(X))
    options = dict(n_components=3, covariance_type="full", reg_covar=1e-6, max_iter=100, tol=1e-3)
    fits = [
        fit.fit(
            MixturePlan(
                **options, device="cpu", seed=0, n_kmeans_inits=1, given=GivenStarts(resp=r)
            ),
            [X[p]],
        )
        for p, r in [(np.arange(len(X)), resp), (permutation, resp[:, permutation])]
    ]
    for name in ["weights", "means", "covariances", "lower_bound"]:
        np.testing.assert_allclose(getattr(fits[0], name), getattr(fits[1], name), atol=1e-10)


@pytest.mark.parametrize("checkpoint", [TINY_CHECKPOINT, None])
@pytest.mark.parametrize("sizes", [(150, 150, 150), (150, 90, 201)])
def test_fit_many_does_not_depend_on_the_order_within_each_dataset(checkpoint, sizes):
    datasets = [make_blobs(70, CENTERS, seed=12 + i)[:n] for i, n in enumerate(sizes)]
    rng = np.random.default_rng(13)
    shuffled = [X[rng.permutation(len(X))] for X in datasets]
    if len(set(sizes)) == 1:  # one 3-D array, ordered in one batched sort
        datasets, shuffled = np.stack(datasets), np.stack(shuffled)
    params = dict(checkpoint=checkpoint, n_init=3, random_state=0, output="arrays")
    a, b = fit_many(datasets, 3, **params), fit_many(shuffled, 3, **params)
    for name in ["weights", "means", "covariances", "lower_bound"]:
        np.testing.assert_allclose(getattr(a, name), getattr(b, name), rtol=0, atol=1e-10)


# --- the clusterer -----------------------------------------------------------------------


@pytest.mark.parametrize("checkpoint", ["default", None])
@pytest.mark.parametrize("n_rows", [200, 100_000])
@pytest.mark.parametrize("weighted", [False, True])
def test_permuted_rows_give_the_same_clustering(checkpoint, n_rows, weighted):
    X = make_blobs(n_rows // 3 + 1, CENTERS, seed=4)[:n_rows]
    permutation = np.random.default_rng(5).permutation(n_rows)
    weights = np.random.default_rng(6).uniform(0.5, 2.0, n_rows) if weighted else None
    fits = []
    for rows in (np.arange(n_rows), permutation):
        params = dict(checkpoint=checkpoint, n_init=3, random_state=0)
        sample_weight = None if weights is None else weights[rows]
        fits.append(TransformerClusterer(3, **params).fit(X[rows], sample_weight=sample_weight))
    a, b = fits
    np.testing.assert_allclose(a.cluster_centers_, b.cluster_centers_, rtol=0, atol=1e-10)
    np.testing.assert_array_equal(a.labels_[permutation], b.labels_)
    assert (a.n_iter_, a.init_method_) == (b.n_iter_, b.init_method_)
    np.testing.assert_allclose(a.inertia_, b.inertia_, rtol=1e-12)
