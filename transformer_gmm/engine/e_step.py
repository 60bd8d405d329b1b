"""The E-step of batched EM in torch, as scikit-learn's ``GaussianMixture``.

The formulas follow scikit-learn's ``_estimate_weighted_log_prob`` and ``_e_step``
(``sklearn/mixture/``), vectorised over a batch of B datasets (or B restarts of one).
Shapes and the ``mask`` convention are those of :mod:`transformer_gmm.engine.em`, whose
loop runs this step; :func:`e_step_unchecked`, on inputs already checked and padded, is
the step inside that loop and inside the sums over blocks of rows
(:mod:`transformer_gmm.engine.sufficient_stats`). :func:`weighted_log_prob_of_fitted` is
the same log-probabilities of a fitted mixture, numpy in and out, on CPU in bounded
memory: what the estimators' ``predict`` and ``score_samples`` compute.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from .batching import check_batch, compact, zero_padding
from .device import entry_point, shared_tensor, tensor, to_numpy
from .gaussian import PARAM_SHAPES, estimate_log_gaussian_prob, lookup, needs_grad
from .logspace import exp_, logsumexp
from .m_step import MixtureParams

__all__ = [
    "check_params",
    "e_step",
    "e_step_unchecked",
    "estimate_weighted_log_prob",
    "log_norm_of_fitted",
    "responsibilities_of_fitted",
    "weighted_log_prob_of_fitted",
]

# Rows per chunk when scoring: bounds memory at O(chunk * K * d) whatever n_samples is.
_CHUNK_ROWS = 65536


def check_params(
    X: Tensor, params: MixtureParams, covariance_type: str, mask, sample_weight=None
) -> int:
    """Check shapes agree (no silent broadcasting of a missing batch dim); return B."""
    means, weights = params.means, params.weights
    if means.dim() != 3 or means.shape[-1] != X.shape[-1]:
        raise ValueError(f"means must have shape (B, K, {X.shape[-1]}), got {means.shape}")
    n_components = means.shape[1]
    if weights.shape[1:] != (n_components,) or weights.dim() != 2:
        raise ValueError(f"weights must have shape (B, {n_components}), got {weights.shape}")
    expected = lookup(PARAM_SHAPES, covariance_type)(n_components, X.shape[-1])
    prec = params.precisions_cholesky
    if prec.dim() != len(expected) + 1 or prec.shape[1:] != expected:
        raise ValueError(
            f"{covariance_type} precisions_cholesky must have shape (B, *{expected}), "
            f"got {tuple(prec.shape)}"
        )
    if sample_weight is not None and sample_weight.shape[-1:] != X.shape[1:2]:
        raise ValueError(
            f"sample_weight must have shape (B, {X.shape[1]}), got {sample_weight.shape}"
        )
    weighted = () if sample_weight is None else (sample_weight,)
    return check_batch(X, weights, means, prec, *weighted, mask=mask)


def estimate_weighted_log_prob(
    X: Tensor,
    params: MixtureParams,
    covariance_type: str,
    *,
    at_once: bool = False,
    x_squared: Tensor | None = None,
) -> Tensor:
    """log p(x_n | k) + log w_k: (B, N, K). ``params.covariances`` is not used.

    Parameters
    ----------
    X : Tensor of shape (B, N, d) or (1, N, d)
    params : MixtureParams
    covariance_type : {"full", "tied", "diag", "spherical"}
    at_once : bool, default=False
        As :func:`~transformer_gmm.engine.gaussian.estimate_log_gaussian_prob` takes it.
    x_squared : Tensor, optional
        ``X.square()``, as :func:`~transformer_gmm.engine.gaussian.estimate_log_gaussian_prob`
        takes it.

    Returns
    -------
    weighted_log_prob : Tensor of shape (B, N, K)

    Examples
    --------
    >>> import torch
    >>> from transformer_gmm.engine import e_step, m_step
    >>> X, resp = two_blobs()  # (1, 40, 2) points in two blobs, one-hot (1, 40, 2) labels
    >>> params = m_step.estimate_gaussian_parameters(
    ...     X, resp, covariance_type="diag", reg_covar=1e-6)
    >>> weighted = e_step.estimate_weighted_log_prob(X, params, "diag")
    >>> weighted.shape
    torch.Size([1, 40, 2])
    >>> weighted[0].argmax(-1).tolist() == [0] * 20 + [1] * 20
    True
    """
    check_params(X, params, covariance_type, None)
    return _weighted_log_prob_unchecked(X, params, covariance_type, at_once, x_squared)


def _weighted_log_prob_unchecked(
    X: Tensor, params: MixtureParams, covariance_type: str, at_once: bool,
    x_squared: Tensor | None,
) -> Tensor:
    """:func:`estimate_weighted_log_prob` on parameters already checked (the loops')."""
    log_prob = estimate_log_gaussian_prob(
        X, params.means, params.precisions_cholesky, covariance_type, at_once=at_once,
        x_squared=x_squared,
    )
    log_weights = params.weights.log()[:, None, :]
    if needs_grad(log_prob, log_weights) or log_prob.shape[0] < log_weights.shape[0]:
        return log_prob + log_weights
    return log_prob.add_(log_weights)  # in place: (B, N, K) is large on many rows


def e_step_unchecked(
    X: Tensor,
    params: MixtureParams,
    covariance_type: str,
    mask,
    sample_weight=None,
    *,
    at_once: bool = False,
    x_squared: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """:func:`e_step` on inputs already checked, compacted and with padding zeroed, as
    the loops hold them (``sample_weight`` compacted too); ``at_once`` and ``x_squared``
    as :func:`estimate_weighted_log_prob` takes them."""
    weighted = _weighted_log_prob_unchecked(X, params, covariance_type, at_once, x_squared)
    log_prob_norm = logsumexp(weighted, -1)  # (B, N)
    # In place where nothing tracks gradients: weighted is this step's own.
    norm = log_prob_norm[..., None]
    log_resp = weighted - norm if needs_grad(weighted) else weighted.sub_(norm)
    if sample_weight is not None:  # (B|1, N), zero on padding
        weighted_sum = torch.where(sample_weight > 0, log_prob_norm * sample_weight, 0.0)
        mean = weighted_sum.sum(-1) / sample_weight.sum(-1)
        return mean, log_resp if mask is None else log_resp.masked_fill(~mask[..., None], -math.inf)
    if mask is None:
        return log_prob_norm.mean(-1), log_resp
    mean = log_prob_norm.masked_fill(~mask, 0.0).sum(-1) / mask.sum(-1)
    return mean, log_resp.masked_fill(~mask[..., None], -math.inf)


def e_step(
    X: Tensor,
    params: MixtureParams,
    covariance_type: str,
    mask: Tensor | None = None,
    sample_weight: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """The E-step.

    Parameters
    ----------
    X : Tensor of shape (B, N, d) or (1, N, d)
    params : MixtureParams
    covariance_type : {"full", "tied", "diag", "spherical"}
    mask : bool Tensor of shape (B, N) or (1, N), optional
        True for real points.
    sample_weight : Tensor of shape (B, N) or (1, N), optional
        Non-negative weights of the points, zero on padding.

    Returns
    -------
    log_prob_norm : Tensor of shape (B,)
        Mean (weighted by ``sample_weight``) over real points of ``logsumexp_k`` of the
        weighted log-probabilities.
    log_resp : Tensor of shape (B, N, K)
        Log-responsibilities; -inf on the rows of padded points.

    Examples
    --------
    >>> import torch
    >>> from transformer_gmm.engine import e_step, m_step
    >>> X, resp = two_blobs()  # (1, 40, 2) points in two blobs, one-hot (1, 40, 2) labels
    >>> params = m_step.estimate_gaussian_parameters(
    ...     X, resp, covariance_type="diag", reg_covar=1e-6)
    >>> log_prob_norm, log_resp = e_step.e_step(X, params, "diag")
    >>> log_prob_norm.shape, log_resp.shape
    (torch.Size([1]), torch.Size([1, 40, 2]))
    >>> torch.allclose(log_resp.exp().sum(-1), torch.ones(1, 40, dtype=torch.float64))
    True
    """
    check_params(X, params, covariance_type, mask, sample_weight)
    X, mask = compact(X), compact(mask)
    X = zero_padding(X, mask)
    return e_step_unchecked(X, params, covariance_type, mask, compact(sample_weight))


@entry_point
def weighted_log_prob_of_fitted(
    X: np.ndarray,
    weights: np.ndarray,
    means: np.ndarray,
    precisions_cholesky: np.ndarray,
    covariance_type: str,
) -> np.ndarray:
    """:func:`estimate_weighted_log_prob` of a fitted mixture's parameters (numpy, one
    mixture) for the rows ``X`` (n, d): log p(x | k) + log w_k of shape (n, K), on CPU in
    float64, in chunks of rows that bound the memory it takes."""
    params = MixtureParams(
        weights=tensor(weights, "cpu")[None],
        means=tensor(means, "cpu")[None],
        covariances=None,  # not needed to score
        precisions_cholesky=tensor(precisions_cholesky, "cpu")[None],
    )
    out = np.empty((X.shape[0], means.shape[0]))
    for start in range(0, X.shape[0], _CHUNK_ROWS):
        chunk = shared_tensor(X[start : start + _CHUNK_ROWS], "cpu")[None]  # read only
        out[start : start + _CHUNK_ROWS] = to_numpy(
            estimate_weighted_log_prob(chunk, params, covariance_type)[0]
        )
    return out


# A fitted mixture's densities and probabilities from its weighted log-probabilities,
# through the engine's exponentials (numpy's and SciPy's take the same slow path below
# -708 as torch's: on well separated components, most of predict_proba's time).


def log_norm_of_fitted(weighted: np.ndarray) -> np.ndarray:
    """log p(x) (n,) from ``weighted`` (n, K), the rows' log p(x | k) + log w_k."""
    return to_numpy(logsumexp(torch.from_numpy(weighted), -1))


def responsibilities_of_fitted(weighted: np.ndarray) -> np.ndarray:
    """p(k | x) (n, K) from ``weighted`` (n, K), the rows' log p(x | k) + log w_k."""
    log_resp = torch.from_numpy(weighted)
    return to_numpy(exp_(log_resp - logsumexp(log_resp, -1)[:, None]))
