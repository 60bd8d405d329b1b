"""EM accelerated by SQUAREM (transformer_gmm.engine.squarem), as the fits with missing
values run it."""

import numpy as np
import pytest
import torch

from transformer_gmm.engine.gaussian import compute_precision_cholesky
from transformer_gmm.engine.m_step import MixtureParams
from transformer_gmm.engine.missing import fit_em_missing
from transformer_gmm.engine.squarem import _extrapolated


def _params(weights, means, covariances) -> MixtureParams:
    covariances = torch.tensor(covariances, dtype=torch.float64)
    return MixtureParams(
        torch.tensor(weights, dtype=torch.float64),
        torch.tensor(means, dtype=torch.float64),
        covariances,
        compute_precision_cholesky(covariances, "diag"),
    )


def test_an_extrapolation_of_steps_that_do_not_speed_up_is_the_last_step():
    """Steps of one length along a line: alpha = -1, theta' = theta_2."""
    history = [
        _params([[0.5, 0.5]], [[[0.0], [t]]], [[[1.0], [1.0 + t]]]) for t in (0.0, 1.0, 2.0)
    ]
    theta, valid = _extrapolated(history, "diag")
    assert valid.tolist() == [True]
    torch.testing.assert_close(theta.means, history[2].means)
    torch.testing.assert_close(theta.covariances, history[2].covariances)


def test_an_extrapolation_that_is_no_mixture_is_refused():
    """Steps that shrink fast extrapolate far: a variance there goes negative in one run
    (1, 0.5, 0.1: alpha = -5, theta' = -1.5), not in the other."""
    history = [
        _params(
            [[0.5, 0.5], [0.5, 0.5]],
            [[[0.0], [1.0]], [[0.0], [1.0]]],
            [[[1.0], [c]], [[1.0], [1.0]]],
        )
        for c in (1.0, 0.5, 0.1)
    ]
    theta, valid = _extrapolated(history, "diag")
    assert valid.tolist() == [False, True]


def _gappy(seed: int, rate: float, covariance_type: str = "full") -> tuple[np.ndarray, tuple]:
    """Three overlapping correlated clusters, ``rate`` of the entries missing, and a poor
    start (every component near the mean, of the data's variances)."""
    rng = np.random.default_rng(seed)
    cov = np.array([[1.0, 0.8, 0.3], [0.8, 1.0, 0.5], [0.3, 0.5, 1.0]])
    centres = np.array([[0.0, 0.0, 0.0], [2.5, 0.0, 1.0], [0.0, 2.5, -1.0]])
    X = np.vstack([rng.multivariate_normal(c, cov, 400) for c in centres])
    X[rng.random(X.shape) < rate] = np.nan
    means = np.nanmean(X, 0) + rng.normal(0, 0.3, (3, 3))
    variances = np.repeat(np.nanvar(X, 0)[None], 3, 0)  # (K, d)
    covariances = variances if covariance_type == "diag" else variances[:, :, None] * np.eye(3)
    start = (np.full(3, 1 / 3), means, covariances)
    return X, start


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_squarem_reaches_plain_em_s_optimum_in_fewer_passes(seed):
    X, start = _gappy(seed, 0.4)
    kwargs = dict(covariance_type="full", reg_covar=1e-6, max_iter=1000, tol=1e-8)
    plain = fit_em_missing(X, *start, accelerate=False, **kwargs)
    fast = fit_em_missing(X, *start, accelerate=True, **kwargs)
    assert plain.converged and fast.converged
    assert fast.n_iter < 0.7 * plain.n_iter
    assert fast.lower_bound == pytest.approx(plain.lower_bound, abs=1e-5)
    order = np.argsort(plain.means[:, 0].numpy())
    np.testing.assert_allclose(
        fast.means[np.argsort(fast.means[:, 0].numpy())], plain.means[order], atol=1e-3
    )
    # The likelihoods the loop reads never decrease, as plain EM's.
    assert np.all(np.diff(fast.lower_bounds) > -1e-12)


def test_squarem_keeps_the_fit_deterministic():
    X, start = _gappy(3, 0.3, "diag")
    kwargs = dict(covariance_type="diag", reg_covar=1e-6, max_iter=200, tol=1e-6)
    one, two = fit_em_missing(X, *start, **kwargs), fit_em_missing(X, *start, **kwargs)
    assert one.n_iter == two.n_iter
    torch.testing.assert_close(one.means, two.means, rtol=0, atol=0)


def test_acceleration_needs_the_covariances_read():
    from transformer_gmm.engine.sufficient_stats import fit_em_from_statistics

    start = _params([[0.5, 0.5]], [[[0.0], [1.0]]], [[[1.0], [1.0]]])
    with pytest.raises(ValueError, match="needs reads_covariances"):
        fit_em_from_statistics(
            start, None, None, 10, covariance_type="diag", reg_covar=1e-6, max_iter=5,
            tol=1e-3, accelerate=True,
        )
