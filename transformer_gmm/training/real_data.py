"""What real datasets add to a synthetic mixture task, each a step of
:func:`~transformer_gmm.training.tasks.sample_task`: full covariances (rotated, elongated
components), skewed or bounded noise, irrelevant and correlated features, outliers and
per-feature standardization.

Each step draws from the generator only where its probability in the prior is > 0, so a
prior without these features draws the same tasks as it did before they existed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .prior import Prior

FEATURES = (
    "full_prob",
    "skew_prob",
    "uniform_prob",
    "outlier_prob",
    "mixing_prob",
    "noise_feature_prob",
    "standardize_prob",
)


def log_uniform(rng: np.random.Generator, low: float, high: float, size=None) -> np.ndarray:
    """Draws whose logarithm is uniform on [log low, log high] (the sampler's scale draws)."""
    return np.exp(rng.uniform(np.log(low), np.log(high), size))


def has_real_data_features(prior: Prior) -> bool:
    """Whether ``prior`` asks for any of these steps (else covariances stay diagonal)."""
    return any(getattr(prior, name) > 0 for name in FEATURES)


def _happens(rng: np.random.Generator, prob: float) -> bool:
    return prob > 0 and rng.random() < prob


def _random_rotation(rng: np.random.Generator, d: int) -> np.ndarray:
    """Haar-distributed orthogonal (d, d): QR of a Gaussian matrix, signs fixed."""
    q, r = np.linalg.qr(rng.standard_normal((d, d)))
    return q * np.where(np.diag(r) < 0, -1.0, 1.0)


def covariance_factors(rng: np.random.Generator, prior: Prior, stds: np.ndarray) -> np.ndarray:
    """(K, d, d) square roots of the covariances: diagonal ``stds``, or, in a fraction
    ``full_prob`` of tasks, each component rotated with its own elongation."""
    K, d = stds.shape
    if not _happens(rng, prior.full_prob):
        return np.einsum("kd,de->kde", stds, np.eye(d))
    factors = np.empty((K, d, d))
    for k in range(K):
        condition = log_uniform(rng, 1.0, prior.max_condition)
        log_var = rng.uniform(-0.5, 0.5, d) * np.log(condition)  # variances' ratio <= condition
        log_var -= log_var.mean()  # geometric mean 1: the component's size is stds[k]
        axes = np.exp(log_var / 2) * stds[k, 0]
        factors[k] = _random_rotation(rng, d) * axes  # R diag(axes)
    return factors


def reshape_noise(rng: np.random.Generator, prior: Prior, noise: np.ndarray) -> np.ndarray:
    """Unit-variance noise made skewed or bounded, per coordinate (a component's axes)."""
    n, d = noise.shape
    if _happens(rng, prior.skew_prob):
        s = rng.uniform(0.3, 0.8)  # standardized log-normal: skewness 1 to 3
        lognormal = (np.exp(s * noise) - np.exp(s * s / 2)) / np.sqrt(
            (np.exp(s * s) - 1) * np.exp(s * s)
        )
        return lognormal * rng.choice([-1.0, 1.0], d)
    if _happens(rng, prior.uniform_prob):
        return rng.uniform(-np.sqrt(3.0), np.sqrt(3.0), (n, d))  # unit variance
    return noise


def add_irrelevant_features(rng, prior, means, factors):
    """Up to half of the features replaced by noise that no component's mean moves."""
    K, d = means.shape
    if d < 2 or not _happens(rng, prior.noise_feature_prob):
        return means, factors
    m = int(rng.integers(1, d // 2 + 1))
    means, factors = means.copy(), factors.copy()
    means[:, d - m :] = 0.0
    factors[:, d - m :, :] = 0.0
    spread = np.sqrt((factors[:, : d - m] ** 2).sum(-1).mean())  # a typical signal std
    noise_std = spread * log_uniform(rng, 0.5, 2.0)
    factors[:, d - m :, d - m :] = noise_std * np.eye(m)
    return means, factors


def mix_features(rng, prior, means, factors):
    """x -> A x with A = Q diag(a) Q', a's ratio up to 10: correlated features."""
    d = means.shape[1]
    if d < 2 or not _happens(rng, prior.mixing_prob):
        return means, factors
    q = _random_rotation(rng, d)
    a = q * log_uniform(rng, 1.0, 10.0, d) ** 0.5 @ q.T
    return means @ a.T, a @ factors


def add_outliers(rng, prior, X, labels, means, weights, factors):
    """Replace 1 to 5 % of the points, not the first K (every component keeps one), by
    uniform draws on the bounding box enlarged by a fifth; each takes the label of the
    component most likely to have drawn it."""
    n, d = X.shape
    K = means.shape[0]
    if not _happens(rng, prior.outlier_prob):
        return X, labels
    count = min(max(1, int(round(rng.uniform(0.01, 0.05) * n))), n - K)
    if count <= 0:
        return X, labels
    low, high = X.min(0), X.max(0)
    pad = 0.2 * (high - low) + 1e-12
    rows = np.sort(rng.choice(n, count, replace=False))
    first = {int(np.flatnonzero(labels == k)[0]) for k in range(K)}
    rows = np.array([r for r in rows if r not in first], dtype=int)
    points = rng.uniform(low - pad / 2, high + pad / 2, (len(rows), d))
    log_p = np.empty((len(rows), K))
    for k in range(K):
        cov = factors[k] @ factors[k].T + 1e-9 * np.eye(d)
        chol = np.linalg.cholesky(cov)
        white = np.linalg.solve(chol, (points - means[k]).T)  # (d, m)
        log_p[:, k] = np.log(weights[k]) - 0.5 * (white**2).sum(0) - np.log(np.diag(chol)).sum()
    X, labels = X.copy(), labels.copy()
    X[rows], labels[rows] = points, log_p.argmax(1)
    return X, labels


def standardize_features(rng, prior, means, factors, X):
    """Each feature divided by its std, as a user would: the task's truth follows."""
    if not _happens(rng, prior.standardize_prob):
        return means, factors, X
    s = X.std(0)
    s = np.where(s > 0, s, 1.0)
    return means / s, factors / s[:, None], X / s
