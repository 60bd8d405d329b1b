"""Fitting data in memory: EM or Lloyd from every start in one batch, and one run kept.

:func:`fit_mixtures` fits B datasets at once, :func:`fit_kmeans` one; their starts come
from :mod:`transformer_gmm.engine.starts`, and the kept run is chosen by
:func:`transformer_gmm.engine.runs.choose` (mixtures) or the lowest inertia (k-means). On many
rows the starts compete on a subsample of ``SELECTION_ROWS`` rows first.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import torch

from . import backend, em, kmeans, m_step, row_order, runs, starts
from .standardize import subsample_rows, take_rows

# Above this many rows, a fit chooses among its starts on a subsample of this many rows,
# then runs EM on all rows from the best start only (see fit_mixtures). The lower bounds
# of different local optima differ by far more than a subsample of this size blurs. The
# fits of a Dask array build their starts on a sample of this many rows.
SELECTION_ROWS = 8192


# --- Gaussian mixtures ---------------------------------------------------------------


def _in_canonical_order(
    Xs: list[np.ndarray] | np.ndarray,
    sample_weight: list[np.ndarray] | np.ndarray | None,
    given: starts.GivenStarts | None,
) -> tuple[
    list[np.ndarray] | np.ndarray, list[np.ndarray] | np.ndarray | None, starts.GivenStarts | None
]:
    """Each dataset's rows in the canonical order of :mod:`transformer_gmm.engine.row_order`,
    each with its weight and, for ``given``'s one dataset, its responsibilities."""
    if isinstance(Xs, np.ndarray):  # (B, n, d): one batched hash and sort
        n_datasets, n_rows, n_features = Xs.shape
        weights = None if sample_weight is None else np.asarray(sample_weight)
        order = row_order.canonical_order(Xs, weights)  # (B, n)
        # One take of the flattened rows: several times faster than take_along_axis.
        flat = (order + n_rows * np.arange(n_datasets)[:, None]).ravel()
        Xs = np.take(Xs.reshape(-1, n_features), flat, axis=0).reshape(Xs.shape)
        if weights is not None:
            sample_weight = np.take(weights.ravel(), flat).reshape(weights.shape)
        orders = list(order)
    else:
        orders = row_order.canonical_orders(Xs, sample_weight)
        Xs = [np.take(X, o, axis=0) for X, o in zip(Xs, orders, strict=True)]  # faster than X[o]
        if sample_weight is not None:
            sample_weight = [np.asarray(w)[o] for w, o in zip(sample_weight, orders, strict=True)]
    if given is not None and given.resp is not None:  # (R, n, K), for the one dataset
        given = dataclasses.replace(given, resp=given.resp[:, orders[0]])
    return Xs, sample_weight, given


@dataclass(frozen=True)
class MixtureFits:
    """The best of each dataset's EM runs, as numpy arrays in the user's space."""

    weights: np.ndarray  # (B, K)
    means: np.ndarray  # (B, K, d)
    covariances: np.ndarray  # (B, ...), by covariance type
    precisions_cholesky: np.ndarray  # (B, ...)
    lower_bound: np.ndarray  # (B,) float
    n_iter: np.ndarray  # (B,) int
    converged: np.ndarray  # (B,) bool
    best_run: np.ndarray  # (B,) int, index of the kept run, in the order of the starts
    # (B, R, T) each run's lower bound at each EM iteration, NaN once it stopped; above
    # SELECTION_ROWS rows, the kept run's iterations on every row follow its own.
    lower_bounds: np.ndarray | None = None
    iteration_times: np.ndarray | None = None  # (T,) seconds from EM's start, per iteration


def _selection_rows(
    x: torch.Tensor, mask: torch.Tensor | None, n_runs: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Where the starts are built and compared: every row, or, for several starts on
    datasets of more than ``SELECTION_ROWS`` rows, a uniform subsample of that many.

    Returns those rows (B, S, d), which of them are real (or None), and their index
    (B, S), None when every row is kept.
    """
    if n_runs == 1 or x.shape[1] <= SELECTION_ROWS:
        return x, mask, None
    index, sub_mask = subsample_rows(tuple(x.shape[:2]), mask, SELECTION_ROWS, generator)
    return take_rows(x, index), sub_mask, index


@backend.explain_out_of_memory
def fit_mixtures(
    Xs: list[np.ndarray] | np.ndarray,
    *,
    n_components: int,
    covariance_type: str,
    reg_covar: float,
    max_iter: int,
    tol: float,
    device: str,
    seed: int,
    n_kmeans_inits: int,
    backbone: backend.Backbone | None = None,
    n_transformer_inits: int = 0,
    sample_weight: list[np.ndarray] | np.ndarray | None = None,
    given: starts.GivenStarts | None = None,
) -> MixtureFits:
    """EM on B datasets (padded into one batch) from every initialisation at once; keep
    each dataset's best run (see :func:`transformer_gmm.engine.runs.choose`).

    Each dataset's runs are, in order: the first ``n_transformer_inits`` of the starts
    of ``backbone``'s transformer (see :func:`transformer_gmm.engine.readout.mixture_inits`:
    per view of the data, from its mixture, then from its per-point head; covariances
    from one M-step on their responsibilities), then
    ``n_kmeans_inits`` starts from k-means++ and Lloyd (scikit-learn's default
    initialisation), then ``given``'s (for one dataset; see
    :class:`~transformer_gmm.engine.starts.GivenStarts`).

    ``sample_weight`` (one non-negative array per dataset, of its number of rows) weighs
    the rows as frequencies: the transformer reads rows drawn in proportion to their
    weights, k-means++, Lloyd and EM are weighted, and the lower bound is the weighted
    mean log-likelihood.

    Datasets of more than ``SELECTION_ROWS`` rows choose among several starts on a
    uniform subsample of that many rows: every start is built and run by EM there, and
    only each dataset's best goes on to EM over all rows. So a large fit costs about one
    EM run whatever ``n_init`` is, with its memory. ``n_iter`` then counts both stages.

    One generator, seeded with ``seed``, draws that subsample (only where it is taken),
    the rows the backbone reads (only where they are more than its context), then the
    k-means++ seeds. Those draws pick rows by position, so each dataset's rows are first
    put in a canonical order (:mod:`transformer_gmm.engine.row_order`), with their weights and
    given responsibilities: the fit does not depend on the order of the rows, to
    rounding (only through ``given.resp``, where the caller drew them row by row).
    Nothing returned is per row.

    The first ``r`` k-means++ starts are the same for any ``n_kmeans_inits >= r``, and
    the transformer's starts take the same draws however many of them run: so more
    starts never lose one, and with k-means++ starts alone (which compete on the lower
    bound only) the kept lower bound never falls, to rounding, as ``n_kmeans_inits``
    grows; except from one start to two on more than ``SELECTION_ROWS`` rows, where one
    start is built on every row and two or more on the subsample (and there, the best
    start on the subsample need not end best on every row).
    """
    Xs, sample_weight, given = _in_canonical_order(Xs, sample_weight, given)
    dtype = backend.dtype_for(device)
    x, mask = backend.pad(Xs, device, dtype)  # (B, N, d), (B, N) or None
    weights_all = None if sample_weight is None else backend.pad(sample_weight, device, dtype)[0]
    del Xs, sample_weight  # the reordered copies, before EM's own memory
    backend.check_magnitude(x, mask)
    n_datasets = x.shape[0]
    generator = backend.generator(seed, device)
    n_runs = n_transformer_inits + n_kmeans_inits + (0 if given is None else given.n_runs)
    x_all, mask_all = x, mask
    x, mask, index = _selection_rows(x, mask, n_runs, generator)  # (B, S, d)
    weights = weights_all  # (B, S) or None
    if weights is not None and index is not None:
        weights = take_rows(weights[..., None], index)[..., 0]
    extra = {} if given is None else {"initial_lower_bound": x.new_full((1,), given.lower_bound)}
    params = starts.mixture_starts(  # (B * R, ...), dataset-major
        x,
        mask,
        generator,
        n_components=n_components,
        covariance_type=covariance_type,
        reg_covar=reg_covar,
        n_kmeans_inits=n_kmeans_inits,
        backbone=backbone,
        n_transformer_inits=n_transformer_inits,
        device=device,
        sample_weight=weights,
        given=given,
        index=index,
    )
    result = em.fit_em(
        runs.repeat(x, n_runs),
        params,
        covariance_type=covariance_type,
        reg_covar=reg_covar,
        max_iter=max_iter,
        tol=tol,
        mask=None if mask is None else runs.repeat(mask, n_runs),
        **runs.weighted(weights, n_runs),
        **extra,
    )
    lower_bounds = result.lower_bounds.view(n_datasets, n_runs, result.lower_bounds.shape[1])
    times = result.iteration_times
    n_rows = x.shape[1] if mask is None else mask.sum(dim=1)  # rows each bound is over
    if weights is not None:  # frequency weights: the bound is over their sum
        n_rows = weights.sum(dim=1)
    best = runs.choose(
        result.lower_bound.view(n_datasets, n_runs), n_transformer_inits, n_rows
    )  # (B,)
    kept = best + n_runs * torch.arange(n_datasets, device=best.device)  # rows of the batch
    if index is not None:  # the chosen starts, now on every row
        chosen = m_step.MixtureParams(*(getattr(result.params, f)[kept] for f in runs.FIELDS))
        n_iter = result.n_iter[kept]
        result = em.fit_em(
            x_all,
            chosen,
            covariance_type=covariance_type,
            reg_covar=reg_covar,
            max_iter=max_iter,
            tol=tol,
            mask=mask_all,
            **runs.weighted(weights_all, 1),
        )
        result.n_iter.add_(n_iter)
        lower_bounds, times = _then(lower_bounds, times, best, result)
        kept = torch.arange(n_datasets, device=best.device)
    # One transfer per field for the whole batch: no per-dataset indexing of tensors.
    fields = [result.params.weights, result.params.means, result.params.covariances]
    fields += [result.params.precisions_cholesky, result.lower_bound]
    return MixtureFits(
        *(backend.to_numpy(t[kept]) for t in fields),
        n_iter=result.n_iter[kept].cpu().numpy(),
        converged=result.converged[kept].cpu().numpy(),
        best_run=best.cpu().numpy(),
        lower_bounds=backend.to_numpy(lower_bounds),
        iteration_times=np.asarray(times, dtype=np.float64),
    )


def _then(
    lower_bounds: torch.Tensor, times: list[float], best: torch.Tensor, second: em.EMResult
) -> tuple[torch.Tensor, list[float]]:
    """The lower bounds (B, R, T) and iteration times of EM on a subsample, followed by
    those of ``second``, the kept runs ``best`` (B,) going on over every row."""
    more = lower_bounds.new_full((*lower_bounds.shape[:2], second.lower_bounds.shape[1]), math.nan)
    more[torch.arange(len(best), device=best.device), best] = second.lower_bounds
    elapsed = times[-1] if times else 0.0
    times = times + [elapsed + t for t in second.iteration_times]
    return torch.cat([lower_bounds, more], dim=2), times


# --- k-means -------------------------------------------------------------------------


@dataclass(frozen=True)
class KMeansFit:
    """The best of the Lloyd runs, in the user's space."""

    centers: np.ndarray
    labels: np.ndarray | None  # None by blocks: the caller labels lazily
    inertia: float
    n_iter: int
    best_run: int
    n_distinct: int  # clusters that hold a point under the returned centres
    # Where asked for (verbose), each Lloyd iteration (kmeans.LloydStep) of the runs, and,
    # above SELECTION_ROWS rows, of the kept run on every row (else empty).
    trace: list[list] | None = None


@backend.explain_out_of_memory
def fit_kmeans(
    X: np.ndarray,
    *,
    n_clusters: int,
    max_iter: int,
    tol: float,
    device: str,
    seed: int,
    n_kmeans_inits: int,
    backbone: backend.Backbone | None = None,
    n_transformer_inits: int = 0,
    sample_weight: np.ndarray | None = None,
    given: np.ndarray | None = None,
    trace: bool = False,
) -> KMeansFit:
    """Lloyd from the first ``n_transformer_inits`` of the centres of
    ``backbone``'s transformer (see :func:`transformer_gmm.engine.readout.cluster_centers`),
    from ``n_kmeans_inits`` k-means++ seedings and from the centres ``given``
    (R, K, d), all in one batch; keep the lowest inertia. ``sample_weight`` (N,) weighs
    the rows as scikit-learn's ``KMeans`` does. As in :func:`fit_mixtures`, a dataset of
    more than ``SELECTION_ROWS`` rows compares its starts on a subsample of that many and
    runs Lloyd on all rows from the best only. One generator, seeded with ``seed``, draws
    that subsample (where it is taken), the rows the backbone reads, then the k-means++
    seeds. ``trace`` keeps every Lloyd iteration (see :class:`KMeansFit`)."""
    # The rows in their canonical order, so that the fit does not depend on how they came.
    order = row_order.canonical_order(X, sample_weight)
    x = backend.tensor(np.take(X, order, axis=0), device)[None]  # (1, n, d)
    backend.check_magnitude(x, None)
    generator = backend.generator(seed, device)
    w = None
    if sample_weight is not None:
        w = backend.tensor(np.take(sample_weight, order), device, x.dtype)[None]
    x_all, w_all = x, w
    n_runs = n_transformer_inits + n_kmeans_inits + (0 if given is None else len(given))
    x, _, index = _selection_rows(x, None, n_runs, generator)
    subsampled = index is not None
    if subsampled and w is not None:
        w = take_rows(w[..., None], index)[..., 0]
    centers = starts.kmeans_starts(
        x,
        generator,
        n_clusters=n_clusters,
        n_kmeans_inits=n_kmeans_inits,
        backbone=backbone,
        n_transformer_inits=n_transformer_inits,
        device=device,
        sample_weight=w,
        given=given,
    )
    stages = [[], []] if trace else None
    centers, labels, inertia, n_iter = kmeans.lloyd(
        x.expand(centers.shape[0], -1, -1),
        centers,
        max_iter=max_iter,
        tol=tol,
        sample_weight=w,
        trace=None if stages is None else stages[0],
    )
    best = int(torch.argmin(inertia))
    if subsampled:  # the chosen start, now on every row
        first_stage = n_iter[best]
        centers, labels, inertia, n_iter = kmeans.lloyd(
            x_all,
            centers[best : best + 1],
            max_iter=max_iter,
            tol=tol,
            sample_weight=w_all,
            trace=None if stages is None else stages[1],
        )
        n_iter = n_iter + first_stage
    kept = 0 if subsampled else best
    labels_in_order = labels[kept].cpu().numpy().astype(np.int32)
    labels = np.empty_like(labels_in_order)
    labels[order] = labels_in_order  # back in the rows' own order
    centers, labels = _empty_clusters_last(backend.to_numpy(centers[kept]), labels)
    return KMeansFit(
        centers=centers,
        labels=labels,
        inertia=float(inertia[kept]),
        n_iter=int(n_iter[kept]),
        best_run=best,
        n_distinct=len(np.unique(labels)),
        trace=stages,
    )


def _empty_clusters_last(centers: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, ...]:
    """The centres (K, d) with those that hold no row moved last, in order, and the
    labels (N,) renamed to match: with fewer distinct rows than clusters, the labels are
    then 0 to n_distinct - 1, as scikit-learn's k-means++ leaves them."""
    empty = np.bincount(labels, minlength=len(centers)) == 0
    if not empty.any():
        return centers, labels
    order = np.argsort(empty, kind="stable")
    new_label = np.empty_like(order)
    new_label[order] = np.arange(len(order))
    return centers[order], new_label[labels].astype(np.int32)
