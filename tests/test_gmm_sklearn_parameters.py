"""GaussianMixture's parameters on TransformerGMM (init_params, the *_init arrays,
warm_start, verbose, lower_bounds_), and sample_weight, which GaussianMixture lacks."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
import sklearn
import torch
from conftest import TINY_CHECKPOINT, make_blobs
from sklearn.exceptions import ConvergenceWarning
from sklearn.mixture import GaussianMixture
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from transformer_gmm import TransformerGMM
from transformer_gmm.engine import kmeans

COVARIANCE_TYPES = ["full", "tied", "diag", "spherical"]


@pytest.fixture
def blobs() -> np.ndarray:
    return make_blobs(40, [[-6.0, 0.0], [0.0, 6.0], [6.0, 0.0]], seed=3)


def starting_point(X: np.ndarray, covariance_type: str, seed: int = 0) -> dict:
    """weights_init, means_init and precisions_init near, not at, a fit of X."""
    fitted = GaussianMixture(3, covariance_type=covariance_type, random_state=seed).fit(X)
    rng = np.random.default_rng(seed)
    weights = fitted.weights_ + rng.uniform(0, 0.05, 3)
    return dict(
        weights_init=weights / weights.sum(),
        means_init=fitted.means_ + rng.normal(0, 0.5, fitted.means_.shape),
        precisions_init=fitted.precisions_ * 0.8,
    )


def assert_same_fit(ours: TransformerGMM, theirs: GaussianMixture, rtol: float = 1e-7) -> None:
    for name in ["weights_", "means_", "covariances_", "precisions_cholesky_"]:
        np.testing.assert_allclose(getattr(ours, name), getattr(theirs, name), rtol=rtol)
    assert ours.n_iter_ == theirs.n_iter_
    assert ours.converged_ == theirs.converged_
    np.testing.assert_allclose(ours.lower_bounds_, theirs.lower_bounds_, rtol=1e-10)


# --- init_params and the *_init arrays ---------------------------------------------------


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
@pytest.mark.parametrize("init_params", ["random", "random_from_data"])
def test_random_starts_are_scikit_learns_draws(blobs, init_params, covariance_type):
    # Drawn from the same random state as GaussianMixture draws them, so the fit is its fit.
    if init_params == "random_from_data" and covariance_type == "tied":
        pytest.skip(
            "scikit-learn's tied M-step assumes each row of the responsibilities sums to 1; "
            "on one-hot starts it gives the covariance of all the data, ours reg_covar "
            "(docs/coming_from_sklearn.md)"
        )
    options = dict(covariance_type=covariance_type, init_params=init_params, random_state=7)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        theirs = GaussianMixture(3, n_init=2, **options).fit(blobs)
        ours = TransformerGMM(3, n_init=2, **options).fit(blobs)
    assert_same_fit(ours, theirs)
    assert ours.init_method_ == init_params


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_given_parameters_give_scikit_learns_fit(blobs, covariance_type):
    start = starting_point(blobs, covariance_type)
    theirs = GaussianMixture(3, covariance_type=covariance_type, **start).fit(blobs)
    ours = TransformerGMM(3, covariance_type=covariance_type, **start).fit(blobs)
    assert_same_fit(ours, theirs)
    assert ours.init_method_ == "user"


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_max_iter_zero_returns_the_given_parameters(blobs, covariance_type):
    start = starting_point(blobs, covariance_type)
    gmm = TransformerGMM(3, covariance_type=covariance_type, max_iter=0, **start).fit(blobs)
    np.testing.assert_allclose(gmm.weights_, start["weights_init"], rtol=1e-12)
    np.testing.assert_allclose(gmm.means_, start["means_init"], rtol=1e-12)
    np.testing.assert_allclose(gmm.precisions_, start["precisions_init"], rtol=1e-10)
    assert gmm.n_iter_ == 0 and len(gmm.lower_bounds_) == 0


@pytest.mark.parametrize("given", ["weights_init", "means_init", "precisions_init"])
def test_one_given_parameter_replaces_that_of_every_start(blobs, given):
    start = {given: starting_point(blobs, "diag")[given]}
    fitted = given.replace("_init", "_") if given != "precisions_init" else "precisions_"
    for init_params in ["transformer", "kmeans", "k-means++", "random", "random_from_data"]:
        gmm = TransformerGMM(
            3,
            covariance_type="diag",
            checkpoint=TINY_CHECKPOINT,
            init_params=init_params,
            max_iter=0,
            n_init=3,
            random_state=0,
            **start,
        ).fit(blobs)
        np.testing.assert_allclose(getattr(gmm, fitted), start[given], rtol=1e-10)


def test_init_arrays_set_after_construction_are_read_in_fit_and_left_alone(blobs):
    start = starting_point(blobs, "full")
    gmm = TransformerGMM(3, max_iter=0)
    gmm.means_init = means = [list(row) for row in start["means_init"]]  # a list, kept a list
    gmm.fit(blobs)
    np.testing.assert_allclose(gmm.means_, start["means_init"])
    assert gmm.means_init is means  # fit validates a copy, never writes back
    assert gmm.get_params()["means_init"] is means


@pytest.mark.parametrize("init_params", ["kmeans", "k-means++", "random", "random_from_data"])
def test_other_initialisations_skip_the_transformer(blobs, init_params, monkeypatch):
    from transformer_gmm import _fitting

    def no_backbone(*args):
        raise AssertionError("the transformer was loaded")

    monkeypatch.setattr(_fitting, "backbone_or_fallback", no_backbone)
    gmm = TransformerGMM(3, init_params=init_params, random_state=0).fit(blobs)
    assert gmm.init_method_ == init_params
    assert gmm.converged_


def test_kmeans_plusplus_start_puts_the_means_at_distinct_rows(blobs):
    gmm = TransformerGMM(3, init_params="k-means++", max_iter=0, random_state=0).fit(blobs)
    is_row = (np.abs(gmm.means_[:, None, :] - blobs[None]) < 1e-9).all(axis=-1)  # (K, n)
    assert is_row.any(axis=1).all() and len(set(is_row.argmax(axis=1))) == 3
    expected = np.broadcast_to(1e-6 * np.eye(2), (3, 2, 2))
    np.testing.assert_allclose(gmm.covariances_, expected, rtol=1e-6, atol=1e-20)


def test_kmeans_start_is_the_fallbacks_start(blobs):
    # init_params="kmeans" is what the default runs without a transformer (k-means++ and
    # Lloyd, then one M-step), from the same generator.
    kmeans = TransformerGMM(3, init_params="kmeans", random_state=0).fit(blobs)
    fallback = TransformerGMM(3, checkpoint=None, random_state=0).fit(blobs)
    np.testing.assert_array_equal(kmeans.means_, fallback.means_)
    assert (kmeans.init_method_, fallback.init_method_) == ("kmeans", "k-means++")


def test_invalid_init_arrays_raise_scikit_learns_messages(blobs):
    gmm = TransformerGMM(3)
    gmm.set_params(weights_init=[0.5, 0.5])
    with pytest.raises(ValueError, match=re.escape("'weights' should have the shape of (3,)")):
        gmm.fit(blobs)
    gmm.set_params(weights_init=[0.2, 0.2, 0.2])
    with pytest.raises(ValueError, match=re.escape("should be normalized, but got sum(weights)")):
        gmm.fit(blobs)
    gmm.set_params(weights_init=[1.5, -0.25, -0.25])
    message = "should be in the range [0, 1], but got max value 1.50000, min value -0.25000"
    with pytest.raises(ValueError, match=re.escape(message)):
        gmm.fit(blobs)
    gmm.set_params(weights_init=None, means_init=np.zeros((3, 3)))
    with pytest.raises(ValueError, match="'means' should have the shape of"):
        gmm.fit(blobs)
    gmm.set_params(means_init=None, covariance_type="diag", precisions_init=-np.ones((3, 2)))
    with pytest.raises(ValueError, match="'diag precision' should be positive"):
        gmm.fit(blobs)
    gmm.set_params(covariance_type="tied", precisions_init=np.array([[1.0, 2.0], [2.0, 1.0]]))
    with pytest.raises(ValueError, match="'tied precision' should be symmetric, positive-def"):
        gmm.fit(blobs)
    gmm.set_params(init_params="bogus", precisions_init=None)
    with pytest.raises(ValueError, match="init_params"):
        gmm.fit(blobs)


# --- warm_start, lower_bounds_, verbose -------------------------------------------------------


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize("checkpoint", [TINY_CHECKPOINT, None])
def test_warm_start_goes_on_where_the_last_fit_stopped(checkpoint):
    X = make_blobs(40, [[-1.5, 0.0], [0.0, 1.5], [1.5, 0.0]], seed=3)  # overlapping: slow EM
    options = dict(checkpoint=checkpoint, n_init=1, random_state=0, tol=1e-12)
    longer = TransformerGMM(3, max_iter=6, **options).fit(X)
    warm = TransformerGMM(3, max_iter=2, warm_start=True, **options)
    for _ in range(3):
        warm.fit(X)
    np.testing.assert_allclose(warm.means_, longer.means_, rtol=1e-10)
    np.testing.assert_allclose(warm.lower_bounds_, longer.lower_bounds_[-2:], rtol=1e-12)
    assert longer.n_iter_ == 6 and warm.n_iter_ == 2 and warm.init_method_ == "warm_start"


def test_warm_start_detects_convergence_from_the_previous_bound(blobs):
    gmm = TransformerGMM(3, max_iter=1, warm_start=True, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        for _ in range(50):
            if gmm.fit(blobs).converged_:
                break
    assert gmm.converged_ and gmm.n_iter_ == 1


def test_warm_start_needs_the_same_shape(blobs):
    gmm = TransformerGMM(3, warm_start=True, random_state=0).fit(blobs)
    with pytest.raises(ValueError, match="warm_start=True continues the previous fit"):
        gmm.fit(np.hstack([blobs, blobs]))


@pytest.mark.parametrize("checkpoint", [TINY_CHECKPOINT, None])
def test_lower_bounds_trace_the_kept_run(blobs, checkpoint):
    gmm = TransformerGMM(3, checkpoint=checkpoint, n_init=4, random_state=0).fit(blobs)
    assert gmm.lower_bounds_.shape == (gmm.n_iter_,)
    assert gmm.lower_bounds_[-1] == gmm.lower_bound_
    assert np.all(np.diff(gmm.lower_bounds_) > -1e-10)  # EM never lowers the bound


def test_large_fits_trace_both_stages(monkeypatch):
    from transformer_gmm.engine import fit

    monkeypatch.setattr(fit, "SELECTION_ROWS", 64)
    X = make_blobs(100, [[-6.0, 0.0], [6.0, 0.0]], seed=0)
    gmm = TransformerGMM(2, checkpoint=None, n_init=3, random_state=0).fit(X)
    assert gmm.lower_bounds_.shape == (gmm.n_iter_,)
    assert gmm.lower_bounds_[-1] == gmm.lower_bound_


def test_verbose_prints_as_scikit_learn(blobs, capsys):
    TransformerGMM(3, n_init=1, verbose=1, verbose_interval=1, tol=1e-8, random_state=0).fit(blobs)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "Initialization 0"
    assert lines[1] == "  Iteration 1"
    assert lines[-1] in ("Initialization converged.", "Initialization did not converge.")

    TransformerGMM(3, n_init=4, verbose=2, verbose_interval=2, random_state=0).fit(blobs)
    out = capsys.readouterr().out
    assert out.startswith("4 initializations run as one batch")
    assert [f"Initialization {i}" in out for i in range(4)] == [True] * 4
    assert re.search(r"  Iteration 2\t time lapse \d+\.\d{5}s\t ll change -?\d+\.\d{5}", out)
    assert re.search(r"Initialization converged. time lapse \d+\.\d{5}s\t lower bound -", out)

    TransformerGMM(3, random_state=0).fit(blobs)  # verbose=0 prints nothing
    assert capsys.readouterr().out == ""


def test_verbose_names_the_starts_a_gate_left_out(blobs, capsys, monkeypatch):
    """Where EM is costly and the transformer's runs agree, "auto" runs no k-means++ start:
    the report says so of those runs."""
    from transformer_gmm.engine import fit as engine_fit

    monkeypatch.setattr(engine_fit, "GATED_FROM_VALUES", 1)  # every fit is costly
    gmm = TransformerGMM(3, covariance_type="diag", verbose=2, random_state=0).fit(blobs)
    out = capsys.readouterr().out
    assert out.startswith("4 initializations run as one batch")
    assert out.count('  Not run: n_init="auto" leaves out k-means++ starts') == 2
    assert gmm.init_method_ == "transformer"


# --- sample_weight ---------------------------------------------------------------------------


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_integer_weights_fit_as_repeated_rows(blobs, covariance_type):
    rng = np.random.default_rng(0)
    counts = rng.integers(1, 4, len(blobs))
    start = starting_point(blobs, covariance_type)
    options = dict(covariance_type=covariance_type, tol=1e-8, **start)
    weighted = TransformerGMM(3, **options).fit(blobs, sample_weight=counts)
    repeated = TransformerGMM(3, **options).fit(np.repeat(blobs, counts, axis=0))
    np.testing.assert_allclose(weighted.means_, repeated.means_, atol=1e-6)
    np.testing.assert_allclose(weighted.weights_, repeated.weights_, atol=1e-6)
    np.testing.assert_allclose(weighted.covariances_, repeated.covariances_, atol=1e-6)
    assert weighted.n_iter_ == repeated.n_iter_
    np.testing.assert_allclose(weighted.lower_bound_, repeated.lower_bound_, rtol=1e-10)


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_zero_weights_fit_as_dropped_rows(blobs, covariance_type):
    keep = np.random.default_rng(1).random(len(blobs)) < 0.7
    start = starting_point(blobs, covariance_type)
    options = dict(covariance_type=covariance_type, tol=1e-8, **start)
    weighted = TransformerGMM(3, **options).fit(blobs, sample_weight=keep.astype(float))
    dropped = TransformerGMM(3, **options).fit(blobs[keep])
    np.testing.assert_allclose(weighted.means_, dropped.means_, atol=1e-6)
    np.testing.assert_allclose(weighted.covariances_, dropped.covariances_, atol=1e-6)
    assert weighted.n_iter_ == dropped.n_iter_


@pytest.mark.parametrize("init_params", ["kmeans", "k-means++", "random_from_data"])
def test_zero_weight_rows_never_seed_a_start(init_params):
    # Three far-away rows of weight zero: a start seeded there would put a mean on them.
    X = np.vstack([make_blobs(30, [[0.0, 0.0], [8.0, 0.0]], seed=0), np.full((3, 2), 500.0)])
    weights = np.r_[np.ones(60), np.zeros(3)]
    for seed in range(5):
        gmm = TransformerGMM(2, init_params=init_params, max_iter=0, random_state=seed)
        gmm.fit(X, sample_weight=weights)
        assert np.all(np.abs(gmm.means_) < 100)


def test_weights_pull_the_transformers_fit(blobs):
    # The left blob weighs ten times the others: its weight follows. (With one weighted
    # k-means++ start, as with the repeated rows, two seeds can land in the heavy blob;
    # the tiny checkpoint's own starts end in a worse optimum, so its k-means++ starts run.)
    weights = np.where(blobs[:, 0] < -3, 10.0, 1.0)
    for checkpoint, n_init in [("default", "auto"), (TINY_CHECKPOINT, 4), (None, 5)]:
        gmm = TransformerGMM(3, checkpoint=checkpoint, n_init=n_init, random_state=0)
        gmm.fit(blobs, sample_weight=weights)
        left = np.argmin(gmm.means_[:, 0])
        np.testing.assert_allclose(gmm.weights_[left], 10 / 12, atol=0.02)


@pytest.mark.parametrize("init_params", ["transformer", "kmeans", "k-means++", "random"])
def test_large_weighted_fits_take_the_weights_of_the_subsampled_rows(monkeypatch, init_params):
    from transformer_gmm.engine import fit

    monkeypatch.setattr(fit, "SELECTION_ROWS", 64)  # the starts compete on 64 rows
    X = make_blobs(100, [[-6.0, 0.0], [6.0, 0.0]], seed=0)
    weights = np.where(X[:, 0] < 0, 3.0, 1.0)
    gmm = TransformerGMM(
        2, checkpoint=TINY_CHECKPOINT, init_params=init_params, n_init=3, random_state=0
    ).fit(X, sample_weight=weights)
    np.testing.assert_allclose(gmm.weights_[np.argmin(gmm.means_[:, 0])], 0.75, atol=0.01)
    assert gmm.lower_bounds_.shape == (gmm.n_iter_,)


@pytest.mark.parametrize("checkpoint", [TINY_CHECKPOINT, None])
def test_equal_weights_give_the_unweighted_fit_to_the_bit(blobs, checkpoint):
    plain = TransformerGMM(3, checkpoint=checkpoint, random_state=0).fit(blobs)
    weighted = TransformerGMM(3, checkpoint=checkpoint, random_state=0)
    weighted.fit(blobs, sample_weight=np.full(len(blobs), 2.5))
    np.testing.assert_array_equal(weighted.means_, plain.means_)
    np.testing.assert_array_equal(weighted.covariances_, plain.covariances_)


def test_score_weights_as_repeated_rows(blobs):
    gmm = TransformerGMM(3, random_state=0).fit(blobs)
    counts = np.arange(len(blobs)) % 3
    repeated = gmm.score(np.repeat(blobs, counts, axis=0))
    np.testing.assert_allclose(gmm.score(blobs, sample_weight=counts), repeated, rtol=1e-12)


def test_invalid_sample_weight_is_refused(blobs):
    gmm = TransformerGMM(3, checkpoint=None)
    with pytest.raises(ValueError, match="Negative values"):
        gmm.fit(blobs, sample_weight=-np.ones(len(blobs)))
    with pytest.raises(ValueError, match="sample_weight.shape"):
        gmm.fit(blobs, sample_weight=np.ones(3))
    with pytest.raises(ValueError, match="at least 3 samples of non-zero weight"):
        gmm.fit(blobs, sample_weight=np.r_[1.0, 1.0, np.zeros(len(blobs) - 2)])


def test_weighted_kmeans_equals_repeated_rows():
    X = torch.randn(1, 30, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    counts = torch.randint(1, 4, (30,), generator=torch.Generator().manual_seed(1))
    centers = X[:, :3]
    weighted = kmeans.lloyd(X, centers, max_iter=50, sample_weight=counts[None].double())
    repeated = kmeans.lloyd(
        X[:, torch.repeat_interleave(torch.arange(30), counts)], centers, max_iter=50
    )
    torch.testing.assert_close(weighted[0], repeated[0])
    torch.testing.assert_close(weighted[2], repeated[2])  # the weighted inertia


def test_metadata_routing_passes_sample_weight(blobs):
    weights = np.where(blobs[:, 0] < -3, 10.0, 1.0)
    with sklearn.config_context(enable_metadata_routing=True):
        gmm = TransformerGMM(3, checkpoint=None, random_state=0).set_fit_request(sample_weight=True)
        gmm.set_score_request(sample_weight=True)
        pipeline = make_pipeline(StandardScaler().set_fit_request(sample_weight=False), gmm)
        pipeline.fit(blobs, sample_weight=weights)
        direct = TransformerGMM(3, checkpoint=None, random_state=0)
        direct.fit(StandardScaler().fit_transform(blobs), sample_weight=weights)
        np.testing.assert_array_equal(pipeline[-1].means_, direct.means_)
        assert np.isfinite(pipeline.score(blobs, sample_weight=weights))
