"""Synthetic Gaussian-mixture tasks, brought to the model's input space exactly as ``fit`` does.

A task is one dataset: K means, K weights, a noise model, n points and their labels. Every
task goes through :func:`~transformer_gmm.engine.standardize.fit_standardization`, the
map ``fit`` applies, as a batch of one (centre, project onto the top min(K - 1, d_max)
principal components when d exceeds that, one global scale, zero-pad), so the model trains
on the distribution it meets at inference.
The targets are mapped by the same standardization: they are what the model should
output for this input.

Why the projection keeps the job small: the K means, centred on their weighted average,
span at most K - 1 directions, and the between-cluster spread adds to the top principal
components first. The K - 1 kept directions hold the means (up to noise), and every
dimension beyond them would only add noise the model must learn to ignore.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from .._missing import mean_imputed
from ..engine.standardize import fit_standardization
from .prior import Prior
from .real_data import (
    add_irrelevant_features,
    add_outliers,
    covariance_factors,
    has_real_data_features,
    log_uniform,
    mix_features,
    reshape_noise,
    standardize_features,
)
from .task_batch import Task, TaskBatch, collate

PRIORS: dict[str, Prior] = {
    # TGMM (Chen, Wu & Fang 2025) at d = 2, the overlapping regime where a learned prior helps.
    "tgmm-2d": Prior(k_range=(2, 5), d_range=(2, 2), n_range=(64, 128)),
    # TGMM across the widths its experiments use: as many tasks with d in 2..16 as in
    # 16..128, where the projection leaves the model the same K - 1 (+ noise) directions.
    "tgmm": Prior(k_range=(2, 5), d_range=(2, 128), n_range=(64, 128)),
    # Far beyond it: K to 16, d to 128, up to the context, overlapping to separated,
    # unequal and diagonal scales, some heavy tails. (K is clipped to the model's heads:
    # a model with heads to 10 draws K to 10, as before the range grew.)
    "broad": Prior(
        k_range=(2, 16),
        d_range=(1, 128),
        n_range=(64, 256),
        half_width=(1.5, 8.0),
        scale_range=(0.5, 2.0),
        diag_prob=0.25,
        heavy_prob=0.1,
    ),
    # What real datasets look like: elongated, rotated components of unequal sizes (down
    # to 3 %) and scales, non-Gaussian shapes, outliers, correlated and irrelevant
    # features, per-feature standardization; d to 64 and K to 16.
    "real": Prior(
        k_range=(2, 16),
        d_range=(1, 64),
        n_range=(64, 256),
        half_width=(1.0, 6.0),
        dirichlet_prob=0.7,
        weight_floor=0.06,
        scale_range=(0.5, 2.0),
        diag_prob=0.2,
        heavy_prob=0.15,
        full_prob=0.7,
        max_condition=300.0,
        skew_prob=0.15,
        uniform_prob=0.1,
        outlier_prob=0.3,
        mixing_prob=0.3,
        noise_feature_prob=0.25,
        standardize_prob=0.5,
    ),
    # For tests: small n, and d on both sides of the tiny model's d_max = 4.
    # K to 6: beyond the tiny model's heads (to 4), for heads grown onto it.
    "tiny": Prior(k_range=(2, 6), d_range=(1, 8), n_range=(16, 64), diag_prob=0.5, heavy_prob=0.2),
    "tiny-missing": Prior(k_range=(2, 4), d_range=(2, 8), n_range=(16, 64), missing_prob=1.0),
    "tiny-real": Prior(
        k_range=(2, 4),
        d_range=(1, 8),
        n_range=(16, 64),
        full_prob=0.5,
        skew_prob=0.3,
        uniform_prob=0.3,
        outlier_prob=0.5,
        mixing_prob=0.5,
        noise_feature_prob=0.5,
        standardize_prob=0.5,
    ),
}


# The same tasks with entries missing (then filled with their columns' means) in 80 % of
# them, for a model that reads the gaps (reads_gaps) and for its control.
PRIORS.update(
    {f"{name}-missing": dataclasses.replace(PRIORS[name], missing_prob=0.8)
     for name in ("broad", "real")}
)


def _draw_weights(rng: np.random.Generator, prior: Prior, K: int) -> np.ndarray:
    if rng.random() < prior.dirichlet_prob:
        w = rng.dirichlet(np.full(K, prior.dirichlet_alpha))
        w = prior.weight_floor / K + (1.0 - prior.weight_floor) * w
    else:
        w = rng.uniform(0.2, 0.8, K)
    return w / w.sum()


def _separated(rng: np.random.Generator, means: np.ndarray, h: float, gap: float) -> np.ndarray:
    """``means`` (K, d) with each drawn again, in turn, until it is ``gap`` from those
    before it; the box [-h, h]^d widens by a tenth after every 100 misses."""
    for k in range(1, len(means)):
        misses = 0
        while np.linalg.norm(means[:k] - means[k], axis=1).min() < gap:
            misses += 1
            h = h * 1.1 if misses % 100 == 0 else h
            means[k] = rng.uniform(-h, h, means.shape[1])
    return means


def draw_observed(rng: np.random.Generator, X: np.ndarray, max_missing: float) -> np.ndarray:
    """Which entries of ``X`` (n, d), d >= 2, are observed: a rate uniform in
    [0, ``max_missing``], completely at random, or (half the time) at random: one feature
    always observed, each other entry of a row missing with a probability that grows
    linearly with that feature's rank (twice the rate at the top). Every row and every
    column keeps an observed entry."""
    n, d = X.shape
    rate = rng.uniform(0.0, max_missing)
    if rng.random() < 0.5:
        missing = rng.random((n, d)) < rate
    else:
        driver = rng.integers(d)
        rank = np.argsort(np.argsort(X[:, driver])) / max(n - 1, 1)  # (n,) in [0, 1]
        chance = np.clip(2.0 * rate * d / (d - 1) * rank, 0.0, 1.0)
        missing = rng.random((n, d)) < chance[:, None]
        missing[:, driver] = False
    empty = np.flatnonzero(missing.all(axis=1))
    missing[empty, rng.integers(d, size=len(empty))] = False
    missing[rng.integers(n), missing.all(axis=0)] = False  # an empty column keeps one entry
    return ~missing


def sample_task(
    rng: np.random.Generator,
    prior: Prior,
    K: int,
    d: int,
    n: int,
    d_max: int,
    noise_directions: int = 0,
) -> Task:
    """Draw one task of K components, d features and n points from ``prior``.

    Every component gets at least one point (so the oracle and the per-point loss are
    defined); the other n - K labels are drawn from the weights.

    Parameters
    ----------
    rng : numpy.random.Generator
        The only source of randomness.
    prior : Prior
        The task distribution (its ranges of K, d and n are not used here).
    K, d, n : int
        Components, features and points; ``n >= K``.
    d_max : int
        The model's input width, for the standardization.
    noise_directions : int, default=0
        Principal directions kept beyond the K - 1, as the model's config says.

    Returns
    -------
    Task

    Examples
    --------
    >>> import numpy as np
    >>> from transformer_gmm.training import PRIORS, sample_task
    >>> task = sample_task(np.random.default_rng(0), PRIORS["tiny"], K=2, d=6, n=20, d_max=4)
    >>> task.X.shape, task.to_model_space(task.X).shape  # 1 direction, padded
    ((20, 6), (20, 4))
    """
    h = log_uniform(rng, *prior.half_width)
    means = rng.uniform(-h, h, (K, d))  # (K, d)
    if prior.min_separation > 0:
        means = _separated(rng, means, h, prior.min_separation)
    weights = _draw_weights(rng, prior, K)  # (K,)
    stds = np.repeat(log_uniform(rng, *prior.scale_range, (K, 1)), d, axis=1)  # (K, d)
    if rng.random() < prior.diag_prob:
        stds = stds * log_uniform(rng, 0.5, 2.0, (K, d))
    labels = np.concatenate([np.arange(K), rng.choice(K, n - K, p=weights)])
    labels = labels[rng.permutation(n)]  # (n,)
    if rng.random() < prior.heavy_prob:
        dof = rng.uniform(3.0, 10.0)
        noise = rng.standard_t(dof, (n, d)) * np.sqrt((dof - 2.0) / dof)  # unit variance
    else:
        noise = rng.standard_normal((n, d))
    factors = covariance_factors(rng, prior, stds) if has_real_data_features(prior) else None
    if factors is None:
        X = means[labels] + stds[labels] * noise  # (n, d)
    else:
        noise = reshape_noise(rng, prior, noise)
        means, factors = add_irrelevant_features(rng, prior, means, factors)
        means, factors = mix_features(rng, prior, means, factors)
        X = means[labels] + np.einsum("nij,nj->ni", factors[labels], noise)  # (n, d)
        X, labels = add_outliers(rng, prior, X, labels, means, weights, factors)
        means, factors, X = standardize_features(rng, prior, means, factors, X)
        stds = np.sqrt((factors**2).sum(-1))  # (K, d) the root of each diagonal
    observed = None
    if prior.missing_prob > 0 and d >= 2 and rng.random() < prior.missing_prob:
        observed = draw_observed(rng, X, prior.max_missing)
        X = mean_imputed(np.where(observed, X, np.nan))  # filled as a fit with NaN fills
    x = torch.from_numpy(np.ascontiguousarray(X, dtype=np.float64))[None]  # a batch of one
    st = fit_standardization(x, None, d_max, K, noise_directions)
    center, scale, basis = st.center[0].numpy(), st.scale[0].item(), st.basis[0].numpy()
    return Task(X, labels, means, weights, stds, center, scale, basis, d_max, factors, observed)


def draw_d(rng: np.random.Generator, d_range: tuple[int, int]) -> int:
    low, high = d_range
    return int(np.clip(np.floor(log_uniform(rng, low, high + 1)), low, high))


def sample_batch(
    rng: np.random.Generator,
    prior: Prior,
    n_components: int,
    batch_size: int,
    d_max: int,
    context_size: int,
    noise_directions: int = 0,
) -> TaskBatch:
    """Draw ``batch_size`` tasks with ``n_components`` components; each draws its own d and n.

    Parameters
    ----------
    rng : numpy.random.Generator
        The only source of randomness: the same generator state gives the same batch.
    prior : Prior
        The task distribution.
    n_components : int
        K, shared by the batch (the model reads one K per forward pass).
    batch_size : int
        B, the number of tasks.
    d_max, context_size : int
        The model's input width and the most points it reads; n is clipped to the latter.
    noise_directions : int, default=0
        Principal directions kept beyond the K - 1, as the model's config says.

    Returns
    -------
    TaskBatch
        CPU tensors; the model-space targets are the true parameters mapped by each task's
        own standardization.

    Examples
    --------
    >>> import numpy as np
    >>> import torch
    >>> from transformer_gmm.training import PRIORS, sample_batch
    >>> batch = sample_batch(np.random.default_rng(0), PRIORS["tiny"], 3, 5, 4, 64)
    >>> batch.n_components, batch.x.shape[0], batch.x.dtype
    (3, 5, torch.float32)
    >>> again = sample_batch(np.random.default_rng(0), PRIORS["tiny"], 3, 5, 4, 64)
    >>> torch.equal(batch.x, again.x)
    True
    """
    n_low, n_high = min(prior.n_range[0], context_size), min(prior.n_range[1], context_size)
    tasks = [
        sample_task(
            rng,
            prior,
            n_components,
            draw_d(rng, prior.d_range),
            max(int(rng.integers(n_low, n_high + 1)), n_components),
            d_max,
            noise_directions,
        )
        for _ in range(batch_size)
    ]
    return collate(tasks, d_max)
