"""Statistics over blocks of rows, and EM and Lloyd from a start over them: for data read
by blocks, a Dask array's chunks (:mod:`transformer_gmm.engine.fit_by_blocks`) or rows in
memory too many for EM's arrays over all of them at once (:mod:`transformer_gmm.engine.fit`).

The data are seen through a :class:`BlockReducer`: ``function(block, *args)`` applied to
every block of rows, each a float64 array of shape (1, length), and summed over the blocks
(the statistics of an iteration) or returned a row per block (the few rows each block
offers an empty component or cluster). A block is read a bounded slice of rows at a
time, converted to float64 on CPU slice by slice, so a fit by blocks holds no float64 copy
of its rows and no (rows, K) array over all of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from . import kmeans, m_step, sufficient_stats
from .device import tensor, to_numpy
from .em import EMResult
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




def in_memory(X: np.ndarray) -> BlockReducer:
    """Rows ``X`` (n, d) held in memory, in any float dtype, as one block (read a bounded
    slice at a time by the ``block_*`` functions)."""
    return BlockReducer(
        sum=lambda function, args, length: function(X, *args),
        stack=lambda function, args, length: function(X, *args),
    )


def _summed(reduce_blocks: BlockReducer, function, args: tuple, length: int) -> torch.Tensor:
    """``function``'s vector summed over every block, as a float64 tensor (length,)."""
    vector = reduce_blocks.sum(function, args, length)
    return torch.from_numpy(np.asarray(vector, dtype=np.float64).reshape(-1))


def _parameters(params: m_step.MixtureParams) -> tuple[np.ndarray, ...]:
    return tuple(to_numpy(t) for t in (params.weights, params.means, params.precisions_cholesky))


def em_from(
    reduce_blocks: BlockReducer, start: m_step.MixtureParams, n_rows: int, plan: MixturePlan
) -> EMResult:
    """EM of ``plan`` from ``start`` (R runs, float64 on CPU) on ``n_rows`` rows read by
    ``reduce_blocks``: :func:`~transformer_gmm.engine.sufficient_stats.fit_em_from_statistics`
    with every pass a reduction over the blocks."""
    n_runs, n_components, n_features = start.means.shape
    covariance_type = plan.covariance_type

    def statistics_of(params: m_step.MixtureParams) -> sufficient_stats.MixtureStatistics:
        n_runs = params.means.shape[0]
        length = sufficient_stats.mixture_statistics_size(
            n_runs, n_components, n_features, covariance_type
        )
        args = (*_parameters(params), covariance_type)
        vector = _summed(reduce_blocks, block_mixture_statistics, args, length)
        return sufficient_stats.MixtureStatistics.from_vector(
            vector, n_runs, n_components, n_features, covariance_type
        )

    n_worst = min(n_components, n_rows)

    def worst_explained_of(params: m_step.MixtureParams, empty: torch.Tensor) -> torch.Tensor:
        n_runs = params.means.shape[0]
        args = (*_parameters(params), empty.numpy(), covariance_type, n_worst)
        length = n_runs * n_worst * (1 + n_features)
        stacked = reduce_blocks.stack(block_worst_explained, args, length)
        return _top_of_blocks(stacked, n_runs, n_worst, largest=False)[..., 1:]

    return sufficient_stats.fit_em_from_statistics(
        start,
        statistics_of,
        worst_explained_of,
        n_rows,
        covariance_type=covariance_type,
        reg_covar=plan.reg_covar,
        max_iter=plan.max_iter,
        tol=plan.tol,
    )


def lloyd_from(
    reduce_blocks: BlockReducer,
    centers: torch.Tensor,
    n_rows: int,
    mean: np.ndarray,
    sum_of_squares: float,
    plan: KMeansPlan,
) -> tuple[torch.Tensor, torch.Tensor, sufficient_stats.LloydStatistics]:
    """Lloyd of ``plan`` from ``centers`` (R, K, d), float64 on CPU, on ``n_rows`` rows read
    by ``reduce_blocks``, whose ``mean`` (d,) Lloyd centres on and whose ``sum_of_squares``
    about it scales ``tol``: the centres, the iterations (R,), and the statistics (with the
    inertia) of the returned centres."""
    n_runs, n_clusters, n_features = centers.shape
    offset = torch.from_numpy(np.asarray(mean, dtype=np.float64)).reshape(1, 1, -1)

    def statistics_of(
        centers: torch.Tensor, with_inertia: bool = False
    ) -> sufficient_stats.LloydStatistics:
        n_runs = centers.shape[0]
        args = (to_numpy(centers), to_numpy(offset.flatten()), with_inertia)
        length = sufficient_stats.lloyd_statistics_size(n_runs, n_clusters, n_features)
        vector = _summed(reduce_blocks, block_lloyd_statistics, args, length)
        return sufficient_stats.LloydStatistics.from_vector(
            vector, n_runs, n_clusters, n_features
        )

    n_far = min(n_clusters, n_rows)

    def farthest_of(centers: torch.Tensor) -> torch.Tensor:
        n_runs = centers.shape[0]
        args = (to_numpy(centers), to_numpy(offset.flatten()), n_far)
        length = n_runs * n_far * (n_features + 2)
        stacked = reduce_blocks.stack(block_farthest, args, length)
        return _top_of_blocks(stacked, n_runs, n_far, largest=True)

    # lloyd's threshold: tol times the mean over features of the variance of the rows.
    threshold = plan.tol * sum_of_squares / (n_rows * n_features)
    centers, n_iter = sufficient_stats.lloyd_from_statistics(
        centers, statistics_of, farthest_of, offset, threshold, plan.max_iter
    )
    return centers, n_iter, statistics_of(centers, with_inertia=True)


def mean_and_sum_of_squares(X: np.ndarray) -> tuple[np.ndarray, float]:
    """The mean (d,) of rows ``X`` (n, d) and the sum of their squares about it, in
    float64, a bounded slice of rows at a time."""
    step = max(1, _BLOCK_ELEMENTS // X.shape[1])
    total = np.zeros(X.shape[1])
    for start in range(0, X.shape[0], step):
        total += X[start : start + step].sum(axis=0, dtype=np.float64)
    mean = total / X.shape[0]
    squares = 0.0
    for start in range(0, X.shape[0], step):
        centred = X[start : start + step] - mean  # float64: mean is
        squares += float(np.einsum("ij,ij->", centred, centred))
    return mean, squares


def labels_of(X: np.ndarray, centers: torch.Tensor, mean: np.ndarray) -> torch.Tensor:
    """Each row's nearest of ``centers`` (K, d), (n,) long, as
    :func:`~transformer_gmm.engine.kmeans.lloyd` labels its rows (centred on ``mean``)."""
    offset = torch.from_numpy(np.asarray(mean, dtype=np.float64)).reshape(1, 1, -1)
    centered = centers[None] - offset
    labels = [
        kmeans.assign(x - offset, centered)[0]
        for x in _slices(X, 1, max(centers.shape[0], X.shape[1]))
    ]
    return torch.cat(labels)
