"""Fitting a dataset that is read by blocks of rows (a Dask array, which
:mod:`transformer_gmm._dask` drives): per-block statistics, and EM and Lloyd over them.

Here the data are seen through a :class:`BlockReducer`: ``function(block, *args)`` applied
to every block of rows, each a float64 array of shape (1, length), and summed over the
blocks (the statistics of an iteration) or returned a row per block (the few rows each
block offers an empty component or cluster). :mod:`transformer_gmm._dask` computes them
with Dask where the blocks live, applying the ``block_*`` functions below; they run on
CPU in float64, whatever device built the starts. The starts are built, and where needed
chosen, on a sample of the rows as :mod:`transformer_gmm.engine.fit` would build and
choose them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from . import fit, gaussian, m_step, row_order, runs, starts, sufficient_stats
from .device import explain_out_of_memory, seeded_generator, tensor, to_numpy
from .plan import KMeansPlan, MixturePlan

BlockFunction = Callable[..., np.ndarray]


@dataclass(frozen=True)
class BlockReducer:
    """``sum(function, args, length)``: ``function(block, *args)``, of shape (1, length),
    summed over every block of rows; ``stack(function, args, length)``: the same, a row per
    block, (n_blocks, length)."""

    sum: Callable[[BlockFunction, tuple, int], np.ndarray]
    stack: Callable[[BlockFunction, tuple, int], np.ndarray]


# Elements of the largest (runs, rows, d or K) temporary while a block is read, in slices
# of rows: 4 MB in float64, so a block costs its own memory and a few of these.
_BLOCK_ELEMENTS = 1 << 19


def _slices(block: np.ndarray, n_runs: int, width: int):
    """The rows of ``block`` as (1, rows, d) float64 tensors, a bounded slice at a time."""
    step = max(1, _BLOCK_ELEMENTS // (n_runs * width))
    for start in range(0, block.shape[0], step):
        yield tensor(block[start : start + step], "cpu")[None]


def block_mixture_statistics(
    block: np.ndarray,
    weights: np.ndarray,
    means: np.ndarray,
    precisions_cholesky: np.ndarray,
    covariance_type: str,
) -> np.ndarray:
    """The :class:`~transformer_gmm.engine.sufficient_stats.MixtureStatistics` of the rows
    ``block`` (n, d) for the R runs of the parameters (shapes (R, ...)), as (1, length)."""
    params = m_step.MixtureParams(
        tensor(weights, "cpu"),
        tensor(means, "cpu"),
        None,
        tensor(precisions_cholesky, "cpu"),
    )
    n_runs, n_components, n_features = means.shape
    size = sufficient_stats.mixture_statistics_size(
        n_runs, n_components, n_features, covariance_type
    )
    total = torch.zeros(size, dtype=torch.float64)
    for x in _slices(block, n_runs, max(n_components, n_features)):
        total += sufficient_stats.mixture_statistics(x, params, covariance_type).to_vector()
    return total.numpy()[None]


def block_lloyd_statistics(
    block: np.ndarray, centers: np.ndarray, offset: np.ndarray, with_inertia: bool
) -> np.ndarray:
    """The :class:`~transformer_gmm.engine.sufficient_stats.LloydStatistics` of the rows
    ``block`` (n, d) for R runs' ``centers`` (R, K, d), as (1, length)."""
    n_runs, n_clusters, n_features = centers.shape
    centers_t = tensor(centers, "cpu")
    offset_t = tensor(offset, "cpu").reshape(1, 1, -1)
    size = sufficient_stats.lloyd_statistics_size(n_runs, n_clusters, n_features)
    total = torch.zeros(size, dtype=torch.float64)
    for x in _slices(block, n_runs, max(n_clusters, n_features)):
        statistics = sufficient_stats.lloyd_statistics(
            x, centers_t, offset_t, with_inertia=with_inertia
        )
        total += statistics.to_vector()
    return total.numpy()[None]


def block_worst_explained(
    block: np.ndarray,
    weights: np.ndarray,
    means: np.ndarray,
    precisions_cholesky: np.ndarray,
    empty: np.ndarray,
    covariance_type: str,
    n: int,
) -> np.ndarray:
    """The ``n`` rows of ``block`` (m, d) that each of R mixtures explains worst without its
    ``empty`` (R, K) components, scored as
    :func:`~transformer_gmm.engine.sufficient_stats.worst_explained`, as (1, R * n * (1 + d)).
    """
    params = m_step.MixtureParams(
        tensor(weights, "cpu"),
        tensor(means, "cpu"),
        None,
        tensor(precisions_cholesky, "cpu"),
    )
    empty_t = torch.from_numpy(empty)
    n_runs, n_components, n_features = means.shape
    worst = torch.zeros(n_runs, 0, 1 + n_features, dtype=torch.float64)
    for x in _slices(block, n_runs, max(n_components, n_features)):
        rows = sufficient_stats.worst_explained(x, params, empty_t, covariance_type, n)
        worst = sufficient_stats.top_rows(torch.cat([worst, rows], 1), n, largest=False)
    return sufficient_stats.top_rows(worst, n, largest=False).reshape(1, -1).numpy()


def block_farthest(
    block: np.ndarray, centers: np.ndarray, offset: np.ndarray, n: int
) -> np.ndarray:
    """The ``n`` rows of ``block`` (m, d) farthest from the nearest of R runs' ``centers``
    (R, K, d), scored as :func:`~transformer_gmm.engine.sufficient_stats.farthest`, as
    (1, R * n * (d + 2))."""
    n_runs, n_clusters, n_features = centers.shape
    centers_t = tensor(centers, "cpu")
    offset_t = tensor(offset, "cpu").reshape(1, 1, -1)
    far = torch.zeros(n_runs, 0, n_features + 2, dtype=torch.float64)
    for x in _slices(block, n_runs, max(n_clusters, n_features)):
        rows = sufficient_stats.farthest(x, centers_t, offset_t, n)
        far = sufficient_stats.top_rows(torch.cat([far, rows], 1), n, largest=True)
    return sufficient_stats.top_rows(far, n, largest=True).reshape(1, -1).numpy()


def _top_of_blocks(stacked: np.ndarray, n_runs: int, n: int, largest: bool) -> torch.Tensor:
    """The best ``n`` rows of each of R runs, (R, n, w), from every block's best ``n``,
    stacked as (n_blocks, R * n * w)."""
    blocks = torch.from_numpy(np.asarray(stacked, dtype=np.float64))
    blocks = blocks.reshape(blocks.shape[0], n_runs, n, -1)  # (n_blocks, R, n, w)
    scored = blocks.transpose(0, 1).reshape(n_runs, -1, blocks.shape[-1])  # (R, n_blocks * n, w)
    return sufficient_stats.top_rows(scored, n, largest=largest)


def _on_cpu(weights, means, covariances, covariance_type: str) -> m_step.MixtureParams:
    """Starts in float64 on CPU, where EM by blocks runs, with the precisions computed
    there (on CPU the same as the starts', not float32 ones made float64 on a GPU)."""
    weights, means, covariances = (
        torch.as_tensor(t).to("cpu", torch.float64) for t in (weights, means, covariances)
    )
    precisions_cholesky = gaussian.compute_precision_cholesky(covariances, covariance_type)
    return m_step.MixtureParams(weights, means, covariances, precisions_cholesky)


@explain_out_of_memory
def fit_mixtures_by_blocks(
    reduce_blocks: BlockReducer,
    sample: np.ndarray,
    n_rows: int,
    plan: MixturePlan,
) -> fit.MixtureFits:
    """:func:`~transformer_gmm.engine.fit.fit` of a mixture ``plan`` on ``n_rows`` rows read by
    ``reduce_blocks``: starts built (and, beyond ``SELECTION_ROWS``, chosen) on ``sample``,
    then EM by blocks; equal to the in-memory fit, to rounding, when ``sample`` holds every row.
    """
    sample = sample[row_order.canonical_order(sample)]
    n_components, covariance_type = plan.n_components, plan.covariance_type
    n_iter_before, best_run = 0, None
    if plan.n_runs > 1 and n_rows > fit.SELECTION_ROWS:
        chosen = fit.fit(plan, [sample])
        start = _on_cpu(chosen.weights, chosen.means, chosen.covariances, covariance_type)
        n_iter_before, best_run = chosen.n_iter, chosen.best_run
    else:
        x = tensor(sample, plan.device)[None]  # (1, S, d)
        generator = seeded_generator(plan.seed, plan.device)
        # plan.given as fit.fit takes it: the estimators give a Dask fit none, but a plan's
        # own parameters (weights, means, precisions) need no rows.
        every = starts.mixture_starts(x, None, generator, plan, given=plan.given)
        start = _on_cpu(every.weights, every.means, every.covariances, covariance_type)
    n_features = sample.shape[1]

    def statistics_of(params: m_step.MixtureParams) -> sufficient_stats.MixtureStatistics:
        n_runs = params.means.shape[0]
        args = tuple(
            to_numpy(t) for t in (params.weights, params.means, params.precisions_cholesky)
        )
        length = sufficient_stats.mixture_statistics_size(
            n_runs, n_components, n_features, covariance_type
        )
        vector = reduce_blocks.sum(block_mixture_statistics, (*args, covariance_type), length)
        return sufficient_stats.MixtureStatistics.from_vector(
            torch.from_numpy(np.asarray(vector, dtype=np.float64).reshape(-1)),
            n_runs,
            n_components,
            n_features,
            covariance_type,
        )

    n_worst = min(n_components, n_rows)

    def worst_explained_of(params: m_step.MixtureParams, empty: torch.Tensor) -> torch.Tensor:
        n_runs = params.means.shape[0]
        args = tuple(
            to_numpy(t) for t in (params.weights, params.means, params.precisions_cholesky)
        )
        args += (empty.numpy(), covariance_type, n_worst)
        length = n_runs * n_worst * (1 + n_features)
        stacked = reduce_blocks.stack(block_worst_explained, args, length)
        return _top_of_blocks(stacked, n_runs, n_worst, largest=False)[..., 1:]

    result = sufficient_stats.fit_em_from_statistics(
        start,
        statistics_of,
        worst_explained_of,
        n_rows,
        covariance_type=covariance_type,
        reg_covar=plan.reg_covar,
        max_iter=plan.max_iter,
        tol=plan.tol,
    )
    kept = 0
    if best_run is None:
        collapsed = runs.collapsed_runs(
            result.params, 1, covariance_type, n_rows, plan.reg_covar
        )  # (1, R), as the in-memory fit passes them over
        best = runs.choose(
            result.lower_bound[None], plan.n_transformer_inits, n_rows, collapsed
        )  # (1,)
        kept, best_run = int(best[0]), best.numpy()
    one = slice(kept, kept + 1)  # a batch of one dataset, as fit.fit returns
    fields = [result.params.weights, result.params.means, result.params.covariances]
    fields += [result.params.precisions_cholesky, result.lower_bound]
    return fit.MixtureFits(
        *(to_numpy(t[one]) for t in fields),
        n_iter=result.n_iter[one].numpy() + n_iter_before,
        converged=result.converged[one].numpy(),
        best_run=best_run,
    )


@explain_out_of_memory
def fit_kmeans_by_blocks(
    reduce_blocks: BlockReducer,
    sample: np.ndarray,
    n_rows: int,
    mean: np.ndarray,
    sum_of_squares: float,
    plan: KMeansPlan,
) -> fit.KMeansFit:
    """:func:`~transformer_gmm.engine.fit.fit` of a k-means ``plan`` by blocks, as
    :func:`fit_mixtures_by_blocks`; Lloyd centres on ``mean`` and scales ``tol`` by
    ``sum_of_squares``; ``labels`` are None (the caller labels rows lazily).
    """
    sample = sample[row_order.canonical_order(sample)]
    n_clusters, max_iter, tol = plan.n_components, plan.max_iter, plan.tol
    n_iter_before, best_run = 0, None
    if plan.n_runs > 1 and n_rows > fit.SELECTION_ROWS:
        chosen = fit.fit(plan, [sample])
        centers = torch.from_numpy(chosen.centers)[None]
        n_iter_before, best_run = chosen.n_iter, chosen.best_run
    else:
        x = tensor(sample, plan.device)[None]  # (1, S, d)
        generator = seeded_generator(plan.seed, plan.device)
        centers = starts.kmeans_starts(x, generator, plan)
        centers = centers.to("cpu", torch.float64)
    n_features = sample.shape[1]
    offset = torch.from_numpy(np.asarray(mean, dtype=np.float64)).reshape(1, 1, -1)

    def statistics_of(
        centers: torch.Tensor, with_inertia: bool = False
    ) -> sufficient_stats.LloydStatistics:
        n_runs = centers.shape[0]
        args = (to_numpy(centers), to_numpy(offset.flatten()), with_inertia)
        length = sufficient_stats.lloyd_statistics_size(n_runs, n_clusters, n_features)
        vector = reduce_blocks.sum(block_lloyd_statistics, args, length)
        return sufficient_stats.LloydStatistics.from_vector(
            torch.from_numpy(np.asarray(vector, dtype=np.float64).reshape(-1)),
            n_runs,
            n_clusters,
            n_features,
        )

    n_far = min(n_clusters, n_rows)

    def farthest_of(centers: torch.Tensor) -> torch.Tensor:
        n_runs = centers.shape[0]
        args = (to_numpy(centers), to_numpy(offset.flatten()), n_far)
        length = n_runs * n_far * (n_features + 2)
        stacked = reduce_blocks.stack(block_farthest, args, length)
        return _top_of_blocks(stacked, n_runs, n_far, largest=True)

    # lloyd's threshold: tol times the mean over features of the variance of the rows.
    threshold = tol * sum_of_squares / (n_rows * n_features)
    centers, n_iter = sufficient_stats.lloyd_from_statistics(
        centers, statistics_of, farthest_of, offset, threshold, max_iter
    )
    final = statistics_of(centers, with_inertia=True)  # the returned centres' pass
    kept = 0
    if best_run is None:
        kept = best_run = int(torch.argmin(final.inertia))
    return fit.KMeansFit(
        centers=to_numpy(centers[kept]),
        labels=None,
        inertia=float(final.inertia[kept]),
        n_iter=int(n_iter[kept]) + int(n_iter_before),
        best_run=best_run,
        n_distinct=int((final.counts[kept] > 0).sum()),
    )
