"""Batched EM for Gaussian mixtures in torch, matching scikit-learn's GaussianMixture.

The loop follows ``BaseMixture.fit_predict`` in ``sklearn/mixture/_base.py``, vectorised
over a batch of B datasets (or B restarts of one dataset). Conventions shared by the
engine's mixture functions:

- ``X`` is (B, N, d), or (1, N, d) broadcast against parameters of batch B. Work happens
  in X's dtype and on X's device.
- ``mask`` (bool, (B or 1, N), optional) is True for real points; padded points take no
  part in sums, means or the log-likelihood.
- Parameter shapes are scikit-learn's with a leading batch dimension: covariances (and
  ``precisions_cholesky``, with scikit-learn's meaning) are full (B, K, d, d), tied
  (B, d, d), diag (B, K, d), spherical (B, K).

The loop's two steps are :mod:`transformer_gmm.engine.e_step` and
:mod:`transformer_gmm.engine.m_step` (with ``MixtureParams`` and the k-means
initialisation); Gaussian densities and precision conversions are in
:mod:`transformer_gmm.engine.gaussian`, k-means in :mod:`transformer_gmm.engine.kmeans`.
Here: the loop, and the re-seeding of components that empty on the way, whose rules
EM by blocks of rows (:mod:`transformer_gmm.engine.sufficient_stats`) shares.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
from torch import Tensor

from . import logspace
from .batching import ShrinkingBatch, compact, take, zero_padding
from .e_step import check_params, e_step_unchecked, estimate_weighted_log_prob
from .gaussian import (
    IllDefinedCovariance,
    all_components_at_once,
    covariances_from_precisions_cholesky,
    try_precision_cholesky,
)
from .m_step import MixtureParams, estimate_parameters_unchecked, pool_covariances

__all__ = [
    "EMPTY_COUNT",
    "GUARD_MARGIN",
    "EMResult",
    "as_tuple",
    "empty_threshold",
    "RowsInMemory",
    "fit_em",
    "log_likelihood_without",
    "reseed_means",
    "reseed_weights_and_covariances",
    "run_em",
    "select_runs",
]


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
    lower_bounds : Tensor of shape (B, T) or None
        The lower bound of each dataset at each iteration (T the most iterations run),
        NaN after it stopped.
    iteration_times : list of float
        Seconds from the start of the loop to the end of each of its T iterations (one
        batched loop serves every dataset).

    Examples
    --------
    >>> import torch
    >>> from transformer_gmm.engine import em, m_step
    >>> X, resp = two_blobs()  # (1, 40, 2) points in two blobs, one-hot (1, 40, 2) labels
    >>> params = m_step.estimate_gaussian_parameters(
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
    lower_bounds: Tensor | None = None  # (B, T) per iteration, NaN after a dataset stopped
    iteration_times: list[float] = field(default_factory=list)  # (T,) seconds, cumulative


# --- empty components ------------------------------------------------------------------

# A component is empty when its weighted count (its total responsibility) is below
# EMPTY_COUNT of an average point's weight, or below GUARD_MARGIN times the M-step's
# 10 eps guard (scikit-learn's), whichever is larger. Its mean is then the ratio of two
# vanishing sums, which that guard pulls toward the origin: near the guard the mean lies
# anywhere, far from the data, and its responsibilities then underflow to zero for good.
# A millionth of a point is far above the guard in float64 (which moves such a mean by
# 2e-9 of its norm) and far below any component that explains data. In float32 the guard
# is 1.2e-6, so there the margin sets the bound: 1.2e-3 of a point, a pull of 1e-3.
EMPTY_COUNT = 1e-6
GUARD_MARGIN = 1e3


def empty_threshold(unit: Tensor | float, dtype: torch.dtype) -> Tensor | float:
    """The weighted count (B|1, 1), or one for all, below which a component is empty."""
    guard = GUARD_MARGIN * 10 * torch.finfo(dtype).eps
    if isinstance(unit, float):
        return max(EMPTY_COUNT * unit, guard)
    return (EMPTY_COUNT * unit).clamp_min(guard)


def _points(mask: Tensor | None, sample_weight: Tensor | None, X: Tensor) -> Tensor:
    """The points that count, (B|1, N) bool: real, and of positive weight when weighted."""
    if sample_weight is not None:
        return sample_weight > 0
    if mask is not None:
        return mask
    return torch.ones(X.shape[:2], dtype=torch.bool, device=X.device)


def _point_weight(points: Tensor, sample_weight: Tensor | None, X: Tensor) -> Tensor | float:
    """The weight of an average point, (B|1, 1); 1.0 when unweighted."""
    if sample_weight is None:
        return 1.0
    return sample_weight.sum(-1, keepdim=True) / points.sum(-1, keepdim=True).to(X.dtype)


def _take_rows(t: Tensor | float, index: Tensor) -> Tensor | float:
    """``take``, which also passes a number shared by every row."""
    return t if isinstance(t, float) else take(t, index)


def log_likelihood_without(
    X: Tensor, params: MixtureParams, empty: Tensor, covariance_type: str
) -> Tensor:
    """log p(x_n) (B, N) under the mixture without its ``empty`` (B, K) components: how
    well the others explain each point, which ranks the points re-seeding takes."""
    others = MixtureParams(
        params.weights.masked_fill(empty, 0.0),  # the empty components explain nothing
        params.means,
        params.covariances,
        params.precisions_cholesky,
    )
    return logspace.logsumexp(estimate_weighted_log_prob(X, others, covariance_type), -1)


def reseed_means(means: Tensor, empty: Tensor, worst: Tensor, n_points: Tensor) -> Tensor:
    """``means`` (B, K, d) with the j-th ``empty`` (B, K) component moved onto ``worst[:, j]``
    (as k-means relocates empty clusters): ``worst`` (B, M, d) are the points the others
    explain worst, worst first, of which only the first ``n_points`` (B|1, 1) are points.
    """
    last = (n_points - 1).clamp(0, worst.shape[1] - 1)  # (B|1, 1)
    rank = torch.minimum((empty.cumsum(1) - 1).clamp_min(0), last)  # (B, K)
    seeds = worst.gather(1, rank[..., None].expand(-1, -1, worst.shape[-1]))  # (B, K, d)
    return torch.where(empty[..., None], seeds, means)


def _reseed_means(
    X: Tensor,
    params: MixtureParams,
    empty: Tensor,
    points: Tensor,
    covariance_type: str,
) -> Tensor:
    """``params.means`` with the j-th ``empty`` component moved onto the j-th point the others
    explain worst; only ``points`` are candidates.
    """
    log_likelihood = log_likelihood_without(X, params, empty, covariance_type)
    log_likelihood = log_likelihood.masked_fill(~points, math.inf)  # (B, N)
    n_worst = min(empty.shape[1], X.shape[1])
    worst = log_likelihood.topk(n_worst, dim=1, largest=False).indices  # (B, n_worst)
    n_batch, n_features = empty.shape[0], X.shape[-1]
    rows = X.expand(n_batch, -1, -1).gather(1, worst[..., None].expand(-1, -1, n_features))
    return reseed_means(params.means, empty, rows, points.sum(-1, keepdim=True))


def reseed_weights_and_covariances(
    params: MixtureParams,
    counts: Tensor,
    empty: Tensor,
    unit: Tensor | float,
    covariance_type: str,
) -> tuple[MixtureParams, Tensor]:
    """Re-seed the ``empty`` (B, K) components but for their means (see
    :func:`reseed_means`): the others' average covariance and one average point's weight
    ``unit``; returns ``(params, failed)``, where ``failed`` (B,) marks covariances that
    are not positive definite.
    """
    covariances = params.covariances
    if covariances is None:
        covariances = covariances_from_precisions_cholesky(
            params.precisions_cholesky, covariance_type
        )
    covariances = pool_covariances(covariances, counts, empty, covariance_type)
    precisions_chol, failed = try_precision_cholesky(covariances, covariance_type)
    counts = torch.where(empty, unit, counts)
    weights = counts / counts.sum(-1, keepdim=True)
    rows = empty.any(-1)  # (B,)
    # Selected by dataset, so that the others keep every bit of their parameters.
    reseeded = select_runs(
        rows, MixtureParams(weights, params.means, covariances, precisions_chol), params
    )
    return reseeded, failed & rows


def _reseed(
    X: Tensor,
    params: MixtureParams,
    counts: Tensor,
    empty: Tensor,
    unit: Tensor | float,
    points: Tensor,
    covariance_type: str,
) -> tuple[MixtureParams, Tensor]:
    """Re-seed the ``empty`` (B, K) components: the others' average covariance, one average
    point's weight, a mean at a badly explained point; returns ``(params, failed)``, where
    ``failed`` (B,) marks covariances that are not positive definite.
    """
    reseeded, failed = reseed_weights_and_covariances(params, counts, empty, unit, covariance_type)
    reseeded.means = _reseed_means(X, reseeded, empty, points, covariance_type)
    return reseeded, failed


# --- EM --------------------------------------------------------------------------------


def select_runs(active: Tensor, new: MixtureParams, old: MixtureParams) -> MixtureParams:
    """Take ``new`` for the active datasets and keep ``old`` for the others."""

    def pick(a: Tensor, b: Tensor | None) -> Tensor:
        if b is None:  # no initial covariances: every dataset is active on iteration 1
            return a
        return torch.where(active.view(-1, *[1] * (a.dim() - 1)), a, b)

    return MixtureParams(*map(pick, as_tuple(new), as_tuple(old)))


def as_tuple(params: MixtureParams) -> tuple:
    """The four fields of ``params``, in order (``dataclasses.astuple`` would deep-copy the
    tensors)."""
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
    sample_weight: Tensor | None = None,
    initial_lower_bound: Tensor | None = None,
    consume_start: bool = False,
) -> EMResult:
    """EM from ``params`` on each dataset of the batch, as scikit-learn's ``fit_predict`` loop.

    Per dataset: ``lower_bound = -inf`` (or ``initial_lower_bound``, as scikit-learn's
    warm start keeps the previous fit's); each iteration runs an E-step (giving
    ``log_prob_norm``) and an M-step (weights renormalised to sum to 1), and the dataset
    converges once ``|log_prob_norm - lower_bound| < tol``. Converged datasets stop
    changing while the others go on, until all converged or ``max_iter``; once a quarter
    of the batch has converged, the others go on in a smaller batch, so the work follows
    the datasets still running rather than the whole batch.

    Unlike scikit-learn, a component that empties (its weighted count below
    ``EMPTY_COUNT`` of an average point's) is re-seeded, as k-means relocates an empty
    cluster: its mean moves onto a point the others explain worst, it takes their average
    covariance and one point's weight, and EM goes on; neither that iteration nor the
    next counts towards convergence. Where no component empties, the iterations are
    scikit-learn's.

    Parameters
    ----------
    X : Tensor of shape (B, N, d), or (1, N, d) for B restarts on one dataset
    params : MixtureParams
        The start; its ``covariances`` may be None (precisions_cholesky is what is used).
    covariance_type, reg_covar, max_iter, tol : as scikit-learn's GaussianMixture
    mask : bool Tensor of shape (B, N) or (1, N), optional
    sample_weight : Tensor of shape (B, N) or (1, N), optional
        Non-negative weights of the points, zero on padding: they multiply the
        responsibilities in the M-step's sums, and the lower bound is the weighted mean
        log-likelihood, so integer weights fit as repeated rows do.
    initial_lower_bound : Tensor of shape (B,) or (1,), optional
        What the first iteration's lower bound is compared with; -inf by default.
    consume_start : bool, default=False
        Empty ``params`` (its fields set to None) once the first step has read it, so that
        its tensors are freed where the caller holds nothing else of them: on wide data a
        start's factors are K d^2 that would otherwise stay for the whole loop.

    Returns
    -------
    EMResult
        With ``max_iter=0``: the given params (their empty components re-seeded),
        ``n_iter`` 0, not converged, and the mean log-likelihood of those params as
        ``lower_bound``. ValueError if a dataset still
        iterating gets a covariance that is not positive definite.

    Examples
    --------
    >>> import torch
    >>> from transformer_gmm.engine import em, m_step
    >>> X, _ = two_blobs()  # one dataset (B=1) of 40 points in two blobs
    >>> init = m_step.initialize_kmeans(X, 2, covariance_type="full", reg_covar=1e-6,
    ...                                  generator=torch.Generator().manual_seed(0))
    >>> result = em.fit_em(X, init, covariance_type="full", reg_covar=1e-6,
    ...                    max_iter=100, tol=1e-3)
    >>> result.converged.tolist(), result.params.covariances.shape
    ([True], torch.Size([1, 2, 2, 2]))
    >>> sorted(result.params.means[0, :, 0].round().tolist())
    [-4.0, 4.0]
    """
    n_batch = check_params(X, params, covariance_type, mask, sample_weight)
    rows = RowsInMemory(X, mask, sample_weight, covariance_type, reg_covar)
    return run_em(rows, params, n_batch, max_iter=max_iter, tol=tol,
                  initial_lower_bound=initial_lower_bound, consume_start=consume_start)


class RowsInMemory:
    """The rows EM reads when they are held in memory: ``X`` (B|1, N, d) with its ``mask``
    and ``sample_weight``, as :func:`fit_em` takes them; one E-step and one M-step over
    every row at a time (:meth:`step`)."""

    reads_covariances = False  # the E-step reads the precisions

    def __init__(self, X: Tensor, mask, sample_weight, covariance_type: str, reg_covar: float):
        X, mask, sample_weight = compact(X), compact(mask), compact(sample_weight)
        self.X, self.mask, self.sample_weight = zero_padding(X, mask), mask, sample_weight
        self.covariance_type, self.reg_covar = covariance_type, reg_covar
        self.points = _points(mask, sample_weight, self.X)  # (B|1, N)
        self.unit = _point_weight(self.points, sample_weight, self.X)  # (B|1, 1) or 1.0
        self.empty_below = empty_threshold(self.unit, X.dtype)  # see EMPTY_COUNT
        # The rows' squares, once for every step that reads them (two an iteration).
        self.x_squared = self.X.square() if covariance_type in ("diag", "spherical") else None

    @property
    def dtype(self) -> torch.dtype:
        return self.X.dtype

    def counts(self, params: MixtureParams) -> Tensor:
        """The weighted count (B, K) each component's weight stands for."""
        return params.weights * self.points.sum(-1, keepdim=True).to(self.X.dtype) * self.unit

    def lower_bound(self, params: MixtureParams) -> Tensor:
        """The mean log-likelihood per point of ``params``, (B|1,)."""
        weighted = () if self.sample_weight is None else (self.sample_weight,)
        return e_step_unchecked(self.X, params, self.covariance_type, self.mask, *weighted)[0]

    def step(self, params: MixtureParams) -> tuple[Tensor, Tensor, MixtureParams, Tensor]:
        """One E-step and one M-step from ``params``: the E-step's mean log-likelihood (B,),
        the components' weighted counts (B, K), the new parameters, and which runs' new
        covariances are not positive definite (B,)."""
        X, covariance_type = self.X, self.covariance_type
        weighted = () if self.sample_weight is None else (self.sample_weight,)
        at_once = all_components_at_once(X, params.means)
        log_prob_norm, log_resp = e_step_unchecked(
            X, params, covariance_type, self.mask, *weighted, at_once=at_once,
            x_squared=self.x_squared,
        )
        # In place where nothing tracks gradients: the log-responsibilities are not read
        # again, and a second (B, N, K) array would be EM's largest on many rows.
        resp = logspace.responsibilities(log_resp)
        if self.sample_weight is not None:
            resp = resp * self.sample_weight[..., None]
        nk, means, covariances = estimate_parameters_unchecked(
            X, resp, covariance_type, self.reg_covar, None, self.x_squared
        )
        precisions_chol, failed = try_precision_cholesky(covariances, covariance_type)
        # scikit-learn's _m_step normalises by sum(nk) here, not by the number of points.
        new = MixtureParams(nk / nk.sum(-1, keepdim=True), means, covariances, precisions_chol)
        return log_prob_norm, nk, new, failed

    def reseed(self, params: MixtureParams, counts: Tensor, empty: Tensor):
        """:func:`_reseed` of the ``empty`` (B, K) components; ``(params, failed)``."""
        return _reseed(
            self.X, params, counts, empty, self.unit, self.points, self.covariance_type
        )

    def take(self, keep: Tensor) -> RowsInMemory:
        """The rows of the runs ``keep`` alone (rows shared by every run stay shared)."""
        taken = object.__new__(RowsInMemory)
        taken.__dict__.update(self.__dict__)
        for name in ("X", "mask", "sample_weight", "x_squared"):
            setattr(taken, name, take(getattr(self, name), keep))
        for name in ("points", "unit", "empty_below"):
            setattr(taken, name, _take_rows(getattr(self, name), keep))
        return taken


def run_em(
    rows,
    params: MixtureParams,
    n_batch: int,
    *,
    max_iter: int,
    tol: float,
    initial_lower_bound: Tensor | None = None,
    consume_start: bool = False,
) -> EMResult:
    """The EM loop of every fit: :func:`fit_em`'s rules on data seen through ``rows``, which
    holds them in memory (:class:`RowsInMemory`) or reads them by blocks
    (:func:`~transformer_gmm.engine.sufficient_stats.fit_em_from_statistics`).

    ``rows`` offers ``step(params)`` (an E-step and an M-step: the mean log-likelihood,
    the weighted counts, the new parameters, the runs whose covariances failed),
    ``reseed(params, counts, empty)``, ``counts(params)`` and ``lower_bound(params)`` (for
    ``max_iter=0``), ``take(keep)`` (the runs still going), ``empty_below`` (the count below
    which a component is empty), ``dtype`` and ``reads_covariances`` (whether ``step``
    reads the covariances, which the loop otherwise frees before each step). ``params``
    are of batch 1 or ``n_batch``; ``consume_start`` as :func:`fit_em`'s.
    """
    start = params
    params = MixtureParams(  # parameters of batch 1 serve every dataset
        *(None if t is None else t.expand(n_batch, *t.shape[1:]) for t in as_tuple(params))
    )
    device = params.means.device
    n_iter = torch.zeros(n_batch, dtype=torch.long, device=device)
    converged = torch.zeros(n_batch, dtype=torch.bool, device=device)
    if max_iter == 0:
        # A start may hold an empty component too (a k-means cluster left empty): it is
        # re-seeded as EM would, so that no fit returns one.
        counts = rows.counts(params)  # (B, K)
        empty = counts < rows.empty_below
        if bool(empty.any()):
            params, failed = rows.reseed(params, counts, empty)
            if bool(failed.any()):
                raise IllDefinedCovariance(rows.dtype)
        return EMResult(
            params,
            rows.lower_bound(params).expand(n_batch).clone(),
            n_iter,
            converged,
            lower_bounds=params.means.new_empty((n_batch, 0)),
        )

    if initial_lower_bound is None:
        lower_bound = params.means.new_full((n_batch,), -math.inf)
    else:
        lower_bound = initial_lower_bound.to(params.means).expand(n_batch).clone()
    batch = ShrinkingBatch(n_batch, device)
    fresh = torch.zeros(n_batch, dtype=torch.bool, device=device)  # re-seeded last iteration
    history, times, started = [], [], time.perf_counter()  # lower bounds, (B,) an iteration
    all_active = True  # known on the host: no run of the working batch has converged
    for iteration in range(1, max_iter + 1):
        active = ~converged  # (A,) over the working batch of A <= B datasets
        if all_active and not rows.reads_covariances:
            # The step reads the precisions alone, and replaces every run's covariances:
            # the old ones are freed before the new are made (on wide data each is d^2).
            params = MixtureParams(params.weights, params.means, None, params.precisions_cholesky)
        log_prob_norm, nk, new, failed = rows.step(params)
        params = new if all_active else select_runs(active, new, params)
        # The previous step's parameters (wide covariances among them) are not held here.
        del new
        if consume_start and start is not None:
            start.weights = start.means = start.covariances = start.precisions_cholesky = None
            start = None
        empty = nk < rows.empty_below  # (A, K)
        reseeded = empty.any(-1) & active  # (A,) re-seeded below
        change = log_prob_norm - lower_bound  # +inf on the first iteration
        lower_bound = torch.where(active, log_prob_norm, lower_bound)
        n_iter = n_iter.masked_fill(active, iteration)
        # A re-seed changes the mixture, not the fit's progress: no convergence on the
        # iteration that re-seeds, nor on the next, whose change would compare two
        # different mixtures' bounds.
        steady = ~(reseeded | fresh)
        converged = converged | (active & steady & (change.abs() < tol))
        fresh = reseeded
        iteration_bounds = lower_bound.new_full((n_batch,), math.nan)  # every dataset's
        active_bounds = torch.where(active, log_prob_norm, math.nan)
        history.append(iteration_bounds.index_copy_(0, batch.rows, active_bounds))
        # One host sync per iteration for the three checks. Datasets that already
        # converged may fail harmlessly: scikit-learn would not have run this M-step for
        # them; nor do the re-seeded ones, whose empty components get new covariances.
        any_failed, any_empty, n_running = torch.stack(
            [(failed & active & ~reseeded).any(), reseeded.any(), (~converged).sum()]
        ).tolist()
        times.append(time.perf_counter() - started)
        if any_empty:
            params, failed = rows.reseed(params, nk, empty & reseeded[:, None])
            any_failed = any_failed or bool(failed.any())
        if any_failed:
            raise IllDefinedCovariance(rows.dtype)
        if n_running == 0:
            break
        all_active = n_running == len(batch.rows)
        if iteration < max_iter and batch.should_shrink(n_running):
            state = (*as_tuple(params), lower_bound, n_iter, converged)
            keep = batch.shrink(converged, n_running, state)
            rows = rows.take(keep)
            params = MixtureParams(*(take(t, keep) for t in as_tuple(params)))
            lower_bound, n_iter, converged = lower_bound[keep], n_iter[keep], converged[keep]
            fresh = fresh[keep]
            all_active = True
    *fitted, lower_bound, n_iter, converged = batch.results(
        (*as_tuple(params), lower_bound, n_iter, converged)
    )
    return EMResult(
        MixtureParams(*fitted),
        lower_bound,
        n_iter,
        converged,
        lower_bounds=torch.stack(history, dim=1),
        iteration_times=times,
    )
