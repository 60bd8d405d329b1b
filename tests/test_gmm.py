"""TransformerGMM: the transformer path, the fallback, invariances and GaussianMixture's surface."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from conftest import TINY_CHECKPOINT, OneStandardization, make_blobs, transformer_estimates
from scipy.stats import multivariate_normal
from sklearn.exceptions import ConvergenceWarning
from sklearn.mixture import GaussianMixture

from transformer_gmm import (
    CheckpointError,
    FallbackWarning,
    TransformerClusterer,
    TransformerGMM,
    _fitting,
    fit_many,
)
from transformer_gmm.engine import fit, model_cache, runs
from transformer_gmm.engine.standardize import subsample_rows

COVARIANCE_TYPES = ["full", "tied", "diag", "spherical"]


def _sorted_means(means):
    return means[np.lexsort(means.T[::-1])]


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_transformer_path_runs_end_to_end(three_blobs, covariance_type):
    # The tiny checkpoint has random weights, so its estimate may lead EM to a local
    # optimum; the trained checkpoint's accuracy is measured by benchmarks/accuracy.py.
    # One random_state for both fits: the 180 points exceed the tiny model's context, so
    # each fit reads a random subset, and the two must read the same one.
    params = dict(
        covariance_type=covariance_type, checkpoint=TINY_CHECKPOINT, n_init=1, random_state=0
    )
    raw = TransformerGMM(3, max_iter=0, **params).fit(three_blobs)
    gmm = TransformerGMM(3, **params).fit(three_blobs)
    assert gmm.init_method_ == "transformer" and gmm.device_ == "cpu"
    assert gmm.converged_ and gmm.n_iter_ >= 1
    # EM from the transformer's estimate never lowers its lower bound (on these separated
    # blobs the M-step readout is already close to the optimum).
    assert gmm.lower_bound_ >= raw.lower_bound_ - 1e-9
    assert gmm.weights_.sum() == pytest.approx(1.0)
    expected_precisions = (
        np.linalg.inv(gmm.covariances_)
        if covariance_type in ("full", "tied")
        else 1 / gmm.covariances_
    )
    np.testing.assert_allclose(gmm.precisions_, expected_precisions, rtol=1e-8)


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_restarts_recover_separated_blobs(three_blobs, covariance_type):
    gmm = TransformerGMM(
        3, covariance_type=covariance_type, checkpoint=TINY_CHECKPOINT, n_init=4, random_state=0
    ).fit(three_blobs)
    np.testing.assert_allclose(_sorted_means(gmm.means_), [[-8, 0], [0, 8], [8, 0]], atol=0.5)
    np.testing.assert_allclose(gmm.weights_, 1 / 3, atol=0.02)


def test_max_iter_zero_returns_the_transformers_estimate(three_blobs):
    X = three_blobs[:60]  # within the tiny model's context: the backbone reads every point
    gmm = TransformerGMM(3, checkpoint=TINY_CHECKPOINT, max_iter=0, n_init=1).fit(X)
    backbone = model_cache.load_backbone(TINY_CHECKPOINT)
    config = backbone.config
    noise = backbone.reading_config.noise_directions
    standardization = OneStandardization(X, config.d_max, 3, noise)
    Z = standardization.transform(X).astype(np.float64)
    estimate = transformer_estimates(backbone, [Z], 3, "cpu")[0]
    # The transformer's responsibilities under its own mixture (scored on the two real
    # coordinates), and one M-step on them.
    densities = np.stack(
        [
            w * multivariate_normal(m[:2], s**2 * np.eye(2)).pdf(Z[:, :2])
            for w, m, s in zip(estimate.weights, estimate.means, estimate.scales[:, 0], strict=True)
        ],
        axis=1,
    )
    resp = densities / densities.sum(axis=1, keepdims=True)
    # Two float32 forward passes (the fit's batch and this one) round by the thread count:
    # about 1e-6 apart on two threads.
    np.testing.assert_allclose(gmm.weights_, resp.mean(axis=0), rtol=1e-5)
    np.testing.assert_allclose(gmm.means_, resp.T @ X / resp.sum(axis=0)[:, None], rtol=1e-5)
    assert gmm.n_iter_ == 0 and not gmm.converged_
    assert gmm.init_method_ == "transformer"


def test_default_checkpoint_missing_falls_back_with_warning(three_blobs, no_bundled_checkpoint):
    with pytest.warns(FallbackWarning, match="No default checkpoint is bundled"):
        gmm = TransformerGMM(3, random_state=0).fit(three_blobs)
    assert gmm.init_method_ == "k-means++"


def test_component_count_without_a_head_falls_back_with_warning(three_blobs):
    with pytest.warns(FallbackWarning, match="heads for 2 to 4 components, not 5"):
        gmm = TransformerGMM(5, checkpoint=TINY_CHECKPOINT, random_state=0).fit(three_blobs)
    assert gmm.init_method_ == "k-means++" and gmm.converged_


def test_explicit_none_and_single_component_do_not_warn(three_blobs):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        TransformerGMM(3, checkpoint=None, random_state=0).fit(three_blobs)
        TransformerGMM(1, random_state=0).fit(three_blobs)


def test_named_checkpoint_that_cannot_be_found_is_an_error(three_blobs, tmp_path):
    with pytest.raises(CheckpointError):
        TransformerGMM(3, checkpoint=str(tmp_path / "nowhere")).fit(three_blobs)
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError):
        TransformerGMM(3, checkpoint=str(tmp_path / "empty")).fit(three_blobs)


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_fallback_matches_sklearn_gaussian_mixture(covariance_type):
    X = make_blobs(80, [[-6.0, 0.0, 1.0], [0.0, 6.0, 0.0], [6.0, 0.0, -1.0]], seed=3)
    ours = TransformerGMM(3, covariance_type=covariance_type, checkpoint=None, random_state=0)
    theirs = GaussianMixture(3, covariance_type=covariance_type, random_state=0)
    ours.fit(X)
    theirs.fit(X)
    np.testing.assert_allclose(_sorted_means(ours.means_), _sorted_means(theirs.means_), atol=1e-3)
    assert ours.lower_bound_ == pytest.approx(theirs.lower_bound_, abs=1e-3)


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_scoring_surface_agrees_with_sklearn_on_the_same_parameters(three_blobs, covariance_type):
    ours = TransformerGMM(3, covariance_type=covariance_type, checkpoint=TINY_CHECKPOINT)
    ours.fit(three_blobs)
    # Give sklearn exactly our parameters and compare every derived quantity.
    theirs = GaussianMixture(3, covariance_type=covariance_type)
    theirs.fit(three_blobs[:10])  # sets its fitted flags; the parameters are overwritten below
    for name in ["weights_", "means_", "covariances_", "precisions_cholesky_", "precisions_"]:
        setattr(theirs, name, getattr(ours, name))
    X = make_blobs(20, [[0.0, 0.0]], scale=6.0, seed=4)
    np.testing.assert_allclose(ours.score_samples(X), theirs.score_samples(X), rtol=1e-10)
    np.testing.assert_allclose(ours.predict_proba(X), theirs.predict_proba(X), atol=1e-12)
    np.testing.assert_array_equal(ours.predict(X), theirs.predict(X))
    assert ours.score(X) == pytest.approx(theirs.score(X), rel=1e-12)
    assert ours.bic(X) == pytest.approx(theirs.bic(X), rel=1e-12)
    assert ours.aic(X) == pytest.approx(theirs.aic(X), rel=1e-12)


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_scoring_reads_the_rows_without_changing_them(three_blobs, covariance_type):
    # Scoring reads float64 rows in place (no copy); a read-only copy scores the same.
    gmm = TransformerGMM(3, covariance_type=covariance_type, checkpoint=None).fit(three_blobs)
    X = make_blobs(50, [[0.0, 0.0]], scale=6.0, seed=5)
    kept, read_only = X.copy(), X.copy()
    read_only.setflags(write=False)
    for method in ("score_samples", "predict_proba", "predict"):
        np.testing.assert_array_equal(getattr(gmm, method)(X), getattr(gmm, method)(read_only))
    np.testing.assert_array_equal(X, kept)


PARAMETERS = ["weights_", "means_", "covariances_", "precisions_", "precisions_cholesky_"]


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
@pytest.mark.parametrize("checkpoint", [TINY_CHECKPOINT, None])
def test_float32_data_gives_float32_parameters_as_gaussian_mixture_does(
    three_blobs, covariance_type, checkpoint
):
    X32 = three_blobs.astype(np.float32)
    params = dict(covariance_type=covariance_type, random_state=0)
    ours = TransformerGMM(3, checkpoint=checkpoint, **params).fit(X32)
    theirs = GaussianMixture(3, **params).fit(X32)
    wide = TransformerGMM(3, checkpoint=checkpoint, **params).fit(X32.astype(np.float64))
    for name in PARAMETERS:
        assert getattr(ours, name).dtype == getattr(theirs, name).dtype == np.float32, name
        assert getattr(wide, name).dtype == np.float64, name
        # EM ran in float64 either way: the float32 fit is the float64 fit, rounded.
        np.testing.assert_allclose(getattr(ours, name), getattr(wide, name), rtol=1e-6)
    X_new, _ = ours.sample(50)
    assert np.isfinite(ours.score_samples(X_new)).all()


def test_fit_many_keeps_each_datasets_dtype(three_blobs):
    X32, X64 = three_blobs.astype(np.float32), three_blobs[:90]
    mixed = fit_many([X32, X64], 3, checkpoint=TINY_CHECKPOINT, random_state=0)
    stacked = fit_many(np.stack([X32, X32]), 3, checkpoint=None, random_state=0)
    expected = [np.float32, np.float64, np.float32, np.float32]
    for gmm, dtype in zip([*mixed, *stacked], expected, strict=True):
        assert {getattr(gmm, name).dtype for name in PARAMETERS} == {np.dtype(dtype)}
    arrays = fit_many([X32, X32[:90]], 3, checkpoint=None, random_state=0, output="arrays")
    assert {a.dtype for a in (arrays.weights, arrays.means, arrays.covariances)} == {
        np.dtype(np.float32)
    }
    arrays = fit_many([X32, X64], 3, checkpoint=None, random_state=0, output="arrays")
    assert arrays.precisions_cholesky.dtype == np.float64  # float32 only when all are


def test_fit_predict_equals_fit_then_predict(three_blobs):
    gmm = TransformerGMM(3, checkpoint=TINY_CHECKPOINT, random_state=0)
    labels = gmm.fit_predict(three_blobs)
    np.testing.assert_array_equal(labels, gmm.predict(three_blobs))


@pytest.mark.parametrize("checkpoint", [TINY_CHECKPOINT, None])
def test_same_random_state_same_result(checkpoint):
    # 200 points > the tiny model's context of 64: the subsample is seeded too.
    X = make_blobs(50, [[-4.0, 0.0], [0.0, 4.0], [4.0, 0.0], [0.0, -4.0]], seed=5)
    first = TransformerGMM(4, checkpoint=checkpoint, n_init=4, random_state=7).fit(X)
    second = TransformerGMM(4, checkpoint=checkpoint, n_init=4, random_state=7).fit(X)
    np.testing.assert_array_equal(first.means_, second.means_)
    np.testing.assert_array_equal(first.covariances_, second.covariances_)


def test_fit_does_not_depend_on_row_order(three_blobs):
    X = three_blobs[:60]  # within the tiny model's context, so no subsample is drawn
    shuffled = X[np.random.default_rng(0).permutation(60)]
    # n_init=1: the transformer's start only (tests/test_row_order.py tests the others).
    a = TransformerGMM(3, checkpoint=TINY_CHECKPOINT, max_iter=0, n_init=1).fit(X)
    b = TransformerGMM(3, checkpoint=TINY_CHECKPOINT, max_iter=0, n_init=1).fit(shuffled)
    np.testing.assert_allclose(a.means_, b.means_, rtol=1e-5, atol=1e-6)
    # n_init=2: both of the transformer's starts, still no k-means++.
    a = TransformerGMM(3, checkpoint=TINY_CHECKPOINT, n_init=2).fit(X)
    b = TransformerGMM(3, checkpoint=TINY_CHECKPOINT, n_init=2).fit(shuffled)
    np.testing.assert_allclose(a.means_, b.means_, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(a.covariances_, b.covariances_, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n_init", [2, 5])
def test_more_starts_never_lower_the_kept_lower_bound(three_blobs, n_init):
    """The first start is the same whatever n_init; the kept one has the best bound."""
    one = TransformerGMM(3, checkpoint=TINY_CHECKPOINT, n_init=1, random_state=0).fit(three_blobs)
    more = TransformerGMM(3, checkpoint=TINY_CHECKPOINT, n_init=n_init, random_state=0)
    more.fit(three_blobs)
    assert more.lower_bound_ >= one.lower_bound_ - 1e-12
    if n_init == 2:  # both starts are the transformer's
        assert more.init_method_ == "transformer"


def test_a_kmeans_start_must_beat_the_transformers_by_the_margin():
    n = 128  # rows per dataset: the gain in total log-likelihood is n times the bound's
    margin = runs.KMEANS_MARGIN_NATS
    small, large = (margin - 1) / n, (margin + 1) / n
    bounds = torch.tensor(
        [
            [-1.0, -1.2, -1.0 + small, -3.0],  # k-means++ likelier, not by the margin
            [-1.0, -0.9, -0.9 + large, -3.0],  # by more than the margin over the best
            [float("nan"), -2.0, -2.0, -2.0 + large],  # a broken run never wins
            [-float("inf"), -float("inf"), -5.0, -4.0],  # no finite transformer bound
        ],
        dtype=torch.float64,
    )
    assert runs.choose(bounds, 2, n).tolist() == [0, 2, 3, 3]
    # Per dataset: the same gains over 10 times fewer rows fall short of the margin.
    rows = torch.tensor([n, n // 10, n, n])
    assert runs.choose(bounds, 2, rows).tolist() == [0, 1, 3, 3]
    # Starts of one kind: the highest bound, as in scikit-learn.
    assert runs.choose(bounds[:, 2:], 0, n).tolist() == [0, 0, 1, 1]
    assert runs.choose(bounds[:, :2], 2, n).tolist() == [0, 1, 1, 0]


@pytest.mark.parametrize(
    "margin, kept", [(float("inf"), "transformer"), (-float("inf"), "k-means++")]
)
def test_fit_keeps_the_start_the_margin_says(three_blobs, monkeypatch, margin, kept):
    """fit reads the margin: an infinite one always keeps the transformer's start, one of
    minus infinity a k-means++ start."""
    monkeypatch.setattr(runs, "KMEANS_MARGIN_NATS", margin)
    gmm = TransformerGMM(3, checkpoint=TINY_CHECKPOINT, n_init=6, random_state=0)
    assert gmm.fit(three_blobs).init_method_ == kept


@pytest.mark.parametrize(
    "n_init, uses_transformer, starts",
    [
        ("auto", True, (2, 2)),
        ("auto", False, (0, 1)),
        (1, True, (1, 0)),
        (2, True, (2, 0)),
        (5, True, (2, 3)),
        (3, False, (0, 3)),
    ],
)
def test_n_init_splits_into_transformer_and_kmeans_starts(n_init, uses_transformer, starts):
    params = TransformerGMM(n_init=n_init)._fit_params()
    assert _fitting.n_starts(params, uses_transformer) == starts


@pytest.mark.parametrize(
    "n_init, n_views, max_iter, starts",
    [("auto", 3, 100, (6, 2)), ("auto", 3, 0, (6, 0)), (5, 2, 100, (4, 1)), (3, 2, 100, (3, 0))],
)
def test_each_view_adds_two_transformer_starts(n_init, n_views, max_iter, starts):
    gmm = TransformerGMM(n_init=n_init, n_views=n_views, max_iter=max_iter)
    assert _fitting.n_starts(gmm._fit_params(), True) == starts
    assert _fitting.n_starts(gmm._fit_params(), False) == (0, 1 if n_init == "auto" else n_init)


def test_more_views_never_lower_the_transformers_own_lower_bound(three_blobs):
    """With max_iter=0 the kept estimate is the likeliest of the views' starts, and the
    views' starts begin with those of fewer views."""
    # random_state=1: a subsample of the 180 rows where the first view is not the best.
    params = dict(checkpoint=TINY_CHECKPOINT, max_iter=0, random_state=1)
    fits = [TransformerGMM(3, n_views=v, **params).fit(three_blobs) for v in (1, 2, 4)]
    bounds = [gmm.lower_bound_ for gmm in fits]
    # The float32 backbone may round a view's reading differently in a larger batch.
    assert bounds[0] <= bounds[1] + 1e-6 and bounds[1] <= bounds[2] + 1e-6
    assert bounds[0] < bounds[2] - 1e-3  # the tiny model's random weights read views differently


def test_max_iter_zero_keeps_the_transformers_own_estimate_by_default(three_blobs):
    params = TransformerGMM(max_iter=0)._fit_params()
    assert _fitting.n_starts(params, True) == (2, 0)  # no k-means++ start
    assert _fitting.n_starts(params, False) == (0, 1)
    gmm = TransformerGMM(3, checkpoint=TINY_CHECKPOINT, max_iter=0, random_state=0)
    assert gmm.fit(three_blobs).init_method_ == "transformer" and gmm.n_iter_ == 0


@pytest.mark.parametrize("n_features", [2, 7])  # 7 > K - 1 = 2: goes through the projection
def test_translation_and_scaling_map_the_means(n_features):
    rng = np.random.default_rng(6)
    X = make_blobs(20, rng.uniform(-5, 5, (3, n_features)), seed=6)
    a, b = 3.5, rng.normal(size=n_features) * 10
    for max_iter in [0, 100]:
        params = dict(checkpoint=TINY_CHECKPOINT, max_iter=max_iter, n_init=1)
        base = TransformerGMM(3, **params).fit(X)
        moved = TransformerGMM(3, **params).fit(a * X + b)
        # The backbone reads float32, so rounding differs in the last bits of its input.
        np.testing.assert_allclose(moved.means_, a * base.means_ + b, rtol=1e-4, atol=1e-4 * a)
        np.testing.assert_allclose(moved.weights_, base.weights_, rtol=1e-4)


def test_sample_draws_from_the_fitted_mixture(three_blobs):
    gmm = TransformerGMM(3, checkpoint=TINY_CHECKPOINT, random_state=0).fit(three_blobs)
    X, y = gmm.sample(3000)
    assert X.shape == (3000, 2) and y.shape == (3000,)
    for k in range(3):
        np.testing.assert_allclose(X[y == k].mean(axis=0), gmm.means_[k], atol=0.15)
    with pytest.raises(ValueError, match="positive integer"):
        gmm.sample(0)


def test_non_convergence_warns(three_blobs):
    from sklearn.exceptions import ConvergenceWarning

    # scikit-learn's GaussianMixture message, word for word.
    with pytest.warns(ConvergenceWarning, match="did not converge. Try different init"):
        TransformerGMM(3, checkpoint=TINY_CHECKPOINT, max_iter=1, tol=0.0).fit(three_blobs)


def test_n_init_keeps_the_best_lower_bound(three_blobs):
    single = TransformerGMM(3, checkpoint=TINY_CHECKPOINT, max_iter=2, random_state=0)
    several = TransformerGMM(3, checkpoint=TINY_CHECKPOINT, max_iter=2, n_init=5, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        single.fit(three_blobs)
        several.fit(three_blobs)
    assert several.lower_bound_ >= single.lower_bound_


# --- large datasets: the starts are compared on a subsample -------------------------------


@pytest.fixture
def small_selection(monkeypatch):
    """Compare starts on 100 rows, so that a dataset of a few hundred counts as large."""
    monkeypatch.setattr(fit, "SELECTION_ROWS", 100)


@pytest.mark.parametrize("checkpoint", [TINY_CHECKPOINT, None])
def test_large_fit_runs_em_on_all_rows_from_the_best_start(small_selection, checkpoint):
    centers = [[-6.0, 0.0], [0.0, 6.0], [6.0, 0.0], [0.0, -6.0]]
    X = make_blobs(100, centers, seed=11)  # 400 rows > 100
    gmm = TransformerGMM(4, checkpoint=checkpoint, n_init=3, random_state=0).fit(X)
    # The final EM ran on all of X: its lower bound is X's mean log-likelihood, and one
    # more EM step on X (scikit-learn's) from the fit hardly moves it. A fit to the 100
    # rows alone would be off by about 0.1 in both.
    assert gmm.converged_ and gmm.lower_bound_ == pytest.approx(gmm.score(X), abs=1e-3)
    one_more_step = GaussianMixture(
        4,
        weights_init=gmm.weights_,
        means_init=gmm.means_,
        precisions_init=gmm.precisions_,
        max_iter=1,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        one_more_step.fit(X)
    np.testing.assert_allclose(one_more_step.means_, gmm.means_, atol=0.02)
    distances = np.linalg.norm(gmm.means_[:, None] - np.array(centers)[None], axis=-1)
    assert distances.min(axis=0).max() < 0.5  # every true centre found


def test_one_start_is_never_subsampled(small_selection):
    X = make_blobs(100, [[-6.0, 0.0], [0.0, 6.0], [6.0, 0.0]], seed=12)
    subsampled = TransformerGMM(3, checkpoint=TINY_CHECKPOINT, n_init=1, random_state=0).fit(X)
    fit.SELECTION_ROWS = 10**9  # undone by monkeypatch
    whole = TransformerGMM(3, checkpoint=TINY_CHECKPOINT, n_init=1, random_state=0).fit(X)
    np.testing.assert_array_equal(subsampled.means_, whole.means_)
    assert subsampled.n_iter_ == whole.n_iter_


def test_every_fit_of_several_starts_reads_the_selection_rows(small_selection, monkeypatch):
    """The fits read ``fit.SELECTION_ROWS`` when they run, so shrinking it (as the tests
    of large fits do) makes each of them compare its starts on that many rows."""
    taken = []

    def recording(shape, mask, n_rows, generator):
        taken.append(n_rows)
        return subsample_rows(shape, mask, n_rows, generator)

    monkeypatch.setattr(fit, "subsample_rows", recording)
    X = make_blobs(100, [[-6.0, 0.0], [0.0, 6.0], [6.0, 0.0]], seed=12)  # 300 rows > 100
    TransformerGMM(3, checkpoint=None, n_init=2, random_state=0).fit(X)
    TransformerClusterer(3, checkpoint=None, n_init=2, random_state=0).fit(X)
    fit_many([X, X[:50]], 3, checkpoint=None, n_init=2, random_state=0)
    assert taken == [100, 100, 100]
