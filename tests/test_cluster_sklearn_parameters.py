"""KMeans's parameters on TransformerClusterer: init, n_init="auto", algorithm, copy_x,
verbose, sample_weight with metadata routing, sparse input, and the relocation of empty
clusters."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
import sklearn
import torch
from conftest import make_blobs
from sklearn.cluster import KMeans
from sklearn.exceptions import ConvergenceWarning
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from transformer_gmm import TransformerClusterer, _fitting
from transformer_gmm.engine import kmeans, model_cache


@pytest.fixture
def blobs() -> np.ndarray:
    return make_blobs(40, [[-6.0, 0.0], [0.0, 6.0], [6.0, 0.0]], seed=3)


def near_centers(X: np.ndarray) -> np.ndarray:
    """Starting centres near, not at, the three blobs."""
    return np.array([[-5.0, 1.0], [1.0, 5.0], [5.0, -1.0]])


# --- init --------------------------------------------------------------------------------


@pytest.mark.parametrize("init", ["k-means++", "random", "array", "callable"])
def test_other_inits_skip_the_transformer(blobs, init, monkeypatch):
    def no_backbone(checkpoint):
        raise AssertionError("the transformer was loaded")

    monkeypatch.setattr(model_cache, "load_backbone", no_backbone)
    init = {
        "array": near_centers(blobs),
        "callable": lambda X, k, random_state: near_centers(X),
    }.get(init, init)
    km = TransformerClusterer(3, init=init, random_state=0).fit(blobs)
    assert np.bincount(km.labels_).tolist() == [40, 40, 40]


def test_given_centres_give_scikit_learns_fit(blobs):
    init = near_centers(blobs)
    ours = TransformerClusterer(3, init=init, n_init=1).fit(blobs)
    theirs = KMeans(3, init=init, n_init=1).fit(blobs)
    np.testing.assert_allclose(ours.cluster_centers_, theirs.cluster_centers_, rtol=1e-12)
    np.testing.assert_array_equal(ours.labels_, theirs.labels_)
    assert ours.n_iter_ == theirs.n_iter_
    np.testing.assert_allclose(ours.inertia_, theirs.inertia_, rtol=1e-10)


def test_max_iter_zero_keeps_the_given_centres(blobs):
    init = near_centers(blobs)
    km = TransformerClusterer(3, init=init, max_iter=0).fit(blobs)
    np.testing.assert_array_equal(km.cluster_centers_, init)
    assert km.n_iter_ == 0 and km.init_method_ == "array"


def test_random_starts_are_scikit_learns_rows(blobs):
    # The same rows as KMeans draws from the same random state, so the same fit.
    for seed in range(3):
        ours = TransformerClusterer(3, init="random", n_init=4, random_state=seed).fit(blobs)
        theirs = KMeans(3, init="random", n_init=4, random_state=seed).fit(blobs)
        np.testing.assert_allclose(ours.cluster_centers_, theirs.cluster_centers_, rtol=1e-10)
        np.testing.assert_allclose(ours.inertia_, theirs.inertia_, rtol=1e-10)


def test_callable_init_is_called_once_per_start_with_the_random_state(blobs):
    calls = []

    def init(X, n_clusters, random_state):
        calls.append((X.shape, n_clusters, type(random_state)))
        return X[random_state.choice(len(X), n_clusters, replace=False)]

    km = TransformerClusterer(3, init=init, n_init=3, random_state=0).fit(blobs)
    assert calls == [((120, 2), 3, np.random.RandomState)] * 3
    assert km._n_init == 3 and km.init_method_ == "callable"


@pytest.mark.parametrize(
    "init, n_init, expected",
    [("k-means++", "auto", 1), ("random", "auto", 10), ("k-means++", 4, 4), ("random", 2, 2)],
)
def test_n_init_auto_is_kmeans_for_kmeans_inits(blobs, init, n_init, expected):
    km = TransformerClusterer(3, init=init, n_init=n_init, random_state=0).fit(blobs)
    assert km._n_init == expected


def test_given_centres_with_several_inits_warn_and_run_once(blobs):
    with pytest.warns(RuntimeWarning, match="performing only one init in TransformerClusterer"):
        km = TransformerClusterer(3, init=near_centers(blobs), n_init=5).fit(blobs)
    assert km._n_init == 1


def test_init_centres_of_the_wrong_shape_are_refused(blobs):
    with pytest.raises(ValueError, match="does not match the number of clusters 3"):
        TransformerClusterer(3, init=blobs[:2]).fit(blobs)
    with pytest.raises(ValueError, match="does not match the number of features of the data 2"):
        TransformerClusterer(3, init=np.zeros((3, 5))).fit(blobs)
    with pytest.raises(ValueError, match="n_samples=2 should be >= n_clusters=3"):
        TransformerClusterer(3).fit(blobs[:2])


# --- algorithm, copy_x, verbose --------------------------------------------------------------


def test_elkan_is_lloyd(blobs):
    lloyd = TransformerClusterer(3, algorithm="lloyd", random_state=0).fit(blobs)
    elkan = TransformerClusterer(3, algorithm="elkan", random_state=0).fit(blobs)
    np.testing.assert_array_equal(lloyd.cluster_centers_, elkan.cluster_centers_)
    with pytest.warns(RuntimeWarning, match="algorithm='elkan' doesn't make sense"):
        TransformerClusterer(1, algorithm="elkan").fit(blobs)


@pytest.mark.parametrize("copy_x", [True, False])
def test_x_is_never_modified(blobs, copy_x):
    X = blobs.copy()
    TransformerClusterer(3, copy_x=copy_x, random_state=0).fit(X)
    np.testing.assert_array_equal(X, blobs)


def test_verbose_prints_as_scikit_learn(blobs, capsys):
    TransformerClusterer(3, init="random", n_init=2, verbose=1, random_state=0).fit(blobs)
    out = capsys.readouterr().out
    assert out.count("Initialization complete") == 2
    assert re.search(r"Iteration 0, inertia [0-9.]+\.", out)
    assert re.search(r"Converged at iteration [0-9]+: strict convergence\.", out)
    TransformerClusterer(3, random_state=0).fit(blobs)
    assert capsys.readouterr().out == ""


# --- sample_weight ---------------------------------------------------------------------------


def test_integer_weights_fit_as_repeated_rows(blobs):
    counts = np.random.default_rng(0).integers(1, 4, len(blobs))
    options = dict(init=near_centers(blobs), n_init=1, tol=0)
    weighted = TransformerClusterer(3, **options).fit(blobs, sample_weight=counts)
    repeated = TransformerClusterer(3, **options).fit(np.repeat(blobs, counts, axis=0))
    np.testing.assert_allclose(weighted.cluster_centers_, repeated.cluster_centers_, atol=1e-6)
    np.testing.assert_allclose(weighted.inertia_, repeated.inertia_, rtol=1e-10)
    np.testing.assert_array_equal(np.repeat(weighted.labels_, counts), repeated.labels_)


def test_zero_weights_fit_as_dropped_rows(blobs):
    keep = np.random.default_rng(1).random(len(blobs)) < 0.7
    options = dict(init=near_centers(blobs), n_init=1, tol=0)
    weighted = TransformerClusterer(3, **options).fit(blobs, sample_weight=keep.astype(float))
    dropped = TransformerClusterer(3, **options).fit(blobs[keep])
    np.testing.assert_allclose(weighted.cluster_centers_, dropped.cluster_centers_, atol=1e-6)
    np.testing.assert_allclose(weighted.inertia_, dropped.inertia_, rtol=1e-10)


@pytest.mark.parametrize("init", ["transformer", "k-means++", "random"])
def test_zero_weight_rows_never_start_a_cluster(init):
    # Three far-away rows of weight zero: a start there would put a centre on them.
    X = np.vstack([make_blobs(30, [[0.0, 0.0], [8.0, 0.0]], seed=0), np.full((3, 2), 500.0)])
    weights = np.r_[np.ones(60), np.zeros(3)]
    for seed in range(5):
        km = TransformerClusterer(2, init=init, n_init=3, max_iter=0, random_state=seed)
        km.fit(X, sample_weight=weights)
        assert np.all(np.abs(km.cluster_centers_) < 100)


@pytest.mark.parametrize("checkpoint", ["default", None])
def test_weights_pull_the_centres(blobs, checkpoint):
    # The left blob's rows weigh fifty times the others': splitting it lowers the
    # weighted inertia more than keeping the other two blobs apart (KMeans(n_init=10)
    # splits it too; unweighted, one centre sits in each blob).
    weights = np.where(blobs[:, 0] < -3, 50.0, 1.0)
    # Without a checkpoint, ten k-means++ starts, as KMeans needs: one start may miss the
    # split, whichever rows its draws land on.
    n_init = 10 if checkpoint is None else "auto"
    km = TransformerClusterer(3, checkpoint=checkpoint, n_init=n_init, random_state=0)
    km.fit(blobs, sample_weight=weights)
    assert np.sum(km.cluster_centers_[:, 0] < -3) == 2


def test_score_weights_as_repeated_rows(blobs):
    km = TransformerClusterer(3, random_state=0).fit(blobs)
    counts = np.arange(len(blobs)) % 3
    repeated = km.score(np.repeat(blobs, counts, axis=0))
    np.testing.assert_allclose(km.score(blobs, sample_weight=counts), repeated, rtol=1e-12)


def test_weighted_fit_predict_and_fit_transform_are_fit_then_predict(blobs):
    weights = np.linspace(0.5, 2.0, len(blobs))
    km = TransformerClusterer(3, random_state=0)
    labels = km.fit_predict(blobs, sample_weight=weights)
    np.testing.assert_array_equal(labels, km.fit(blobs, sample_weight=weights).labels_)
    distances = km.fit_transform(blobs, sample_weight=weights)
    np.testing.assert_allclose(distances, km.transform(blobs))


def test_invalid_sample_weight_is_refused(blobs):
    km = TransformerClusterer(3, checkpoint=None)
    with pytest.raises(ValueError, match="Negative values"):
        km.fit(blobs, sample_weight=-np.ones(len(blobs)))
    with pytest.raises(ValueError, match="sample_weight.shape"):
        km.fit(blobs, sample_weight=np.ones(3))
    with pytest.raises(ValueError, match="at least 3 samples of non-zero weight"):
        km.fit(blobs, sample_weight=np.r_[1.0, 1.0, np.zeros(len(blobs) - 2)])


def test_metadata_routing_passes_sample_weight(blobs):
    weights = np.where(blobs[:, 0] < -3, 10.0, 1.0)
    with sklearn.config_context(enable_metadata_routing=True):
        km = TransformerClusterer(3, random_state=0).set_fit_request(sample_weight=True)
        km.set_score_request(sample_weight=True)
        pipeline = make_pipeline(StandardScaler().set_fit_request(sample_weight=False), km)
        pipeline.fit(blobs, sample_weight=weights)
        direct = TransformerClusterer(3, random_state=0)
        direct.fit(StandardScaler().fit_transform(blobs), sample_weight=weights)
        np.testing.assert_array_equal(pipeline[-1].cluster_centers_, direct.cluster_centers_)
        assert np.isfinite(pipeline.score(blobs, sample_weight=weights))


# --- sparse input ----------------------------------------------------------------------------


@pytest.mark.parametrize("init", ["transformer", "k-means++"])
def test_sparse_input_fits_as_dense(blobs, init):
    X = blobs.copy()
    X[np.abs(X) < 1] = 0.0
    dense = TransformerClusterer(3, init=init, random_state=0).fit(X)
    sparse = TransformerClusterer(3, init=init, random_state=0).fit(sp.csr_matrix(X))
    np.testing.assert_array_equal(dense.cluster_centers_, sparse.cluster_centers_)
    np.testing.assert_array_equal(sparse.predict(sp.csr_matrix(X)), dense.labels_)
    np.testing.assert_allclose(sparse.transform(sp.csc_matrix(X)), dense.transform(X))
    np.testing.assert_allclose(sparse.score(sp.csr_matrix(X)), dense.score(X))


def test_sparse_input_too_large_to_densify_says_what_to_do(blobs, monkeypatch):
    monkeypatch.setattr(_fitting, "MAX_DENSIFIED_VALUES", 100)
    with pytest.raises(ValueError, match="TruncatedSVD"):
        TransformerClusterer(3).fit(sp.csr_matrix(blobs))


def test_gaussian_mixture_still_refuses_sparse_input(blobs):
    from transformer_gmm import TransformerGMM

    with pytest.raises(TypeError, match="dense data is required"):
        TransformerGMM(3).fit(sp.csr_matrix(blobs))


# --- empty clusters --------------------------------------------------------------------------


def test_an_empty_cluster_takes_the_farthest_point_in_a_batch():
    # Two runs of one dataset: the first starts with a centre no point is near, and takes
    # the point farthest from its centre, as KMeans does; the second is left as it runs
    # alone.
    X = torch.tensor([[[0.0, 0.0], [0.5, 0.0], [0.5, 1.0], [1.0, 1.0]]], dtype=torch.float64)
    starts = torch.tensor([[[0.5, 0.5], [3.0, 3.0]], [[0.0, 0.0], [1.0, 1.0]]], dtype=torch.float64)
    centers, labels, inertia, n_iter = kmeans.lloyd(X.expand(2, -1, -1), starts, max_iter=300)
    alone = kmeans.lloyd(X, starts[1:], max_iter=300)
    assert inertia[0].item() == pytest.approx(0.25) and n_iter[0].item() == 3
    torch.testing.assert_close(centers[1:], alone[0])
    torch.testing.assert_close(labels[1:], alone[1])


def test_fewer_distinct_rows_than_clusters_warn_and_leave_no_label_gap():
    X = np.array([[0.0, 0.0], [0.0, 1.0], [1.0, 0.0], [1.0, 0.0]])
    for init in ["transformer", "k-means++", X]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            km = TransformerClusterer(4, init=init, random_state=0).fit(X)
        assert any(issubclass(w.category, ConvergenceWarning) for w in caught)
        assert set(km.labels_) == {0, 1, 2}


def test_dask_fits_refuse_what_needs_rows_in_memory(blobs):
    da = pytest.importorskip("dask.array")
    X = da.from_array(blobs, chunks=(40, 2))
    with pytest.raises(ValueError, match="need X in memory"):
        TransformerClusterer(3).fit(X, sample_weight=np.ones(len(blobs)))
    with pytest.raises(ValueError, match="need X in memory"):
        TransformerClusterer(3, init="random").fit(X)
