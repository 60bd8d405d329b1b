"""Fitting on a chunked dask array reaches the in-memory fit, and predicts lazily."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

distributed = pytest.importorskip(
    "dask.distributed", reason='needs dask.distributed: pip install "dask[array,distributed]"'
)
import dask  # noqa: E402
import dask.array as da  # noqa: E402
import torch  # noqa: E402
from conftest import make_blobs  # noqa: E402
from sklearn.exceptions import ConvergenceWarning  # noqa: E402
from sklearn.utils import check_random_state  # noqa: E402

from transformer_gmm import TransformerClusterer, TransformerGMM, _dask, _initialization  # noqa: E402
from transformer_gmm._fitting import draw_seed  # noqa: E402
from transformer_gmm.engine import em, fit, gaussian, kmeans, m_step, runs  # noqa: E402
from transformer_gmm.engine.plan import (  # noqa: E402
    GivenStarts,  # noqa: E402
    KMeansPlan,
    MixturePlan,
)

K = 3
CENTERS = [[-5.0, 0.0, 1.0], [0.0, 5.0, -1.0], [4.0, -1.0, 0.0]]
# Uneven chunks, two of them with fewer rows than K.
CHUNKS = ((2, 700, 1, 597, 500), (3,))


@pytest.fixture
def client(dask_client):
    with dask_client.as_current():
        yield dask_client


@pytest.fixture(params=["local", "distributed"])
def scheduler(request):
    """Dask's local threaded scheduler, or two worker processes behind a Client."""
    if request.param == "local":
        with dask.config.set(scheduler="threads"):
            yield None
        return
    client = request.getfixturevalue("client")
    with distributed.get_task_stream(client) as tasks:
        yield client
    assert tasks.data, "the fit should have run tasks on the cluster's workers"


@pytest.fixture(scope="module")
def X() -> np.ndarray:
    return make_blobs(600, CENTERS, seed=3)


@pytest.fixture(scope="module")
def X_dask(X):
    return da.from_array(X, chunks=CHUNKS)


def assert_same_mixture(dask_fit, memory_fit):
    for name in ["weights_", "means_", "covariances_", "precisions_cholesky_"]:
        np.testing.assert_allclose(
            getattr(dask_fit, name), getattr(memory_fit, name), rtol=0, atol=1e-6, err_msg=name
        )
    assert dask_fit.lower_bound_ == pytest.approx(memory_fit.lower_bound_, abs=1e-9)
    assert (dask_fit.n_iter_, dask_fit.converged_) == (memory_fit.n_iter_, memory_fit.converged_)
    assert dask_fit.init_method_ == memory_fit.init_method_


# --- the same fit as in memory ---------------------------------------------------------
# Up to 8,192 rows the sample is every row, so the starts (the transformer's and
# k-means++'s, from the same seed) are the in-memory fit's, and EM over the chunks, all
# runs in one pass an iteration, must end where EM in memory does.


@pytest.mark.parametrize("covariance_type", ["full", "diag", "tied", "spherical"])
def test_gmm_matches_in_memory_fit(scheduler, X, X_dask, covariance_type):
    options = dict(covariance_type=covariance_type, random_state=0)
    in_memory = TransformerGMM(K, **options).fit(X)
    by_chunks = TransformerGMM(K, **options).fit(X_dask)
    assert_same_mixture(by_chunks, in_memory)
    assert by_chunks.n_features_in_ == 3


def test_clusterer_matches_in_memory_fit(scheduler, X, X_dask):
    in_memory = TransformerClusterer(K, random_state=0).fit(X)
    by_chunks = TransformerClusterer(K, random_state=0).fit(X_dask)
    np.testing.assert_allclose(by_chunks.cluster_centers_, in_memory.cluster_centers_, atol=1e-6)
    assert by_chunks.inertia_ == pytest.approx(in_memory.inertia_, rel=1e-9)
    assert (by_chunks.n_iter_, by_chunks.init_method_) == (
        in_memory.n_iter_,
        in_memory.init_method_,
    )
    assert isinstance(by_chunks.labels_, da.Array)  # lazy, documented
    np.testing.assert_array_equal(by_chunks.labels_.compute(), in_memory.labels_)


def test_max_iter_zero_and_non_convergence(X, X_dask):
    with dask.config.set(scheduler="threads"):
        for max_iter in [0, 1]:
            options = dict(max_iter=max_iter, tol=0.0, checkpoint=None, random_state=0)
            fits, warned = [], []
            for data in [X_dask, X]:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    fits.append(TransformerGMM(K, **options).fit(data))
                warned.append(any(issubclass(w.category, ConvergenceWarning) for w in caught))
            assert_same_mixture(*fits)
            assert warned == [max_iter == 1] * 2


def test_large_array_matches_in_memory_em_from_its_start():
    """Above 8,192 rows the starts are built and chosen on a sample of the chunks; EM over
    the chunks from the chosen one ends where EM in memory from it ends."""
    X = make_blobs(4_000, CENTERS, seed=4)  # 12,000 rows
    X_dask = da.from_array(X, chunks=(2_500, -1))
    with dask.config.set(scheduler="threads"):
        gmm = TransformerGMM(K, covariance_type="full", checkpoint=None, n_init=2, random_state=0)
        gmm.fit(X_dask)
        # The same sample and the same start, then EM in memory on every row.
        seed = draw_seed(check_random_state(0))
        sample = _dask._summarize(X_dask, seed, "TransformerGMM").sample
    assert sample.shape == (8_192, 3)
    options = dict(covariance_type="full", reg_covar=1e-6, max_iter=100, tol=1e-3)
    plan = MixturePlan(n_components=K, device="cpu", seed=seed, n_kmeans_inits=2, **options)
    chosen = fit.fit(plan, [sample])
    start = m_step.MixtureParams(*(torch.from_numpy(getattr(chosen, f)) for f in runs.FIELDS))
    result = em.fit_em(torch.from_numpy(X)[None], start, **options)
    np.testing.assert_allclose(gmm.means_, result.params.means[0].numpy(), atol=1e-6)
    np.testing.assert_allclose(gmm.covariances_, result.params.covariances[0].numpy(), atol=1e-6)
    assert gmm.n_iter_ == int(chosen.n_iter[0] + result.n_iter[0])


# --- empty components and clusters follow the in-memory rules ---------------------------
# From a start of the plan's own, a Dask fit and an in-memory fit run from the same
# parameters, so they must agree also where a component or a cluster empties on the way.

FAR = [40.0, 40.0, 40.0]  # no row comes near: whatever starts here empties at once


def given_mixture_plan(covariance_type: str, means, weights=None, max_iter: int = 100):
    """A mixture plan that starts EM from ``means``, unit precisions and ``weights``."""
    n_components, n_features = np.shape(means)
    shape = {
        "full": (n_components, n_features, n_features),
        "tied": (n_features, n_features),
        "diag": (n_components, n_features),
        "spherical": (n_components,),
    }[covariance_type]
    precisions = np.ones(shape)
    if covariance_type in ("full", "tied"):
        precisions = np.broadcast_to(np.eye(n_features), shape).copy()
    given = GivenStarts(
        weights=np.full(n_components, 1.0 / n_components)
        if weights is None
        else np.asarray(weights),
        means=np.asarray(means, dtype=float),
        precisions_cholesky=_initialization.precisions_cholesky(precisions, covariance_type),
    )
    return MixturePlan(
        n_components=n_components,
        max_iter=max_iter,
        tol=1e-3,
        device="cpu",
        seed=0,
        covariance_type=covariance_type,
        reg_covar=1e-6,
        given=given,
        start_names=("user",),
    )


def assert_same_fits(by_chunks: fit.MixtureFits, in_memory: fit.MixtureFits):
    for name in ["weights", "means", "covariances", "precisions_cholesky", "lower_bound"]:
        np.testing.assert_allclose(
            getattr(by_chunks, name), getattr(in_memory, name), rtol=1e-9, atol=1e-9, err_msg=name
        )
    assert (by_chunks.n_iter, by_chunks.converged) == (in_memory.n_iter, in_memory.converged)


def counting(monkeypatch, module, name: str) -> list:
    """Count the calls of ``module.name``."""
    calls, original = [], getattr(module, name)

    def counted(*args):
        calls.append(name)
        return original(*args)

    monkeypatch.setattr(module, name, counted)
    return calls


@pytest.mark.parametrize("covariance_type", gaussian.COVARIANCE_TYPES)
def test_emptied_component_is_reseeded_as_in_memory(X, X_dask, covariance_type, monkeypatch):
    plan = given_mixture_plan(covariance_type, [CENTERS[0], CENTERS[1], FAR])
    reseeds = counting(monkeypatch, em, "_reseed")
    in_memory = fit.fit(plan, [X])
    assert reseeds, "the far component empties, and is re-seeded, in memory"
    with dask.config.set(scheduler="threads"):
        by_chunks = _dask.fit_plan(plan, X_dask)
    assert_same_fits(by_chunks, in_memory)


def test_empty_start_is_reseeded_as_in_memory(scheduler, X, X_dask, monkeypatch):
    # max_iter=0 returns the start, its empty component re-seeded.
    plan = given_mixture_plan("diag", [CENTERS[0], CENTERS[1], CENTERS[2]], [0.5, 0.5, 0.0], 0)
    reseeds = counting(monkeypatch, em, "_reseed")
    in_memory = fit.fit(plan, [X])
    assert reseeds
    assert_same_fits(_dask.fit_plan(plan, X_dask), in_memory)


@pytest.mark.parametrize("start", ["far", "twice"])
def test_emptied_cluster_is_relocated_as_in_memory(scheduler, X, X_dask, start, monkeypatch):
    # A centre far from every row, or one that another at the same place takes every row from.
    centers = {"far": [CENTERS[0], CENTERS[1], FAR], "twice": [CENTERS[0], CENTERS[0], FAR]}
    given = np.asarray(centers[start], dtype=float)[None]  # (1 run, K, d)
    plan = KMeansPlan(n_components=3, max_iter=300, tol=1e-4, device="cpu", seed=0, given=given)
    relocations = counting(monkeypatch, kmeans, "_relocate_empty")
    in_memory = fit.fit(plan, [X])
    assert relocations, "a cluster empties, and is relocated, in memory"
    by_chunks = _dask.fit_plan(plan, X_dask)
    np.testing.assert_allclose(by_chunks.centers, in_memory.centers, rtol=0, atol=1e-9)
    assert by_chunks.inertia == pytest.approx(in_memory.inertia, rel=1e-9)
    assert (by_chunks.n_iter, by_chunks.n_distinct) == (in_memory.n_iter, in_memory.n_distinct)


# --- lazy predictions ------------------------------------------------------------------


def test_gmm_predictions_are_lazy_and_equal(client, X, X_dask):
    gmm = TransformerGMM(K, random_state=0).fit(X)
    for method in ["predict", "predict_proba", "score_samples"]:
        lazy = getattr(gmm, method)(X_dask)
        assert isinstance(lazy, da.Array), method
        np.testing.assert_allclose(lazy.compute(), getattr(gmm, method)(X), rtol=1e-12)
    assert gmm.score(X_dask) == pytest.approx(gmm.score(X), rel=1e-12)
    assert isinstance(gmm.score(X_dask), float)
    assert gmm.bic(X_dask) == pytest.approx(gmm.bic(X), rel=1e-12)
    labels = TransformerGMM(K, random_state=0).fit_predict(X_dask)
    assert isinstance(labels, da.Array)
    np.testing.assert_array_equal(labels.compute(), gmm.predict(X))


def test_clusterer_predictions_are_lazy_and_equal(client, X, X_dask):
    clusterer = TransformerClusterer(K, random_state=0).fit(X)
    for method in ["predict", "transform"]:
        lazy = getattr(clusterer, method)(X_dask)
        assert isinstance(lazy, da.Array), method
        np.testing.assert_allclose(lazy.compute(), getattr(clusterer, method)(X), rtol=1e-12)
    assert clusterer.score(X_dask) == pytest.approx(clusterer.score(X), rel=1e-12)
    labels = TransformerClusterer(K, random_state=0).fit_predict(X_dask)
    np.testing.assert_array_equal(labels.compute(), clusterer.labels_)


def test_float32_array_gives_float32_parameters(X):
    X_dask = da.from_array(X.astype(np.float32), chunks=(1_000, -1))
    with dask.config.set(scheduler="threads"):
        gmm = TransformerGMM(K, checkpoint=None, random_state=0).fit(X_dask)
        clusterer = TransformerClusterer(K, checkpoint=None, random_state=0).fit(X_dask)
    assert gmm.means_.dtype == gmm.covariances_.dtype == np.float32
    assert clusterer.cluster_centers_.dtype == np.float32


# --- bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize("Estimator", [TransformerGMM, TransformerClusterer])
def test_bad_input(Estimator, X):
    estimator = Estimator(K, checkpoint=None, random_state=0)
    with pytest.raises(ValueError, match="chunked along its columns"):
        estimator.fit(da.from_array(X, chunks=(500, 2)))
    with pytest.raises(ValueError, match="Expected a 2D array"):
        estimator.fit(da.from_array(X[:, 0], chunks=500))
    with pytest.raises(ValueError, match="minimum of 2"):
        estimator.fit(da.from_array(X[:1], chunks=(1, -1)))
    with dask.config.set(scheduler="threads"):
        for bad, message in [(np.nan, "NaN"), (np.inf, "infinity")]:
            X_bad = X.copy()
            X_bad[1_234, 1] = bad
            with pytest.raises(ValueError, match=message):
                estimator.fit(da.from_array(X_bad, chunks=(500, -1)))
        estimator.fit(da.from_array(X, chunks=(500, -1)))
        lazy = estimator.predict(da.from_array(X_bad, chunks=(500, -1)))  # no error yet
        with pytest.raises(ValueError, match="infinity"):
            lazy.compute()
    with pytest.raises(ValueError, match="features"):
        estimator.predict(da.from_array(X[:, :2], chunks=(500, -1)))
