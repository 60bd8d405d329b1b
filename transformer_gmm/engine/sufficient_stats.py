"""EM and Lloyd from sums over blocks of rows, batched, in torch.

An EM iteration needs the data only through per-component sums over rows (and a Lloyd
iteration through counts and sums), so data in blocks (a Dask array's chunks, or rows in
memory too many for EM's arrays over all of them: :mod:`transformer_gmm.engine.blocks`) is
fitted by computing each block's statistics where it lives and updating from the totals;
rows with missing entries offer their expected statistics
(:func:`transformer_gmm.engine.missing.missing_statistics`). The statistics come from the
in-memory kernels, and the loops are the in-memory fit's
(:func:`~transformer_gmm.engine.em.run_em`, :func:`~transformer_gmm.engine.kmeans.run_lloyd`)
reading the data through :class:`RowsByStatistics` and :class:`LloydRowsByStatistics`, so
from the same start they reach the in-memory fit to rounding. ``statistics_of`` maps the
parameters of the loop's working batch to their statistics summed over every block.

A component or a cluster that empties follows the in-memory rule too: it takes one of the
few rows its mixture explains worst (:func:`~transformer_gmm.engine.em.fit_em`) or that lie
farthest from their centre (:func:`~transformer_gmm.engine.kmeans.lloyd`). Each block
offers its own few, scored (:func:`worst_explained`, :func:`farthest`), and
:func:`top_rows` keeps the best of all the blocks' offers: the top n of a union of rows is
the top n of the parts' top n, so the rows chosen are those the in-memory fit chooses
(ties aside).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

import torch
from torch import Tensor

from .covariance_prior import CovariancePrior
from .e_step import e_step_unchecked
from .em import (
    EMResult,
    as_tuple,
    empty_threshold,
    log_likelihood_without,
    reseed_means,
    reseed_weights_and_covariances,
    run_em,
)
from .gaussian import PARAM_SHAPES, lookup, try_precision_cholesky
from .kmeans import (
    assign,
    centers_from_sums,
    first_minimum,
    inertia_of,
    nearest_one_hot,
    nearest_scores,
    relocate_empty,
    run_lloyd,
)
from .logspace import responsibilities
from .m_step import COVARIANCE_ESTIMATORS, MixtureParams
from .squarem import Accelerated

__all__ = [
    "LloydRowsByStatistics",
    "LloydStatistics",
    "MixtureStatistics",
    "RowsByStatistics",
    "farthest",
    "fit_em_from_statistics",
    "lloyd_from_statistics",
    "lloyd_statistics",
    "mixture_statistics",
    "parameters_from_statistics",
    "top_rows",
    "worst_explained",
]


class _Summable:
    """Statistics of disjoint blocks add up field by field; a flat vector carries them."""

    def __add__(self, other):
        return type(self)(*(a + b for a, b in zip(self._fields(), other._fields(), strict=True)))

    def _fields(self) -> tuple[Tensor, ...]:
        return tuple(getattr(self, f.name) for f in fields(self))

    def to_vector(self) -> Tensor:
        """Every field, flattened and concatenated: what travels from a block."""
        return torch.cat([t.reshape(-1) for t in self._fields()])

    @classmethod
    def _from_vector(cls, vector: Tensor, shapes: list[tuple[int, ...]]):
        sizes = [torch.Size(shape).numel() for shape in shapes]
        parts = torch.split(vector, sizes)
        return cls(*(part.reshape(shape) for part, shape in zip(parts, shapes, strict=True)))


def top_rows(scored: Tensor, n: int, *, largest: bool) -> Tensor:
    """The ``n`` of B runs' scored rows (B, M, w), the score in column 0, with the highest
    (``largest``) or lowest scores, best first: (B, n, w). Fewer than ``n`` rows are made
    up with rows that rank last (zeros, of score -inf when ``largest``, else +inf), so that
    a block with fewer rows offers ``n`` too.

    Examples
    --------
    The best two of two blocks' best two are the best two of all the rows:

    >>> import torch
    >>> from transformer_gmm.engine import sufficient_stats
    >>> scored = torch.tensor([[[3.0, 30.0], [1.0, 10.0], [4.0, 40.0], [2.0, 20.0]]])
    >>> parts = [sufficient_stats.top_rows(part, 2, largest=True) for part in scored.split(2, 1)]
    >>> sufficient_stats.top_rows(torch.cat(parts, 1), 2, largest=True).tolist()
    [[[4.0, 40.0], [3.0, 30.0]]]
    """
    missing = n - scored.shape[1]
    if missing > 0:
        filler = scored.new_zeros(scored.shape[0], missing, scored.shape[2])
        filler[..., 0] = -torch.inf if largest else torch.inf
        scored = torch.cat([scored, filler], 1)
    order = scored[..., 0].topk(n, dim=1, largest=largest).indices  # (B, n)
    return scored.gather(1, order[..., None].expand(-1, -1, scored.shape[-1]))


# --- Gaussian mixtures -----------------------------------------------------------------


@dataclass
class MixtureStatistics(_Summable):
    """What an EM iteration needs of some rows, for B runs.

    Attributes
    ----------
    log_likelihood : Tensor of shape (B,)
        Sum over the rows of ``log p(x_n)``.
    nk : Tensor of shape (B, K)
        Sum of the responsibilities.
    sums : Tensor of shape (B, K, d)
        ``sum_n r_nk x_n``.
    scatter : Tensor
        ``sum_n r_nk (x_n - c_k)(x_n - c_k)^T`` about the means ``c_k`` of the E-step,
        kept as the covariance type keeps covariances: full (B, K, d, d), tied (B, d, d)
        (summed over k), diag (B, K, d) (the diagonal), spherical (B, K) (its mean).
        About the current means rather than the origin, so that the M-step subtracts
        small numbers from large ones only when the means moved far.
    """

    log_likelihood: Tensor
    nk: Tensor
    sums: Tensor
    scatter: Tensor

    @classmethod
    def from_vector(
        cls, vector: Tensor, n_runs: int, n_components: int, n_features: int, covariance_type: str
    ) -> MixtureStatistics:
        """Undo :meth:`to_vector`."""
        return cls._from_vector(
            vector, _mixture_shapes(n_runs, n_components, n_features, covariance_type)
        )


def _mixture_shapes(n_runs: int, k: int, d: int, covariance_type: str) -> list[tuple[int, ...]]:
    scatter = lookup(PARAM_SHAPES, covariance_type)(k, d)
    return [(n_runs,), (n_runs, k), (n_runs, k, d), (n_runs, *scatter)]


def mixture_statistics_size(
    n_runs: int, n_components: int, n_features: int, covariance_type: str
) -> int:
    """Length of :meth:`MixtureStatistics.to_vector` for these sizes."""
    shapes = _mixture_shapes(n_runs, n_components, n_features, covariance_type)
    return sum(torch.Size(shape).numel() for shape in shapes)


# The in-memory covariance estimators divide the scatter by nk (tied: by its sum); the
# statistics multiply that back, and the M-step divides again.
SCATTER_SCALE = {
    "full": lambda nk: nk[..., None, None],
    "tied": lambda nk: nk.sum(-1)[:, None, None],
    "diag": lambda nk: nk[..., None],
    "spherical": lambda nk: nk,
}


def _outer(a: Tensor, b: Tensor) -> Tensor:
    return a[..., :, None] * b[..., None, :]


def _correction_full(centred_sums: Tensor, shift: Tensor, nk: Tensor) -> Tensor:
    # sum_n r (x - m)(x - m)^T = sum_n r (x - c)(x - c)^T - s e^T - e s^T + nk e e^T, with
    # e = m - c and s = sum_n r (x - c); exact whatever the means m are.
    return (
        _outer(centred_sums, shift)
        + _outer(shift, centred_sums)
        - nk[..., None, None] * _outer(shift, shift)
    )


def _correction_diag(centred_sums: Tensor, shift: Tensor, nk: Tensor) -> Tensor:
    return 2.0 * centred_sums * shift - nk[..., None] * shift.square()


_CORRECTIONS = {
    "full": _correction_full,
    "tied": lambda *args: _correction_full(*args).sum(1),
    "diag": _correction_diag,
    "spherical": lambda *args: _correction_diag(*args).mean(-1),
}


def mixture_statistics(
    X: Tensor, params: MixtureParams, covariance_type: str, sample_weight: Tensor | None = None
) -> MixtureStatistics:
    """The E-step on rows ``X`` and the sums the M-step needs, for each run of ``params``.

    Parameters
    ----------
    X : Tensor of shape (1, n, d) or (B, n, d)
        Rows, all real.
    params : MixtureParams
        B runs' current parameters (``covariances`` is not used).
    covariance_type : {"full", "tied", "diag", "spherical"}
    sample_weight : Tensor of shape (1, n) or (B, n), optional
        Non-negative weights of the rows: they multiply the responsibilities and the
        log-likelihoods in the sums, as in :func:`~transformer_gmm.engine.em.fit_em`.

    Returns
    -------
    MixtureStatistics
        Of B runs, the scatter about ``params.means``.

    Examples
    --------
    Statistics of two halves add up to those of the whole:

    >>> import torch
    >>> from transformer_gmm.engine import m_step, sufficient_stats
    >>> X = torch.randn(1, 40, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    >>> resp = torch.rand(1, 40, 3, dtype=torch.float64, generator=torch.Generator())
    >>> params = m_step.estimate_gaussian_parameters(
    ...     X, resp / resp.sum(-1, keepdim=True), covariance_type="full", reg_covar=1e-6)
    >>> whole = sufficient_stats.mixture_statistics(X, params, "full")
    >>> halves = [sufficient_stats.mixture_statistics(x, params, "full") for x in X.split(20, 1)]
    >>> torch.allclose((halves[0] + halves[1]).to_vector(), whole.to_vector())
    True
    """
    log_prob_norm, log_resp = e_step_unchecked(X, params, covariance_type, None, sample_weight)
    resp = responsibilities(log_resp)  # (B, n, K)
    total = X.shape[1]  # the weight of the rows, by which the mean log-likelihood multiplies
    if sample_weight is not None:
        resp = resp * sample_weight[..., None]
        total = sample_weight.sum(-1)
    nk = resp.sum(1)  # (B, K)
    # The in-memory M-step's 10 eps: a component no row of this block reaches divides 0 by
    # it, not by zero, and the scale below multiplies it back.
    nk_safe = nk + 10 * torch.finfo(resp.dtype).eps
    estimator = lookup(COVARIANCE_ESTIMATORS, covariance_type)
    scatter = estimator(resp, X, nk_safe, params.means, 0.0) * SCATTER_SCALE[covariance_type](
        nk_safe
    )
    return MixtureStatistics(log_prob_norm * total, nk, resp.mT @ X, scatter)


def parameters_from_statistics(
    statistics: MixtureStatistics,
    centres: Tensor,
    covariance_type: str,
    reg_covar: float,
    prior: CovariancePrior | None = None,
) -> tuple[MixtureParams, Tensor]:
    """The M-step from statistics summed over every row, as
    :func:`~transformer_gmm.engine.em.fit_em`'s.

    Parameters
    ----------
    statistics : MixtureStatistics
        Of B runs, summed over all the rows.
    centres : Tensor of shape (B, K, d)
        The means the scatter is about (those of the E-step).
    covariance_type : {"full", "tied", "diag", "spherical"}
    reg_covar : float
        Added to the diagonal of the covariances.
    prior : CovariancePrior or None, default=None
        Where given, the covariances are its mode given the rows (a maximum a
        posteriori M-step; :mod:`~transformer_gmm.engine.covariance_prior`).

    Returns
    -------
    params : MixtureParams
        Weights ``nk / sum(nk)``, the weighted means, covariances and their
        precisions_cholesky.
    failed : bool Tensor of shape (B,)
        The runs whose covariances are not positive definite.

    Examples
    --------
    One M-step from the statistics of two blocks equals the in-memory M-step:

    >>> import torch
    >>> from transformer_gmm.engine import e_step, m_step, sufficient_stats
    >>> X = torch.randn(1, 40, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    >>> resp = torch.rand(1, 40, 3, dtype=torch.float64, generator=torch.Generator())
    >>> start = m_step.estimate_gaussian_parameters(
    ...     X, resp / resp.sum(-1, keepdim=True), covariance_type="diag", reg_covar=1e-6)
    >>> halves = [sufficient_stats.mixture_statistics(x, start, "diag") for x in X.split(20, 1)]
    >>> params, failed = sufficient_stats.parameters_from_statistics(
    ...     halves[0] + halves[1], start.means, "diag", 1e-6)
    >>> _, log_resp = e_step.e_step(X, start, "diag")
    >>> expected = m_step.estimate_gaussian_parameters(
    ...     X, log_resp.exp(), covariance_type="diag", reg_covar=1e-6)
    >>> torch.allclose(params.covariances, expected.covariances), failed.tolist()
    (True, [False])
    """
    nk = statistics.nk + 10 * torch.finfo(statistics.nk.dtype).eps  # as the in-memory M-step
    means = statistics.sums / nk[..., None]  # (B, K, d)
    centred_sums = statistics.sums - statistics.nk[..., None] * centres  # sum_n r (x - c)
    correction = _CORRECTIONS[covariance_type](centred_sums, means - centres, statistics.nk)
    scatter = statistics.scatter - correction
    scale = SCATTER_SCALE[covariance_type](nk)
    if prior is not None:
        scatter = scatter + prior.pseudo_scatter(covariance_type)
        scale = scale + prior.count
    covariances = scatter / scale
    if covariance_type in ("full", "tied"):
        eye = torch.eye(means.shape[-1], dtype=means.dtype, device=means.device)
        covariances = covariances + reg_covar * eye
    else:
        covariances = covariances + reg_covar
    precisions_cholesky, failed = try_precision_cholesky(covariances, covariance_type)
    weights = nk / nk.sum(-1, keepdim=True)
    return MixtureParams(weights, means, covariances, precisions_cholesky), failed


def _take_runs(params: MixtureParams, index: Tensor) -> MixtureParams:
    return MixtureParams(*(None if t is None else t[index] for t in as_tuple(params)))


def worst_explained(
    X: Tensor, params: MixtureParams, empty: Tensor, covariance_type: str, n: int
) -> Tensor:
    """Of rows ``X`` (1, m, d), the ``n`` that each run of ``params`` explains worst without
    its ``empty`` (B, K) components, worst first: (B, n, 1 + d), each row's log-likelihood
    under the others, then the row; past ``m`` rows, rows of log-likelihood +inf.

    What a block offers to the re-seeding of empty components (see :func:`top_rows`).
    """
    log_likelihood = log_likelihood_without(X, params, empty, covariance_type)  # (B, m)
    rows = X.expand(log_likelihood.shape[0], -1, -1)
    scored = torch.cat([log_likelihood[..., None], rows], -1)
    return top_rows(scored, n, largest=False)


def _reseed(
    params: MixtureParams,
    counts: Tensor,
    empty: Tensor,
    worst_explained_of: Callable[[MixtureParams, Tensor], Tensor],
    n_rows: int,
    covariance_type: str,
    unit: float = 1.0,
) -> tuple[MixtureParams, Tensor]:
    """:func:`~transformer_gmm.engine.em.fit_em`'s re-seeding of the ``empty`` (B, K)
    components, with the rows explained worst read through ``worst_explained_of``;
    returns ``(params, failed)``."""
    reseeded, failed = reseed_weights_and_covariances(
        params, counts, empty, unit, covariance_type
    )
    runs = empty.any(-1).nonzero().flatten()  # only these read the rows again
    worst = worst_explained_of(_take_runs(reseeded, runs), empty[runs])
    n_points = torch.full((1, 1), n_rows, device=counts.device)
    means = reseed_means(reseeded.means[runs], empty[runs], worst, n_points)
    reseeded.means = reseeded.means.index_copy(0, runs, means)
    return reseeded, failed


def fit_em_from_statistics(
    params: MixtureParams,
    statistics_of: Callable[[MixtureParams], MixtureStatistics],
    worst_explained_of: Callable[[MixtureParams, Tensor], Tensor],
    n_rows: int,
    *,
    covariance_type: str,
    reg_covar: float,
    max_iter: int,
    tol: float,
    unit: float = 1.0,
    reads_covariances: bool = False,
    accelerate: bool = False,
    prior: CovariancePrior | None = None,
) -> EMResult:
    """EM from ``params`` with :func:`~transformer_gmm.engine.em.fit_em`'s rules, on data seen
    through ``statistics_of`` and ``worst_explained_of`` only.

    The loop is :func:`~transformer_gmm.engine.em.run_em`, the in-memory fit's. Each
    iteration asks ``statistics_of`` once, for the runs of its working batch (those still
    going, and those stopped since the batch last shrank): their statistics summed over
    the ``n_rows`` rows (one pass over the data). A run's lower
    bound is the mean log-likelihood of its E-step; it converges once that changes by less
    than ``tol``, and then stops changing. A component that empties is re-seeded as in
    memory, which takes one more pass, through ``worst_explained_of``; neither that
    iteration nor the next counts towards convergence. ``max_iter=0`` asks
    ``statistics_of`` once, for the lower bound of ``params`` (their empty components
    re-seeded).

    Parameters
    ----------
    params : MixtureParams
        B runs' starts.
    statistics_of : callable
        ``statistics_of(params)`` returns the summed :class:`MixtureStatistics` of the
        runs of ``params``, for the scatter about ``params.means``.
    worst_explained_of : callable
        ``worst_explained_of(params, empty)`` returns, for each run of ``params``, the
        ``min(K, n_rows)`` rows it explains worst without its ``empty`` (R, K)
        components, worst first, (R, min(K, n_rows), d): :func:`top_rows` of every
        block's :func:`worst_explained`, without the scores.
    n_rows : int
        The number of rows the statistics sum over.
    covariance_type, reg_covar, max_iter, tol : as in :func:`~transformer_gmm.engine.em.fit_em`
    unit : float, default=1.0
        An average row's weight, where the statistics weigh the rows (their total weight
        is ``n_rows * unit``): a component is empty below a millionth of it, and a
        re-seeded one starts with it.
    reads_covariances : bool, default=False
        Whether ``statistics_of`` reads the runs' covariances (rows with missing entries
        do); otherwise the loop frees them before each pass.
    accelerate : bool, default=False
        Extrapolate every third pass (:mod:`~transformer_gmm.engine.squarem`), where EM
        converges slowly (many entries missing); it needs ``reads_covariances``.
    prior : CovariancePrior or None, default=None
        A prior on the covariances: each M-step takes its mode, and the lower bound adds
        its log-density per unit of weight, so that the bound EM climbs is still the
        objective the M-step maximizes.

    Returns
    -------
    EMResult
        ValueError if a run still going gets a covariance that is not positive definite.

    Examples
    --------
    The same fit as :func:`~transformer_gmm.engine.em.fit_em`, from four blocks of rows:

    >>> import torch
    >>> from transformer_gmm.engine import em, m_step, sufficient_stats
    >>> X = torch.randn(1, 200, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    >>> X[0, :100] += 4.0
    >>> start = m_step.initialize_kmeans(X, 2, covariance_type="tied", reg_covar=1e-6,
    ...                                  generator=torch.Generator().manual_seed(0))
    >>> blocks = X.split(50, 1)
    >>> def statistics_of(params):
    ...     parts = [sufficient_stats.mixture_statistics(x, params, "tied") for x in blocks]
    ...     return sum(parts[1:], parts[0])
    >>> def worst_explained_of(params, empty):
    ...     parts = [sufficient_stats.worst_explained(x, params, empty, "tied", 2)
    ...              for x in blocks]
    ...     return sufficient_stats.top_rows(torch.cat(parts, 1), 2, largest=False)[..., 1:]
    >>> by_blocks = sufficient_stats.fit_em_from_statistics(
    ...     start, statistics_of, worst_explained_of, 200, covariance_type="tied",
    ...     reg_covar=1e-6, max_iter=100, tol=1e-3)
    >>> in_memory = em.fit_em(X, start, covariance_type="tied", reg_covar=1e-6,
    ...                       max_iter=100, tol=1e-3)
    >>> torch.allclose(by_blocks.params.means, in_memory.params.means)
    True
    >>> by_blocks.n_iter.tolist() == in_memory.n_iter.tolist()
    True
    """
    rows = RowsByStatistics(
        statistics_of, worst_explained_of, n_rows, covariance_type, reg_covar,
        params.means.dtype, unit, reads_covariances, prior,
    )
    if accelerate:
        if not reads_covariances:  # the loop would free the covariances it extrapolates
            raise ValueError("accelerate=True needs reads_covariances=True.")
        rows = Accelerated(rows, covariance_type)
    return run_em(rows, params, params.means.shape[0], max_iter=max_iter, tol=tol)


class RowsByStatistics:
    """The rows EM reads by blocks, seen through their summed statistics alone (see
    :func:`fit_em_from_statistics`): :func:`~transformer_gmm.engine.em.run_em`'s data, as
    :class:`~transformer_gmm.engine.em.RowsInMemory` is for rows in memory."""

    def __init__(
        self,
        statistics_of: Callable[[MixtureParams], MixtureStatistics],
        worst_explained_of: Callable[[MixtureParams, Tensor], Tensor],
        n_rows: int,
        covariance_type: str,
        reg_covar: float,
        dtype: torch.dtype,
        unit: float = 1.0,
        reads_covariances: bool = False,
        prior: CovariancePrior | None = None,
    ):
        self.statistics_of, self.worst_explained_of = statistics_of, worst_explained_of
        self.n_rows, self.covariance_type, self.reg_covar = n_rows, covariance_type, reg_covar
        self.dtype, self.unit, self.reads_covariances = dtype, unit, reads_covariances
        self.prior = prior
        self.total = n_rows * unit  # the rows' weight
        self.empty_below = empty_threshold(unit, dtype)

    def counts(self, params: MixtureParams) -> Tensor:
        return params.weights * self.total

    def lower_bound(self, params: MixtureParams) -> Tensor:
        return self._bound(self.statistics_of(params), params)

    def step(self, params: MixtureParams) -> tuple[Tensor, Tensor, MixtureParams, Tensor]:
        """One pass over the blocks: an E-step and the M-step from its statistics."""
        statistics = self.statistics_of(params)
        new, failed = parameters_from_statistics(
            statistics, params.means, self.covariance_type, self.reg_covar, self.prior
        )
        counts = statistics.nk + 10 * torch.finfo(self.dtype).eps  # the M-step's, as in memory
        return self._bound(statistics, params), counts, new, failed

    def _bound(self, statistics: MixtureStatistics, params: MixtureParams) -> Tensor:
        """The mean log-likelihood of ``params``, plus their prior's log-density per unit
        of weight where there is a prior."""
        log_likelihood = statistics.log_likelihood
        if self.prior is not None:
            log_likelihood = log_likelihood + self.prior.log_density(
                params.precisions_cholesky, self.covariance_type
            )
        return log_likelihood / self.total

    def reseed(self, params: MixtureParams, counts: Tensor, empty: Tensor):
        return _reseed(
            params, counts, empty, self.worst_explained_of, self.n_rows, self.covariance_type,
            self.unit,
        )

    def take(self, keep: Tensor) -> RowsByStatistics:
        return self  # every run reads the same blocks


# --- k-means ---------------------------------------------------------------------------


@dataclass
class LloydStatistics(_Summable):
    """What a Lloyd iteration needs of some rows, for B runs.

    Attributes
    ----------
    counts : Tensor of shape (B, K)
        Rows nearest to each centre.
    sums : Tensor of shape (B, K, d)
        Their sum, less ``offset`` each (the data's mean, as Lloyd centres the data).
    inertia : Tensor of shape (B,)
        Sum of squared distances of the rows to their nearest centre (zero unless asked).
    """

    counts: Tensor
    sums: Tensor
    inertia: Tensor

    @classmethod
    def from_vector(cls, vector: Tensor, n_runs: int, n_clusters: int, n_features: int):
        """Undo :meth:`to_vector`."""
        return cls._from_vector(vector, _lloyd_shapes(n_runs, n_clusters, n_features))


def _lloyd_shapes(n_runs: int, k: int, d: int) -> list[tuple[int, ...]]:
    return [(n_runs, k), (n_runs, k, d), (n_runs,)]


def lloyd_statistics_size(n_runs: int, n_clusters: int, n_features: int) -> int:
    """Length of :meth:`LloydStatistics.to_vector` for these sizes."""
    return sum(torch.Size(s).numel() for s in _lloyd_shapes(n_runs, n_clusters, n_features))


def lloyd_statistics(
    X: Tensor,
    centers: Tensor,
    offset: Tensor,
    *,
    with_inertia: bool = False,
    sample_weight: Tensor | None = None,
) -> LloydStatistics:
    """Assign rows ``X`` (1, n, d) to the nearest of each run's ``centers`` (B, K, d).

    Distances are taken relative to ``offset`` (1, 1, d), the mean of all the data, as
    :func:`~transformer_gmm.engine.kmeans.lloyd` centres its rows; here only the centres
    are moved by it (:func:`~transformer_gmm.engine.kmeans.nearest_scores`), so the rows
    are read once and never copied, and the sums are less ``offset`` each. The inertia, from
    differences as the in-memory one, is left at zero unless ``with_inertia``: the
    iterations do not need it. ``sample_weight`` (1, n), optional, weighs the rows in the
    counts, sums and inertia, as :func:`~transformer_gmm.engine.kmeans.lloyd` does.

    Examples
    --------
    >>> import torch
    >>> from transformer_gmm.engine import sufficient_stats
    >>> X = torch.tensor([[[0.0], [1.0], [9.0], [10.0]]], dtype=torch.float64)
    >>> centers = torch.tensor([[[0.0], [10.0]]], dtype=torch.float64)
    >>> offset = X.mean(1, keepdim=True)
    >>> stats = sufficient_stats.lloyd_statistics(X, centers, offset, with_inertia=True)
    >>> stats.counts.tolist(), stats.inertia.tolist()
    ([[2.0, 2.0]], [2.0])
    """
    n_runs = centers.shape[0]
    scores = nearest_scores(X, centers - offset, offset)  # (B, K, n); X is read, not copied
    one_hot = nearest_one_hot(scores)  # (B, K, n)
    weights, weighted_x = None, X
    if sample_weight is None:
        counts = one_hot.sum(-1, keepdim=True)  # (B, K, 1)
    else:
        weights = sample_weight[..., None].to(X.dtype)  # (1, n, 1)
        counts, weighted_x = one_hot @ weights, X * weights
    sums = one_hot @ weighted_x - counts * offset  # (B, K, d)
    inertia = X.new_zeros(n_runs)
    if with_inertia:
        inertia = inertia_of(X, centers, first_minimum(scores), weights)
    return LloydStatistics(counts[..., 0], sums, inertia)


def farthest(X: Tensor, centers: Tensor, offset: Tensor, n: int) -> Tensor:
    """Of rows ``X`` (1, m, d), the ``n`` farthest from the nearest of each run's ``centers``
    (B, K, d), farthest first: (B, n, d + 2), each row's squared distance to its centre,
    the row less ``offset`` (as :func:`lloyd_statistics`), its cluster; past ``m`` rows,
    rows at distance -inf.

    What a block offers to the relocation of empty clusters (see :func:`top_rows`).

    Examples
    --------
    >>> import torch
    >>> from transformer_gmm.engine import sufficient_stats
    >>> X = torch.tensor([[[0.0], [1.0], [9.5], [12.0]]], dtype=torch.float64)
    >>> centers = torch.tensor([[[0.0], [10.0]]], dtype=torch.float64)
    >>> far = sufficient_stats.farthest(X, centers, torch.zeros(1, 1, 1, dtype=torch.float64), 2)
    >>> far.tolist()  # distance, row, cluster
    [[[4.0, 12.0, 1.0], [1.0, 1.0, 0.0]]]
    """
    x = X - offset
    centred = centers - offset
    labels = assign(x, centred)  # (B, m)
    nearest = centred.gather(1, labels[..., None].expand(-1, -1, x.shape[-1]))  # (B, m, d)
    distances = (x - nearest).square().sum(-1)  # (B, m), as kmeans.lloyd's
    rows = x.expand(labels.shape[0], -1, -1)
    scored = torch.cat([distances[..., None], rows, labels[..., None].to(x.dtype)], -1)
    return top_rows(scored, n, largest=True)


def lloyd_from_statistics(
    centers: Tensor,
    statistics_of: Callable[[Tensor], LloydStatistics],
    farthest_of: Callable[[Tensor], Tensor],
    offset: Tensor,
    threshold: float,
    max_iter: int,
) -> tuple[Tensor, Tensor]:
    """Lloyd from ``centers`` (B, K, d) with :func:`~transformer_gmm.engine.kmeans.lloyd`'s rule,
    on data seen through ``statistics_of`` and ``farthest_of`` only.

    The loop is :func:`~transformer_gmm.engine.kmeans.run_lloyd`, the in-memory fit's.
    ``statistics_of(centers)`` returns the summed :class:`LloydStatistics` of the runs of
    its working batch (one pass over the data). A run stops when the squared shift of its
    centres is at most ``threshold`` (``tol`` times the mean variance of the features).
    An empty cluster takes a row farthest from its centre, as in memory, which takes one
    more pass: ``farthest_of(centers)`` returns, for each run, the ``min(K, n_rows)`` rows
    farthest from their centre, (R, min(K, n_rows), d + 2) as :func:`farthest` scores them
    (:func:`top_rows` of every block's). Lloyd in memory also stops when no row changes
    cluster, but then the centres come out of the same sums again and do not move, so
    this rule stops on the same iteration without comparing labels. Returns the centres
    and the iterations run, (B,).

    Examples
    --------
    >>> import torch
    >>> from transformer_gmm.engine import kmeans, sufficient_stats
    >>> X = torch.randn(1, 200, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    >>> X[0, :100] += 4.0
    >>> start = X[:, [0, 1]]  # two points of the same cluster
    >>> offset = X.mean(1, keepdim=True)
    >>> threshold = 1e-4 * (X - offset).square().mean().item()
    >>> blocks = X.split(50, 1)
    >>> def statistics_of(centers):
    ...     parts = [sufficient_stats.lloyd_statistics(x, centers, offset) for x in blocks]
    ...     return sum(parts[1:], parts[0])
    >>> def farthest_of(centers):
    ...     parts = [sufficient_stats.farthest(x, centers, offset, 2) for x in blocks]
    ...     return sufficient_stats.top_rows(torch.cat(parts, 1), 2, largest=True)
    >>> centers, n_iter = sufficient_stats.lloyd_from_statistics(
    ...     start, statistics_of, farthest_of, offset, threshold, 300)
    >>> expected = kmeans.lloyd(X, start, max_iter=300)
    >>> torch.allclose(centers, expected.centers), n_iter.tolist() == expected.n_iter.tolist()
    (True, True)
    """
    rows = LloydRowsByStatistics(statistics_of, farthest_of, offset)
    threshold = torch.tensor([threshold], dtype=centers.dtype, device=centers.device)
    centers, n_iter, _ = run_lloyd(rows, centers, threshold, max_iter)
    return centers, n_iter


class LloydRowsByStatistics:
    """The rows Lloyd reads by blocks, seen through their summed statistics alone (see
    :func:`lloyd_from_statistics`): :func:`~transformer_gmm.engine.kmeans.run_lloyd`'s
    data, as :class:`~transformer_gmm.engine.kmeans.LloydRows` is for rows in memory."""

    def __init__(
        self,
        statistics_of: Callable[[Tensor], LloydStatistics],
        farthest_of: Callable[[Tensor], Tensor],
        offset: Tensor,
    ):
        self.statistics_of, self.farthest_of, self.offset = statistics_of, farthest_of, offset

    def step(self, centers: Tensor, active: Tensor) -> tuple[Tensor, Tensor]:
        """New centres from one pass over the blocks; labels are not compared (see
        :func:`lloyd_from_statistics`), so no run converges strictly."""
        statistics = self.statistics_of(centers)
        counts, sums = statistics.counts[..., None], statistics.sums  # (A, K, 1), (A, K, d)
        if bool((counts == 0).any()):
            far = self.farthest_of(centers)  # (A, M, d + 2)
            distances, rows, labels = far[..., 0], far[..., 1:-1], far[..., -1].long()
            counts, sums = relocate_empty(
                counts, sums, distances, rows, labels, torch.ones_like(distances)
            )
        new = centers_from_sums(counts, sums, self.offset)
        return new, torch.zeros_like(active)

    def take(self, keep: Tensor) -> LloydRowsByStatistics:
        return self  # every run reads the same blocks
