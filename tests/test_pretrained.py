"""The bundled default checkpoint: found offline, used by default, and pinned.

The reference values below were measured with the checkpoint when it shipped; a change in
the checkpoint, the preprocessing or the readout that moves them fails here first.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from conftest import OneStandardization, transformer_estimates
from sklearn.datasets import make_circles, make_moons
from sklearn.metrics import adjusted_rand_score
from sklearn.mixture import GaussianMixture
from test_merge import separated_blobs

from transformer_gmm import TransformerClusterer, TransformerGMM
from transformer_gmm.engine import model_cache
from transformer_gmm.storage import checkpoints

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
from common import mean_error, paper_em, sample_tgmm_task  # noqa: E402


def overlapping_blobs() -> np.ndarray:
    """Three unit-variance components 1.5 to 2.1 apart: soft responsibilities."""
    rng = np.random.default_rng(2025)
    centers = np.array([[-1.5, 0.0], [0.0, 1.5], [1.5, 0.0]])
    return np.vstack([rng.normal(c, 1.0, (40, 2)) for c in centers])


def four_blobs_in_20d() -> np.ndarray:
    """20 features > K - 1 = 3: goes through the projection."""
    rng = np.random.default_rng(7)
    centers = rng.uniform(-5, 5, (4, 20))
    return np.vstack([rng.normal(c, 1.0, (30, 20)) for c in centers])


def test_default_checkpoint_is_bundled_and_covers_2_to_10_components():
    bundled = checkpoints.bundled_checkpoints()
    assert "default" in bundled
    backbone = model_cache.load_backbone("default")
    assert backbone.supported_n_components == range(2, 11)
    card = (bundled["default"] / "README.md").read_text()
    for fact in ("steps", "tasks seen", "hardware", "wall time", "benchmarks/accuracy.py"):
        assert fact in card


def test_estimators_use_it_offline_without_a_warning(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # bundled: never a network request
    X = overlapping_blobs()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gmm = TransformerGMM(3, n_init=1, random_state=0).fit(X)
        km = TransformerClusterer(3, n_init=1, random_state=0).fit(X)
    assert gmm.init_method_ == "transformer" and km.init_method_ == "transformer"


# The network's own output (model space), sorted by the first coordinate of the means.
PINNED_RAW = {
    "overlapping": dict(
        weights=[0.31337, 0.3509, 0.33572],
        means=[[-1.0583, 0.01918], [0.18301, -0.14831], [0.60699, 0.26113]],
        scales=[0.81519, 0.77447, 0.82458],
    ),
    "20d": dict(
        weights=[0.24038, 0.23171, 0.27226, 0.25565],
        means=[[-1.54859, -1.34316], [-0.71101, 1.25938], [0.2654, 0.97623], [2.02247, -0.75638]],
        scales=[0.19914, 0.16052, 0.16996, 0.19914],
    ),
}
DATA = {"overlapping": (overlapping_blobs, 3), "20d": (four_blobs_in_20d, 4)}


@pytest.mark.parametrize("name", sorted(PINNED_RAW))
def test_pinned_network_output(name):
    make_data, n_components = DATA[name]
    X = make_data()
    backbone = model_cache.load_backbone("default")
    config = backbone.config
    noise = backbone.reading_config.noise_directions
    standardization = OneStandardization(X, config.d_max, n_components, noise)
    (estimate,) = transformer_estimates(
        backbone, [standardization.transform(X)], n_components, "cpu"
    )
    order = np.argsort(estimate.means[:, 0])
    expected = PINNED_RAW[name]
    np.testing.assert_allclose(estimate.weights[order], expected["weights"], atol=2e-4)
    np.testing.assert_allclose(estimate.means[order, :2], expected["means"], atol=2e-4)
    np.testing.assert_allclose(estimate.scales[order, 0], expected["scales"], atol=2e-4)


def test_pinned_estimate_in_the_users_space():
    # max_iter=0: one M-step on the network's responsibilities, no EM iteration.
    gmm = TransformerGMM(3, max_iter=0, n_init=1, random_state=0).fit(overlapping_blobs())
    order = np.argsort(gmm.means_[:, 0])
    # The checkpoint reads these 120 rows as 32 weighted cells (summary_cells).
    np.testing.assert_allclose(gmm.weights_[order], [0.32343, 0.34204, 0.33453], atol=1e-4)
    np.testing.assert_allclose(
        gmm.means_[order],
        [[-1.60448, 0.30506], [0.47055, 0.08146], [1.10479, 0.83828]],
        atol=1e-4,
    )
    # Separated components: the readout averages the points themselves, so its means are
    # the clusters' sample means even where the network's regressed means are coarse.
    X = four_blobs_in_20d()
    gmm = TransformerGMM(4, max_iter=0, n_init=1, random_state=0).fit(X)
    true_clusters = np.repeat(np.arange(4), 30)
    sample_means = np.stack([X[true_clusters == k].mean(axis=0) for k in range(4)])
    order = np.argsort(gmm.means_[:, 0])
    np.testing.assert_allclose(gmm.means_[order], sample_means[np.argsort(sample_means[:, 0])])
    np.testing.assert_allclose(gmm.weights_, 0.25)


def test_it_beats_the_papers_em_and_matches_a_single_em_run():
    # A cell of benchmarks/accuracy.py (d = 8, K = 3), with fewer tasks.
    rng = np.random.default_rng(83)
    tasks = [sample_tgmm_task(rng, 3, 8) for _ in range(12)]
    alone, default, paper, single = [], [], [], []
    for seed, task in enumerate(tasks):
        fit = dict(covariance_type="spherical", random_state=seed)
        means = TransformerGMM(3, max_iter=0, n_init=1, **fit).fit(task.X).means_
        alone.append(mean_error(means, task.means))
        default.append(mean_error(TransformerGMM(3, **fit).fit(task.X).means_, task.means))
        paper.append(mean_error(paper_em(task.X, 3, np.random.default_rng(seed))[0], task.means))
        means = GaussianMixture(3, **fit).fit(task.X).means_
        single.append(mean_error(means, task.means))
    assert np.mean(alone) < np.mean(paper)
    assert np.mean(default) <= 1.01 * np.mean(single)


# --- choosing K with the bundled checkpoint -------------------------------------------------


def three_separated_blobs() -> np.ndarray:
    rng = np.random.default_rng(2025)
    return np.vstack([rng.normal(c, 1.0, (100, 2)) for c in ([-6, 0], [6, 0], [0, 8])])


def test_the_bundled_checkpoint_reads_p_of_k():
    backbone = model_cache.load_backbone("default")
    assert backbone.has_k_posterior and backbone.config.k_posterior_seeds == 4


@pytest.mark.parametrize(
    "make_X, k_bic, k_posterior, k_clusterer, posterior",
    [
        (
            three_separated_blobs,
            3,
            3,
            3,
            [9.0523e-08, 1.6400e-04, 8.9665e-01, 6.5421e-02, 2.6693e-02,
             6.6524e-03, 2.5190e-03, 1.1491e-03, 4.1604e-04, 3.3544e-04],
        ),
        (
            # Full covariances from 30 points a cluster in 20 dimensions: near-singular
            # components lift the likelihood more than BIC's penalty costs, so BIC took
            # the largest candidate. It now passes over candidates with collapsed
            # components, and among the others a full covariance in 20 dimensions costs
            # more than four clusters of 30 points buy: it takes one. The posterior (the
            # default) and X-means find the four.
            four_blobs_in_20d,
            1,
            4,
            4,
            [4.9276e-12, 6.3057e-12, 3.6893e-06, 9.9944e-01, 5.5158e-04,
             5.5311e-07, 4.5717e-09, 1.1460e-08, 1.1026e-09, 5.1733e-10],
        ),
    ],
)
def test_chosen_k_is_pinned(make_X, k_bic, k_posterior, k_clusterer, posterior):
    X = make_X()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback: the checkpoint covers 1..10
        by_bic = TransformerGMM(n_components="auto", criterion="bic", random_state=0).fit(X)
        by_posterior = TransformerGMM(n_components="auto", random_state=0).fit(X)  # "auto"
        clusterer = TransformerClusterer(
            n_clusters="auto", criterion="bic", random_state=0
        ).fit(X)
        clusterer_default = TransformerClusterer(n_clusters="auto", random_state=0).fit(X)
    assert by_posterior.selection_criterion_ == "posterior"
    assert (by_bic.n_components_, by_posterior.n_components_) == (k_bic, k_posterior)
    assert clusterer.n_clusters_ == k_clusterer
    # Gaussian blobs: the count of clusters is the count of components.
    assert clusterer_default.n_clusters_ == by_posterior.n_components_
    # The candidates stop where each full covariance can have its d + 1 points: 120 rows
    # in 20 dimensions hold five components; P(K | X) is read over those candidates.
    top = min(10, len(X) // (X.shape[1] + 1))
    np.testing.assert_array_equal(by_bic.candidates_, np.arange(1, top + 1))
    expected = np.asarray(posterior[:top]) / np.sum(posterior[:top])
    np.testing.assert_allclose(by_posterior.k_posterior_, expected, rtol=2e-3, atol=1e-6)
    np.testing.assert_allclose(by_bic.k_posterior_, by_posterior.k_posterior_)


@pytest.mark.parametrize(
    "make_data",
    [
        lambda: make_moons(300, noise=0.06, random_state=0),
        lambda: make_circles(300, noise=0.04, factor=0.5, random_state=0),
    ],
    ids=["moons", "circles"],
)
@pytest.mark.parametrize("seed", [0, 1])
def test_the_clusterer_counts_two_curved_clusters(make_data, seed):
    """Two moons take many Gaussian components, two nested circles one: the mixture counts
    those, the clusterer the two clusters a person sees (the cluster-count head), and labels
    them by their rows, which stand apart."""
    X, y = make_data()
    mixture = TransformerGMM(n_components="auto", random_state=seed).fit(X)
    clusterer = TransformerClusterer(n_clusters="auto", random_state=seed).fit(X)
    assert mixture.n_components_ != 2
    assert clusterer.n_clusters_ == 2
    # merge=True labels them: the same count and posterior, and, as the rows of both fall
    # into two groups that stand apart, those groups; the mixture has P(K | X)'s most
    # probable number of components, at least the count (no larger one tiles the rings).
    merged = TransformerClusterer(n_clusters="auto", merge=True, random_state=seed).fit(X)
    assert merged.n_clusters_ == 2 and merged._separated is not None
    np.testing.assert_array_equal(merged.k_posterior_, clusterer.k_posterior_)
    assert merged.mixture_.n_components_ == max(2, mixture.n_components_)
    # The rows' groups label both (k-means's centres alone would cut them straight), and
    # new rows go to the group of their nearest row.
    assert adjusted_rand_score(y, merged.labels_) > 0.95  # moons: 0.99 (tips), circles: 1
    np.testing.assert_array_equal(clusterer.labels_, merged.labels_)
    np.testing.assert_array_equal(clusterer.predict(X), clusterer.labels_)
    for label in range(2):  # the centres are the groups' means
        np.testing.assert_allclose(
            clusterer.cluster_centers_[label], X[clusterer.labels_ == label].mean(axis=0)
        )
    assert clusterer.inertia_ == pytest.approx(
        ((X - clusterer.cluster_centers_[clusterer.labels_]) ** 2).sum()
    )
    # A stream's later batches move the centres, which label the rows from then on.
    stream = TransformerClusterer(n_clusters="auto", random_state=seed).partial_fit(X)
    np.testing.assert_array_equal(stream.labels_, clusterer.labels_)
    stream.partial_fit(X)
    np.testing.assert_array_equal(stream.predict(X), stream.transform(X).argmin(axis=1))


@pytest.mark.parametrize("seed, k", [(1, 7), (2, 8)])
def test_the_clusterer_counts_separated_blobs_the_heads_overcount(seed, k):
    """Seven and eight blobs that stand apart, which the heads read as ten: the rows fall
    into k groups that stand apart, each one Gaussian, and the clusterer counts those."""
    X, y = separated_blobs(seed, k)
    clusterer = TransformerClusterer(n_clusters="auto", random_state=0).fit(X)
    assert clusterer.candidates_[np.argmax(clusterer.k_posterior_)] == 10
    assert clusterer.n_clusters_ == k
    assert adjusted_rand_score(y, clusterer.labels_) == 1.0
    merged = TransformerClusterer(n_clusters="auto", merge=True, random_state=0).fit(X)
    assert merged.n_clusters_ == k and adjusted_rand_score(y, merged.labels_) == 1.0
