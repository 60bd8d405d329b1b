"""EM for a Gaussian mixture on data with missing entries (NaN), missing at random.

The E-step scores each row by its marginal density over its observed features; the
M-step reads the conditional expectations of the missing entries given the observed ones
and their conditional covariances (Ghahramani and Jordan, 1994). Rows that share a missing
pattern share every matrix those need (the marginal covariances, their factors, the
regressions of the missing features on the observed ones), so the rows are grouped by
pattern, and each pattern's matrices are computed once. Each pattern's Sigma_oo is taken
as Sigma with its missing rows and columns replaced by the identity's, a (d, d) matrix
whose factors are those of Sigma_oo embedded: every pattern then has the same shape, and
runs of patterns (as many as a bounded temporary holds) are one batched product over
their patterns, rows and components, with no loop over patterns in Python.

Every covariance type runs through the full (K, d, d) covariances: the conditional
moments need the cross-covariances, which are zero for the diagonal types, so this costs
nothing in exactness. The M-step's covariances are the full ones projected onto the type
(their diagonal, its mean, or their weighted average), which maximises the expected
complete-data likelihood under the type's constraint.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from .gaussian import compute_precision_cholesky, covariances_from_precisions_cholesky

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


# Elements of the largest (rows, K, d, d) temporary of one chunk of patterns (32 MiB in
# float64): the rows' factors, gathered from their patterns'.
_CHUNK_ELEMENTS = 2**22


@dataclass(frozen=True)
class Patterns:
    """The rows grouped by missing pattern: each pattern's mask of observed features
    (P, d), the rows in pattern order, and where each pattern's rows start in it (tensors
    on the data's device)."""

    masks: Tensor  # (P, d) bool, True where observed
    order: Tensor  # (n,) the rows, pattern by pattern
    bounds: np.ndarray  # (P + 1,) pattern p's rows are order[bounds[p]:bounds[p + 1]]

    @classmethod
    def of(cls, X: np.ndarray, device: str | torch.device) -> Patterns:
        is_missing = np.isnan(X)
        patterns, inverse = np.unique(is_missing, axis=0, return_inverse=True)
        inverse = inverse.ravel()
        order = np.argsort(inverse, kind="stable")
        bounds = np.searchsorted(inverse[order], np.arange(len(patterns) + 1))
        return cls(
            torch.as_tensor(~patterns, device=device), torch.as_tensor(order, device=device),
            bounds,
        )

    def chunks(self, n_components: int) -> list[tuple[int, int]]:
        """Runs of consecutive patterns, (first, last + 1), whose rows' factors, (rows, K,
        d, d), hold at most ``_CHUNK_ELEMENTS`` (at least one pattern a run)."""
        n_features = self.masks.shape[1]
        limit = max(1, _CHUNK_ELEMENTS // (n_components * n_features**2))
        runs, first, n_patterns = [], 0, len(self.bounds) - 1
        while first < n_patterns:
            last = int(np.searchsorted(self.bounds, self.bounds[first] + limit, "right")) - 1
            last = min(max(last, first + 1), n_patterns)
            runs.append((first, last))
            first = last
        return runs


@dataclass(frozen=True)
class _Chunk:
    """One run of patterns, for every component: its rows, each row's pattern within the
    run, the patterns' observed masks (p, d) in the data's dtype, the precisions' Cholesky
    factors of Sigma_oo embedded in (d, d) with the identity on the missing features
    (p, K, d, d), and their log-determinants, sum(log(diag)), (p, K)."""

    rows: Tensor
    pattern: Tensor
    masks: Tensor
    factors: Tensor
    log_det: Tensor


def _chunk(patterns: Patterns, first: int, last: int, covariances: Tensor) -> _Chunk:
    """Every pattern of the run at once: Sigma with its missing rows and columns replaced by
    the identity's is block-diagonal up to a permutation, so its Cholesky factor is that of
    Sigma_oo, embedded, and the identity on the missing features (which add 0 to the
    log-determinant and to every quadratic form of a vector zero there)."""
    masks = patterns.masks[first:last].to(covariances.dtype)  # (p, d)
    embedded = covariances[None] * masks[:, None, :, None] * masks[:, None, None, :]
    embedded = embedded + torch.diag_embed(1.0 - masks)[:, None]  # (p, K, d, d)
    factors = compute_precision_cholesky(embedded, "full")
    log_det = torch.log(torch.diagonal(factors, dim1=-2, dim2=-1)).sum(-1)
    start, stop = int(patterns.bounds[first]), int(patterns.bounds[last])
    counts = torch.as_tensor(np.diff(patterns.bounds[first : last + 1]), device=masks.device)
    pattern = torch.repeat_interleave(torch.arange(last - first, device=masks.device), counts)
    return _Chunk(patterns.order[start:stop], pattern, masks, factors, log_det)


def _whitened(x: Tensor, chunk: _Chunk, means: Tensor) -> Tensor:
    """The chunk's rows' observed deviations from each mean (zero where missing),
    whitened: (x_o - mu_o)^T P_oo, embedded, (m, K, d)."""
    observed = chunk.masks[chunk.pattern]  # (m, d)
    deviations = (x[chunk.rows][:, None, :] - means[None]) * observed[:, None, :]
    return torch.einsum("mkd,mkde->mke", deviations, chunk.factors[chunk.pattern])


def _log_prob_by_pattern(
    x: Tensor, patterns: Patterns, weights: Tensor, means: Tensor, covariances: Tensor
) -> tuple[Tensor, list[_Chunk]]:
    """log p(x_o | k) + log w_k for every row, (n, K), and each run of patterns' factors
    over its observed features. ``x`` is zero where missing."""
    out = x.new_empty((x.shape[0], weights.shape[0]))
    chunks = []
    for first, last in patterns.chunks(len(weights)):
        chunk = _chunk(patterns, first, last, covariances)
        whitened = _whitened(x, chunk, means)
        n_observed = chunk.masks.sum(1)[chunk.pattern]  # (m,)
        out[chunk.rows] = (
            -0.5 * (n_observed[:, None] * math.log(2 * math.pi) + whitened.square().sum(-1))
            + chunk.log_det[chunk.pattern]
            + weights.log()
        )
        chunks.append(chunk)
    return out, chunks


def _completed(
    x: Tensor, chunk: _Chunk, means: Tensor, covariances: Tensor
) -> tuple[Tensor, Tensor]:
    """The chunk's rows completed under each component, (m, K, d): the observed entries,
    and the missing ones' conditional means mu_m + Sigma_mo Sigma_oo^-1 (x_o - mu_o); and
    each pattern's conditional covariance of its missing entries, Sigma_mm - Sigma_mo
    Sigma_oo^-1 Sigma_om, embedded in (p, K, d, d) with zeros on the observed features."""
    whitened = _whitened(x, chunk, means)
    factors = chunk.factors[chunk.pattern]  # (m, K, d, d)
    # Sigma_oo^-1 (x_o - mu_o) = P P^T (x_o - mu_o), zero on the missing features.
    solved = torch.einsum("mkde,mke->mkd", factors, whitened)
    regressed = torch.einsum("kfd,mkd->mkf", covariances, solved)  # Sigma_:o Sigma_oo^-1 (.)
    observed = chunk.masks[chunk.pattern][:, None, :] > 0  # (m, 1, d)
    completed = torch.where(observed, x[chunk.rows][:, None, :], means[None] + regressed)
    # Sigma_oo^-1 embedded: P P^T less the identity on the missing features.
    masks = chunk.masks[:, None]  # (p, 1, d)
    inverse = (chunk.factors @ chunk.factors.mT) * masks[..., :, None] * masks[..., None, :]
    conditional = covariances[None] - covariances[None] @ inverse @ covariances[None]
    missing = 1.0 - masks
    conditional = conditional * missing[..., :, None] * missing[..., None, :]
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
    chunks: list[_Chunk], reg_covar: float, covariance_type: str,
) -> tuple[Tensor, Tensor, Tensor]:
    """Weights, means and full covariances (K, d, d) from the responsibilities ``resp``
    (n, K, already weighted by the samples' weights) and the completed rows."""
    n_components, n_features = means.shape
    nk = resp.sum(0) + 10 * torch.finfo(resp.dtype).eps  # as scikit-learn keeps nk > 0
    completed, conditionals = [], []
    new_means = means.new_zeros(means.shape)
    for chunk in chunks:
        filled, conditional = _completed(x, chunk, means, covariances)
        completed.append(filled)
        conditionals.append(conditional)
        new_means += torch.einsum("mk,mkd->kd", resp[chunk.rows], filled)
    new_means /= nk[:, None]
    # A second pass centred on the new means: raw second moments minus the means' outer
    # product would lose the covariances' digits where the data sit far from the origin.
    scatter = means.new_zeros((n_components, n_features, n_features))
    for chunk, filled, conditional in zip(chunks, completed, conditionals, strict=True):
        r = resp[chunk.rows]  # (m, K)
        centred = filled - new_means[None]  # (m, K, d)
        scatter += torch.einsum("mk,mkd,mke->kde", r, centred, centred)
        by_pattern = r.new_zeros((len(chunk.masks), n_components)).index_add_(
            0, chunk.pattern, r
        )  # (p, K)
        scatter += torch.einsum("pk,pkde->kde", by_pattern, conditional)
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
    x = torch.where(torch.isnan(x), 0.0, x)  # the products read the observed entries alone
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
    :func:`~transformer_gmm.engine.e_step.weighted_log_prob_of_fitted` scores full rows."""
    dtype = torch.float64
    x = torch.as_tensor(X, dtype=dtype)
    x = torch.where(torch.isnan(x), 0.0, x)
    factors = torch.as_tensor(precisions_cholesky, dtype=dtype)
    covariances = covariances_from_precisions_cholesky(factors[None], covariance_type)[0]
    sigma = full_covariances(covariances, covariance_type, X.shape[1])
    sigma = sigma.expand(len(weights), -1, -1)
    log_prob, _ = _log_prob_by_pattern(
        x, Patterns.of(X, "cpu"), torch.as_tensor(weights, dtype=dtype),
        torch.as_tensor(means, dtype=dtype), sigma,
    )
    return log_prob.numpy()
