"""Fitting a dataset that is read by blocks of rows (a Dask array, which
:mod:`transformer_gmm._dask` drives): per-block statistics, and EM and Lloyd over them.

Here the data are seen through a :class:`~transformer_gmm.engine.blocks.BlockReducer`,
which :mod:`transformer_gmm._dask` computes with Dask where the blocks live, applying the
``block_*`` functions of :mod:`transformer_gmm.engine.blocks`; they run on CPU in float64,
whatever device built the starts. The starts are built, and where needed
chosen, on a sample of the rows as :mod:`transformer_gmm.engine.fit` would build and
choose them.
"""

from __future__ import annotations

import numpy as np
import torch

from . import blocks, fit, gaussian, m_step, row_order, runs, starts
from .device import entry_point, seeded_generator, tensor, to_numpy
from .plan import KMeansPlan, MixturePlan


def _on_cpu(weights, means, covariances, covariance_type: str) -> m_step.MixtureParams:
    """Starts in float64 on CPU, where EM by blocks runs, with the precisions computed
    there (on CPU the same as the starts', not float32 ones made float64 on a GPU)."""
    weights, means, covariances = (
        torch.as_tensor(t).to("cpu", torch.float64) for t in (weights, means, covariances)
    )
    precisions_cholesky = gaussian.compute_precision_cholesky(covariances, covariance_type)
    return m_step.MixtureParams(weights, means, covariances, precisions_cholesky)


@entry_point
def fit_mixtures_by_blocks(
    reduce_blocks: blocks.BlockReducer,
    sample: np.ndarray,
    n_rows: int,
    plan: MixturePlan,
) -> fit.MixtureFits:
    """:func:`~transformer_gmm.engine.fit.fit` of a mixture ``plan`` on ``n_rows`` rows read by
    ``reduce_blocks``: starts built (and, beyond ``SELECTION_ROWS``, chosen) on ``sample``,
    then EM by blocks; equal to the in-memory fit, to rounding, when ``sample`` holds every row.
    """
    sample = sample[row_order.canonical_order(sample)]
    covariance_type = plan.covariance_type
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
    result = blocks.em_from(reduce_blocks, start, n_rows, plan)
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


@entry_point
def fit_kmeans_by_blocks(
    reduce_blocks: blocks.BlockReducer,
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
    centers, n_iter, final = blocks.lloyd_from(
        reduce_blocks, centers, n_rows, mean, sum_of_squares, plan
    )
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
