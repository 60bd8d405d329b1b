"""Collapsed components: what a fitted mixture, ``fit_many`` and the choice of K by BIC
share to find them and to say so.

A component collapses when it holds too few points for its covariance: the covariance is
then singular but for ``reg_covar``, and the component's likelihood on its handful of
points grows without bound as ``reg_covar`` shrinks. Such optima win on likelihood and
lose on everything else (new data, agreement with classes).
"""

from __future__ import annotations

import numpy as np
import torch

from ._blas import one_blas_thread
from ._warnings import warn_user
from .engine.collapse import FLOOR_FACTOR, RELATIVE_FLOOR, collapsed, points_needed

__all__ = [
    "FLOOR_FACTOR",
    "RELATIVE_FLOOR",
    "CollapsedComponentWarning",
    "collapsed_components",
    "identical_components",
    "points_needed",
    "remedy",
    "warn_collapsed",
    "warn_identical",
]


class CollapsedComponentWarning(UserWarning):
    """A fitted mixture has collapsed components (see ``collapsed_components_``).

    Each holds fewer points than its covariance needs, or has a variance at the
    ``reg_covar`` floor: it fits a handful of points and inflates the likelihood.
    """


def collapsed_components(
    weights: np.ndarray,
    means: np.ndarray,
    covariances: np.ndarray,
    covariance_type: str,
    n_samples,
    reg_covar: float,
) -> np.ndarray:
    """Which components collapsed: bool of ``weights``' shape (..., K).

    Parameters
    ----------
    weights : ndarray of shape (..., K)
    means : ndarray of shape (..., K, d)
    covariances : ndarray
        Shaped as ``GaussianMixture.covariances_`` for ``covariance_type``, with the same
        leading axes as ``weights``.
    covariance_type : {"full", "tied", "diag", "spherical"}
    n_samples : float or ndarray of shape (...)
        The points (or the total weight) each mixture was fitted on.
    reg_covar : float

    Returns
    -------
    collapsed : ndarray of bool, shape (..., K)
        True where a component holds fewer points than :func:`points_needed`, or where its
        smallest variance is within ``FLOOR_FACTOR`` of ``reg_covar`` and below
        ``RELATIVE_FLOOR`` times the mixture's mean variance per feature (the data's, as
        the fitted mixture describes it: no pass over the data).

    Examples
    --------
    >>> import numpy as np
    >>> from transformer_gmm._collapsed import collapsed_components
    >>> means = np.array([[0.0, 0.0], [5.0, 5.0]])
    >>> covariances = np.array([[1.0, 0.5], [1e-6, 2.0]])  # diag, K = 2, d = 2
    >>> weights = np.array([0.5, 0.5])
    >>> collapsed_components(weights, means, covariances, "diag", 100, 1e-6).tolist()
    [False, True]
    """
    weights, means, covariances, n_samples = (
        torch.as_tensor(np.asarray(a, dtype=np.float64))
        for a in (weights, means, covariances, n_samples)
    )
    return collapsed(weights, means, covariances, covariance_type, n_samples, reg_covar).numpy()


def warn_collapsed(collapsed: np.ndarray, covariance_type: str, n_features: int) -> None:
    """Warn, as scikit-learn warns of convergence, if a component of one fit collapsed."""
    if not collapsed.any():
        return
    which = np.flatnonzero(collapsed).tolist()
    needed = points_needed(covariance_type, n_features)
    why = f"holds fewer than {needed} points or " if needed else ""
    warn_user(
        f"{len(which)} of {collapsed.size} mixture components collapsed (components "
        f"{which}): each {why}has a variance at the reg_covar floor, so it fits a handful "
        f"of points and inflates the likelihood. {remedy(covariance_type)}; "
        "collapsed_components_ marks them.",
        CollapsedComponentWarning,
    )


# Covariances that need fewer points per component than each type: what a collapse
# warning offers instead (a tied covariance is shared, so it needs none).
_FEWER_POINTS = {
    "full": "covariance_type='diag' or 'tied', ",
    "diag": "covariance_type='tied', ",
    "spherical": "covariance_type='tied', ",
    "tied": "",
}


def remedy(covariance_type: str) -> str:
    """What a fit of ``covariance_type`` with collapsed components can do instead."""
    return f"Use {_FEWER_POINTS[covariance_type]}a larger reg_covar, or fewer components"


# Two components are copies of one another when their means are closer than this many of
# the first one's standard deviations (in its metric) and their covariances agree to this
# relative tolerance: their densities then differ by about this fraction, and the mixture
# has fewer distinct components than it was asked for.
IDENTICAL = 1e-3


@one_blas_thread
def identical_components(
    means: np.ndarray,
    covariances: np.ndarray,
    precisions_cholesky: np.ndarray,
    covariance_type: str,
) -> np.ndarray:
    """Which components repeat an earlier one: bool of shape (..., K).

    EM cannot tell such components apart, and keeps them equal: it happens where the data
    vary far less than ``reg_covar`` (the floor then swamps every covariance, and every
    point is as likely under each component), or where several points are one.

    Parameters
    ----------
    means : ndarray of shape (..., K, d)
    covariances, precisions_cholesky : ndarray
        Shaped as ``GaussianMixture``'s for ``covariance_type``, with the leading axes of
        ``means``.
    covariance_type : {"full", "tied", "diag", "spherical"}

    Returns
    -------
    identical : ndarray of bool, shape (..., K)
        True where a component's mean is within ``IDENTICAL`` standard deviations of an
        earlier component's, and its covariance within ``IDENTICAL`` of that one's
        (relative).

    Examples
    --------
    >>> import numpy as np
    >>> from transformer_gmm._collapsed import identical_components
    >>> means = np.array([[0.0, 0.0], [0.0, 1e-12], [5.0, 5.0]])
    >>> covariances = np.full((3, 2), 1e-6)  # diag, K = 3, d = 2
    >>> identical_components(means, covariances, 1 / np.sqrt(covariances), "diag").tolist()
    [False, True, False]
    """
    means = np.asarray(means, dtype=np.float64)
    covariances = np.asarray(covariances, dtype=np.float64)
    factors = np.asarray(precisions_cholesky, dtype=np.float64)
    n_components = means.shape[-2]
    difference = means[..., None, :, :] - means[..., :, None, :]  # (..., K_j, K_k, d)
    # The difference whitened by component j's precision: its Mahalanobis distance.
    if covariance_type == "full":  # (K_k, d) @ (d, d) for each j: one batched product
        whitened = difference @ factors
    elif covariance_type == "tied":
        whitened = difference @ factors[..., None, :, :]
    elif covariance_type == "diag":
        whitened = difference * factors[..., :, None, :]
    else:
        whitened = difference * factors[..., :, None, None]
    close = np.sum(whitened**2, axis=-1) <= IDENTICAL**2  # (..., K_j, K_k), means
    close &= np.tri(n_components, k=-1, dtype=bool).T  # j < k: component k repeats j
    if covariance_type != "tied":  # else one covariance for all
        # Pair by pair, and only where the means agree: a (K, K, d, d) difference of wide
        # covariances would hold K^2 / 2 times the covariances.
        flat = covariances.reshape(*covariances.shape[: means.ndim - 1], -1)  # (..., K, c)
        squared_norm = np.einsum("...i,...i->...", flat, flat)  # (..., K)
        pairs = np.nonzero(close.reshape(-1, n_components, n_components).any(axis=0))
        for j, k in zip(*pairs, strict=True):
            gap = flat[..., j, :] - flat[..., k, :]
            scale = np.maximum(squared_norm[..., j], squared_norm[..., k])
            close[..., j, k] &= np.einsum("...i,...i->...", gap, gap) <= IDENTICAL**2 * scale
    return close.any(axis=-2)


def warn_identical(identical: np.ndarray, covariances: np.ndarray, reg_covar: float) -> None:
    """Warn if components of one fit (``identical``, (K,)) repeat others, and say why where
    the fitted ``covariances`` tell (they sit at the ``reg_covar`` floor)."""
    if not identical.any():
        return
    which = np.flatnonzero(identical).tolist()
    at_floor = float(np.max(np.abs(covariances))) <= FLOOR_FACTOR * reg_covar
    if at_floor:
        why = (
            "X varies far less than reg_covar, which then swamps every covariance: every "
            f"point is as likely under each component. Rescale X (by a constant, or with "
            f"sklearn.preprocessing.StandardScaler) or lower reg_covar (now {reg_covar:g})."
        )
    else:
        why = "Fit fewer components, or check X for repeated points."
    warn_user(
        f"{len(which)} of {identical.size} mixture components (components {which}) repeat "
        "others: their means and covariances are the same, so the mixture has "
        f"{identical.size - len(which)} distinct components. {why}",
        CollapsedComponentWarning,
    )
