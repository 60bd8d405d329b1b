"""EM for a Gaussian mixture on data with missing entries (NaN), missing at random.

The E-step scores each row by its marginal density over its observed features; the
M-step reads the conditional expectations of the missing entries given the observed ones
and their conditional covariances (Ghahramani and Jordan, 1994). Rows that share a missing
pattern share every matrix those need (the marginal covariances, their factors, the
regressions of the missing features on the observed ones), so the rows are grouped by
pattern and each group is one batched product over its rows and every component: the
cost grows with the number of patterns, not of rows.

Every covariance type runs through the full (K, d, d) covariances: the conditional
moments need the cross-covariances, which are zero for the diagonal types, so this costs
nothing in exactness. The M-step's covariances are the full ones projected onto the type
(their diagonal, its mean, or their weighted average), which maximises the expected
complete-data likelihood under the type's constraint.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from .gaussian import (
    compute_precision_cholesky,
    covariances_from_precisions_cholesky,
    estimate_log_gaussian_prob,
)

__all__ = ["MissingEMResult", "Patterns", "check_rows", "fit_em_missing", "weighted_log_prob"]


def check_rows(X: np.ndarray) -> None:
    """A ValueError where a row of ``X`` has no observed feature: it says nothing about
    the mixture, and has no density to score or component to predict."""
    empty = np.isnan(X).all(axis=1)
    if empty.any():
        rows = np.flatnonzero(empty)
        raise ValueError(
            f"{len(rows)} row(s) of X have every feature missing (NaN), for instance row "
            f"{rows[0]}; such a row carries no information. Drop these rows first, e.g. "
            "X[~np.isnan(X).all(axis=1)]."
        )


@dataclass(frozen=True)
class Patterns:
    """The rows grouped by missing pattern: for each pattern, its rows' indices and the
    indices of its observed and missing features (tensors on the data's device)."""

    rows: list[Tensor]
    observed: list[Tensor]
    missing: list[Tensor]

    @classmethod
    def of(cls, X: np.ndarray, device: str | torch.device) -> Patterns:
        is_missing = np.isnan(X)
        patterns, inverse = np.unique(is_missing, axis=0, return_inverse=True)
        inverse = inverse.ravel()
        order = np.argsort(inverse, kind="stable")
        bounds = np.searchsorted(inverse[order], np.arange(len(patterns) + 1))
        rows, observed, missing = [], [], []
        for p, pattern in enumerate(patterns):
            rows.append(torch.as_tensor(order[bounds[p] : bounds[p + 1]], device=device))
            observed.append(torch.as_tensor(np.flatnonzero(~pattern), device=device))
            missing.append(torch.as_tensor(np.flatnonzero(pattern), device=device))
        return cls(rows, observed, missing)


def _marginal_log_prob(
    x_observed: Tensor, means: Tensor, covariances: Tensor, observed: Tensor
) -> tuple[Tensor, Tensor]:
    """log N(x_o | mu_o, Sigma_oo) of one pattern's rows, (n_p, K), and the precisions'
    Cholesky factors of Sigma_oo, (K, o, o)."""
    sigma_oo = covariances[:, observed][:, :, observed]
    precisions_cholesky = compute_precision_cholesky(sigma_oo, "full")
    log_prob = estimate_log_gaussian_prob(
        x_observed[None], means[None][:, :, observed], precisions_cholesky[None], "full"
    )[0]
    return log_prob, precisions_cholesky


def _log_prob_by_pattern(
    x: Tensor, patterns: Patterns, weights: Tensor, means: Tensor, covariances: Tensor
) -> tuple[Tensor, list[Tensor]]:
    """log p(x_o | k) + log w_k for every row, (n, K), and each pattern's precisions'
    Cholesky factors over its observed features."""
    out = x.new_empty((x.shape[0], weights.shape[0]))
    factors = []
    for rows, observed in zip(patterns.rows, patterns.observed, strict=True):
        x_observed = x[rows][:, observed]
        log_prob, factor = _marginal_log_prob(x_observed, means, covariances, observed)
        out[rows] = log_prob + weights.log()
        factors.append(factor)
    return out, factors


def _completed(
    x_observed: Tensor, means: Tensor, covariances: Tensor, factor: Tensor,
    observed: Tensor, missing: Tensor,
) -> tuple[Tensor, Tensor]:
    """One pattern's rows completed under each component, (K, n_p, d): the observed entries,
    and the missing ones' conditional means mu_m + Sigma_mo Sigma_oo^-1 (x_o - mu_o); and
    the conditional covariance of the missing entries, Sigma_mm - Sigma_mo Sigma_oo^-1
    Sigma_om, (K, m, m) (the same for every row of the pattern)."""
    n_components, n_features = means.shape
    completed = x_observed.new_empty((n_components, x_observed.shape[0], n_features))
    completed[:, :, observed] = x_observed[None]
    if len(missing) == 0:
        return completed, x_observed.new_zeros((n_components, 0, 0))
    sigma_mo = covariances[:, missing][:, :, observed]  # (K, m, o)
    # Sigma_oo^-1 = P P^T with P the precisions' Cholesky factor.
    regression = (sigma_mo @ factor) @ factor.mT  # Sigma_mo Sigma_oo^-1, (K, m, o)
    centred = x_observed[None] - means[:, None, observed]  # (K, n_p, o)
    completed[:, :, missing] = means[:, None, missing] + centred @ regression.mT
    sigma_mm = covariances[:, missing][:, :, missing]
    conditional = sigma_mm - regression @ sigma_mo.mT
    return completed, conditional


def _project(covariances: Tensor, nk: Tensor, covariance_type: str) -> Tensor:
    """The full covariances (K, d, d) as ``covariance_type``'s parameters, where the M-step
    of that type would put them given the same expected statistics."""
    if covariance_type == "full":
        return covariances
    if covariance_type == "tied":
        return (nk[:, None, None] * covariances).sum(0) / nk.sum()
    diagonal = torch.diagonal(covariances, dim1=-2, dim2=-1)
    if covariance_type == "diag":
        return diagonal
    return diagonal.mean(-1)  # spherical


def full_covariances(covariances: Tensor, covariance_type: str, n_features: int) -> Tensor:
    """``covariance_type``'s covariances (without a batch dimension) as full ones: (K, d, d),
    or (1, d, d) for "tied" (broadcast over the components)."""
    if covariance_type == "full":
        return covariances
    if covariance_type == "tied":
        return covariances[None]
    if covariance_type == "diag":
        return torch.diag_embed(covariances)
    eye = torch.eye(n_features, dtype=covariances.dtype, device=covariances.device)
    return covariances[:, None, None] * eye  # spherical


def _m_step(
    x: Tensor, patterns: Patterns, resp: Tensor, means: Tensor, covariances: Tensor,
    factors: list[Tensor], reg_covar: float, covariance_type: str,
) -> tuple[Tensor, Tensor, Tensor]:
    """Weights, means and full covariances (K, d, d) from the responsibilities ``resp``
    (n, K, already weighted by the samples' weights) and the completed rows."""
    n_components, n_features = means.shape
    nk = resp.sum(0) + 10 * torch.finfo(resp.dtype).eps  # as scikit-learn keeps nk > 0
    completed, conditionals = [], []
    new_means = means.new_zeros(means.shape)
    for rows, observed, missing, factor in zip(
        patterns.rows, patterns.observed, patterns.missing, factors, strict=True
    ):
        filled, conditional = _completed(
            x[rows][:, observed], means, covariances, factor, observed, missing
        )
        completed.append(filled)
        conditionals.append(conditional)
        new_means += torch.einsum("nk,knd->kd", resp[rows], filled)
    new_means /= nk[:, None]
    # A second pass centred on the new means: raw second moments minus the means' outer
    # product would lose the covariances' digits where the data sit far from the origin.
    scatter = means.new_zeros((n_components, n_features, n_features))
    for rows, missing, filled, conditional in zip(
        patterns.rows, patterns.missing, completed, conditionals, strict=True
    ):
        r = resp[rows]  # (n_p, K)
        centred = filled - new_means[:, None]  # (K, n_p, d)
        scatter += torch.einsum("nk,knd,kne->kde", r, centred, centred)
        if len(missing):
            block = r.sum(0)[:, None, None] * conditional  # (K, m, m)
            scatter[:, missing[:, None], missing[None, :]] += block
    new_covariances = scatter / nk[:, None, None]
    eye = torch.eye(n_features, dtype=x.dtype, device=x.device)
    projected = _project(new_covariances, nk, covariance_type)
    if covariance_type in ("full", "tied"):
        projected = projected + reg_covar * eye
    else:
        projected = projected + reg_covar
    weights = nk / nk.sum()
    return weights, new_means, projected


@dataclass(frozen=True)
class MissingEMResult:
    """EM's estimate on data with missing entries, as tensors without a batch dimension."""

    weights: Tensor  # (K,)
    means: Tensor  # (K, d)
    covariances: Tensor  # of covariance_type's shape
    precisions_cholesky: Tensor
    lower_bound: float  # mean observed-data log-likelihood per (weighted) row
    lower_bounds: list[float]
    n_iter: int
    converged: bool


def fit_em_missing(
    X: np.ndarray,
    weights: np.ndarray,
    means: np.ndarray,
    covariances: np.ndarray,
    *,
    covariance_type: str,
    reg_covar: float,
    max_iter: int,
    tol: float,
    sample_weight: np.ndarray | None = None,
    device: str = "cpu",
) -> MissingEMResult:
    """EM on ``X`` (n, d) with NaN for missing entries, from the given parameters (of
    ``covariance_type``'s shapes), in float64 on ``device``.

    Each iteration is an E-step (each row's responsibilities under its observed
    features' marginal) and an M-step (the expected sufficient statistics, with the
    missing entries' conditional means and covariances). EM stops when the mean
    observed-data log-likelihood gains less than ``tol``, as :func:`~.em.fit_em` does.
    Every row must have an observed feature.
    """
    dtype = torch.float64
    x = torch.as_tensor(X, dtype=dtype, device=device)
    patterns = Patterns.of(X, device)
    n_features = X.shape[1]
    row_weight = (
        torch.ones(x.shape[0], dtype=dtype, device=device)
        if sample_weight is None
        else torch.as_tensor(sample_weight, dtype=dtype, device=device)
    )
    total = row_weight.sum()
    w = torch.as_tensor(weights, dtype=dtype, device=device)
    mu = torch.as_tensor(means, dtype=dtype, device=device)
    sigma = full_covariances(
        torch.as_tensor(covariances, dtype=dtype, device=device), covariance_type, n_features
    ).expand(len(w), -1, -1)
    typed = torch.as_tensor(covariances, dtype=dtype, device=device)
    lower_bounds: list[float] = []
    converged, n_iter = False, 0
    log_prob, factors = _log_prob_by_pattern(x, patterns, w, mu, sigma)
    lower_bound = float((torch.logsumexp(log_prob, 1) * row_weight).sum() / total)
    while n_iter < max_iter:
        n_iter += 1
        resp = torch.softmax(log_prob, dim=1) * row_weight[:, None]
        w, mu, typed = _m_step(x, patterns, resp, mu, sigma, factors, reg_covar, covariance_type)
        sigma = full_covariances(typed, covariance_type, n_features).expand(len(w), -1, -1)
        log_prob, factors = _log_prob_by_pattern(x, patterns, w, mu, sigma)
        previous = lower_bound
        lower_bound = float((torch.logsumexp(log_prob, 1) * row_weight).sum() / total)
        lower_bounds.append(lower_bound)
        if abs(lower_bound - previous) < tol:
            converged = True
            break
    return MissingEMResult(
        weights=w,
        means=mu,
        covariances=typed,
        precisions_cholesky=compute_precision_cholesky(typed[None], covariance_type)[0],
        lower_bound=lower_bound,
        lower_bounds=lower_bounds,
        n_iter=n_iter,
        converged=converged,
    )


def weighted_log_prob(
    X: np.ndarray,
    weights: np.ndarray,
    means: np.ndarray,
    precisions_cholesky: np.ndarray,
    covariance_type: str,
) -> np.ndarray:
    """log p(x_o | k) + log w_k, (n, K), of rows with missing entries (NaN): each row's
    density is the marginal over its observed features. On CPU in float64, as
    :func:`~transformer_gmm.engine.backend.estimate_weighted_log_prob` scores full rows."""
    dtype = torch.float64
    x = torch.as_tensor(X, dtype=dtype)
    factors = torch.as_tensor(precisions_cholesky, dtype=dtype)
    covariances = covariances_from_precisions_cholesky(factors[None], covariance_type)[0]
    sigma = full_covariances(covariances, covariance_type, X.shape[1])
    sigma = sigma.expand(len(weights), -1, -1)
    log_prob, _ = _log_prob_by_pattern(
        x, Patterns.of(X, "cpu"), torch.as_tensor(weights, dtype=dtype),
        torch.as_tensor(means, dtype=dtype), sigma,
    )
    return log_prob.numpy()
