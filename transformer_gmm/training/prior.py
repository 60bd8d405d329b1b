"""The distribution over mixture tasks a training run draws from: :class:`Prior`, whose
named instances are :data:`transformer_gmm.training.tasks.PRIORS`."""

from __future__ import annotations

from dataclasses import dataclass


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
    missing_prob : float, default=0.0
        Probability that entries are missing (a task of at least two features), then filled
        with their column's observed mean, as a fit with NaN reads them: completely at
        random, or (half the tasks) at random, more often where one always-observed
        feature ranks higher. The rate is uniform up to ``max_missing``.
    max_missing : float, default=0.5
        The largest fraction of entries missing.

    Examples
    --------
    >>> from transformer_gmm.training import PRIORS, Prior
    >>> Prior(k_range=(2, 3), d_range=(2, 2)).n_range
    (64, 256)
    >>> sorted(PRIORS)  # doctest: +NORMALIZE_WHITESPACE
    ['broad', 'broad-missing', 'real', 'real-missing', 'tgmm', 'tgmm-2d', 'tiny', 'tiny-missing',
     'tiny-real']
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
    missing_prob: float = 0.0  # tasks with entries missing (filled with column means)
    max_missing: float = 0.5  # the largest fraction of entries missing
