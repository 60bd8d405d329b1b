"""TransformerClusterer: labels from the per-point head, Lloyd refinement, KMeans's surface."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from conftest import TINY_CHECKPOINT, OneStandardization, make_blobs, transformer_estimates
from sklearn.cluster import KMeans
from sklearn.exceptions import ConvergenceWarning
from sklearn.metrics import adjusted_rand_score

from transformer_gmm import FallbackWarning, TransformerClusterer, _fitting
from transformer_gmm.engine import fit, model_cache


def test_transformer_path_clusters_separated_blobs(three_blobs):
    # The tiny checkpoint has random weights: whether its start beats k-means++ depends on
    # the 64 of 180 points it reads, which random_state draws; with this one it does.
    km = TransformerClusterer(3, checkpoint=TINY_CHECKPOINT, random_state=1).fit(three_blobs)
    assert km.init_method_ == "transformer"
    assert km.labels_.shape == (180,) and km.cluster_centers_.shape == (3, 2)
    reference = KMeans(3, n_init=10, random_state=0).fit(three_blobs)
    assert adjusted_rand_score(reference.labels_, km.labels_) == 1.0
    assert km.inertia_ == pytest.approx(reference.inertia_, rel=1e-9)
    assert km.n_iter_ >= 1


def test_max_iter_zero_uses_the_heads_labels(three_blobs):
    X = three_blobs[:60]  # within the tiny model's context: the head reads every point
    km = TransformerClusterer(3, checkpoint=TINY_CHECKPOINT, max_iter=0, n_init=1).fit(X)
    backbone = model_cache.load_backbone(TINY_CHECKPOINT)
    config = backbone.config
    noise = backbone.reading_config.noise_directions
    standardization = OneStandardization(X, config.d_max, 3, noise)
    estimate = transformer_estimates(backbone, [standardization.transform(X)], 3, "cpu")[0]
    head_labels = estimate.point_probs.argmax(axis=1)
    lifted_means = standardization.inverse_transform_means(estimate.means)
    for k in range(3):
        expected = X[head_labels == k].mean(axis=0) if (head_labels == k).any() else lifted_means[k]
        np.testing.assert_allclose(km.cluster_centers_[k], expected, rtol=1e-10)
    assert km.n_iter_ == 0
    # labels_ are always the nearest centre, as KMeans guarantees.
    np.testing.assert_array_equal(km.labels_, km.predict(X))


def test_labels_transform_predict_and_score_agree(three_blobs):
    km = TransformerClusterer(3, checkpoint=TINY_CHECKPOINT, random_state=0).fit(three_blobs)
    distances = km.transform(three_blobs)
    assert distances.shape == (180, 3)
    np.testing.assert_array_equal(distances.argmin(axis=1), km.labels_)
    np.testing.assert_array_equal(km.predict(three_blobs), km.labels_)
    np.testing.assert_array_equal(km.fit_predict(three_blobs), km.labels_)
    assert km.score(three_blobs) == pytest.approx(-km.inertia_, rel=1e-9)
    np.testing.assert_allclose(km.fit_transform(three_blobs), distances)


def test_fallback_warns_and_matches_kmeans(three_blobs, no_bundled_checkpoint):
    with pytest.warns(FallbackWarning):
        km = TransformerClusterer(3, random_state=0).fit(three_blobs)
    assert km.init_method_ == "k-means++"
    reference = KMeans(3, n_init=1, random_state=0).fit(three_blobs)
    assert adjusted_rand_score(reference.labels_, km.labels_) == 1.0
    with pytest.warns(FallbackWarning, match="not 6"):
        TransformerClusterer(6, checkpoint=TINY_CHECKPOINT, random_state=0).fit(three_blobs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        TransformerClusterer(3, checkpoint=None, random_state=0).fit(three_blobs)


def test_fallback_warning_names_kmeans_not_em(three_blobs, no_bundled_checkpoint):
    for checkpoint in ["default", TINY_CHECKPOINT]:
        with pytest.warns(FallbackWarning) as caught:
            TransformerClusterer(6, checkpoint=checkpoint, random_state=0).fit(three_blobs)
        (message,) = [str(w.message) for w in caught if w.category is FallbackWarning]
        assert "k-means (Lloyd) with k-means++ seeding" in message
        assert "EM" not in message


@pytest.mark.parametrize("checkpoint", [TINY_CHECKPOINT, None])
def test_float32_data_gives_float32_centres_as_kmeans_does(three_blobs, checkpoint):
    X32 = three_blobs.astype(np.float32)
    km = TransformerClusterer(3, checkpoint=checkpoint, random_state=0).fit(X32)
    reference = KMeans(3, random_state=0).fit(X32)
    assert km.cluster_centers_.dtype == reference.cluster_centers_.dtype == np.float32
    assert km.transform(X32).dtype == reference.transform(X32).dtype == np.float32
    assert type(km.inertia_) is float and km.labels_.dtype == np.int32
    wide = TransformerClusterer(3, checkpoint=checkpoint, random_state=0).fit(three_blobs)
    assert wide.cluster_centers_.dtype == np.float64
    # The same optimum; rounded rows are other values, which can order the rows, and so
    # number the clusters, differently.
    order32, order64 = (np.lexsort(c.T[::-1]) for c in (km.cluster_centers_, wide.cluster_centers_))
    np.testing.assert_allclose(
        km.cluster_centers_[order32], wide.cluster_centers_[order64], rtol=1e-6
    )


@pytest.mark.parametrize("checkpoint", [TINY_CHECKPOINT, None])
def test_fewer_distinct_clusters_than_asked_warns_as_kmeans_does(checkpoint):
    X = np.ones((50, 3))
    with pytest.warns(ConvergenceWarning) as theirs:
        KMeans(3, random_state=0).fit(X)
    with pytest.warns(ConvergenceWarning) as ours:
        km = TransformerClusterer(3, checkpoint=checkpoint, random_state=0).fit(X)
    assert len(np.unique(km.labels_)) == 1
    assert [str(w.message) for w in ours] == [str(w.message) for w in theirs]
    assert str(ours[0].message) == (
        "Number of distinct clusters (1) found smaller than n_clusters (3). "
        "Possibly due to duplicate points in X."
    )
    assert ours[0].filename == __file__  # points at the caller's line
    # Two distinct points for three clusters.
    with pytest.warns(ConvergenceWarning, match=r"distinct clusters \(2\) found smaller"):
        TransformerClusterer(3, checkpoint=checkpoint).fit(np.repeat([[0.0], [5.0]], 20, axis=0))


def test_same_random_state_same_result():
    X = make_blobs(40, [[-4.0, 0.0], [0.0, 4.0], [4.0, 0.0], [0.0, -4.0]], seed=8)
    for checkpoint in [TINY_CHECKPOINT, None]:
        a = TransformerClusterer(4, checkpoint=checkpoint, n_init=3, random_state=3).fit(X)
        b = TransformerClusterer(4, checkpoint=checkpoint, n_init=3, random_state=3).fit(X)
        np.testing.assert_array_equal(a.cluster_centers_, b.cluster_centers_)
        np.testing.assert_array_equal(a.labels_, b.labels_)


def test_n_init_keeps_the_lowest_inertia():
    X = make_blobs(30, np.random.default_rng(9).uniform(-3, 3, (4, 2)), seed=9)
    single = TransformerClusterer(4, checkpoint=TINY_CHECKPOINT, random_state=0).fit(X)
    several = TransformerClusterer(4, checkpoint=TINY_CHECKPOINT, n_init=8, random_state=0).fit(X)
    assert several.inertia_ <= single.inertia_ + 1e-9
    # 120 points > the tiny model's context: the same seed reads the same subsample.
    first = TransformerClusterer(4, checkpoint=TINY_CHECKPOINT, n_init=1, random_state=1).fit(X)
    both = TransformerClusterer(4, checkpoint=TINY_CHECKPOINT, n_init=2, random_state=1).fit(X)
    assert both.inertia_ <= first.inertia_ + 1e-9 and both.init_method_ == "transformer"


def test_views_add_starts_and_never_raise_the_inertia():
    X = make_blobs(30, np.random.default_rng(9).uniform(-3, 3, (4, 2)), seed=9)
    params = dict(checkpoint=TINY_CHECKPOINT, max_iter=0, random_state=2)
    one = TransformerClusterer(4, **params).fit(X)
    four = TransformerClusterer(4, n_views=4, **params).fit(X)
    assert _fitting.n_starts(four._fit_params(), True) == (8, 0)
    assert four.init_method_ == "transformer"
    assert four.inertia_ <= one.inertia_ + 1e-9


def test_large_fit_compares_starts_on_a_subsample_then_runs_lloyd_on_all_rows(monkeypatch):
    monkeypatch.setattr(fit, "SELECTION_ROWS", 100)  # 400 rows count as large
    centers = [[-6.0, 0.0], [0.0, 6.0], [6.0, 0.0], [0.0, -6.0]]
    X = make_blobs(100, centers, seed=13)
    km = TransformerClusterer(4, checkpoint=TINY_CHECKPOINT, random_state=0).fit(X)
    # Lloyd's fixed point on all of X: each centre is the mean of its points there.
    assert km.labels_.shape == (400,)
    for k in range(4):
        np.testing.assert_allclose(km.cluster_centers_[k], X[km.labels_ == k].mean(axis=0))
    assert km.inertia_ == pytest.approx(((X - km.cluster_centers_[km.labels_]) ** 2).sum())
    distances = np.linalg.norm(km.cluster_centers_[:, None] - np.array(centers)[None], axis=-1)
    assert distances.min(axis=0).max() < 0.5


@pytest.mark.parametrize("dtypes", [("float64", "float64"), ("float32", "float64"),
                                    ("float64", "float32"), ("float32", "float32")])
def test_distances_are_scikit_learns_to_the_bit(dtypes):
    # predict and transform compute euclidean_distances' arithmetic themselves, on rows
    # the estimator already validated; the distances must be the ones it gives.
    from sklearn.metrics.pairwise import euclidean_distances

    from transformer_gmm.cluster import _distances

    rng = np.random.default_rng(0)
    for n, d, k, scale in [(1, 3, 2, 1.0), (500, 7, 5, 1e6), (2000, 64, 9, 1e-4)]:
        X = (rng.normal(size=(n, d)) * scale + 100 * scale).astype(dtypes[0])
        centers = (rng.normal(size=(k, d)) * scale).astype(dtypes[1])
        offset = centers.mean(axis=0)
        expected = euclidean_distances(X - offset, centers - offset)
        found = _distances(X, centers)
        assert found.dtype == expected.dtype and np.array_equal(found, expected)
