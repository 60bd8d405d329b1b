"""EM for a Gaussian mixture on data with missing entries (NaN), missing at random.

The E-step scores each row by its marginal density over its observed features; the
M-step reads the conditional expectations of the missing entries given the observed ones
and their conditional covariances (Ghahramani and Jordan, 1994). Rows that share a missing
pattern share every matrix those need (the marginal covariances, their factors, the
regressions of the missing features on the observed ones), so the rows are grouped by
pattern, and each pattern's matrices are computed once. Each pattern's Sigma_oo is taken
as Sigma with its missing rows and columns replaced by the identity's, a (d, d) matrix
whose factors are those of Sigma_oo embedded: every pattern then has the same shape, and
runs of patterns (as many as a bounded temporary holds) are read at once. Within a run, a
pattern with many rows solves them in one product of its own; the rows of the others
gather their patterns' matrices for one batched product, so that many small patterns cost
no loop in Python.

Every covariance type runs through the full (K, d, d) covariances: the conditional
moments need the cross-covariances, which are zero for the diagonal types, so this costs
nothing in exactness. The expected statistics are kept as every fit keeps its
(:class:`~transformer_gmm.engine.sufficient_stats.MixtureStatistics`: the full scatter's
diagonal, its mean, or its sum over the components), so the M-step is every fit's, which
maximises the expected complete-data likelihood under the type's constraint, and EM's
loop is every fit's too.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from .covariance_prior import CovariancePrior
from .gaussian import compute_precision_cholesky, covariances_from_precisions_cholesky
from .logspace import exp_, logsumexp
from .m_step import MixtureParams
from .row_order import canonical_order
from .sufficient_stats import MixtureStatistics, fit_em_from_statistics

__all__ = [
    "MissingEMResult",
    "Patterns",
    "check_rows",
    "fit_em_missing",
    "missing_statistics",
    "weighted_log_prob",
    "worst_explained",
]


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
# float64): the rows' Sigma_oo^-1, gathered from their patterns'.
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
        patterns, inverse = _unique_patterns(np.isnan(X))
        order = np.argsort(inverse, kind="stable")
        bounds = np.searchsorted(inverse[order], np.arange(len(patterns) + 1))
        return cls(
            torch.as_tensor(~patterns, device=device), torch.as_tensor(order, device=device),
            bounds,
        )

    def chunks(self, n_components: int) -> list[tuple[int, int]]:
        """Runs of consecutive patterns, (first, last + 1), whose rows' matrices, (rows, K,
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

    def runs(self, x: Tensor, n_components: int, row_weight: Tensor | None = None) -> list[_Run]:
        """Each run of :meth:`chunks` as every iteration reads it (see :class:`_Run`), of
        the rows ``x`` (n, d), zero where missing, weighed by ``row_weight`` (n,) or 1. The
        runs' rows are views of one copy of ``x`` in pattern order."""
        ordered = x[self.order]  # (n, d)
        weights = x.new_ones(len(x)) if row_weight is None else row_weight[self.order]
        device, out = x.device, []
        for first, last in self.chunks(n_components):
            start, stop = int(self.bounds[first]), int(self.bounds[last])
            starts = self.bounds[first : last + 1] - start  # each pattern's first row, and the end
            sizes = np.diff(starts)
            pattern = torch.repeat_interleave(
                torch.arange(last - first, device=device), torch.as_tensor(sizes, device=device)
            )
            large = sizes >= _OWN_PRODUCT_ROWS
            own = [(int(p), int(starts[p]), int(starts[p + 1])) for p in np.flatnonzero(large)]
            gathered = None
            if not large.all():
                gathered = torch.as_tensor(np.flatnonzero(np.repeat(~large, sizes)), device=device)
            masks = self.masks[first:last]  # (p, d) bool
            out.append(_Run(
                self.order[start:stop], ordered[start:stop], weights[start:stop], pattern,
                masks.to(x.dtype), masks[pattern], masks.sum(1)[pattern].to(x.dtype), own,
                gathered,
            ))
        return out


def _unique_patterns(is_missing: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(is_missing, axis=0, return_inverse=True)``, the same patterns in the same
    (lexicographic) order, from each row's bits packed into bytes: one key a row, an integer
    up to 64 features, sorted rather than rows of d bools (20,000 x 7: 1.6 ms, not 27)."""
    n_features = is_missing.shape[1]
    packed = np.packbits(is_missing, axis=1)  # (n, w): the first feature the highest bit
    width = packed.shape[1]
    if width <= 8:  # big-endian integers order as their bytes do
        padded = np.zeros((len(packed), 8), np.uint8)
        padded[:, :width] = packed
        keys = padded.view(">u8").ravel()
    else:  # byte strings, compared byte by byte
        keys = np.ascontiguousarray(packed).view(np.dtype((np.void, width))).ravel()
    unique_keys, inverse = np.unique(keys, return_inverse=True)
    if width <= 8:
        unique_bytes = unique_keys.astype(">u8").view(np.uint8).reshape(-1, 8)[:, :width]
    else:
        unique_bytes = unique_keys.view(np.uint8).reshape(-1, width)
    patterns = np.unpackbits(unique_bytes, axis=1, count=n_features).astype(bool)
    return patterns, inverse.ravel()


# A pattern with at least this many rows in a chunk solves them by its Sigma_oo^-1 in one
# product of its own; the rows of smaller ones gather their patterns' matrices, (rows, K,
# d, d), for one batched product, which a loop over many small patterns would not beat.
_OWN_PRODUCT_ROWS = 64


@dataclass(frozen=True)
class _Run:
    """One run of patterns (:meth:`Patterns.runs`), what does not change between EM's
    iterations: its rows (m,) (indices into the data), their values (m, d), zero where
    missing, and weights (m,); each row's pattern within the run (m,); the patterns'
    observed masks (p, d) in the data's dtype, each row's (m, d) as bools, and its number
    of observed features (m,). ``own``: the patterns of ``_OWN_PRODUCT_ROWS`` rows or more,
    (pattern, first row, last row + 1) in the run; ``gathered``: the run's other rows
    (None: there are none)."""

    rows: Tensor
    x: Tensor
    weight: Tensor
    pattern: Tensor
    masks: Tensor
    observed: Tensor
    n_observed: Tensor
    own: list[tuple[int, int, int]]
    gathered: Tensor | None


@dataclass(frozen=True)
class _Chunk:
    """One run of patterns under one mixture's covariances: the run, the log-determinants
    of the precisions' Cholesky factors of Sigma_oo, sum(log(diag)), (p, K), and
    Sigma_oo^-1 embedded in (d, d) with zeros on the missing features, (p, K, d, d)."""

    run: _Run
    log_det: Tensor
    inverses: Tensor

    def solved(self, vectors: Tensor) -> Tensor:
        """Sigma_oo^-1 v for each row's ``vectors`` (K, m, d), zero where missing, under
        its pattern: (K, m, d)."""
        out = torch.empty_like(vectors)
        for pattern, first, last in self.run.own:  # symmetric: v^T A is (A v)^T
            out[:, first:last] = torch.bmm(vectors[:, first:last], self.inverses[pattern])
        if self.run.gathered is not None:
            rows = self.run.gathered
            inverses = self.inverses[self.run.pattern[rows]]  # (rows, K, d, d)
            out[:, rows] = torch.einsum("kmd,mkde->kme", vectors[:, rows], inverses)
        return out


def _chunk(run: _Run, covariances: Tensor) -> _Chunk:
    """Every pattern of the run at once: Sigma with its missing rows and columns replaced by
    the identity's is block-diagonal up to a permutation, so its Cholesky factor is that of
    Sigma_oo, embedded, and the identity on the missing features (which add 0 to the
    log-determinant and to every quadratic form of a vector zero there)."""
    masks = run.masks
    observed = masks[:, None, :, None] * masks[:, None, None, :]  # (p, 1, d, d), 0 or 1
    embedded = covariances[None] * observed + torch.diag_embed(1.0 - masks)[:, None]
    factors = compute_precision_cholesky(embedded, "full")  # (p, K, d, d)
    log_det = torch.log(torch.diagonal(factors, dim1=-2, dim2=-1)).sum(-1)
    # Sigma_oo^-1 embedded: P P^T less the identity on the missing features.
    inverses = (factors @ factors.mT) * observed
    return _Chunk(run, log_det, inverses)


def _deviations(run: _Run, means: Tensor) -> Tensor:
    """The run's rows' observed deviations from each mean, zero where missing:
    x_o - mu_o, embedded, component-major (K, m, d)."""
    return (run.x[None] - means[:, None]) * run.observed[None]


class _Scored(NamedTuple):
    """One run of patterns scored under a mixture: the chunk, its rows' deviations
    x_o - mu_o (K, m, d, zero where missing) and those solved, Sigma_oo^-1 (x_o - mu_o),
    and log p(x_o | k) + log w_k (m, K)."""

    chunk: _Chunk
    deviations: Tensor
    solved: Tensor
    log_prob: Tensor


def _scored_chunks(
    runs: list[_Run], weights: Tensor, means: Tensor, covariances: Tensor
) -> Iterator[_Scored]:
    """Each run of patterns with its rows scored over their observed features: the
    E-step's part of a chunk, which its completion reads too."""
    for run in runs:
        chunk = _chunk(run, covariances)
        deviations = _deviations(run, means)  # (K, m, d)
        solved = chunk.solved(deviations)
        squared = (deviations * solved).sum(-1).T  # Mahalanobis, (m, K)
        log_prob = (
            -0.5 * (run.n_observed[:, None] * math.log(2 * math.pi) + squared)
            + chunk.log_det[run.pattern]
            + weights.log()
        )
        yield _Scored(chunk, deviations, solved, log_prob)


def _log_prob_by_pattern(
    runs: list[_Run], n_rows: int, weights: Tensor, means: Tensor, covariances: Tensor
) -> Tensor:
    """log p(x_o | k) + log w_k for every one of the ``n_rows`` rows, (n, K), over its
    observed features."""
    out = means.new_empty((n_rows, weights.shape[0]))
    for scored in _scored_chunks(runs, weights, means, covariances):
        out[scored.chunk.run.rows] = scored.log_prob
    return out


def _completed(scored: _Scored, covariances: Tensor) -> tuple[Tensor, Tensor]:
    """The chunk's rows completed under each component, less its mean, component-major
    (K, m, d): the observed entries' deviations x_o - mu_o, and the missing ones'
    conditional means less the mean, Sigma_mo Sigma_oo^-1 (x_o - mu_o); and each pattern's
    conditional covariance of its missing entries, Sigma_mm - Sigma_mo Sigma_oo^-1 Sigma_om,
    embedded in (p, K, d, d) with zeros on the observed features, from the chunk as
    :func:`_scored_chunks` scored it."""
    chunk = scored.chunk
    # Sigma_:o Sigma_oo^-1 (.), one product per component: (K, m, d) @ (K, d, f).
    regressed = torch.bmm(scored.solved, covariances.mT)
    centred = torch.where(chunk.run.observed[None], scored.deviations, regressed)
    conditional = covariances[None] - covariances[None] @ chunk.inverses @ covariances[None]
    missing = 1.0 - chunk.run.masks[:, None]  # (p, 1, d)
    conditional = conditional * (missing[..., :, None] * missing[..., None, :])
    return centred, conditional


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


def missing_statistics(
    runs: list[_Run],
    params: MixtureParams,
    covariance_type: str,
    row_weight: Tensor,
) -> MixtureStatistics:
    """The :class:`~transformer_gmm.engine.sufficient_stats.MixtureStatistics` of rows with
    missing entries, for one run of ``params`` (batch 1): the E-step on each row's observed
    features, and the expected sums and scatter of the rows completed under each
    component (the missing entries' conditional means, and their conditional covariances
    added to the scatter). ``runs``: the rows' runs of patterns (:meth:`Patterns.runs`),
    of weights ``row_weight`` (n,)."""
    n_rows, n_features = len(row_weight), params.means.shape[-1]
    weights, means = params.weights[0], params.means[0]
    covariances = params.covariances
    if covariances is None:
        covariances = covariances_from_precisions_cholesky(
            params.precisions_cholesky, covariance_type
        )
    sigma = full_covariances(covariances[0], covariance_type, n_features)
    sigma = sigma.expand(len(weights), -1, -1)  # (K, d, d)
    n_components = len(weights)
    resp = means.new_empty((n_rows, n_components))  # (n, K)
    log_norm = means.new_empty(n_rows)  # (n,)
    sums = means.new_zeros((n_components, n_features))
    scatter = means.new_zeros((n_components, n_features, n_features))
    # Chunk by chunk, the E-step on its rows' observed features, then their completion:
    # the rows' solved deviations serve both.
    for scored in _scored_chunks(runs, weights, means, sigma):
        run, log_prob = scored.chunk.run, scored.log_prob  # (m, K)
        chunk_norm = logsumexp(log_prob, 1)  # (m,)
        r = exp_(log_prob - chunk_norm[:, None]) * run.weight[:, None]
        resp[run.rows], log_norm[run.rows] = r, chunk_norm
        # About the E-step's means, as the statistics keep the scatter: (K, m, d).
        centred, conditional = _completed(scored, sigma)
        weighted = centred * r.T[..., None]  # (K, m, d)
        sums += weighted.sum(1) + r.sum(0)[:, None] * means
        scatter += torch.bmm(weighted.mT, centred)
        by_pattern = r.new_zeros((len(run.masks), n_components)).index_add_(
            0, run.pattern, r
        )  # (p, K)
        scatter += torch.einsum("pk,pkde->kde", by_pattern, conditional)
    scatter = _as_type(scatter, covariance_type)
    log_likelihood = (log_norm * row_weight).sum()
    return MixtureStatistics(log_likelihood[None], resp.sum(0)[None], sums[None], scatter[None])


def _as_type(scatter: Tensor, covariance_type: str) -> Tensor:
    """The full scatter (K, d, d) kept as :class:`MixtureStatistics` keeps
    ``covariance_type``'s: summed over the components, its diagonal, or that's mean."""
    if covariance_type == "full":
        return scatter
    if covariance_type == "tied":
        return scatter.sum(0)
    diagonal = torch.diagonal(scatter, dim1=-2, dim2=-1)
    return diagonal if covariance_type == "diag" else diagonal.mean(-1)


def worst_explained(
    runs: list[_Run],
    filled: Tensor,
    points: Tensor,
    params: MixtureParams,
    empty: Tensor,
    covariance_type: str,
) -> Tensor:
    """The rows (1, n, d) the mixture ``params`` explains worst without its ``empty``
    (1, K) components, over their observed features, worst first, as ``filled`` holds
    them (their missing entries at the columns' observed means): where a re-seeded
    component's mean goes. Only ``points`` (n,), the rows of positive weight, qualify."""
    others = MixtureParams(
        params.weights.masked_fill(empty, 0.0), params.means, params.covariances,
        params.precisions_cholesky,
    )
    sigma = full_covariances(others.covariances[0], covariance_type, filled.shape[1])
    sigma = sigma.expand(empty.shape[1], -1, -1)
    log_prob = _log_prob_by_pattern(
        runs, len(filled), others.weights[0], others.means[0], sigma
    )
    log_likelihood = logsumexp(log_prob, 1).masked_fill(~points, math.inf)  # (n,)
    n_worst = min(empty.shape[1], filled.shape[0])
    worst = log_likelihood.topk(n_worst, largest=False).indices
    return filled[worst][None]


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
    iteration_times: list[float]  # seconds from EM's start, per iteration


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
    accelerate: bool = True,
    prior_count: float = 0.0,
) -> MissingEMResult:
    """EM on ``X`` (n, d) with NaN for missing entries, from the given parameters (of
    ``covariance_type``'s shapes), in float64 on ``device``.

    The loop is every fit's (:func:`~transformer_gmm.engine.em.run_em`, by way of
    :func:`~transformer_gmm.engine.sufficient_stats.fit_em_from_statistics`), its rules
    included: the lower bound is the mean observed-data log-likelihood of the E-step,
    convergence is its change below ``tol``, and a component that empties is re-seeded
    at a row the others explain worst. Each iteration's statistics are
    :func:`missing_statistics`. Every row must have an observed feature. The rows are
    read in canonical order, so their own order does not change the fit.

    ``prior_count`` > 0 draws each covariance towards the observed entries' variances
    (divided by K^(2/d)) with that many pseudo-rows
    (:class:`~transformer_gmm.engine.covariance_prior.CovariancePrior`): the M-steps are
    then its mode, and the lower bound includes its log-density.
    """
    # In canonical row order, as every fit reads its rows: the sums then run in one order
    # whatever the rows' own, and so the fit is the same to the bit.
    order = canonical_order(X, sample_weight)
    X = X[order]
    sample_weight = None if sample_weight is None else sample_weight[order]
    dtype = torch.float64
    x = torch.as_tensor(X, dtype=dtype, device=device)
    is_missing = torch.isnan(x)
    x = torch.where(is_missing, 0.0, x)  # the products read the observed entries alone
    # A candidate row for a re-seeded mean: its missing entries at the columns' means.
    column_means = x.sum(0) / (~is_missing).sum(0)
    filled = torch.where(is_missing, column_means, x)
    n_rows = X.shape[0]
    row_weight = (
        torch.ones(n_rows, dtype=dtype, device=device)
        if sample_weight is None
        else torch.as_tensor(sample_weight, dtype=dtype, device=device)
    )
    # What every iteration reads of the rows, gathered once (in place of x, which no
    # iteration reads).
    runs = Patterns.of(X, device).runs(x, len(weights), row_weight)
    points = row_weight > 0
    n_points = int(points.sum())
    unit = float(row_weight.sum()) / n_points  # an average row's weight
    prior = None
    if prior_count > 0:  # pseudo-rows of an average row's weight, as the statistics weigh
        prior = CovariancePrior.of_data(
            x, ~is_missing, row_weight, len(weights), prior_count * unit
        )
    del x
    typed = torch.as_tensor(covariances, dtype=dtype, device=device)[None]
    start = MixtureParams(
        torch.as_tensor(weights, dtype=dtype, device=device)[None],
        torch.as_tensor(means, dtype=dtype, device=device)[None],
        typed,
        compute_precision_cholesky(typed, covariance_type),
    )
    result = fit_em_from_statistics(
        start,
        lambda params: missing_statistics(runs, params, covariance_type, row_weight),
        lambda params, empty: worst_explained(
            runs, filled, points, params, empty, covariance_type
        ),
        n_points,
        covariance_type=covariance_type,
        reg_covar=reg_covar,
        max_iter=max_iter,
        tol=tol,
        unit=unit,
        reads_covariances=True,  # the conditional moments need them
        accelerate=accelerate,
        prior=prior,
    )
    bounds = result.lower_bounds[0]
    return MissingEMResult(
        weights=result.params.weights[0],
        means=result.params.means[0],
        covariances=result.params.covariances[0],
        precisions_cholesky=result.params.precisions_cholesky[0],
        lower_bound=float(result.lower_bound[0]),
        lower_bounds=bounds[~torch.isnan(bounds)].tolist(),
        n_iter=int(result.n_iter[0]),
        converged=bool(result.converged[0]),
        iteration_times=list(result.iteration_times),
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
    log_prob = _log_prob_by_pattern(
        Patterns.of(X, "cpu").runs(x, len(weights)), len(x),
        torch.as_tensor(weights, dtype=dtype), torch.as_tensor(means, dtype=dtype), sigma,
    )
    return log_prob.numpy()
