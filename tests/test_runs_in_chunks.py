"""Wide data: EM runs its starts a chunk at a time (engine.fit.MEMORY_BUDGET_BYTES), and
the check for collapsed components factorizes a few matrices at a time
(engine.collapse._CHUNK_BYTES). Both only bound memory: the fit is the one of all runs
at once, to the bit."""

import numpy as np
import pytest
import torch

from transformer_gmm import TransformerGMM, fit_many
from transformer_gmm.engine import collapse, gaussian
from transformer_gmm.engine import fit as engine_fit


def _blobs(seed: int, n: int = 120, d: int = 6) -> np.ndarray:
    rng = np.random.default_rng(seed)
    means = rng.uniform(-5, 5, (3, d))
    return means[rng.integers(0, 3, n)] + rng.standard_normal((n, d))


@pytest.fixture
def one_component_at_a_time(monkeypatch):
    """EM takes one component at a time, as on wide data, where runs go in chunks."""
    monkeypatch.setattr(gaussian, "ALL_COMPONENTS_AT_ONCE", 0)


def _fitted(estimator) -> dict:
    return {k: np.asarray(v) for k, v in vars(estimator).items()
            if k.endswith("_") and isinstance(v, np.ndarray | float | int)}


def _assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


@pytest.mark.parametrize("covariance_type", ["full", "tied"])
def test_runs_in_chunks_give_the_fit_of_all_runs_at_once(
    one_component_at_a_time, monkeypatch, covariance_type
):
    X = _blobs(0)
    params = dict(covariance_type=covariance_type, n_init=4, random_state=0)
    whole = _fitted(TransformerGMM(3, **params).fit(X))
    assert engine_fit.runs_per_chunk(torch.zeros(1, len(X), X.shape[1]), _plan(X, params)) == 4
    monkeypatch.setattr(engine_fit, "MEMORY_BUDGET_BYTES", 1)  # one run at a time
    assert engine_fit.runs_per_chunk(torch.zeros(1, len(X), X.shape[1]), _plan(X, params)) == 1
    _assert_same(_fitted(TransformerGMM(3, **params).fit(X)), whole)


def test_fit_many_runs_in_chunks_give_the_batch_fit(one_component_at_a_time, monkeypatch):
    Xs = [_blobs(1), _blobs(2, n=90)]
    whole = fit_many(Xs, 3, n_init=3, random_state=0)
    monkeypatch.setattr(engine_fit, "MEMORY_BUDGET_BYTES", 1)
    chunked = fit_many(Xs, 3, n_init=3, random_state=0)
    for a, b in zip(whole, chunked, strict=True):
        _assert_same(_fitted(a), _fitted(b))


def _plan(X, params):
    from sklearn.utils import check_random_state

    from transformer_gmm import _fitting

    full = TransformerGMM(3, **params).get_params()
    return _fitting.mixture_plan(full, X, None, check_random_state(0))


def test_collapse_check_in_chunks_matches_all_at_once(monkeypatch):
    rng = np.random.default_rng(3)
    d = 5
    factors = rng.standard_normal((4, 3, d, d))
    covariances = torch.from_numpy(factors @ np.swapaxes(factors, -1, -2) + 1e-6 * np.eye(d))
    covariances[1, 2] = torch.from_numpy(np.diag([1.0, 1.0, 1.0, 1.0, 1e-7]))  # at the floor
    weights = torch.full((4, 3), 1 / 3, dtype=torch.float64)
    means = torch.from_numpy(rng.standard_normal((4, 3, d)))
    args = (weights, means, covariances, "full", 100.0, 1e-8)
    whole = collapse.collapsed(*args)
    assert whole[1, 2] and whole.sum() == 1
    monkeypatch.setattr(collapse, "_CHUNK_BYTES", 1)  # one matrix at a time
    assert torch.equal(collapse.collapsed(*args), whole)


def test_wide_starts_hold_no_covariances_and_fit_the_same(monkeypatch):
    X = _blobs(4)
    params = dict(covariance_type="full", n_init=4, random_state=0)
    reference = _fitted(TransformerGMM(3, **params).fit(X))
    built = []
    original = engine_fit.starts.mixture_starts

    def spy(*args, **kwargs):
        built.append(original(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(engine_fit.starts, "mixture_starts", spy)
    monkeypatch.setattr(engine_fit, "ONE_MATRIX_AT_A_TIME", X.shape[1])  # X counts as wide
    _assert_same(_fitted(TransformerGMM(3, **params).fit(X)), reference)
    assert built and all(start.covariances is None for start in built)
