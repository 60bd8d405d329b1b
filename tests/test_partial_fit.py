"""partial_fit of both estimators: the first batch is fitted as fit fits it, each later one
is a step of stepwise EM (TransformerGMM) or mini-batch k-means (TransformerClusterer)."""

from __future__ import annotations

import pickle
import warnings

import numpy as np
import pytest
from benchmark_scripts import load_benchmark
from conftest import TINY_CHECKPOINT
from sklearn.base import clone
from sklearn.cluster import KMeans, MiniBatchKMeans
from sklearn.utils._param_validation import InvalidParameterError

from transformer_gmm import TransformerClusterer, TransformerGMM, _streaming
from transformer_gmm._fitting import MIXTURE_STREAM_VIEWS

COVARIANCE_TYPES = ["full", "tied", "diag", "spherical"]
GMM_ATTRIBUTES = ["weights_", "means_", "covariances_", "precisions_cholesky_", "precisions_"]


def stationary_mixture(n_samples: int, seed: int = 0) -> np.ndarray:
    """Rows of one fixed mixture of three Gaussians of different shapes in 2-D, shuffled."""
    rng = np.random.default_rng(seed)
    centers = np.array([[-6.0, 0.0], [0.0, 5.0], [5.0, -1.0]])
    scales = np.array([[1.0, 0.5], [0.7, 1.5], [1.2, 1.2]])
    component = rng.choice(3, size=n_samples, p=[0.5, 0.3, 0.2])
    return centers[component] + rng.normal(size=(n_samples, 2)) * scales[component]


def batches(X: np.ndarray, size: int) -> list[np.ndarray]:
    return [X[start : start + size] for start in range(0, len(X), size)]


def with_gaps(X: np.ndarray, share: float = 0.2, seed: int = 0) -> np.ndarray:
    """``X`` with a ``share`` of its entries missing at random, each row keeping one."""
    rng = np.random.default_rng(seed)
    gaps = X.copy()
    gaps[rng.random(X.shape) < share] = np.nan
    empty = np.isnan(gaps).all(axis=1)
    gaps[empty, 0] = X[empty, 0]
    return gaps


def gmm(covariance_type: str = "full", **params) -> TransformerGMM:
    return TransformerGMM(
        3, covariance_type=covariance_type, checkpoint=None, random_state=0, **params
    )


def assert_same_mixture(a: TransformerGMM, b: TransformerGMM, rtol: float = 0.0) -> None:
    for name in GMM_ATTRIBUTES:
        np.testing.assert_allclose(getattr(a, name), getattr(b, name), rtol=rtol, atol=0.0)


# --- TransformerGMM ---------------------------------------------------------------------


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_first_call_is_fit_on_first_batch(covariance_type):
    # n_views="auto" reads MIXTURE_STREAM_VIEWS views of a mixture stream's first batch,
    # one in fit.
    X = stationary_mixture(300)
    params = dict(checkpoint=TINY_CHECKPOINT, random_state=0, covariance_type=covariance_type)
    streamed = TransformerGMM(3, **params).partial_fit(X)
    fitted = TransformerGMM(3, n_views=MIXTURE_STREAM_VIEWS, **params).fit(X)
    assert_same_mixture(streamed, fitted)
    assert streamed.init_method_ == fitted.init_method_
    assert streamed.lower_bound_ == fitted.lower_bound_
    assert (streamed.n_steps_, streamed.n_samples_seen_) == (1, 300)
    assert not hasattr(fitted, "n_steps_")


@pytest.mark.parametrize("estimator", [TransformerGMM, TransformerClusterer])
def test_first_batch_reads_the_views_asked_for(estimator):
    # An int n_views is the user's, in partial_fit as in fit; "auto" reads more views of
    # the first batch than of a fit's data.
    X = stationary_mixture(300)
    params = dict(checkpoint=TINY_CHECKPOINT, random_state=0, max_iter=0)
    for n_views in (1, 2):
        streamed = estimator(3, n_views=n_views, **params).partial_fit(X)
        fitted = estimator(3, n_views=n_views, **params).fit(X)
        assert streamed.n_views == n_views
        np.testing.assert_array_equal(_centers(streamed), _centers(fitted))
    auto = estimator(3, **params)
    assert auto.n_views == "auto" and auto._fit_params()["n_views"] == 1
    one = estimator(3, n_views=1, **params).fit(X)
    np.testing.assert_array_equal(_centers(auto.fit(X)), _centers(one))
    assert not hasattr(auto, "_reading_first_batch")  # only while the first batch is read


def _centers(estimator) -> np.ndarray:
    return getattr(estimator, "means_", getattr(estimator, "cluster_centers_", None))


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_step_size_one_on_all_rows_follows_em_iterations(covariance_type):
    # With learning_decay=0 every step is 1: the average is the batch's statistics, and
    # the whole data as every batch makes each call one EM iteration of fit.
    X = stationary_mixture(400)
    streamed = gmm(covariance_type, max_iter=3, tol=0.0, learning_decay=0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # EM does not converge with tol=0
        streamed.partial_fit(X)
        for _ in range(4):
            streamed.partial_fit(X)
        fitted = gmm(covariance_type, max_iter=7, tol=0.0).fit(X)
    assert streamed.n_iter_ == fitted.n_iter_ == 7
    assert_same_mixture(streamed, fitted, rtol=1e-10)
    np.testing.assert_allclose(streamed.lower_bounds_, fitted.lower_bounds_, rtol=1e-12)


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_stream_of_a_stationary_mixture_nears_the_full_fit(covariance_type):
    X = stationary_mixture(30_000)
    full = gmm(covariance_type).fit(X)
    streamed = gmm(covariance_type)
    for batch in batches(X, 500):
        streamed.partial_fit(batch)
    assert streamed.n_steps_ == 60 and streamed.n_samples_seen_ == 30_000
    # The target for a pass over the rows: within 0.01 nats per point.
    assert abs(streamed.score(X) - full.score(X)) < 0.01
    order = np.argsort(streamed.means_[:, 0])
    np.testing.assert_allclose(
        streamed.means_[order], full.means_[np.argsort(full.means_[:, 0])], atol=0.1
    )


def test_later_steps_move_less():
    # rho_t decays: the same batch moves the means less at step 20 than at step 2.
    X = stationary_mixture(4_000)
    parts = batches(X, 200)
    streamed = gmm("diag").partial_fit(parts[0])
    shifts = []
    for batch in parts[1:]:
        before = streamed.means_.copy()
        streamed.partial_fit(batch)
        shifts.append(np.abs(streamed.means_ - before).max())
    assert np.mean(shifts[-5:]) < 0.5 * np.mean(shifts[:5])


def test_a_batch_with_other_features_is_an_error():
    X = stationary_mixture(200)
    streamed = gmm().partial_fit(X[:100])
    with pytest.raises(ValueError, match="X has 1 features, but TransformerGMM is expecting 2"):
        streamed.partial_fit(X[100:, :1])
    assert streamed.n_steps_ == 1  # the refused batch is not counted


@pytest.mark.parametrize("estimator", ["gmm", "clusterer"])
def test_later_batches_meet_scikit_learn_checks(estimator):
    """A later batch that is a plain finite float array skips validate_data; every other
    one still gets its errors and warnings, and the same step as its array."""
    import pandas as pd

    X = stationary_mixture(300)
    make = gmm if estimator == "gmm" else clusterer
    plain, listed = make().partial_fit(X[:100]), make().partial_fit(X[:100])
    plain.partial_fit(X[100:200])
    listed.partial_fit(X[100:200].tolist())  # validate_data's path
    np.testing.assert_array_equal(_centers(plain), _centers(listed))
    np.testing.assert_array_equal(plain.predict(X), listed.predict(X))
    # A batch may have gaps, but no row without an observed entry.
    for bad, message in [
        (np.full((5, 2), np.inf), "Input X contains infinity"),
        (np.full((5, 2), np.nan), "every feature missing"),
        (np.zeros((0, 2)), "0 sample"),
        (np.zeros(2), "Expected 2D array"),
        (np.zeros((5, 3)), "X has 3 features"),
        (np.zeros((5, 2), dtype=complex), "Complex data not supported"),
    ]:
        with pytest.raises(ValueError, match=message):
            plain.partial_fit(bad)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # finite rows whose sum overflows: validate_data's
        assert not _streaming._is_plain_batch(plain, np.full((5, 2), 1e308))
    assert _streaming._is_plain_batch(plain, X[200:])
    named = make().partial_fit(pd.DataFrame(X[:100], columns=["a", "b"]))
    with pytest.warns(UserWarning, match="X does not have valid feature names"):
        named.partial_fit(X[100:200])


@pytest.mark.parametrize("sample_weight", [[-1.0] * 50, [0.0] * 50, [1.0] * 49])
def test_bad_sample_weight_is_an_error(sample_weight):
    X = stationary_mixture(150)
    streamed = gmm().partial_fit(X[:100])
    with pytest.raises(ValueError, match="sample_weight|non-zero weight|Negative"):
        streamed.partial_fit(X[100:], sample_weight=sample_weight)


@pytest.mark.parametrize("params", [{"learning_decay": 1.5}, {"learning_offset": -1.0}])
def test_step_size_parameters_are_validated(params):
    with pytest.raises(InvalidParameterError):
        gmm(**params).partial_fit(stationary_mixture(100))


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_integer_weights_step_as_repeated_rows(covariance_type):
    X = stationary_mixture(300, seed=1)
    first, batch = X[:200], X[200:]
    counts = np.random.default_rng(0).integers(0, 4, len(batch))
    weighted = gmm(covariance_type).partial_fit(first).partial_fit(batch, sample_weight=counts)
    repeated = gmm(covariance_type).partial_fit(first).partial_fit(np.repeat(batch, counts, 0))
    assert_same_mixture(weighted, repeated, rtol=1e-10)
    assert weighted.lower_bound_ == pytest.approx(repeated.lower_bound_, rel=1e-12)


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_a_batch_steps_alike_in_any_row_order(covariance_type):
    X = stationary_mixture(400, seed=2)
    first, batch = X[:200], X[200:]
    permuted = batch[np.random.default_rng(0).permutation(len(batch))]
    a = gmm(covariance_type).partial_fit(first).partial_fit(batch)
    b = gmm(covariance_type).partial_fit(first).partial_fit(permuted)
    assert_same_mixture(a, b, rtol=1e-10)


def test_stream_is_deterministic_and_survives_pickling():
    parts = batches(stationary_mixture(1_000, seed=3), 200)
    a = gmm().partial_fit(parts[0]).partial_fit(parts[1])
    b = pickle.loads(pickle.dumps(a))
    for batch in parts[2:]:
        a.partial_fit(batch)
        b.partial_fit(batch)
    assert a.n_steps_ == b.n_steps_ == 5
    assert_same_mixture(a, b)
    c = gmm()
    for batch in parts:
        c.partial_fit(batch)
    assert_same_mixture(a, c)


def test_clone_and_fit_start_a_new_stream():
    parts = batches(stationary_mixture(900, seed=4), 300)
    streamed = gmm().partial_fit(parts[0]).partial_fit(parts[1])
    assert not hasattr(clone(streamed), "n_steps_")
    # fit replaces the stream's mixture: the next partial_fit fits its batch afresh.
    streamed.fit(parts[1])
    streamed.partial_fit(parts[2])
    assert streamed.n_steps_ == 1
    assert_same_mixture(streamed, gmm().fit(parts[2]))


@pytest.mark.parametrize("gaps", [False, True])
def test_an_emptied_component_is_reseeded_onto_a_batch_row(gaps):
    X = stationary_mixture(600, seed=5)
    streamed = gmm("full").partial_fit(X[:300])
    # A component far from every row, with no weight: the next step empties it.
    streamed.weights_[0] = 1e-300
    streamed.weights_ /= streamed.weights_.sum()
    streamed.means_[0] = [1e3, 1e3]
    batch = with_gaps(X[300:], seed=3) if gaps else X[300:]
    streamed.partial_fit(batch)
    assert np.isfinite(streamed.covariances_).all() and (streamed.weights_ > 0).all()
    # Moved onto a row of the batch (over its observed entries, where it has gaps).
    assert ((batch == streamed.means_[0]) | np.isnan(batch)).all(1).any()
    assert abs(streamed.weights_[0] - 1 / len(batch)) < 1e-3


def test_partial_fit_with_the_number_of_components_chosen():
    X = stationary_mixture(600, seed=6)
    streamed = TransformerGMM("auto", checkpoint=None, max_components=4, random_state=0)
    streamed.partial_fit(X[:300]).partial_fit(X[300:])
    assert streamed.n_components_ == len(streamed.weights_) == streamed.means_.shape[0]
    assert streamed.n_steps_ == 2


# --- TransformerGMM on batches with gaps (NaN) ---------------------------------------------


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_step_size_one_on_rows_with_gaps_is_an_iteration_of_their_em(covariance_type):
    # With learning_decay=0 a step on the whole data is one iteration of fit's EM for
    # missing values (without its covariance prior), from the fitted mixture.
    from transformer_gmm.engine.missing import fit_em_missing

    X = with_gaps(stationary_mixture(400, seed=7))
    streamed = gmm(covariance_type, learning_decay=0.0, missing_covariance_prior=0)
    streamed.partial_fit(X)
    start = [getattr(streamed, name).copy() for name in ("weights_", "means_", "covariances_")]
    streamed.partial_fit(X)
    iteration = fit_em_missing(
        X, *start, covariance_type=covariance_type, reg_covar=streamed.reg_covar,
        max_iter=1, tol=0.0, accelerate=False,
    )
    np.testing.assert_allclose(streamed.means_, iteration.means, rtol=1e-10)
    np.testing.assert_allclose(streamed.covariances_, iteration.covariances, rtol=1e-10)
    np.testing.assert_allclose(streamed.weights_, iteration.weights, rtol=1e-10)
    assert streamed.lower_bound_ == pytest.approx(iteration.lower_bounds[0], rel=1e-10)


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_a_stream_with_gaps_nears_the_fit_on_all_rows(covariance_type):
    X = with_gaps(stationary_mixture(6_000, seed=8), seed=1)
    streamed = gmm(covariance_type)
    for batch in batches(X, 300):
        streamed.partial_fit(batch)
    fitted = gmm(covariance_type).fit(X)
    assert streamed.n_steps_ == 20 and np.isfinite(streamed.covariances_).all()
    assert streamed.score(X) == pytest.approx(fitted.score(X), abs=0.01)


@pytest.mark.parametrize("covariance_type", ["full", "diag"])
def test_a_batch_with_gaps_steps_alike_in_any_row_order_and_as_repeated_rows(covariance_type):
    X = with_gaps(stationary_mixture(400, seed=9), seed=2)
    first, batch = X[:200], X[200:]
    permuted = batch[np.random.default_rng(0).permutation(len(batch))]
    a = gmm(covariance_type).partial_fit(first).partial_fit(batch)
    b = gmm(covariance_type).partial_fit(first).partial_fit(permuted)
    assert_same_mixture(a, b, rtol=1e-10)
    counts = np.random.default_rng(1).integers(0, 4, len(batch))
    weighted = gmm(covariance_type).partial_fit(first).partial_fit(batch, sample_weight=counts)
    repeated = gmm(covariance_type).partial_fit(first).partial_fit(np.repeat(batch, counts, 0))
    assert_same_mixture(weighted, repeated, rtol=1e-10)


def test_a_batch_that_observes_a_feature_nowhere_still_steps():
    X = stationary_mixture(600, seed=10)
    streamed = gmm().partial_fit(X[:300])
    batch = X[300:].copy()
    batch[:, 1] = np.nan  # feature 1 missing from the whole batch: the first batch had it
    streamed.partial_fit(batch)
    assert streamed.n_steps_ == 2 and np.isfinite(streamed.means_).all()
    assert np.isfinite(streamed.covariances_).all() and np.isfinite(streamed.lower_bound_)


def test_a_clusterer_step_with_gaps_fills_them_from_the_nearest_centres():
    # k-POD's step: each missing entry takes its row's nearest centre's coordinate (over
    # the observed ones), and the mini-batch step runs on the filled rows; the batch's
    # labels and inertia are then over its observed entries, as predict and score read it.
    X = stationary_mixture(600, seed=11)
    streamed = clusterer().partial_fit(X[:300])
    centers, counts = streamed.cluster_centers_.copy(), streamed._counts.copy()
    batch = with_gaps(X[300:], seed=4)
    nearest = clusterer().fit(X[:300])  # the same centres, to predict over observed entries
    nearest.cluster_centers_ = centers
    filled = np.where(np.isnan(batch), centers[nearest.predict(batch)], batch)
    streamed.partial_fit(batch)
    reference = clusterer().partial_fit(X[:300]).partial_fit(filled)
    np.testing.assert_allclose(streamed.cluster_centers_, reference.cluster_centers_,
                               rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(streamed._counts, counts + np.bincount(
        nearest.predict(batch), minlength=3))
    np.testing.assert_array_equal(streamed.labels_, streamed.predict(batch))
    assert streamed.inertia_ == pytest.approx(-streamed.score(batch), rel=1e-12)


def test_a_clusterer_stream_with_gaps_nears_k_pod_on_all_rows():
    X = with_gaps(stationary_mixture(6_000, seed=12), seed=5)
    streamed = clusterer()
    for batch in batches(X, 300):
        streamed.partial_fit(batch)
    fitted = clusterer().fit(X)
    assert streamed.n_steps_ == 20
    assert -streamed.score(X) <= 1.01 * -fitted.score(X)
    counts = np.random.default_rng(2).integers(0, 4, 300)
    weighted = clusterer().partial_fit(X[:300]).partial_fit(X[300:600], sample_weight=counts)
    repeated = clusterer().partial_fit(X[:300]).partial_fit(np.repeat(X[300:600], counts, 0))
    np.testing.assert_allclose(weighted.cluster_centers_, repeated.cluster_centers_,
                               rtol=1e-10)


# --- TransformerClusterer ---------------------------------------------------------------


def clusterer(**params) -> TransformerClusterer:
    return TransformerClusterer(3, checkpoint=None, random_state=0, **params)


@pytest.mark.parametrize("max_iter", [300, 0])
def test_clusterer_first_call_is_fit_on_first_batch(max_iter):
    # n_views="auto" reads one view of a clusterer stream's first batch, as fit does (with
    # max_iter=0 the centres are the chosen start's, which four views would move).
    X = stationary_mixture(300)
    params = dict(checkpoint=TINY_CHECKPOINT, random_state=0, max_iter=max_iter)
    streamed = TransformerClusterer(3, **params).partial_fit(X)
    fitted = TransformerClusterer(3, **params).fit(X)
    np.testing.assert_array_equal(streamed.cluster_centers_, fitted.cluster_centers_)
    np.testing.assert_array_equal(streamed.labels_, fitted.labels_)
    assert streamed.inertia_ == fitted.inertia_ and streamed.n_steps_ == 1
    np.testing.assert_array_equal(streamed._counts, np.bincount(fitted.labels_, minlength=3))


def test_clusterer_step_is_minibatch_kmeans_step():
    # From the same centres and counts, one step moves each centre to the mean of all the
    # rows it took: sklearn's mini-batch update without random reassignment.
    X = stationary_mixture(600, seed=7)
    streamed = clusterer().partial_fit(X[:300])
    centers, counts = streamed.cluster_centers_.copy(), streamed._counts.copy()
    streamed.partial_fit(X[300:])
    labels = ((X[300:, None, :] - centers[None]) ** 2).sum(-1).argmin(1)  # nearest centre
    expected = np.array(
        [
            (counts[k] * centers[k] + X[300:][labels == k].sum(0))
            / (counts[k] + (labels == k).sum())
            for k in range(3)
        ]
    )
    np.testing.assert_allclose(streamed.cluster_centers_, expected, rtol=1e-12)
    np.testing.assert_array_equal(streamed._counts, counts + np.bincount(labels, minlength=3))
    np.testing.assert_array_equal(streamed.labels_, streamed.predict(X[300:]))
    assert streamed.inertia_ == pytest.approx(-streamed.score(X[300:]), rel=1e-10)


def test_clusterer_stream_is_as_good_as_minibatch_kmeans():
    X = stationary_mixture(30_000, seed=8)
    streamed = clusterer()
    minibatch = MiniBatchKMeans(3, random_state=0, n_init=1)
    for batch in batches(X, 500):
        streamed.partial_fit(batch)
        minibatch.partial_fit(batch)
    assert streamed.n_steps_ == minibatch.n_steps_ == 60
    full = KMeans(3, random_state=0, n_init=1).fit(X)
    inertia = -streamed.score(X)
    assert inertia <= 1.001 * -minibatch.score(X)
    assert inertia <= 1.01 * full.inertia_


def test_clusterer_batch_with_other_features_is_an_error():
    X = stationary_mixture(200)
    streamed = clusterer().partial_fit(X[:100])
    with pytest.raises(
        ValueError, match="X has 1 features, but TransformerClusterer is expecting 2"
    ):
        streamed.partial_fit(X[100:, :1])


def test_clusterer_integer_weights_step_as_repeated_rows():
    X = stationary_mixture(300, seed=9)
    first, batch = X[:200], X[200:]
    counts = np.random.default_rng(0).integers(0, 4, len(batch))
    weighted = clusterer().partial_fit(first).partial_fit(batch, sample_weight=counts)
    repeated = clusterer().partial_fit(first).partial_fit(np.repeat(batch, counts, 0))
    np.testing.assert_allclose(weighted.cluster_centers_, repeated.cluster_centers_, rtol=1e-12)
    np.testing.assert_allclose(weighted._counts, repeated._counts)
    assert weighted.inertia_ == pytest.approx(repeated.inertia_, rel=1e-10)


def test_clusterer_stream_survives_pickling_and_clone():
    parts = batches(stationary_mixture(900, seed=10), 300)
    a = clusterer().partial_fit(parts[0])
    b = pickle.loads(pickle.dumps(a))
    for batch in parts[1:]:
        a.partial_fit(batch)
        b.partial_fit(batch)
    np.testing.assert_array_equal(a.cluster_centers_, b.cluster_centers_)
    assert a.n_steps_ == b.n_steps_ == 3
    assert not hasattr(clone(a), "n_steps_")


def test_clusterer_empty_cluster_takes_the_farthest_row():
    X = stationary_mixture(600, seed=11)
    streamed = clusterer().partial_fit(X[:300])
    streamed._counts[0] = 0.0  # as a fit that left a cluster empty (duplicate rows)
    streamed.cluster_centers_[0] = [1e3, 1e3]  # no row of the batch is nearest to it
    batch = X[300:]
    streamed.partial_fit(batch)
    assert streamed._counts[0] == 1.0
    assert np.isclose(batch, streamed.cluster_centers_[0], rtol=1e-12).all(1).any()


# --- the benchmark ------------------------------------------------------------------------


def test_streaming_benchmark_runs(tmp_path):
    rows = load_benchmark("streaming").main(
        [
            "--n-rows",
            "4000",
            "--batch-sizes",
            "1000",
            "2000",
            "--checkpoint",
            "none",
            "--results",
            str(tmp_path),
        ]
    )
    assert (tmp_path / "streaming.csv").stat().st_size > 0
    assert len(rows) == 1 + 2 * 4
    # What the quality is, the tests above say; here every measure is there and finite.
    assert all(
        np.isfinite([r["metric"], r["memory_mib"], r["rows_per_second"]]).all() for r in rows
    )


def test_streaming_benchmark_with_gaps_runs_our_streams_alone(tmp_path):
    rows = load_benchmark("streaming").main(
        ["--n-rows", "4000", "--batch-sizes", "2000", "--gaps", "0.2", "--checkpoint", "none",
         "--results", str(tmp_path), "--out", "gaps"]
    )
    assert [r["method"] for r in rows] == [
        "TransformerGMM.fit (all rows)", "TransformerGMM.partial_fit",
        "TransformerClusterer.partial_fit"]
    assert rows[0]["dataset"] == "synthetic 20% gaps"
    assert all(np.isfinite(r["metric"]) for r in rows)
    assert np.isfinite(rows[1]["gap_to_full_fit"])


def test_streaming_seeds_benchmark_pairs_the_seeds(tmp_path):
    import csv

    summary = load_benchmark("streaming_seeds").main(
        ["--n-rows", "4000", "--batch-sizes", "1000", "--seeds", "3", "--datasets",
         "synthetic", "--checkpoint", "none", "--results", str(tmp_path)]
    )
    with (tmp_path / "streaming_seeds.csv").open() as file:
        rows = list(csv.DictReader(file))
    assert [int(r["seed"]) for r in rows] == [0, 1, 2]
    differences = [float(r["ours_inertia"]) - float(r["minibatch_inertia"]) for r in rows]
    (line,) = summary
    assert line["n_seeds"] == 3
    assert line["inertia_difference"] == pytest.approx(np.mean(differences))
    assert line["inertia_difference_se"] == pytest.approx(np.std(differences, ddof=1) / np.sqrt(3))
    assert np.isfinite(line["seconds_ratio"]) and line["seconds_ratio"] > 0


def test_streaming_seeds_benchmark_pairs_the_views_against(tmp_path):
    import csv

    (line,) = load_benchmark("streaming_seeds").main(
        ["--n-rows", "4000", "--batch-sizes", "1000", "--seeds", "2", "--datasets",
         "synthetic", "--checkpoint", TINY_CHECKPOINT, "--views-against", "2",
         "--results", str(tmp_path)]
    )
    with (tmp_path / "streaming_seeds.csv").open() as file:
        rows = list(csv.DictReader(file))
    differences = [float(r["ours_inertia"]) - float(r["views_inertia"]) for r in rows]
    assert line["views_difference"] == pytest.approx(np.mean(differences))
    assert line["views_difference_se"] == pytest.approx(np.std(differences, ddof=1) / np.sqrt(2))
    first = sum(float(r["ours_first_seconds"]) for r in rows)
    assert line["views_first_seconds_ratio"] == pytest.approx(
        first / sum(float(r["views_first_seconds"]) for r in rows))


@pytest.mark.parametrize("merge", [False, True])
def test_a_clusterer_stream_labels_later_batches_by_its_centres(merge):
    """The first batch of an "auto" stream is labelled as fit labels it (row groups that
    stand apart, or the merged mixture's clusters); later batches move the centres, and
    the nearest centre then labels a row in labels_ and in predict alike."""
    from sklearn.datasets import make_moons

    X, _ = make_moons(400, noise=0.05, random_state=0)
    km = TransformerClusterer(n_clusters="auto", merge=merge, random_state=0)
    km.partial_fit(X[:200])
    fitted = TransformerClusterer(n_clusters="auto", merge=merge, random_state=0).fit(X[:200])
    np.testing.assert_array_equal(km.labels_, fitted.labels_)
    np.testing.assert_array_equal(km.predict(X[:200]), km.labels_)
    km.partial_fit(X[200:])
    assert not hasattr(km, "mixture_") and not hasattr(km, "component_to_cluster_")
    np.testing.assert_array_equal(km.predict(X[200:]), km.labels_)
    np.testing.assert_array_equal(km.transform(X[200:]).argmin(1), km.labels_)
