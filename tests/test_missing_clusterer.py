"""TransformerClusterer on data with missing entries (NaN): k-POD over the observed
entries, distances over the observed coordinates, the untouched path without NaN; and the
edge cases of missing data that both estimators share."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import sparse
from sklearn.metrics import adjusted_rand_score
from sklearn.utils import check_random_state
from test_missing_values import TRUE_MEANS, matched_error, mixture_with_gaps

from transformer_gmm import TransformerClusterer, TransformerGMM, _fitting, _missing
from transformer_gmm.engine import kpod

LABELS = np.repeat(np.arange(3), 400)


def observed_inertia(X: np.ndarray, centers: np.ndarray, labels: np.ndarray) -> float:
    """The inertia over the observed entries, written out."""
    gaps = (X - centers[labels]) ** 2
    return float(np.nansum(gaps))


def clusterer(**params) -> TransformerClusterer:
    return TransformerClusterer(3, checkpoint=None, random_state=0, **params)


def test_centres_close_to_truth_and_labels_right():
    _, X = mixture_with_gaps(rate=0.3)
    km = clusterer().fit(X)
    assert matched_error(km.cluster_centers_) < 0.3
    assert adjusted_rand_score(LABELS, km.labels_) > 0.85
    assert not np.isnan(km.cluster_centers_).any()


def test_labels_inertia_score_and_transform_read_the_observed_coordinates():
    _, X = mixture_with_gaps(rate=0.3)
    km = clusterer().fit(X)
    distances = km.transform(X)
    by_hand = np.sqrt(np.nansum((X[:, None] - km.cluster_centers_[None]) ** 2, axis=-1))
    np.testing.assert_allclose(distances, by_hand, rtol=1e-9, atol=1e-9)
    np.testing.assert_array_equal(km.predict(X), km.labels_)
    np.testing.assert_array_equal(distances.argmin(axis=1), km.labels_)
    assert np.isclose(km.inertia_, observed_inertia(X, km.cluster_centers_, km.labels_))
    assert np.isclose(km.score(X), -km.inertia_)
    assert np.array_equal(km.fit_predict(X), km.labels_)


def test_kpod_lowers_the_observed_inertia_of_its_start():
    _, X = mixture_with_gaps(rate=0.5)
    start = clusterer().fit(_missing.mean_imputed(X)).cluster_centers_
    start_labels = _missing.observed_distances(X, start).argmin(axis=1)
    result = kpod.fit_kpod(X, start, max_iter=300, tol=1e-4)
    assert result.converged
    assert result.inertia < observed_inertia(X, start, start_labels)
    assert np.isclose(result.inertia, observed_inertia(X, result.centers, result.labels))


def test_without_nan_the_fit_never_takes_the_missing_data_path(monkeypatch):
    X, _ = mixture_with_gaps()
    reference = clusterer().fit(X)

    def forbidden(*args, **kwargs):
        raise AssertionError("the missing-data path ran on data without NaN")

    monkeypatch.setattr(_missing, "kpod_in_canonical_order", forbidden)
    monkeypatch.setattr(_missing, "observed_distances", forbidden)
    monkeypatch.setattr(kpod, "fit_kpod", forbidden)
    km = clusterer().fit(X)
    for name in ("cluster_centers_", "labels_", "inertia_", "n_iter_"):
        np.testing.assert_array_equal(getattr(km, name), getattr(reference, name))
    km.predict(X), km.transform(X), km.score(X), km.fit_predict(X)


def test_without_nan_the_fit_is_the_fit_of_the_plan():
    X, _ = mixture_with_gaps()
    km = clusterer().fit(X)
    plan = _fitting.kmeans_plan(
        km.get_params(deep=False), X, None, check_random_state(0), "TransformerClusterer"
    )
    fitted = _fitting.run(plan, X)
    np.testing.assert_array_equal(km.cluster_centers_, fitted.centers)
    assert km.inertia_ == fitted.inertia


def test_row_order_does_not_change_the_fit():
    _, X = mixture_with_gaps(rate=0.3)
    order = np.random.default_rng(1).permutation(len(X))
    km = clusterer().fit(X)
    shuffled = clusterer().fit(X[order])
    np.testing.assert_allclose(shuffled.cluster_centers_, km.cluster_centers_, rtol=1e-10)
    np.testing.assert_array_equal(shuffled.labels_, km.labels_[order])


def test_integer_weights_fit_as_repeated_rows():
    _, X = mixture_with_gaps(rate=0.3)
    weights = np.random.default_rng(2).integers(1, 4, len(X))
    init = TRUE_MEANS + 0.5
    # tol=0: the tolerance reads the unweighted variance (as KMeans's), so with a positive
    # one the two could stop at different iterations.
    weighted = clusterer(init=init, n_init=1, tol=0.0).fit(X, sample_weight=weights)
    repeated = clusterer(init=init, n_init=1, tol=0.0).fit(np.repeat(X, weights, axis=0))
    np.testing.assert_allclose(weighted.cluster_centers_, repeated.cluster_centers_, rtol=1e-9)
    assert np.isclose(weighted.inertia_, repeated.inertia_, rtol=1e-9)


def test_float32_keeps_its_dtype():
    _, X = mixture_with_gaps()
    km = clusterer().fit(X.astype(np.float32))
    assert km.cluster_centers_.dtype == np.float32
    assert km.transform(X.astype(np.float32)).dtype == np.float32


def test_the_number_of_clusters_is_chosen_on_the_imputed_rows():
    _, X = mixture_with_gaps()
    km = TransformerClusterer("auto", max_clusters=4, criterion="bic", checkpoint=None,
                              random_state=0).fit(X)
    assert km.n_clusters_ in km.candidates_
    assert km.cluster_centers_.shape == (km.n_clusters_, 4)
    assert np.isclose(km.score(X), -km.inertia_)


def test_sparse_input_with_nan_is_the_dense_fit():
    _, X = mixture_with_gaps(rate=0.3)
    dense = clusterer().fit(X)
    from_sparse = clusterer().fit(sparse.csr_matrix(X))
    np.testing.assert_array_equal(from_sparse.cluster_centers_, dense.cluster_centers_)
    np.testing.assert_allclose(from_sparse.transform(sparse.csr_matrix(X)), dense.transform(X))


def test_the_nan_tag_is_set():
    assert clusterer().__sklearn_tags__().input_tags.allow_nan
    assert TransformerGMM(3).__sklearn_tags__().input_tags.allow_nan


# --- edge cases of both estimators -------------------------------------------------------

ESTIMATORS = [
    pytest.param(lambda: TransformerGMM(3, checkpoint=None, random_state=0), id="gmm"),
    pytest.param(lambda: clusterer(), id="clusterer"),
]


@pytest.mark.parametrize("make", ESTIMATORS)
def test_a_row_with_every_feature_missing_is_an_error(make):
    _, X = mixture_with_gaps()
    X_bad = X.copy()
    X_bad[5] = np.nan
    with pytest.raises(ValueError, match="every feature missing.*Drop these rows"):
        make().fit(X_bad)
    fitted = make().fit(X)
    with pytest.raises(ValueError, match="every feature missing"):
        fitted.predict(X_bad[:10])


@pytest.mark.parametrize("make", ESTIMATORS)
def test_a_column_with_every_value_missing_is_an_error(make):
    _, X = mixture_with_gaps()
    X[:, 1] = np.nan
    with pytest.raises(ValueError, match=r"Column\(s\) \[1\].*Drop these columns"):
        make().fit(X)


@pytest.mark.parametrize("make", ESTIMATORS)
def test_nan_in_sample_weight_is_an_error(make):
    _, X = mixture_with_gaps()
    weights = np.ones(len(X))
    weights[3] = np.nan
    with pytest.raises(ValueError, match="Input sample_weight contains NaN"):
        make().fit(X, sample_weight=weights)


@pytest.mark.filterwarnings("ignore:.*collapsed")
@pytest.mark.parametrize("make", ESTIMATORS)
def test_no_complete_row_and_a_column_observed_in_fewer_rows_than_components(make):
    # Documented behaviour: both fit. Every row has a gap, and feature 3 is observed in
    # two rows only (fewer than the 3 components): its estimates lean on those rows.
    X, _ = mixture_with_gaps()
    X[np.arange(len(X)), np.arange(len(X)) % 3] = np.nan
    X[2:, 3] = np.nan
    fitted = make().fit(X)
    centres = getattr(fitted, "means_", getattr(fitted, "cluster_centers_", None))
    assert np.isfinite(centres).all()
    assert len(np.unique(fitted.predict(X))) == 3


@pytest.mark.parametrize("make", ESTIMATORS)
def test_fewer_rows_than_components_is_an_error(make):
    _, X = mixture_with_gaps()
    with pytest.raises(ValueError, match="n_samples"):
        make().fit(X[:2])


@pytest.mark.parametrize("make", ESTIMATORS)
def test_partial_fit_takes_nan_as_fit_does(make):
    # The first batch is fitted as fit fits data with gaps (checkpoint=None: no views);
    # later batches with gaps step, from a first batch with or without them.
    complete, X = mixture_with_gaps()
    first, fitted = make().partial_fit(X), make().fit(X)
    centres = "means_" if hasattr(fitted, "means_") else "cluster_centers_"
    np.testing.assert_array_equal(getattr(first, centres), getattr(fitted, centres))
    for streaming in (first, make().partial_fit(complete)):
        streaming.partial_fit(X[::2])
        assert streaming.n_steps_ == 2 and np.isfinite(getattr(streaming, centres)).all()
    with pytest.raises(ValueError, match="every feature missing"):
        streaming.partial_fit(np.full((3, X.shape[1]), np.nan))


def test_gmm_refuses_sparse_input():
    _, X = mixture_with_gaps()
    with pytest.raises(TypeError, match="[Ss]parse"):
        TransformerGMM(3, checkpoint=None).fit(sparse.csr_matrix(X))


@pytest.mark.parametrize("make", ESTIMATORS)
def test_nan_in_a_dask_array_says_to_compute_or_impute(make):
    da = pytest.importorskip("dask.array")
    _, X = mixture_with_gaps()
    with pytest.raises(ValueError, match=r"impute.*X\.compute\(\)"):
        make().fit(da.from_array(X, chunks=(300, 4)))
