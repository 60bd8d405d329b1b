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

k-means (``kmeans_plusplus``, ``lloyd``) lives in :mod:`transformer_gmm.kmeans` and is
importable from here too.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from .kmeans import _check_batch, _compact, _point_weights, _zero_padding, kmeans_plusplus, lloyd

COVARIANCE_TYPES = ("full", "tied", "diag", "spherical")


@dataclass
class MixtureParams:
    """Parameters of B Gaussian mixtures with K components in d dimensions."""

    weights: Tensor  # (B, K)
    means: Tensor  # (B, K, d)
    covariances: Tensor | None  # full (B,K,d,d) | tied (B,d,d) | diag (B,K,d) | spherical (B,K)
    precisions_cholesky: Tensor  # same shape as covariances


@dataclass
class EMResult:
    """What :func:`fit_em` returns, per dataset of the batch."""

    params: MixtureParams
    lower_bound: Tensor  # (B,) mean log-likelihood per point at the last E-step
    n_iter: Tensor  # (B,) long
    converged: Tensor  # (B,) bool


def _lookup(table: dict[str, Callable], covariance_type: str) -> Callable:
    if covariance_type not in table:
        raise ValueError(
            f"covariance_type must be one of {COVARIANCE_TYPES}, got {covariance_type!r}"
        )
    return table[covariance_type]


# Shape of one dataset's precisions_cholesky (and covariances), given K and d.
_PARAM_SHAPES = {
    "full": lambda k, d: (k, d, d),
    "tied": lambda k, d: (d, d),
    "diag": lambda k, d: (k, d),
    "spherical": lambda k, d: (k,),
}


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


# --- precisions ------------------------------------------------------------------------

_ERROR_MESSAGE = (
    "Fitting the mixture model failed because some components have ill-defined empirical "
    "covariance (for instance caused by singleton or collapsed samples). Try to decrease "
    "the number of components, increase reg_covar, or scale the input data."
)


def _error_message(dtype: torch.dtype) -> str:
    if dtype == torch.float32:
        return _ERROR_MESSAGE + (
            " The numerical accuracy can also be improved by passing float64 data instead"
            " of float32."
        )
    return _ERROR_MESSAGE


def _precision_cholesky_matrix(covariances: Tensor) -> tuple[Tensor, Tensor]:
    lower, info = torch.linalg.cholesky_ex(covariances)  # (..., d, d)
    eye = torch.eye(covariances.shape[-1], dtype=covariances.dtype, device=covariances.device)
    precisions_chol = torch.linalg.solve_triangular(lower, eye, upper=False).mT
    return precisions_chol, (info != 0)[..., None, None]


def _precision_cholesky_vector(covariances: Tensor) -> tuple[Tensor, Tensor]:
    return 1.0 / covariances.sqrt(), covariances <= 0


_PRECISION_CHOLESKY = {
    "full": _precision_cholesky_matrix,
    "tied": _precision_cholesky_matrix,
    "diag": _precision_cholesky_vector,
    "spherical": _precision_cholesky_vector,
}


def _precision_cholesky(covariances: Tensor, covariance_type: str) -> tuple[Tensor, Tensor]:
    """precisions_cholesky and a (B,) flag of the datasets whose covariances failed."""
    precisions_chol, failed = _lookup(_PRECISION_CHOLESKY, covariance_type)(covariances)
    failed = failed | ~torch.isfinite(precisions_chol)  # same shape as covariances
    n_dims = len(_PARAM_SHAPES[covariance_type](1, 1))  # dims of one dataset
    return precisions_chol, failed.flatten(failed.dim() - n_dims).any(-1)


def compute_precision_cholesky(covariances: Tensor, covariance_type: str) -> Tensor:
    """Cholesky factor of the precisions, as scikit-learn's ``_compute_precision_cholesky``.

    For full/tied, ``inv(cholesky(cov)).T`` (upper triangular, ``precision = P @ P.T``);
    for diag/spherical, ``1 / sqrt(cov)``. Any leading batch shape is accepted.

    Raises
    ------
    ValueError
        With scikit-learn's message, if a covariance is not positive definite.
    """
    precisions_chol, failed = _precision_cholesky(covariances, covariance_type)
    if bool(failed.any()):
        raise ValueError(_error_message(covariances.dtype))
    return precisions_chol


def _from_precisions_matrix(precisions: Tensor) -> Tensor:
    # The upper factor U with U U^T = precision is the flip of the lower Cholesky factor
    # of the flipped matrix (scikit-learn's _compute_precision_cholesky_from_precisions).
    lower, info = torch.linalg.cholesky_ex(precisions.flip(-2, -1))
    if bool((info != 0).any()):
        raise ValueError("precisions must be symmetric positive definite")
    return lower.flip(-2, -1)


_FROM_PRECISIONS = {
    "full": _from_precisions_matrix,
    "tied": _from_precisions_matrix,
    "diag": torch.sqrt,
    "spherical": torch.sqrt,
}


def precisions_cholesky_from_precisions(precisions: Tensor, covariance_type: str) -> Tensor:
    """precisions_cholesky from precision matrices (for ``precisions_init``), as scikit-learn.

    Any leading batch shape is accepted. Raises ValueError if a precision matrix is not
    positive definite.
    """
    return _lookup(_FROM_PRECISIONS, covariance_type)(precisions)


def _covariances_matrix(precisions_chol: Tensor) -> Tensor:
    # precision = P P^T, so covariance = P^-T P^-1; P is upper triangular.
    eye = torch.eye(
        precisions_chol.shape[-1], dtype=precisions_chol.dtype, device=precisions_chol.device
    )
    inverse = torch.linalg.solve_triangular(precisions_chol, eye, upper=True)
    return inverse.mT @ inverse


_COVARIANCES_FROM_PRECISIONS_CHOLESKY = {
    "full": _covariances_matrix,
    "tied": _covariances_matrix,
    "diag": lambda p: p.square().reciprocal(),
    "spherical": lambda p: p.square().reciprocal(),
}


def covariances_from_precisions_cholesky(
    precisions_cholesky: Tensor, covariance_type: str
) -> Tensor:
    """Covariances from scikit-learn-style precisions_cholesky; any leading batch shape."""
    return _lookup(_COVARIANCES_FROM_PRECISIONS_CHOLESKY, covariance_type)(precisions_cholesky)


# --- log-probabilities -----------------------------------------------------------------
# Each returns the squared Mahalanobis distances (B, N, K) for X (B|1, N, d), means
# (B, K, d) and precisions_cholesky of the type, following scikit-learn's formulas.


def _mahalanobis_full(X: Tensor, means: Tensor, precisions_chol: Tensor) -> Tensor:
    columns = []
    for k in range(means.shape[1]):  # per component, as scikit-learn: memory O(B N d)
        prec_chol = precisions_chol[:, k]  # (B, d, d)
        y = X @ prec_chol - means[:, k, None, :] @ prec_chol  # (B, N, d)
        columns.append(y.square().sum(-1))
    return torch.stack(columns, dim=-1)


def _mahalanobis_tied(X: Tensor, means: Tensor, precisions_chol: Tensor) -> Tensor:
    X_prec = X @ precisions_chol  # (B, N, d)
    means_prec = means @ precisions_chol  # (B, K, d)
    columns = [(X_prec - means_prec[:, k, None, :]).square().sum(-1) for k in range(means.shape[1])]
    return torch.stack(columns, dim=-1)


def _mahalanobis_diag(X: Tensor, means: Tensor, precisions_chol: Tensor) -> Tensor:
    precisions = precisions_chol.square()  # (B, K, d)
    return (
        (means.square() * precisions).sum(-1)[:, None, :]
        - 2.0 * X @ (means * precisions).mT
        + X.square() @ precisions.mT
    )


def _mahalanobis_spherical(X: Tensor, means: Tensor, precisions_chol: Tensor) -> Tensor:
    precisions = precisions_chol.square()[:, None, :]  # (B, 1, K)
    return (
        means.square().sum(-1)[:, None, :] * precisions
        - 2.0 * (X @ means.mT) * precisions
        + X.square().sum(-1, keepdim=True) * precisions
    )


_MAHALANOBIS = {
    "full": _mahalanobis_full,
    "tied": _mahalanobis_tied,
    "diag": _mahalanobis_diag,
    "spherical": _mahalanobis_spherical,
}

# log det of precisions_chol per component, (B, K) or (B, 1) for tied; it equals half the
# log det of the precision, i.e. minus half that of the covariance.
_LOG_DET_CHOLESKY = {
    "full": lambda p, d: torch.diagonal(p, dim1=-2, dim2=-1).log().sum(-1),
    "tied": lambda p, d: torch.diagonal(p, dim1=-2, dim2=-1).log().sum(-1, keepdim=True),
    "diag": lambda p, d: p.log().sum(-1),
    "spherical": lambda p, d: d * p.log(),
}


def estimate_log_gaussian_prob(
    X: Tensor, means: Tensor, precisions_cholesky: Tensor, covariance_type: str
) -> Tensor:
    """log N(x_n | mu_k, Sigma_k): (B, N, K), as scikit-learn's ``_estimate_log_gaussian_prob``.

    ``X`` is (B|1, N, d); ``means`` (B, K, d); ``precisions_cholesky`` of the type's shape.
    """
    n_features = X.shape[-1]
    distances = _lookup(_MAHALANOBIS, covariance_type)(X, means, precisions_cholesky)
    log_det = _LOG_DET_CHOLESKY[covariance_type](precisions_cholesky, n_features)
    return -0.5 * (n_features * math.log(2 * math.pi) + distances) + log_det[:, None, :]


def estimate_weighted_log_prob(X: Tensor, params: MixtureParams, covariance_type: str) -> Tensor:
    """log p(x_n | k) + log w_k: (B, N, K). ``params.covariances`` is not used."""
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

    Returns
    -------
    log_prob_norm : Tensor of shape (B,)
        Mean over real points of ``logsumexp_k`` of the weighted log-probabilities.
    log_resp : Tensor of shape (B, N, K)
        Log-responsibilities; -inf on the rows of padded points.
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

    Returns
    -------
    MixtureParams
        Batch B; weights are ``nk / n_real_points``.
    """
    seeds = kmeans_plusplus(X, n_components, generator=generator, mask=mask)
    _, labels, _, _ = lloyd(X, seeds, max_iter=n_init_lloyd_iter, tol=1e-4, mask=mask)
    # Padded points have label -1: give them a column, then masking zeroes their row.
    resp = torch.nn.functional.one_hot(labels.clamp_min(0), n_components).to(X.dtype)
    return estimate_gaussian_parameters(
        X, resp, covariance_type=covariance_type, reg_covar=reg_covar, mask=mask
    )
