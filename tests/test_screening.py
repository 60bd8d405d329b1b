"""Wide data: the starts compete in a few principal directions, and EM runs at full width
from the winner alone (engine.screening)."""

import numpy as np
import pytest
import torch
from sklearn.metrics import adjusted_rand_score

from transformer_gmm import TransformerClusterer, TransformerGMM, fit_many
from transformer_gmm.engine import em, kmeans, screening, standardize
from transformer_gmm.engine import fit as engine_fit


def _wide_blobs(seed: int, n: int = 300, d: int = 40, k: int = 3):
    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 4, (k, d))
    labels = rng.integers(0, k, n)
    return centres[labels] + rng.standard_normal((n, d)), labels


@pytest.fixture
def screened(monkeypatch):
    """40 features count as wide; the starts compete in K + 2 directions. Records the
    width of every EM batch."""
    monkeypatch.setattr(screening, "SCREEN_FROM_FEATURES", 32)
    monkeypatch.setattr(screening, "SCREEN_DIAG_FROM_VALUES", 0)
    monkeypatch.setattr(screening, "EXTRA_DIMS", 2)
    widths = []
    original = em.fit_em

    def spy(X, params, **kwargs):
        widths.append((X.shape[-1], params.means.shape[0]))
        return original(X, params, **kwargs)

    monkeypatch.setattr(em, "fit_em", spy)
    return widths


def _fitted(estimator) -> dict:
    return {k: np.asarray(v) for k, v in vars(estimator).items()
            if k.endswith("_") and isinstance(v, np.ndarray | float | int)}


@pytest.mark.parametrize("covariance_type", ["full", "diag"])
def test_starts_compete_in_a_projection_and_one_runs_at_full_width(screened, covariance_type):
    X, labels = _wide_blobs(0)
    # Four starts (a small full fit's default runs the transformer's two alone).
    gmm = TransformerGMM(3, covariance_type=covariance_type, n_init=4, random_state=0).fit(X)
    # Every start in 5 directions in one batch, then one run at full width.
    assert screened == [(5, 4), (40, 1)]
    assert gmm.init_method_ in ("transformer", "k-means++")
    assert adjusted_rand_score(labels, gmm.predict(X)) == 1.0
    assert gmm.converged_ and len(gmm.lower_bounds_) == gmm.n_iter_
    unscreened = TransformerGMM(3, covariance_type=covariance_type, n_init=4, random_state=0)
    screening.SCREEN_FROM_FEATURES = 10**9
    reference = unscreened.fit(X)
    assert gmm.score(X) >= reference.score(X) - 1e-6


@pytest.mark.parametrize("covariance_type", ["diag", "spherical", "full", "tied"])
def test_diagonal_fits_of_few_values_run_every_start_at_full_width(
    monkeypatch, covariance_type
):
    """A diagonal model is not the same model in a projection: on few values (200 x 40
    here) its starts compete at full width. Rotation-invariant ones (and Lloyd) screen."""
    assert not screening.screens(50, 2000, 2, "diag")
    assert screening.screens(1000, 1024, 2, "diag")  # 2^20 values: screened
    assert screening.screens(50, 2000, 2, "spherical") and screening.screens(50, 2000, 2, None)
    monkeypatch.setattr(screening, "SCREEN_FROM_FEATURES", 32)
    widths = []
    original = em.fit_em

    def spy(X, params, **kwargs):
        widths.append(X.shape[-1])
        return original(X, params, **kwargs)

    monkeypatch.setattr(em, "fit_em", spy)
    X, _ = _wide_blobs(3, n=200)
    TransformerGMM(3, covariance_type=covariance_type, n_init=4, random_state=0).fit(X)
    assert (min(widths) < 40) == (covariance_type != "diag")


def test_a_screened_fit_ignores_row_order_and_is_deterministic(screened):
    X, _ = _wide_blobs(1)
    first = _fitted(TransformerGMM(3, random_state=0).fit(X))
    order = np.random.default_rng(0).permutation(len(X))
    again = _fitted(TransformerGMM(3, random_state=0).fit(X[order]))
    for name in ("weights_", "means_", "covariances_", "lower_bound_", "n_iter_"):
        np.testing.assert_array_equal(first[name], again[name], err_msg=name)


def test_on_a_subsample_the_winner_runs_once_on_every_row(screened, monkeypatch):
    monkeypatch.setattr(engine_fit, "SELECTION_ROWS", 200)
    monkeypatch.setattr(engine_fit, "SCREENED_ON_EVERY_ROW", 400)  # 500 rows: subsampled
    X, labels = _wide_blobs(2, n=500)
    gmm = TransformerGMM(3, random_state=0, n_init=4).fit(X)  # four starts at any size
    # The starts compete in the projection on 200 rows; EM at full width runs on all 500.
    assert screened == [(5, 4), (40, 1)]
    assert adjusted_rand_score(labels, gmm.predict(X)) == 1.0
    assert len(gmm.lower_bounds_) == gmm.n_iter_ and np.isfinite(gmm.lower_bounds_).all()


def test_fit_many_screens_each_dataset_as_alone(screened):
    datasets = [_wide_blobs(3)[0], _wide_blobs(4, n=250)[0]]
    batch = fit_many(datasets, 3, random_state=0)
    for X, fitted in zip(datasets, batch, strict=True):
        alone = TransformerGMM(3, random_state=0).fit(X)
        np.testing.assert_allclose(fitted.means_, alone.means_, rtol=1e-8, atol=1e-8)
        assert fitted.init_method_ == alone.init_method_


def test_given_starts_and_one_start_are_not_screened(screened):
    X, _ = _wide_blobs(5)
    TransformerGMM(3, n_init=1, random_state=0).fit(X)
    assert screened == [(40, 1)]
    screened.clear()
    means = TransformerGMM(3, random_state=0).fit(X).means_
    screened.clear()
    TransformerGMM(3, means_init=means, n_init=1, random_state=0).fit(X)
    assert all(width == 40 for width, _ in screened)


def test_leading_axes_match_the_eigendecomposition():
    rng = np.random.default_rng(0)
    scales = np.r_[np.linspace(20.0, 5.0, 6), np.ones(94)]
    x = torch.from_numpy(rng.standard_normal((2, 2000, 100)) * scales)
    centered = x - x.mean(dim=1, keepdim=True)
    counts = torch.full((2, 1), 2000.0, dtype=torch.float64)
    values, vectors, _ = standardize.leading_axes(centered, counts, 6)
    exact_values, exact_vectors = torch.linalg.eigh(centered.mT @ centered / 2000.0)
    # Within 1e-6 where the leading variances stand 25 times above the rest (three
    # subspace iterations; the gap sets the accuracy).
    torch.testing.assert_close(values[:, -6:], exact_values[:, -6:], rtol=1e-6, atol=0)
    overlap = (vectors[..., -6:] * exact_vectors[..., -6:]).sum(dim=1).abs()  # sign aside
    torch.testing.assert_close(overlap, torch.ones_like(overlap), rtol=0, atol=1e-6)


@pytest.fixture
def lloyd_widths(monkeypatch):
    monkeypatch.setattr(screening, "SCREEN_FROM_FEATURES", 32)
    monkeypatch.setattr(screening, "EXTRA_DIMS", 2)
    widths = []
    original = kmeans.lloyd

    def spy(X, centers, **kwargs):
        widths.append((X.shape[-1], centers.shape[0]))
        return original(X, centers, **kwargs)

    monkeypatch.setattr(kmeans, "lloyd", spy)
    return widths


def test_clusterer_starts_compete_in_a_projection(lloyd_widths):
    X, labels = _wide_blobs(6)
    km = TransformerClusterer(3, random_state=0).fit(X)
    assert lloyd_widths[-2:] == [(5, 4), (40, 1)]
    assert adjusted_rand_score(labels, km.labels_) == 1.0
    np.testing.assert_array_equal(km.predict(X), km.labels_)
    screening.SCREEN_FROM_FEATURES = 10**9
    reference = TransformerClusterer(3, random_state=0).fit(X)
    assert km.inertia_ <= reference.inertia_ * (1 + 1e-9)
    order = np.random.default_rng(1).permutation(len(X))
    screening.SCREEN_FROM_FEATURES = 32
    again = TransformerClusterer(3, random_state=0).fit(X[order])
    np.testing.assert_array_equal(again.cluster_centers_, km.cluster_centers_)


def test_clusterer_on_a_subsample_refits_the_winner_on_every_row(lloyd_widths, monkeypatch):
    monkeypatch.setattr(engine_fit, "SELECTION_ROWS", 200)
    monkeypatch.setattr(engine_fit, "SCREENED_ON_EVERY_ROW", 400)
    X, labels = _wide_blobs(7, n=500)
    km = TransformerClusterer(3, random_state=0).fit(X)
    assert lloyd_widths[-2:] == [(5, 4), (40, 1)]
    assert adjusted_rand_score(labels, km.labels_) == 1.0 and km.n_iter_ >= 1


def test_up_to_twice_the_subsample_screened_starts_compete_on_every_row(screened, monkeypatch):
    monkeypatch.setattr(engine_fit, "SELECTION_ROWS", 200)  # 300 rows: within twice that
    drawn = []
    original = engine_fit._selection_rows

    def spy(x, mask, n_runs, generator):
        drawn.append(n_runs)
        return original(x, mask, n_runs, generator)

    monkeypatch.setattr(engine_fit, "_selection_rows", spy)
    monkeypatch.setattr(engine_fit, "SCREENED_ON_EVERY_ROW", 400)
    X, labels = _wide_blobs(8, n=300)
    gmm = TransformerGMM(3, random_state=0, n_init=4).fit(X)  # four starts at any size
    assert drawn == [1]  # no subsample drawn: one run's worth of rows, all of them
    assert screened == [(5, 4), (40, 1)] and adjusted_rand_score(labels, gmm.predict(X)) == 1.0
