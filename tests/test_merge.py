"""Merging a mixture's components into clusters (transformer_gmm._merge)."""

import copy
import pickle

import numpy as np
import pytest
from sklearn.datasets import make_blobs, make_circles, make_moons
from sklearn.metrics import adjusted_rand_score
from sklearn.metrics.pairwise import pairwise_distances_argmin

from transformer_gmm import TransformerClusterer, TransformerGMM
from transformer_gmm._merge import (
    SeparatedCount,
    _principal_axes,
    choose_n_clusters,
    component_to_cluster,
    entropy,
    merge_connected,
    merge_hierarchy,
    separated_count,
    separated_partition,
)
from transformer_gmm.cluster import is_one_gaussian


def separated_blobs(seed: int, k: int, n: int = 300) -> tuple[np.ndarray, np.ndarray]:
    """``k`` unit Gaussians in the plane, means at least six standard deviations apart."""
    rng = np.random.default_rng(seed)
    while True:
        means = rng.uniform(-12, 12, (k, 2))
        gaps = np.linalg.norm(means[:, None] - means[None], axis=-1)
        if gaps[~np.eye(k, dtype=bool)].min() >= 6:
            break
    labels = np.arange(n) % k
    return means[labels] + rng.standard_normal((n, 2)), labels


def two_clusters_of_two_gaussians(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Two clusters far apart, each drawn as two overlapping Gaussians."""
    rng = np.random.default_rng(seed)
    means = [(-12, 0), (-10, 0), (10, 0), (12, 0)]
    X = np.vstack([rng.normal(m, 1, (100, 2)) for m in means])
    return X, np.repeat([0, 0, 1, 1], 100)


def fitted_attributes(estimator) -> dict:
    return {k: copy.deepcopy(v) for k, v in vars(estimator).items() if k.endswith("_")}


def test_overlapping_pairs_merge_into_two_clusters():
    X, truth = two_clusters_of_two_gaussians()
    gmm = TransformerGMM(n_components=4, checkpoint=None, random_state=0).fit(X)
    mapping = gmm.merge_components(X)
    labels = mapping[gmm.predict(X)]
    assert mapping.max() + 1 == 2
    assert np.array_equal(labels == labels[0], truth == truth[0])


def test_separated_gaussians_are_not_merged():
    rng = np.random.default_rng(1)
    X = np.vstack([rng.normal(m, 1, (80, 2)) for m in ((-10, -10), (-10, 10), (10, -10), (10, 10))])
    gmm = TransformerGMM(n_components=4, checkpoint=None, random_state=0).fit(X)
    assert len(np.unique(gmm.merge_components(X))) == 4


def test_merging_leaves_the_mixture_unchanged():
    X, _ = two_clusters_of_two_gaussians()
    gmm = TransformerGMM(n_components=4, checkpoint=None, random_state=0).fit(X)
    before = fitted_attributes(gmm)
    gmm.merge_components(X)
    gmm.merge_components(X, n_clusters=1)
    after = fitted_attributes(gmm)
    assert before.keys() == after.keys()
    for name, value in before.items():
        np.testing.assert_array_equal(np.asarray(after[name]), np.asarray(value), err_msg=name)


def test_entropy_never_increases_along_the_hierarchy():
    rng = np.random.default_rng(2)
    for _ in range(5):
        resp = rng.dirichlet(np.full(6, 0.5), size=200)
        hierarchy = merge_hierarchy(resp)
        assert len(hierarchy.entropy) == 6
        assert np.isclose(hierarchy.entropy[0], entropy(resp))
        assert np.all(np.diff(hierarchy.entropy) <= 1e-9)
        assert np.isclose(hierarchy.entropy[-1], 0.0)
        assert np.allclose(hierarchy.entropy[:-1] - hierarchy.entropy[1:], hierarchy.drops)


def test_greedy_merge_takes_the_largest_drop():
    rng = np.random.default_rng(3)
    resp = rng.dirichlet(np.full(5, 0.7), size=100)
    first = merge_hierarchy(resp).drops[0]
    for a in range(5):
        for b in range(a + 1, 5):
            merged = np.delete(resp, b, axis=1)
            merged[:, a] += resp[:, b]
            assert entropy(resp) - entropy(merged) <= first + 1e-9


def test_hierarchy_is_deterministic_and_weighted():
    rng = np.random.default_rng(4)
    resp = rng.dirichlet(np.ones(4), size=50)
    one, two = merge_hierarchy(resp), merge_hierarchy(resp.copy())
    assert one.pairs == two.pairs and np.array_equal(one.entropy, two.entropy)
    # Integer weights count as repeated rows.
    weights = rng.integers(1, 4, 50)
    weighted = merge_hierarchy(resp, weights)
    repeated = merge_hierarchy(np.repeat(resp, weights, axis=0))
    assert weighted.pairs == repeated.pairs
    assert np.allclose(weighted.entropy, repeated.entropy)


def test_cut_and_choice():
    resp = np.array([[0.5, 0.5, 0.0], [0.5, 0.5, 0.0], [0.0, 0.0, 1.0]])
    hierarchy = merge_hierarchy(resp)
    assert choose_n_clusters(hierarchy) == 2  # the 50/50 pair merges, the third stays
    assert component_to_cluster(hierarchy, 2).tolist() == [0, 0, 1]
    assert component_to_cluster(hierarchy, 3).tolist() == [0, 1, 2]
    assert component_to_cluster(hierarchy, 1).tolist() == [0, 0, 0]
    with pytest.raises(ValueError, match="between 1 and"):
        component_to_cluster(hierarchy, 4)


def two_rings(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Two thin nested rings, each cut into four arcs: the rows, their ring, and soft
    assignments to the eight arcs (a row near an arc's end shares up to a tenth with the
    next arc: arcs of a thin ring barely overlap)."""
    rng = np.random.default_rng(seed)
    angle = rng.uniform(0, 2 * np.pi, 400)
    ring = np.repeat([0, 1], 200)
    radius = np.where(ring == 0, 1.0, 2.0) + rng.normal(0, 0.03, 400)
    X = np.column_stack([radius * np.cos(angle), radius * np.sin(angle)])
    position = angle / (np.pi / 2)  # 0 .. 4 along each ring
    arc = np.floor(position).astype(int) % 4
    share = np.clip(position - np.floor(position) - 0.9, 0, None)  # 0 .. 0.1 near the end
    resp = np.zeros((400, 8))
    rows = np.arange(400)
    resp[rows, 4 * ring + arc] = 1 - share
    resp[rows, 4 * ring + (arc + 1) % 4] += share
    return X, ring, resp


def test_touching_arcs_merge_before_rings_that_overlap_a_little_in_entropy():
    X, ring, resp = two_rings()
    # Some inner rows shared evenly with the outer arc beside them: the entropy merges
    # across the rings first; their rows do not touch.
    resp[:30] = 0.5 * resp[:30] + 0.5 * np.roll(resp[:30], 4, axis=1)
    mapping = merge_connected(X, resp, 2)
    assert mapping.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    hierarchy = merge_hierarchy(resp)
    assert component_to_cluster(hierarchy, 2).tolist() != mapping.tolist()


def test_connected_merges_ignore_row_order_and_rows_of_no_weight():
    X, ring, resp = two_rings(1)
    mapping = merge_connected(X, resp, 2)
    order = np.random.default_rng(0).permutation(len(X))
    assert np.array_equal(merge_connected(X[order], resp[order], 2), mapping)
    # A row of weight zero between the rings links nothing.
    weights = np.ones(len(X) + 1)
    weights[-1] = 0
    bridge = np.vstack([X, [[1.5, 0.0]]])
    bridged_resp = np.vstack([resp, np.full((1, 8), 1 / 8)])
    assert np.array_equal(merge_connected(bridge, bridged_resp, 2, weights), mapping)
    with pytest.raises(ValueError, match="between 1 and"):
        merge_connected(X, resp, 9)


def test_rows_with_gaps_link_nothing():
    """A row with NaN between the rings takes part in the entropy, not in the links; a
    mixture fitted on data with gaps merges down to a count."""
    X, ring, resp = two_rings(2)
    mapping = merge_connected(X, resp, 2)
    gappy = np.vstack([X, [[1.5, np.nan]]])
    assert np.array_equal(merge_connected(gappy, np.vstack([resp, np.full((1, 8), 1 / 8)]), 2),
                          mapping)
    assert merge_connected(np.full((3, 2), np.nan), np.eye(3), 2).max() == 1
    X, truth = two_clusters_of_two_gaussians()
    X[3, 1] = np.nan
    gmm = TransformerGMM(n_components=4, checkpoint=None, random_state=0).fit(X)
    labels = gmm.merge_components(X, n_clusters=2)[gmm.predict(X)]
    assert np.array_equal(labels == labels[0], truth == truth[0])


def test_merge_components_rejects_a_bad_n_clusters():
    X, _ = two_clusters_of_two_gaussians()
    gmm = TransformerGMM(n_components=4, checkpoint=None, random_state=0).fit(X)
    with pytest.raises(ValueError, match="pass None to choose it"):
        gmm.merge_components(X, n_clusters=5)
    assert gmm.merge_components(X, n_clusters=3).max() == 2


def test_clusterer_counts_merged_clusters():
    X, truth = two_clusters_of_two_gaussians()
    params = dict(n_clusters=[4], merge=True, checkpoint=None, random_state=0)
    km = TransformerClusterer(**params).fit(X)
    assert km.mixture_.n_components_ == 4 and km.n_clusters_ == 2
    assert km.cluster_centers_.shape == (2, 2)
    assert np.array_equal(km.predict(X), km.labels_)
    assert np.array_equal(km.labels_ == km.labels_[0], truth == truth[0])
    assert np.isclose(km.inertia_, ((X - km.cluster_centers_[km.labels_]) ** 2).sum())
    again = TransformerClusterer(**params).fit(X)
    assert np.array_equal(again.labels_, km.labels_)
    # An int n_clusters ignores merge, and forgets the merged fit's attributes.
    km.set_params(n_clusters=4).fit(X)
    assert km.n_clusters_ == 4 and not hasattr(km, "component_to_cluster_")


def test_merged_clusterer_refuses_missing_values_with_a_clear_error():
    X = np.random.default_rng(0).normal(size=(60, 2))
    X[3, 1] = np.nan
    with pytest.raises(ValueError, match="merge=True does not take missing values"):
        TransformerClusterer(n_clusters=[2], merge=True, checkpoint=None).fit(X)


def test_rows_that_stand_apart_are_their_own_partition():
    """Nested circles: the rows' groups are the circles, whatever the rows' order or the
    weights' scale; a zero-weight row between them links nothing; Gaussians that overlap,
    or more groups than stand apart, give none."""
    X, truth = make_circles(400, factor=0.5, noise=0.04, random_state=0)
    rows, groups = separated_partition(X, 2)
    assert adjusted_rand_score(truth, groups[pairwise_distances_argmin(X, rows)]) == 1.0
    order = np.random.default_rng(0).permutation(len(X))
    for again in (separated_partition(X[order], 2), separated_partition(X, 2, np.full(400, 0.3))):
        assert np.array_equal(again[0], rows) and np.array_equal(again[1], groups)
    bridged = np.vstack([X, np.linspace([0.5, 0.0], [1.0, 0.0], 12)])
    weights = np.r_[np.ones(400), np.zeros(12)]
    assert np.array_equal(separated_partition(bridged, 2, weights)[1], groups)
    assert separated_partition(bridged, 2) is None  # the bridge joins the circles
    assert separated_partition(X, 5) is None  # pieces of one circle touch
    overlapping, _ = make_blobs(300, centers=[[0, 0], [2, 0], [0, 2]], random_state=0)
    assert separated_partition(overlapping, 3) is None
    assert separated_partition(X, 1) is None


def test_merged_clusterer_splits_components_that_span_nested_circles():
    X, truth = make_circles(300, factor=0.5, noise=0.05, random_state=1)
    km = TransformerClusterer(n_clusters="auto", merge=True, random_state=0).fit(X)
    assert km.n_clusters_ == 2 and adjusted_rand_score(truth, km.labels_) == 1.0
    assert np.array_equal(km.predict(X), km.labels_)
    new, new_truth = make_circles(200, factor=0.5, noise=0.05, random_state=2)
    assert adjusted_rand_score(new_truth, km.predict(new)) > 0.95
    assert np.array_equal(pickle.loads(pickle.dumps(km)).predict(new), km.predict(new))
    order = np.random.default_rng(0).permutation(len(X))
    shuffled = TransformerClusterer(n_clusters="auto", merge=True, random_state=0).fit(X[order])
    assert np.array_equal(shuffled.predict(new), km.predict(new))
    # The centres and inertia are summed in canonical row order: the same to the bit.
    assert np.array_equal(shuffled.cluster_centers_, km.cluster_centers_)
    assert shuffled.inertia_ == km.inertia_


def test_merged_centres_are_the_same_whatever_the_row_order():
    # Two moons labelled by their merged mixture (the sums over rows once moved in the
    # last bits with the rows' order), with and without weights.
    X, _ = make_moons(300, noise=0.05, random_state=0)
    weight = np.random.default_rng(1).uniform(0.5, 2.0, len(X))
    order = np.random.default_rng(0).permutation(len(X))
    for w in (None, weight):
        fits = [
            TransformerClusterer(n_clusters="auto", merge=True, random_state=0).fit(
                rows, sample_weight=None if w is None else w[index]
            )
            for rows, index in ((X, np.arange(len(X))), (X[order], order))
        ]
        np.testing.assert_array_equal(fits[1].cluster_centers_, fits[0].cluster_centers_)
        assert fits[1].inertia_ == fits[0].inertia_
        np.testing.assert_array_equal(fits[1].labels_, fits[0].labels_[order])


def test_separated_count_lowers_a_count_to_blobs_that_stand_apart():
    X, truth = separated_blobs(1, 7)
    read = separated_count(X, 10, None, is_one_gaussian)
    assert read.n_clusters == 7
    rows, groups = read.partition
    assert adjusted_rand_score(truth[pairwise_distances_argmin(rows, X)], groups) == 1.0
    assert separated_count(X, 8, None, is_one_gaussian).n_clusters == 7
    kept = separated_count(X, 7, None, is_one_gaussian)  # the count stands already
    assert kept.n_clusters == 7 and np.array_equal(kept.partition[1], groups)
    order = np.random.default_rng(0).permutation(len(X))
    assert separated_count(X[order], 10, None, is_one_gaussian).n_clusters == 7
    # Rows of no weight are not read, wherever they lie.
    far = np.vstack([X, np.full((20, 2), 100.0)])
    weights = np.r_[np.ones(len(X)), np.zeros(20)]
    assert separated_count(far, 10, weights, is_one_gaussian).n_clusters == 7
    # Below the count, the count stands unless more candidates are allowed (next test).
    assert separated_count(X, 2, None, is_one_gaussian).n_clusters == 2
    assert separated_count(X[:3], 2, None, is_one_gaussian) is None  # too few rows


def test_separated_count_raises_a_count_to_sheared_blobs_far_apart():
    # Six blobs sheared alike (scikit-learn's anisotropic example), far apart: a count of
    # two or three is raised to the six groups, each one Gaussian in its own axes (a
    # diagonal test in the data's axes would read each tilted blob as two).
    rng = np.random.default_rng(3)
    means = 16.0 * np.array([[0, 0], [1, 0], [2, 0], [0, 1], [1, 1], [2, 1]])
    truth = np.arange(360) % 6
    X = (means[truth] + rng.standard_normal((360, 2))) @ np.array([[0.6, -0.64], [-0.41, 0.85]])
    for count in (1, 2, 3):
        read = separated_count(X, count, None, is_one_gaussian, 10)
        assert read.n_clusters == 6
        rows, groups = read.partition
        assert adjusted_rand_score(truth[pairwise_distances_argmin(rows, X)], groups) == 1.0
    # 6 not allowed: 5, the most allowed (one group holds two blobs far apart).
    assert separated_count(X, 3, None, is_one_gaussian, 5).n_clusters == 5
    blobs = [X[truth == k] for k in range(6)]
    assert not any(is_one_gaussian(blob, 6) for blob in blobs)  # tilted: two diagonal ones
    assert all(is_one_gaussian(_principal_axes(blob), 6) for blob in blobs)
    # Two moons: their arcs never stand far enough apart to be counted as more.
    moons, _ = make_moons(300, noise=0.05, random_state=0)
    assert separated_count(moons, 2, None, is_one_gaussian, 10).n_clusters == 2


def test_separated_count_raises_a_count_past_one_group_of_touching_blobs():
    # The six sheared blobs with two of them touching: five groups stand far apart, four
    # of them one Gaussian each and one of two (not one Gaussian). They are at least five
    # clusters, and the count is raised to five.
    rng = np.random.default_rng(3)
    means = 16.0 * np.array([[0, 0], [1, 0], [2, 0], [0, 1], [1, 1], [2, 1]])
    means[1] = means[0] + [0.0, 5.0]  # touching the first blob
    truth = np.arange(360) % 6
    X = (means[truth] + rng.standard_normal((360, 2))) @ np.array([[0.6, -0.64], [-0.41, 0.85]])
    assert not is_one_gaussian(_principal_axes(X[truth <= 1]), 5)
    joined = np.where(truth == 1, 0, truth)
    for count in (1, 2, 3):
        read = separated_count(X, count, None, is_one_gaussian, 10)
        assert read.n_clusters == 5
        rows, groups = read.partition
        assert adjusted_rand_score(joined[pairwise_distances_argmin(rows, X)], groups) == 1.0


def test_separated_count_keeps_a_count_of_touching_or_curved_clusters():
    rng = np.random.default_rng(2)
    centres = ([0, 0], [2.5, 0], [5, 0], [20, 20])  # three touching, one apart
    touching = np.vstack([rng.normal(c, 1, (100, 2)) for c in centres])
    assert separated_partition(touching, 2) is not None  # two groups stand apart, but one
    assert separated_count(touching, 5, None, is_one_gaussian) == SeparatedCount(5, None)
    rings, _ = make_circles(400, noise=0.02, factor=0.3, random_state=0)
    assert separated_partition(rings, 2) is not None
    # A ring is not one Gaussian.
    assert separated_count(rings, 4, None, is_one_gaussian) == SeparatedCount(4, None)


def test_one_gaussian_test_asks_more_of_two_where_many_groups_are_tested():
    # 37 rows of one Gaussian that BIC, alone, reads as two (2 of 300 such draws): one of
    # eight groups tested together, they are one, as a count of eight needs all eight.
    rows = np.random.default_rng(112).normal(size=(37, 2))
    assert not is_one_gaussian(rows)
    assert is_one_gaussian(rows, 8)
    # Two blobs apart stay two, whatever the number of groups.
    rng = np.random.default_rng(0)
    pair = np.vstack([rng.normal(0, 1, (40, 2)), rng.normal(8, 1, (40, 2))])
    assert not is_one_gaussian(pair, 10)
