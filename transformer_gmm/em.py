"""Batched EM for Gaussian mixtures in torch, matching scikit-learn's GaussianMixture.

The formulas follow ``sklearn/mixture/_gaussian_mixture.py`` and the loop follows
``BaseMixture.fit_predict``, vectorised over a batch of B datasets (or B restarts of one
dataset). Conventions shared by every function:

- ``X`` is (B, N, d), or (1, N, d) broadcast against parameters of batch B. Work happens
  in X's dtype and on X's device.
- ``mask`` (bool, (B or 1, N), optional) is True for real points; padded points take no
  part in sums, means or the log-likelihood.
- Parameter shapes are scikit-learn's with a leading batch dimension: covariances (and
  ``precisions_cholesky``, with scikit-learn's meaning) are full (B, K, d, d), tied
  (B, d, d), diag (B, K, d), spherical (B, K).

Gaussian densities and precision conversions live in :mod:`transformer_gmm.gaussian`,
k-means (``kmeans_plusplus``, ``lloyd``) in :mod:`transformer_gmm.kmeans`; both are
importable from here too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from .gaussian import (
    _PARAM_SHAPES,
    COVARIANCE_TYPES,
    _error_message,
    _lookup,
    _precision_cholesky,
    compute_precision_cholesky,
    covariances_from_precisions_cholesky,
    estimate_log_gaussian_prob,
    precisions_cholesky_from_precisions,
)
from .kmeans import _check_batch, _compact, _point_weights, _zero_padding, kmeans_plusplus, lloyd

__all__ = [
    "COVARIANCE_TYPES",
    "EMResult",
    "MixtureParams",
    "compute_precision_cholesky",
    "covariances_from_precisions_cholesky",
    "e_step",
    "estimate_gaussian_parameters",
    "estimate_log_gaussian_prob",
    "estimate_weighted_log_prob",
    "fit_em",
    "initialize_kmeans",
    "kmeans_plusplus",
    "lloyd",
    "precisions_cholesky_from_precisions",
]


@dataclass
class MixtureParams:
    """Parameters of B Gaussian mixtures with K components in d dimensions.

    Attributes
    ----------
    weights : Tensor of shape (B, K)
    means : Tensor of shape (B, K, d)
    covariances : Tensor or None
        full (B, K, d, d), tied (B, d, d), diag (B, K, d) or spherical (B, K).
    precisions_cholesky : Tensor
        Of the same shape as the covariances, with scikit-learn's meaning.

    Examples
    --------
    >>> import torch
    >>> from transformer_gmm.em import MixtureParams, compute_precision_cholesky
    >>> covariances = torch.ones(1, 2, dtype=torch.float64)  # spherical, B=1, K=2
    >>> params = MixtureParams(
    ...     weights=torch.tensor([[0.5, 0.5]], dtype=torch.float64),
    ...     means=torch.tensor([[[-1.0], [1.0]]], dtype=torch.float64),
    ...     covariances=covariances,
    ...     precisions_cholesky=compute_precision_cholesky(covariances, "spherical"))
    >>> params.means.shape
    torch.Size([1, 2, 1])
    """

    weights: Tensor  # (B, K)
    means: Tensor  # (B, K, d)
    covariances: Tensor | None  # full (B,K,d,d) | tied (B,d,d) | diag (B,K,d) | spherical (B,K)
    precisions_cholesky: Tensor  # same shape as covariances


@dataclass
class EMResult:
    """What :func:`fit_em` returns, per dataset of the batch.

    Attributes
    ----------
    params : MixtureParams
        The fitted parameters.
    lower_bound : Tensor of shape (B,)
        Mean log-likelihood per point at the last E-step.
    n_iter : long Tensor of shape (B,)
        Iterations run.
    converged : bool Tensor of shape (B,)
        Whether each dataset converged.

    Examples
    --------
    >>> import torch
    >>> from transformer_gmm import em
    >>> g = torch.Generator().manual_seed(0)
    >>> X = torch.randn(1, 40, 2, generator=g, dtype=torch.float64)  # one dataset (B=1)
    >>> X[0, :20] -= 4.0
    >>> X[0, 20:] += 4.0
    >>> resp = torch.zeros(1, 40, 2, dtype=torch.float64)
    >>> resp[0, :20, 0] = resp[0, 20:, 1] = 1.0  # the first 20 points in component 0
    >>> params = em.estimate_gaussian_parameters(
    ...     X, resp, covariance_type="diag", reg_covar=1e-6)
    >>> result = em.fit_em(X, params, covariance_type="diag", reg_covar=1e-6,
    ...                    max_iter=100, tol=1e-3)
    >>> result.params.weights.shape, result.converged.tolist()
    (torch.Size([1, 2]), [True])
    """

    params: MixtureParams
    lower_bound: Tensor  # (B,) mean log-likelihood per point at the last E-step
    n_iter: Tensor  # (B,) long
    converged: Tensor  # (B,) bool


def _check_params(X: Tensor, params: MixtureParams, covariance_type: str, mask) -> int:
    """Check shapes agree (no silent broadcasting of a missing batch dim); return B."""
    means, weights = params.means, params.weights
    if means.dim() != 3 or means.shape[-1] != X.shape[-1]:
        raise ValueError(f"means must have shape (B, K, {X.shape[-1]}), got {means.shape}")
    n_components = means.shape[1]
    if weights.shape[1:] != (n_components,) or weights.dim() != 2:
        raise ValueError(f"weights must have shape (B, {n_components}), got {weights.shape}")
    expected = _lookup(_PARAM_SHAPES, covariance_type)(n_components, X.shape[-1])
    prec = params.precisions_cholesky
    if prec.dim() != len(expected) + 1 or prec.shape[1:] != expected:
        raise ValueError(
            f"{covariance_type} precisions_cholesky must have shape (B, *{expected}), "
            f"got {tuple(prec.shape)}"
        )
    return _check_batch(X, weights, means, prec, mask=mask)


# --- M-step ----------------------------------------------------------------------------
# Each estimator takes resp (B, N, K) and X (B|1, N, d) with padding already zeroed, nk
# (B, K), and means (B, K, d), which need not be the resp-weighted means (the transformer
# supplies its own), so the formulas stay exact for any means; with the weighted means
# they reduce to scikit-learn's.


def _covariances_full(resp: Tensor, X: Tensor, nk: Tensor, means: Tensor, reg: float) -> Tensor:
    # One component at a time, as scikit-learn does: memory O(B N d), not O(B N K d).
    covariances = []
    for k in range(means.shape[1]):
        diff = X - means[:, k, None, :]  # (B, N, d)
        covariances.append((resp[..., k, None] * diff).mT @ diff / nk[:, k, None, None])
    eye = torch.eye(X.shape[-1], dtype=X.dtype, device=X.device)
    return torch.stack(covariances, dim=1) + reg * eye  # (B, K, d, d)


def _covariances_tied(resp: Tensor, X: Tensor, nk: Tensor, means: Tensor, reg: float) -> Tensor:
    # sum_k sum_n r_nk (x_n - mu_k)(x_n - mu_k)^T / sum(nk), expanded to cost O(N d^2).
    sums = resp.mT @ X  # (B, K, d)
    second_moment = (resp.sum(-1, keepdim=True) * X).mT @ X  # (B, d, d)
    cross = sums.mT @ means  # (B, d, d)
    means_term = (nk[..., None] * means).mT @ means  # (B, d, d)
    covariance = (second_moment - cross - cross.mT + means_term) / nk.sum(-1)[:, None, None]
    return covariance + reg * torch.eye(X.shape[-1], dtype=X.dtype, device=X.device)


def _covariances_diag(resp: Tensor, X: Tensor, nk: Tensor, means: Tensor, reg: float) -> Tensor:
    avg_X2 = resp.mT @ X.square() / nk[..., None]  # (B, K, d)
    avg_X = resp.mT @ X / nk[..., None]  # (B, K, d)
    return avg_X2 - 2.0 * means * avg_X + means.square() + reg


_COVARIANCE_ESTIMATORS = {
    "full": _covariances_full,
    "tied": _covariances_tied,
    "diag": _covariances_diag,
    "spherical": lambda *args: _covariances_diag(*args).mean(-1),  # (B, K)
}


def _estimate_parameters(
    X: Tensor, resp: Tensor, covariance_type: str, reg_covar: float, means: Tensor | None
) -> tuple[Tensor, Tensor, Tensor]:
    """scikit-learn's ``_estimate_gaussian_parameters``: (nk, means, covariances)."""
    # The 10 eps keep empty components from dividing by zero, exactly as scikit-learn.
    nk = resp.sum(1) + 10 * torch.finfo(resp.dtype).eps  # (B, K)
    if means is None:
        means = resp.mT @ X / nk[..., None]  # (B, K, d)
    covariances = _lookup(_COVARIANCE_ESTIMATORS, covariance_type)(resp, X, nk, means, reg_covar)
    return nk, means.expand(nk.shape[0], -1, -1), covariances


def estimate_gaussian_parameters(
    X: Tensor,
    resp: Tensor,
    *,
    covariance_type: str,
    reg_covar: float,
    means: Tensor | None = None,
    mask: Tensor | None = None,
) -> MixtureParams:
    """The M-step, as scikit-learn's ``_estimate_gaussian_parameters``.

    Parameters
    ----------
    X : Tensor of shape (B, N, d) or (1, N, d)
    resp : Tensor of shape (B, N, K)
        Responsibilities (rows of real points normally sum to 1).
    covariance_type : {"full", "tied", "diag", "spherical"}
    reg_covar : float
        Added to the diagonal of the covariances.
    means : Tensor of shape (B, K, d), optional
        Means to use (in the covariances too) instead of the weighted means.
    mask : bool Tensor of shape (B, N) or (1, N), optional

    Returns
    -------
    MixtureParams
        weights ``nk / n_real_points`` (as scikit-learn's initialisation), means,
        covariances and precisions_cholesky. ValueError if a covariance is not positive
        definite.

    Examples
    --------
    >>> import torch
    >>> from transformer_gmm import em
    >>> g = torch.Generator().manual_seed(0)
    >>> X = torch.randn(1, 40, 2, generator=g, dtype=torch.float64)  # one dataset (B=1)
    >>> X[0, :20] -= 4.0
    >>> X[0, 20:] += 4.0
    >>> resp = torch.zeros(1, 40, 2, dtype=torch.float64)
    >>> resp[0, :20, 0] = resp[0, 20:, 1] = 1.0  # the first 20 points in component 0
    >>> params = em.estimate_gaussian_parameters(
    ...     X, resp, covariance_type="diag", reg_covar=1e-6)
    >>> params.weights.round(decimals=3).tolist()
    [[0.5, 0.5]]
    >>> torch.allclose(params.means[0, 0], X[0, :20].mean(0))  # weighted means
    True
    >>> params.covariances.shape  # diag: (B, K, d)
    torch.Size([1, 2, 2])
    """
    n_batch = _check_batch(X, resp, *([] if means is None else [means]), mask=mask)
    if resp.dim() != 3 or resp.shape[1] != X.shape[1]:
        raise ValueError(f"resp must have shape (B, {X.shape[1]}, K), got {resp.shape}")
    if means is not None and means.shape[1:] != (resp.shape[2], X.shape[2]):
        raise ValueError(f"means must have shape (B, K, d), got {means.shape}")
    X, mask, resp = _compact(X), _compact(mask), resp.expand(n_batch, -1, -1)
    n_real = _point_weights(X, mask).sum(-1, keepdim=True)  # (B|1, 1)
    X = _zero_padding(X, mask)
    if mask is not None:
        resp = resp.masked_fill(~mask[..., None], 0.0)
    nk, means, covariances = _estimate_parameters(X, resp, covariance_type, reg_covar, means)
    return MixtureParams(
        nk / n_real, means, covariances, compute_precision_cholesky(covariances, covariance_type)
    )


def estimate_weighted_log_prob(X: Tensor, params: MixtureParams, covariance_type: str) -> Tensor:
    """log p(x_n | k) + log w_k: (B, N, K). ``params.covariances`` is not used.

    Parameters
    ----------
    X : Tensor of shape (B, N, d) or (1, N, d)
    params : MixtureParams
    covariance_type : {"full", "tied", "diag", "spherical"}

    Returns
    -------
    weighted_log_prob : Tensor of shape (B, N, K)

    Examples
    --------
    >>> import torch
    >>> from transformer_gmm import em
    >>> g = torch.Generator().manual_seed(0)
    >>> X = torch.randn(1, 40, 2, generator=g, dtype=torch.float64)  # one dataset (B=1)
    >>> X[0, :20] -= 4.0
    >>> X[0, 20:] += 4.0
    >>> resp = torch.zeros(1, 40, 2, dtype=torch.float64)
    >>> resp[0, :20, 0] = resp[0, 20:, 1] = 1.0  # the first 20 points in component 0
    >>> params = em.estimate_gaussian_parameters(
    ...     X, resp, covariance_type="diag", reg_covar=1e-6)
    >>> weighted = em.estimate_weighted_log_prob(X, params, "diag")
    >>> weighted.shape
    torch.Size([1, 40, 2])
    >>> weighted[0].argmax(-1).tolist() == [0] * 20 + [1] * 20
    True
    """
    _check_params(X, params, covariance_type, None)
    log_prob = estimate_log_gaussian_prob(
        X, params.means, params.precisions_cholesky, covariance_type
    )
    return log_prob + params.weights.log()[:, None, :]


# --- EM --------------------------------------------------------------------------------


def _e_step(X: Tensor, params: MixtureParams, covariance_type: str, mask) -> tuple[Tensor, Tensor]:
    weighted = estimate_weighted_log_prob(X, params, covariance_type)  # (B, N, K)
    log_prob_norm = weighted.logsumexp(-1)  # (B, N)
    log_resp = weighted - log_prob_norm[..., None]
    if mask is None:
        return log_prob_norm.mean(-1), log_resp
    mean = log_prob_norm.masked_fill(~mask, 0.0).sum(-1) / mask.sum(-1)
    return mean, log_resp.masked_fill(~mask[..., None], -math.inf)


def e_step(
    X: Tensor, params: MixtureParams, covariance_type: str, mask: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """The E-step.

    Parameters
    ----------
    X : Tensor of shape (B, N, d) or (1, N, d)
    params : MixtureParams
    covariance_type : {"full", "tied", "diag", "spherical"}
    mask : bool Tensor of shape (B, N) or (1, N), optional
        True for real points.

    Returns
    -------
    log_prob_norm : Tensor of shape (B,)
        Mean over real points of ``logsumexp_k`` of the weighted log-probabilities.
    log_resp : Tensor of shape (B, N, K)
        Log-responsibilities; -inf on the rows of padded points.

    Examples
    --------
    >>> import torch
    >>> from transformer_gmm import em
    >>> g = torch.Generator().manual_seed(0)
    >>> X = torch.randn(1, 40, 2, generator=g, dtype=torch.float64)  # one dataset (B=1)
    >>> X[0, :20] -= 4.0
    >>> X[0, 20:] += 4.0
    >>> resp = torch.zeros(1, 40, 2, dtype=torch.float64)
    >>> resp[0, :20, 0] = resp[0, 20:, 1] = 1.0  # the first 20 points in component 0
    >>> params = em.estimate_gaussian_parameters(
    ...     X, resp, covariance_type="diag", reg_covar=1e-6)
    >>> log_prob_norm, log_resp = em.e_step(X, params, "diag")
    >>> log_prob_norm.shape, log_resp.shape
    (torch.Size([1]), torch.Size([1, 40, 2]))
    >>> torch.allclose(log_resp.exp().sum(-1), torch.ones(1, 40, dtype=torch.float64))
    True
    """
    _check_params(X, params, covariance_type, mask)
    X, mask = _compact(X), _compact(mask)
    return _e_step(_zero_padding(X, mask), params, covariance_type, mask)


def _select(active: Tensor, new: MixtureParams, old: MixtureParams) -> MixtureParams:
    """Take ``new`` for the active datasets and keep ``old`` for the others."""

    def pick(a: Tensor, b: Tensor | None) -> Tensor:
        if b is None:  # no initial covariances: every dataset is active on iteration 1
            return a
        return torch.where(active.view(-1, *[1] * (a.dim() - 1)), a, b)

    return MixtureParams(*map(pick, _astuple(new), _astuple(old)))


def _astuple(params: MixtureParams) -> tuple:
    # dataclasses.astuple would deep-copy the tensors.
    return (params.weights, params.means, params.covariances, params.precisions_cholesky)


def fit_em(
    X: Tensor,
    params: MixtureParams,
    *,
    covariance_type: str,
    reg_covar: float,
    max_iter: int,
    tol: float,
    mask: Tensor | None = None,
) -> EMResult:
    """EM from ``params`` on each dataset of the batch, as scikit-learn's ``fit_predict`` loop.

    Per dataset: ``lower_bound = -inf``; each iteration runs an E-step (giving
    ``log_prob_norm``) and an M-step (weights renormalised to sum to 1), and the dataset
    converges once ``|log_prob_norm - lower_bound| < tol``. Converged datasets stop
    changing while the others go on, until all converged or ``max_iter``.

    Parameters
    ----------
    X : Tensor of shape (B, N, d), or (1, N, d) for B restarts on one dataset
    params : MixtureParams
        The start; its ``covariances`` may be None (precisions_cholesky is what is used).
    covariance_type, reg_covar, max_iter, tol : as scikit-learn's GaussianMixture
    mask : bool Tensor of shape (B, N) or (1, N), optional

    Returns
    -------
    EMResult
        With ``max_iter=0``: the given params, ``n_iter`` 0, not converged, and the mean
        log-likelihood of the given params as ``lower_bound``. ValueError if a dataset still
        iterating gets a covariance that is not positive definite.

    Examples
    --------
    >>> import torch
    >>> from transformer_gmm import em
    >>> g = torch.Generator().manual_seed(0)
    >>> X = torch.randn(1, 40, 2, generator=g, dtype=torch.float64)  # one dataset (B=1)
    >>> X[0, :20] -= 4.0
    >>> X[0, 20:] += 4.0
    >>> init = em.initialize_kmeans(X, 2, covariance_type="full", reg_covar=1e-6,
    ...                              generator=torch.Generator().manual_seed(0))
    >>> result = em.fit_em(X, init, covariance_type="full", reg_covar=1e-6,
    ...                    max_iter=100, tol=1e-3)
    >>> result.converged.tolist(), result.params.covariances.shape
    ([True], torch.Size([1, 2, 2, 2]))
    >>> sorted(result.params.means[0, :, 0].round().tolist())
    [-4.0, 4.0]
    """
    n_batch = _check_params(X, params, covariance_type, mask)
    params = MixtureParams(  # parameters of batch 1 serve every dataset
        *(None if t is None else t.expand(n_batch, *t.shape[1:]) for t in _astuple(params))
    )
    X, mask = _compact(X), _compact(mask)
    X = _zero_padding(X, mask)
    n_iter = torch.zeros(n_batch, dtype=torch.long, device=X.device)
    converged = torch.zeros(n_batch, dtype=torch.bool, device=X.device)
    if max_iter == 0:
        log_prob_norm, _ = _e_step(X, params, covariance_type, mask)
        return EMResult(params, log_prob_norm.expand(n_batch).clone(), n_iter, converged)

    lower_bound = X.new_full((n_batch,), -math.inf)
    for iteration in range(1, max_iter + 1):
        active = ~converged  # (B,)
        log_prob_norm, log_resp = _e_step(X, params, covariance_type, mask)
        nk, means, covariances = _estimate_parameters(
            X, log_resp.exp(), covariance_type, reg_covar, None
        )
        precisions_chol, failed = _precision_cholesky(covariances, covariance_type)
        # scikit-learn's _m_step normalises by sum(nk) here, not by the number of points.
        new = MixtureParams(nk / nk.sum(-1, keepdim=True), means, covariances, precisions_chol)
        params = _select(active, new, params)
        change = log_prob_norm - lower_bound  # +inf on the first iteration
        lower_bound = torch.where(active, log_prob_norm, lower_bound)
        n_iter = n_iter.masked_fill(active, iteration)
        converged = converged | (active & (change.abs() < tol))
        # One host sync per iteration for both checks. Datasets that already converged
        # may fail harmlessly: scikit-learn would not have run this M-step for them.
        any_failed, all_converged = torch.stack([(failed & active).any(), converged.all()]).tolist()
        if any_failed:
            raise ValueError(_error_message(X.dtype))
        if all_converged:
            break
    return EMResult(params, lower_bound, n_iter, converged)


# --- initialisation --------------------------------------------------------------------


def initialize_kmeans(
    X: Tensor,
    n_components: int,
    *,
    covariance_type: str,
    reg_covar: float,
    generator: torch.Generator,
    mask: Tensor | None = None,
    n_init_lloyd_iter: int = 300,
) -> MixtureParams:
    """scikit-learn's default GaussianMixture initialisation, once per dataset of the batch.

    k-means++ seeds, Lloyd to convergence (tol 1e-4), one-hot responsibilities from the
    labels, one M-step. ``X`` is (B, N, d): pass ``X.expand(B, N, d)`` for B restarts.

    Parameters
    ----------
    X : Tensor of shape (B, N, d)
    n_components : int
        Number of components K.
    covariance_type : {"full", "tied", "diag", "spherical"}
    reg_covar : float
        Added to the diagonal of the covariances.
    generator : torch.Generator
        The only source of randomness (on X's device).
    mask : bool Tensor of shape (B, N) or (1, N), optional
        True for real points.
    n_init_lloyd_iter : int, default=300
        Maximum Lloyd iterations.

    Returns
    -------
    MixtureParams
        Batch B; weights are ``nk / n_real_points``.

    Examples
    --------
    >>> import torch
    >>> from transformer_gmm import em
    >>> g = torch.Generator().manual_seed(0)
    >>> X = torch.randn(1, 40, 2, generator=g, dtype=torch.float64)  # one dataset (B=1)
    >>> X[0, :20] -= 4.0
    >>> X[0, 20:] += 4.0
    >>> generator = torch.Generator().manual_seed(0)
    >>> params = em.initialize_kmeans(X.expand(3, -1, -1), 2, covariance_type="spherical",
    ...                               reg_covar=1e-6, generator=generator)  # 3 restarts
    >>> params.weights.shape, params.means.shape, params.covariances.shape
    (torch.Size([3, 2]), torch.Size([3, 2, 2]), torch.Size([3, 2]))
    """
    seeds = kmeans_plusplus(X, n_components, generator=generator, mask=mask)
    _, labels, _, _ = lloyd(X, seeds, max_iter=n_init_lloyd_iter, tol=1e-4, mask=mask)
    # Padded points have label -1: give them a column, then masking zeroes their row.
    resp = torch.nn.functional.one_hot(labels.clamp_min(0), n_components).to(X.dtype)
    return estimate_gaussian_parameters(
        X, resp, covariance_type=covariance_type, reg_covar=reg_covar, mask=mask
    )
