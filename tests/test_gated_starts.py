"""n_init="auto" on costly EM: k-means++'s starts run only for the datasets whose
transformer starts ended on different optima (engine.fit.STARTS_AGREE); on small data with
full covariances, they do not run at all."""

import numpy as np
import pytest

from transformer_gmm import TransformerGMM, _fitting, fit_many
from transformer_gmm.engine import fit as engine_fit
from transformer_gmm.engine import starts


def _blobs(seed: int, n: int = 300) -> np.ndarray:
    rng = np.random.default_rng(seed)
    means = rng.uniform(-5, 5, (3, 4))
    return means[rng.integers(0, 3, n)] + rng.standard_normal((n, 4))


@pytest.fixture
def counted_starts(monkeypatch):
    """Every dataset's costly enough to gate; the kinds of starts each call builds."""
    monkeypatch.setattr(engine_fit, "GATED_FROM_VALUES", 1)
    calls = []
    original = starts.mixture_starts

    def spy(x, mask, generator, plan, **kwargs):
        calls.append((x.shape[0], plan.n_transformer_inits, plan.n_kmeans_inits))
        return original(x, mask, generator, plan, **kwargs)

    monkeypatch.setattr(starts, "mixture_starts", spy)
    return calls


@pytest.mark.parametrize("covariance_type", ["full", "diag"])
def test_agreeing_transformer_starts_skip_kmeans(counted_starts, covariance_type):
    X = _blobs(1)
    gated = TransformerGMM(3, covariance_type=covariance_type, random_state=0).fit(X)
    assert counted_starts == [(1, 2, 0)]  # the transformer's starts alone
    counted_starts.clear()
    every = TransformerGMM(3, covariance_type=covariance_type, random_state=0, n_init=4).fit(X)
    assert counted_starts == [(1, 2, 2)]  # an int n_init runs every start it asks for
    assert gated.init_method_ == every.init_method_ == "transformer"
    np.testing.assert_array_equal(gated.means_, every.means_)
    assert gated.lower_bound_ == every.lower_bound_


def test_disagreeing_starts_give_the_ungated_fit(counted_starts, monkeypatch):
    """Where the transformer's runs disagree, every start runs, drawn in the same order:
    the fit of one dataset is the ungated fit, bit for bit."""
    monkeypatch.setattr(engine_fit, "STARTS_AGREE", -1.0)  # never agree
    X = _blobs(2)
    gated = TransformerGMM(3, random_state=0).fit(X)
    assert counted_starts == [(1, 2, 0), (1, 0, 2)]
    every = TransformerGMM(3, random_state=0, n_init=4).fit(X)
    for name in ("weights_", "means_", "covariances_", "lower_bounds_"):
        np.testing.assert_array_equal(getattr(gated, name), getattr(every, name))
    assert (gated.n_iter_, gated.init_method_) == (every.n_iter_, every.init_method_)


def test_fit_many_runs_kmeans_only_where_needed(counted_starts, monkeypatch):
    Xs = [_blobs(seed, 200) for seed in range(5)]
    fit_many(Xs, n_components=3, random_state=0)
    assert counted_starts[0] == (5, 2, 0)
    assert all(n_datasets < 5 for n_datasets, _, _ in counted_starts[1:])
    counted_starts.clear()
    monkeypatch.setattr(engine_fit, "STARTS_AGREE", -1.0)
    fitted = fit_many(Xs, n_components=3, random_state=0)
    assert counted_starts == [(5, 2, 0), (5, 0, 2)]
    assert all(np.isfinite(f.lower_bound_) for f in fitted)


def test_small_problems_are_not_gated(counted_starts, monkeypatch):
    monkeypatch.setattr(engine_fit, "GATED_FROM_VALUES", 10**9)
    TransformerGMM(3, covariance_type="diag", random_state=0).fit(_blobs(3))
    assert counted_starts == [(1, 2, 2)]


def test_small_full_fits_run_the_transformer_starts_alone(counted_starts, monkeypatch):
    monkeypatch.setattr(engine_fit, "GATED_FROM_VALUES", 10**9)
    X = _blobs(4)
    default = TransformerGMM(3, random_state=0).fit(X)
    assert counted_starts == [(1, 2, 0)]
    counted_starts.clear()
    two = TransformerGMM(3, random_state=0, n_init=2).fit(X)  # the same two starts
    assert counted_starts == [(1, 2, 0)]
    for name in ("weights_", "means_", "covariances_", "lower_bounds_"):
        np.testing.assert_array_equal(getattr(default, name), getattr(two, name))
    counted_starts.clear()
    TransformerGMM(3, random_state=0, n_init=4).fit(X)  # an int n_init runs them all
    assert counted_starts == [(1, 2, 2)]


def test_larger_full_fits_keep_the_kmeans_starts(counted_starts, monkeypatch):
    """Above STARTS_ALONE_ROWS rows, k-means++'s run; fit_many decides by its largest
    dataset, as one plan serves them all."""
    monkeypatch.setattr(engine_fit, "GATED_FROM_VALUES", 10**9)
    monkeypatch.setattr(_fitting, "STARTS_ALONE_ROWS", 250)
    TransformerGMM(3, random_state=0).fit(_blobs(5, n=300))
    assert counted_starts == [(1, 2, 2)]
    counted_starts.clear()
    fit_many([_blobs(6, n=200), _blobs(7, n=300)], n_components=3, random_state=0)
    assert counted_starts == [(2, 2, 2)]
    counted_starts.clear()
    fit_many([_blobs(6, n=200), _blobs(7, n=240)], n_components=3, random_state=0)
    assert counted_starts == [(2, 2, 0)]


def test_mid_size_full_fits_keep_the_kmeans_starts(counted_starts, monkeypatch):
    monkeypatch.setattr(engine_fit, "GATED_FROM_VALUES", 10**9)
    TransformerGMM(3, random_state=0).fit(_blobs(8, n=_fitting.STARTS_ALONE_ROWS + 1))
    assert counted_starts == [(1, 2, 2)]
    counted_starts.clear()
    TransformerGMM(3, random_state=0).fit(_blobs(8, n=_fitting.STARTS_ALONE_ROWS))
    assert counted_starts == [(1, 2, 0)]
