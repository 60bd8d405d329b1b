"""Hsu & Kakade's spectral method (benchmarks/spectral.py) recovers spherical mixtures."""

from __future__ import annotations

import numpy as np
import pytest
from benchmark_scripts import load_benchmark as _load
from scipy.optimize import linear_sum_assignment

spectral = _load("spectral")
WEIGHTS = np.array([0.2, 0.3, 0.5])


def _mixture(seed, n_features, n_samples=20_000, noise=1.0, offset=1.0):
    """Three orthogonal means of norm 6 (8.5 apart), moved off the origin by ``offset``."""
    rng = np.random.default_rng(seed)
    basis = np.linalg.qr(rng.standard_normal((n_features, 3)))[0].T
    means = 6 * basis + offset
    labels = rng.choice(3, n_samples, p=WEIGHTS)
    return means[labels] + noise * rng.standard_normal((n_samples, n_features)), means


@pytest.mark.parametrize(("seed", "n_features"), [(0, 10), (1, 10), (2, 3)])
def test_recovers_a_well_separated_mixture(seed, n_features):
    # Tolerances: with N = 20000 and weights >= 0.2, even the means of the true clusters
    # are off by about sqrt(d / (N w)) = 0.05 (d = 10); the moment method is less
    # efficient (third moments), and its largest error over 8 seeds was 0.07. 0.3 is
    # 5% of the means' norm and 3.5% of their separation: sampling noise passes, a wrong
    # matching, a missed component or a failed deflation does not. A weight's standard
    # error is sqrt(w (1 - w) / N) = 0.0035 (largest error seen 0.0074); we allow 0.03.
    # d = K = 3 is included: the smallest eigenvalue of the covariance is still sigma^2.
    X, means = _mixture(seed, n_features)
    weights, estimated = spectral.spectral_fit(X, 3, np.random.default_rng(seed))
    distance = np.linalg.norm(estimated[:, None] - means[None], axis=2)  # (K, K)
    rows, cols = linear_sum_assignment(distance)
    assert distance[rows, cols].max() < 0.3
    assert np.abs(weights[rows] - WEIGHTS[cols]).max() < 0.03
    assert weights.sum() == pytest.approx(1.0)


def test_noise_variance_is_the_smallest_covariance_eigenvalue():
    X, _ = _mixture(0, 10, noise=0.5)
    assert spectral.noise_variance(X, 3) == pytest.approx(0.25, rel=0.05)


def test_whitened_tensor_matches_the_d_cubed_formula():
    X, _ = _mixture(0, 4, n_samples=500)
    sigma2 = spectral.noise_variance(X, 3)
    W, W_t_pinv = spectral.whitening(X, 3, sigma2)
    second = X.T @ X / len(X) - sigma2 * np.eye(4)
    np.testing.assert_allclose(W.T @ second @ W, np.eye(3), atol=1e-8)
    np.testing.assert_allclose(W_t_pinv.T @ W, np.eye(3), atol=1e-8)
    m, eye = X.mean(axis=0), np.eye(4)
    third = (np.einsum("ni,nj,nk->ijk", X, X, X) / len(X)
             - sigma2 * (np.einsum("i,jk->ijk", m, eye) + np.einsum("j,ik->ijk", m, eye)
                         + np.einsum("k,ij->ijk", m, eye)))
    expected = np.einsum("abc,ai,bj,ck->ijk", third, W, W, W)
    np.testing.assert_allclose(spectral.whitened_third_moment(X, W, sigma2), expected,
                               atol=1e-8)


def test_power_method_finds_the_largest_eigenpair_of_an_orthogonal_tensor():
    rng = np.random.default_rng(0)
    basis = np.linalg.qr(rng.standard_normal((3, 3)))[0].T  # orthonormal rows
    T = np.einsum("r,ri,rj,rk->ijk", np.array([1.5, 2.0, 3.0]), basis, basis, basis)
    value, vector = spectral.robust_tensor_power(T, rng)
    # Every eigenvector attracts some starts; the restarts keep the largest value.
    assert value == pytest.approx(3.0, abs=1e-6)
    assert abs(vector @ basis[2]) == pytest.approx(1.0, abs=1e-6)


def test_fewer_features_than_components_raises():
    X = np.random.default_rng(0).standard_normal((100, 2))
    with pytest.raises(ValueError, match="n_features >= n_components"):
        spectral.spectral_fit(X, 3, 0)
