"""Where EM and Lloyd start: the transformer's starts, k-means++'s, and the estimator's own.

Both fits (:func:`transformer_gmm.engine.fit.fit` in memory,
:mod:`transformer_gmm.engine.fit_by_blocks` for a Dask array) build their starts here, in
torch, on the fit's device; the backbone reads the data through
:mod:`transformer_gmm.engine.readout`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from . import gaussian, kmeans, m_step, model_cache, readout, runs
from .batching import cat_batch, groups_on_shared_rows
from .device import tensor
from .plan import GivenStarts
from .screening import Projection
from .standardize import take_rows, weighted_rows

if TYPE_CHECKING:
    from .plan import FitPlan, KMeansPlan, MixturePlan


def _weighted_draw(x, sample_weight, backbone, generator, plan: FitPlan) -> tuple:
    """The rows (B, C, d) the transformer reads of weighted data, drawn in proportion to
    ``sample_weight``, and their mask; those the plan's K-unknown pass drew, where it has one
    (every view of it read the same weighted draw: the first view's rows are all of them)."""
    if plan.k_unknown_pass is not None:
        n_datasets = x.shape[0]
        rows_mask = plan.k_unknown_pass.rows_mask
        rows = plan.k_unknown_pass.rows[:n_datasets]
        return rows, None if rows_mask is None else rows_mask[:n_datasets]
    return weighted_rows(x, sample_weight, backbone.reading_config.context_size, generator)


def _gaps(plan: MixturePlan, index: torch.Tensor | None, device) -> torch.Tensor | None:
    """Where the one dataset's rows (1, S, d), those of ``index`` (1, S) or all, were
    filled: ``plan.gaps`` (in canonical order), for a backbone that reads them."""
    if plan.gaps is None:
        return None
    gaps = torch.as_tensor(plan.gaps, device=device)[None]  # (1, n, d)
    return gaps if index is None else take_rows(gaps, index)


# --- Gaussian mixtures ---------------------------------------------------------------


def mixture_starts(
    x: torch.Tensor,
    mask: torch.Tensor | None,
    generator: torch.Generator,
    plan: MixturePlan,
    *,
    sample_weight: torch.Tensor | None = None,
    given: GivenStarts | None = None,
    index: torch.Tensor | None = None,
    covariances: bool = True,
    project: Projection | None = None,
) -> m_step.MixtureParams:
    """The starts of a mixture ``plan`` for ``x`` (B, N, d), flattened to (B * R, ...),
    dataset-major: the transformer's, k-means++'s, then ``plan.given``'s. Without
    ``covariances``, the transformer's and k-means++'s starts hold None for theirs, each
    dropped as soon as it is made: EM reads a start's precisions, and on wide data its
    first M-step replaces covariances that would take R K d^2 of memory. With
    ``project``, the transformer's and k-means++'s starts are made in that projection of
    the data (:mod:`~transformer_gmm.engine.screening`): the same responsibilities and the
    same draws, the M-steps and k-means++ on the projected rows.
    """
    if project is not None and given is not None:
        raise ValueError("Given starts are not screened: they start EM at full width.")
    space = (lambda t: t) if project is None else project
    n_datasets = x.shape[0]
    n_components, covariance_type = plan.n_components, plan.covariance_type
    reg_covar, backbone, device = plan.reg_covar, plan.backbone, plan.device
    n_transformer_inits, n_kmeans_inits = plan.n_transformer_inits, plan.n_kmeans_inits
    run_params = []  # each (B, R_i, ...) parameters
    if n_transformer_inits > 0:
        model = model_cache.model_on(backbone, device)
        x_read, mask_read, gaps = x, mask, _gaps(plan, index, x.device)
        if sample_weight is not None:  # the rows drawn by weight, then read without gaps
            x_read, mask_read = _weighted_draw(x, sample_weight, backbone, generator, plan)
            gaps = None
        starts = readout.mixture_inits(
            model,
            x_read,
            mask_read,
            n_components,
            generator,
            n_starts=n_transformer_inits,
            k_unknown_pass=plan.k_unknown_pass,
            gaps=gaps,
        )
        for params in _transformer_start_params(starts, space, covariance_type, reg_covar):
            if not covariances:
                params.covariances = None
            run_params.append(runs.unflatten(params, n_datasets))
    if n_kmeans_inits > 0:
        # Run-major: k-means++ draws each row of its batch independently of the batch's
        # size, so run r of every dataset is the same for any n_kmeans_inits > r.
        params = m_step.initialize_kmeans(
            runs.repeat(space(x), n_kmeans_inits, run_major=True),
            n_components,
            covariance_type=covariance_type,
            reg_covar=reg_covar,
            generator=generator,
            mask=None if mask is None else runs.repeat(mask, n_kmeans_inits, run_major=True),
            **runs.weighted(sample_weight, n_kmeans_inits, run_major=True),
        )
        if not covariances:
            params.covariances = None
        run_params.append(runs.unflatten(params, n_datasets, run_major=True))
    if given is None:
        return runs.flatten(runs.concatenate(run_params))
    run_params += _given_starts(
        x,
        mask,
        sample_weight,
        index,
        generator,
        given,
        n_components=n_components,
        covariance_type=covariance_type,
        reg_covar=reg_covar,
    )
    return _with_given(runs.flatten(runs.concatenate(run_params)), given, covariance_type)


def _transformer_start_params(
    starts: tuple, space, covariance_type: str, reg_covar: float
) -> list[m_step.MixtureParams]:
    """Each of the transformer's ``starts`` (``readout.MixtureInit``) as parameters: the
    weights its responsibilities gave, and the covariances of one M-step about its means
    (in the ``space`` the starts are made in). Starts on the same rows of one dataset
    (every start where the rows fit the context) share one batched M-step: its
    products and the rows' squares are then made once."""
    params_of_starts = []
    for group in groups_on_shared_rows(starts, lambda init: (init.x, init.mask)):
        params = m_step.estimate_gaussian_parameters(
            space(group[0].x),
            cat_batch([init.resp for init in group]),  # (S, M, K): start s is row s
            covariance_type=covariance_type,
            reg_covar=reg_covar,
            means=cat_batch([space(init.means) for init in group]),
            mask=group[0].mask,
        )
        fields = [getattr(params, f).chunk(len(group)) for f in runs.FIELDS]
        for init, *parts in zip(group, *fields, strict=True):
            one = m_step.MixtureParams(*parts)
            one.weights = init.weights
            params_of_starts.append(one)
    return params_of_starts


def _given_starts(
    x: torch.Tensor,
    mask: torch.Tensor | None,
    sample_weight: torch.Tensor | None,
    index: torch.Tensor | None,
    generator: torch.Generator,
    given: GivenStarts,
    *,
    n_components: int,
    covariance_type: str,
    reg_covar: float,
) -> list[m_step.MixtureParams]:
    """``given``'s own starts (each (B, R_i, ...)): its k-means++ seedings, its
    responsibilities (their rows at ``index``), or, with neither, its parameters."""
    n_datasets, starts = x.shape[0], []
    options = dict(covariance_type=covariance_type, reg_covar=reg_covar)
    if given.n_seedings > 0:  # run-major, as mixture_starts lays out k-means++'s runs
        n_seedings = given.n_seedings
        params = m_step.initialize_kmeans_plusplus(
            runs.repeat(x, n_seedings, run_major=True),
            n_components,
            generator=generator,
            mask=None if mask is None else runs.repeat(mask, n_seedings, run_major=True),
            **runs.weighted(sample_weight, n_seedings, run_major=True),
            **options,
        )
        starts.append(runs.unflatten(params, n_datasets, run_major=True))
    if given.resp is not None:
        resp = tensor(given.resp, str(x.device), x.dtype)  # (R, N, K), for one dataset
        if index is not None:
            resp = take_rows(resp, index.expand(resp.shape[0], -1))
        params = m_step.estimate_gaussian_parameters(
            x, resp, mask=mask, **runs.weighted(sample_weight, 1), **options
        )
        starts.append(runs.unflatten(params, n_datasets))
    if given.n_runs == 1 and not starts:  # complete: one start, which _with_given fills in
        shapes = (given.weights.shape, given.means.shape, given.precisions_cholesky.shape)
        weights, means, precisions_cholesky = (x.new_zeros(n_datasets, 1, *s) for s in shapes)
        starts.append(
            m_step.MixtureParams(weights, means, precisions_cholesky, precisions_cholesky)
        )
    return starts


def _with_given(
    params: m_step.MixtureParams, given: GivenStarts, covariance_type: str
) -> m_step.MixtureParams:
    """``params`` (B * R, ...) with ``given``'s weights, means and precisions in place of
    theirs, and the covariances those precisions give."""

    def replace(array: np.ndarray | None, like: torch.Tensor) -> torch.Tensor:
        if array is None:
            return like
        return tensor(array, str(like.device), like.dtype).expand_as(like).contiguous()

    weights = replace(given.weights, params.weights)
    means = replace(given.means, params.means)
    if given.precisions_cholesky is None:
        return m_step.MixtureParams(weights, means, params.covariances, params.precisions_cholesky)
    precisions_cholesky = replace(given.precisions_cholesky, params.precisions_cholesky)
    covariances = gaussian.covariances_from_precisions_cholesky(
        precisions_cholesky, covariance_type
    )
    return m_step.MixtureParams(weights, means, covariances, precisions_cholesky)


# --- k-means -------------------------------------------------------------------------


def kmeans_starts(
    x: torch.Tensor,
    generator: torch.Generator,
    plan: KMeansPlan,
    *,
    sample_weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """The starting centres (R, K, d) of a k-means ``plan`` for one dataset ``x`` (1, N, d):
    the transformer's, k-means++'s, then ``plan.given``'s.
    """
    n_clusters, given, device = plan.n_components, plan.given, plan.device
    n_transformer_inits, n_kmeans_inits = plan.n_transformer_inits, plan.n_kmeans_inits
    backbone, starts = plan.backbone, []
    if n_transformer_inits > 0:
        model = model_cache.model_on(backbone, device)
        x_read = x
        if sample_weight is not None:  # the rows drawn by weight, then read
            x_read, _ = _weighted_draw(x, sample_weight, backbone, generator, plan)
        starts += readout.cluster_centers(
            model,
            x_read,
            None,
            n_clusters,
            generator,
            n_starts=n_transformer_inits,
            k_unknown_pass=plan.k_unknown_pass,
        )
    if n_kmeans_inits > 0:
        starts.append(
            kmeans.kmeans_plusplus(
                x.expand(n_kmeans_inits, -1, -1),
                n_clusters,
                generator=generator,
                **runs.weighted(sample_weight, n_kmeans_inits),
            )
        )
    if given is not None:
        starts.append(tensor(given, str(x.device), x.dtype))
    return torch.cat(starts)
