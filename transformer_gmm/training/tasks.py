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

from dataclasses import dataclass

import numpy as np
import torch

from ..engine.standardize import Standardization, fit_standardization
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
from .task_batch import TaskBatch, collate


@dataclass(frozen=True)
class Prior:
    """A distribution over mixture tasks; all ranges are inclusive.

    Parameters
    ----------
    k_range : tuple of int, default=(2, 10)
        K, uniform (clipped to the model's heads).
    d_range : tuple of int, default=(1, 128)
        d, log-uniform.
    n_range : tuple of int, default=(64, 256)
        n, uniform (clipped to the model's context).
    half_width : tuple of float, default=(5.0, 5.0)
        Means are uniform on ``[-h, h]^d``, with ``h`` log-uniform in this range.
    dirichlet_prob : float, default=0.5
        Probability of Dirichlet weights (floored); otherwise TGMM's ``U[0.2, 0.8]``,
        normalised.
    dirichlet_alpha : float, default=1.0
        The Dirichlet's concentration.
    weight_floor : float, default=0.2
        No Dirichlet weight falls below ``weight_floor / K``.
    scale_range : tuple of float, default=(1.0, 1.0)
        Noise standard deviation per component, log-uniform.
    diag_prob : float, default=0.0
        Probability that the noise std also varies per coordinate.
    heavy_prob : float, default=0.0
        Probability of Student-t noise (3 to 10 degrees of freedom), rescaled to the same std.
    full_prob : float, default=0.0
        Probability that every component gets a full covariance: its own random rotation,
        variances whose ratio (the condition number) is log-uniform up to
        ``max_condition``, and its own overall scale from ``scale_range``.
    max_condition : float, default=100.0
        The largest condition number of a full covariance.
    skew_prob, uniform_prob : float, default=0.0
        Probabilities of skewed (standardized log-normal, either sign) and of bounded
        (uniform) noise along each component's axes; otherwise Gaussian or Student-t.
    outlier_prob : float, default=0.0
        Probability of 1 to 5 % outliers, uniform on the data's bounding box enlarged by
        a fifth; each is labelled with the component most likely to have drawn it.
    mixing_prob : float, default=0.0
        Probability that all features are mixed by one random linear map (condition
        number up to 10): features correlated across every component.
    noise_feature_prob : float, default=0.0
        Probability that up to half of the d features carry only noise, the same for
        every component (irrelevant features).
    standardize_prob : float, default=0.0
        Probability that each feature is divided by its standard deviation, as users
        do before fitting.
    min_separation : float, default=0.0
        Means at least this far apart (in units of the noise std before scaling): each is
        drawn again until it is, the box widening by a tenth after every 100 misses, so
        that every cluster stands apart and a count can be exact.

    Examples
    --------
    >>> from transformer_gmm.training import PRIORS, Prior
    >>> Prior(k_range=(2, 3), d_range=(2, 2)).n_range
    (64, 256)
    >>> sorted(PRIORS)
    ['broad', 'real', 'tgmm', 'tgmm-2d', 'tiny', 'tiny-real']
    """

    k_range: tuple[int, int] = (2, 10)  # K, uniform (clipped to the model's heads)
    d_range: tuple[int, int] = (1, 128)  # d, log-uniform: as many tasks in 1..11 as in 11..128
    n_range: tuple[int, int] = (64, 256)  # n, uniform (clipped to the model's context)
    half_width: tuple[float, float] = (5.0, 5.0)  # means ~ U[-h, h]^d, h log-uniform: the SNR
    dirichlet_prob: float = 0.5  # weights ~ floored Dirichlet; else TGMM's U[0.2, 0.8], normalised
    dirichlet_alpha: float = 1.0
    weight_floor: float = 0.2  # w = floor / K + (1 - floor) * Dirichlet: no weight below floor / K
    scale_range: tuple[float, float] = (1.0, 1.0)  # noise std per component, log-uniform
    diag_prob: float = 0.0  # tasks whose noise std also varies per coordinate
    heavy_prob: float = 0.0  # tasks with Student-t noise (3 to 10 dof), rescaled to the same std
    # What real data add (each drawn only when its probability is > 0, so that priors
    # without them draw the same tasks as before they existed):
    full_prob: float = 0.0  # tasks with rotated, elongated components (full covariances)
    max_condition: float = 100.0  # largest ratio of a full covariance's variances
    skew_prob: float = 0.0  # skewed noise along each component's axes
    uniform_prob: float = 0.0  # bounded (uniform) noise
    outlier_prob: float = 0.0  # tasks with 1 to 5 % outliers
    mixing_prob: float = 0.0  # one linear map correlates the features of every component
    noise_feature_prob: float = 0.0  # up to half of the features carry only noise
    standardize_prob: float = 0.0  # each feature divided by its std, as users do
    min_separation: float = 0.0  # means at least this far apart (0: no constraint)


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


@dataclass(frozen=True)
class Task:
    """One dataset in the user's (original) space, and the map ``fit`` would apply to it.

    Attributes
    ----------
    X : ndarray of shape (n, d)
        The points.
    labels : ndarray of shape (n,)
        The component each point came from.
    means : ndarray of shape (K, d)
    weights : ndarray of shape (K,)
    stds : ndarray of shape (K, d)
        Noise standard deviation per component and coordinate.
    center : ndarray of shape (d,)
    scale : float
    basis : ndarray of shape (d, kept)
    d_max : int
        The map ``fit`` applies to ``X``, fitted by the engine's
        :func:`~transformer_gmm.engine.standardize.fit_standardization` and kept as numpy
        (tasks cross process boundaries from the DataLoader's workers, where every tensor
        would hold a file descriptor): :attr:`standardization` gives it back as the
        engine's map, and :meth:`to_model_space` and :meth:`from_model_space` apply it.
    factors : ndarray of shape (K, d, d) or None
        Where covariances are full: covariance k is ``factors[k] @ factors[k].T``, and
        ``stds`` is the root of its diagonal. None where they are diagonal (``stds``).

    Examples
    --------
    >>> import numpy as np
    >>> from transformer_gmm.training import PRIORS, sample_task
    >>> task = sample_task(np.random.default_rng(0), PRIORS["tiny"], K=3, d=2, n=30, d_max=4)
    >>> task.X.shape, task.means.shape, bool(np.bincount(task.labels).min() >= 1)
    ((30, 2), (3, 2), True)
    """

    X: np.ndarray  # (n, d) points
    labels: np.ndarray  # (n,) the component each point came from
    means: np.ndarray  # (K, d)
    weights: np.ndarray  # (K,)
    stds: np.ndarray  # (K, d) noise standard deviation per component and coordinate
    # The engine's map of X, as numpy: z = basis.T @ (x - center) / scale, zero-padded.
    center: np.ndarray  # (d,)
    scale: float
    basis: np.ndarray  # (d, kept)
    d_max: int
    factors: np.ndarray | None = None  # (K, d, d): covariance k is factors[k] @ factors[k].T

    @property
    def standardization(self) -> Standardization:
        """The map ``fit`` applies to ``X``: the engine's, for a batch of one dataset.

        Examples
        --------
        >>> import numpy as np
        >>> from transformer_gmm.training import PRIORS, sample_task
        >>> task = sample_task(np.random.default_rng(0), PRIORS["tiny"], 2, 6, 20, d_max=4)
        >>> task.standardization.basis.shape, task.standardization.n_kept  # 1 of 6 kept
        (torch.Size([1, 6, 1]), 1)
        """
        return Standardization(
            center=torch.from_numpy(self.center)[None],
            scale=torch.tensor([self.scale], dtype=torch.float64),
            basis=torch.from_numpy(self.basis)[None],
            d_max=self.d_max,
        )

    def to_model_space(self, points: np.ndarray) -> np.ndarray:
        """Points (m, d) of the user's space as float32 model inputs (m, d_max).

        Examples
        --------
        >>> import numpy as np
        >>> from transformer_gmm.training import PRIORS, sample_task
        >>> task = sample_task(np.random.default_rng(0), PRIORS["tiny"], 2, 6, 20, d_max=4)
        >>> z = task.to_model_space(task.X)  # 1 direction kept of 6, then zero padding
        >>> z.shape, z.dtype, bool((z[:, 1:] == 0).all())
        ((20, 4), dtype('float32'), True)
        """
        points = torch.as_tensor(points, dtype=torch.float64)[None]
        return self.standardization.transform(points)[0].numpy()

    def from_model_space(self, means: np.ndarray) -> np.ndarray:
        """Model-space means (K, d_max) back in the user's space, float64 (K, d).

        Examples
        --------
        >>> import numpy as np
        >>> from transformer_gmm.training import PRIORS, sample_task
        >>> task = sample_task(np.random.default_rng(0), PRIORS["tiny"], 3, 2, 30, d_max=4)
        >>> back = task.from_model_space(task.to_model_space(task.means))  # d = K - 1: all kept
        >>> bool(np.allclose(back, task.means, atol=1e-5))
        True
        """
        means = torch.as_tensor(means, dtype=torch.float64)[None]
        return self.standardization.inverse_transform_means(means)[0].numpy()

    def model_space_stds(self) -> np.ndarray:
        """Noise std per component along each kept direction in model space, (K, kept)."""
        basis, scale = self.basis, self.scale
        if self.factors is None:  # basis.T diag(std^2) basis: its diagonal
            return np.sqrt(self.stds**2 @ basis**2) / scale
        return np.sqrt(((basis.T @ self.factors) ** 2).sum(-1)) / scale

    def oracle_means(self) -> np.ndarray:
        """Means of the true clusters, (K, d): what an estimator that knew the labels gets.

        Examples
        --------
        >>> import numpy as np
        >>> from transformer_gmm.training import PRIORS, sample_task
        >>> task = sample_task(np.random.default_rng(0), PRIORS["tiny"], K=3, d=2, n=30, d_max=4)
        >>> oracle = task.oracle_means()
        >>> oracle.shape, bool(np.allclose(oracle[0], task.X[task.labels == 0].mean(0)))
        ((3, 2), True)
        """
        K = self.means.shape[0]
        counts = np.bincount(self.labels, minlength=K)[:, None]  # (K, 1), >= 1 by construction
        sums = np.zeros_like(self.means)
        np.add.at(sums, self.labels, self.X)
        return sums / counts


# --- sampling ------------------------------------------------------------------------


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
    x = torch.from_numpy(np.ascontiguousarray(X, dtype=np.float64))[None]  # a batch of one
    st = fit_standardization(x, None, d_max, K, noise_directions)
    center, scale, basis = st.center[0].numpy(), st.scale[0].item(), st.basis[0].numpy()
    return Task(X, labels, means, weights, stds, center, scale, basis, d_max, factors)


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
