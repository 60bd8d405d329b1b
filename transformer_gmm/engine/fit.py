"""Fitting data in memory: EM or Lloyd from every start in one batch, and one run kept.

:func:`fit` runs a :class:`~transformer_gmm.engine.plan.MixturePlan` on B datasets or a
:class:`~transformer_gmm.engine.plan.KMeansPlan` on one: canonical row order, padding, a
subsample where the starts compete on many rows, the starts
(:mod:`transformer_gmm.engine.starts`), EM or Lloyd from all of them, the choice of one
run (:func:`transformer_gmm.engine.runs.choose` for mixtures, the lowest inertia for
k-means), and, after a subsample, EM or Lloyd on every row from the chosen start. What
differs between mixtures and k-means is in :class:`_Mixtures` and :class:`_KMeans`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import torch

from . import blocks, e_step, em, kmeans, logspace, m_step, row_order, runs, screening, starts
from .device import dtype_for, entry_point, pad, seeded_generator, tensor, to_numpy
from .gaussian import ONE_MATRIX_AT_A_TIME, IllDefinedCovariance, all_components_at_once
from .input_range import check_magnitude, check_range
from .plan import FitPlan, KMeansPlan, MixturePlan
from .standardize import subsample_rows, take_rows

# Above this many rows, a fit chooses among its starts on a subsample of this many rows,
# then runs EM or Lloyd on all rows from the best start only (see fit). The lower bounds
# of different local optima differ by far more than a subsample of this size blurs. The
# fits of a Dask array build their starts on a sample of this many rows.
SELECTION_ROWS = 8192
# Starts screened in a projection (wide data) compete on every row up to this many.
SCREENED_ON_EVERY_ROW = 2 * SELECTION_ROWS

# Above this many rows (one dataset, on CPU), that run on all rows reads them by blocks
# (engine.blocks), as a Dask array's chunks are read: no float64 copy of the rows and no
# (rows, K) array over all of them, so the fit holds little more than the data. Below
# it, in memory is one block: EM's arrays over every row are small, and faster to build.
REFIT_BY_BLOCKS_ROWS = 1 << 17


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


def hash_on_device(device: str) -> bool:
    """Whether rows are put in canonical order where they are fitted: on a GPU, where the
    host's hash would take longer than the fit; on the CPU, numpy's is the faster."""
    return device.startswith("cuda")


@entry_point
def fit(
    plan: FitPlan,
    Xs: list[np.ndarray] | np.ndarray,
    sample_weight: list[np.ndarray] | np.ndarray | None = None,
) -> MixtureFits | KMeansFit:
    """Run ``plan`` on the datasets ``Xs`` from every start at once and keep each dataset's best
    run: :class:`MixtureFits` for a :class:`MixturePlan`, :class:`KMeansFit` for a
    :class:`KMeansPlan`.

    Runs start from the transformer's starts, then k-means++'s, then ``plan.given``'s.
    Rows are first put in canonical order (:mod:`~transformer_gmm.engine.row_order`), so the
    fit does not depend on their order; beyond ``SELECTION_ROWS`` rows, starts compete on a
    uniform subsample and only the best runs on every row. ``sample_weight`` weighs rows as
    frequencies.
    """
    # Each dataset's own dtype, whose range it is held to (check_magnitude).
    dtypes = [Xs.dtype] * len(Xs) if isinstance(Xs, np.ndarray) else [X.dtype for X in Xs]
    if hash_on_device(plan.device) and (isinstance(Xs, np.ndarray) or len(Xs) == 1):
        Xs, sample_weight, orders = _in_canonical_order_on_device(Xs, sample_weight, plan.device)
    else:
        Xs, sample_weight, orders = _in_canonical_order(Xs, sample_weight)
    if _refits_by_blocks(plan, Xs, sample_weight):
        return _fit_then_refit_by_blocks(plan, Xs[0], orders[0], dtypes[0])
    if dtype_for(plan.device) == torch.float32:  # on a GPU
        try:
            on_device = _on_device(plan, Xs, sample_weight, torch.float32, dtypes)
            return _fit_on_device(plan, *on_device, orders)
        except IllDefinedCovariance:
            # float32 cannot hold a covariance this close to the reg_covar floor, where
            # float64 can: the same fit in float64 on the same device, below (out of this
            # block, so that the float32 tensors are freed first).
            pass
    on_device = _on_device(plan, Xs, sample_weight, torch.float64, dtypes)
    del Xs, sample_weight  # the reordered copies, before EM's own memory
    return _fit_on_device(plan, *on_device, orders)


def _solver(plan: FitPlan, orders: list[np.ndarray]) -> _Mixtures | _KMeans:
    """EM's part of the fit for a :class:`MixturePlan`, its given responsibilities (R, n, K)
    in the rows' canonical ``orders``; Lloyd's for a :class:`KMeansPlan`."""
    if isinstance(plan, KMeansPlan):
        return _KMeans(plan)
    given = plan.given
    if given is not None and given.resp is not None:  # for the one dataset
        given = dataclasses.replace(given, resp=given.resp[:, orders[0]])
    if plan.gaps is not None:  # for the one dataset
        plan = dataclasses.replace(plan, gaps=plan.gaps[orders[0]])
    return _Mixtures(plan, given)


def _on_device(plan: FitPlan, Xs, sample_weight, dtype: torch.dtype, dtypes: list) -> tuple:
    """The datasets padded on the plan's device in ``dtype``: (B, N, d), the mask (B, N) or
    None, and the weights (B, N) or None; each dataset checked against the range of the
    narrower of ``dtype`` and its own (``dtypes``)."""
    x, mask = pad(Xs, plan.device, dtype)  # (B, N, d), (B, N) or None
    weights = None if sample_weight is None else pad(sample_weight, plan.device, dtype)[0]
    check_magnitude(x, mask, dtypes)
    return x, mask, weights


def _fit_on_device(plan: FitPlan, x, mask, weights_all, orders):
    """:func:`fit` on the padded datasets ``x`` (B, N, d) in canonical order."""
    generator = seeded_generator(plan.seed, plan.device)
    solver = _solver(plan, orders)
    x_all, mask_all = x, mask
    # Screened starts compete cheaply in a projection and leave one run at full width: up
    # to SCREENED_ON_EVERY_ROW rows, as for one run, every row is read and nothing refitted.
    every_row = _screens(plan, x) and x.shape[1] <= SCREENED_ON_EVERY_ROW
    n_runs = 1 if every_row else plan.n_runs
    x, mask, index = _selection_rows(x, mask, n_runs, generator)  # (B, S, d)
    weights = weights_all  # (B, S) or None
    if weights is not None and index is not None:
        weights = take_rows(weights[..., None], index)[..., 0]
    first = solver.run_starts(x, mask, weights, generator, index)
    best = solver.choose(first, x, mask, weights)
    if index is None:
        return solver.result(first, best, orders[0])
    # The chosen starts, now on every row.
    final = solver.refit(first, best, x_all, mask_all, weights_all)
    return solver.result(final, best, orders[0], first=first)


def _screens(plan: FitPlan, x: torch.Tensor) -> bool:
    """Whether the starts compete in a projection first (:mod:`.screening`): wide data,
    several starts of the plan's own (none given), EM or Lloyd to run, no Lloyd trace to
    keep."""
    return (
        plan.n_runs > 1
        and plan.given is None
        and plan.max_iter > 0
        and not (isinstance(plan, KMeansPlan) and plan.trace)
        and screening.screens(
            x.shape[1], x.shape[-1], plan.n_components,
            None if isinstance(plan, KMeansPlan) else plan.covariance_type,
        )
    )


def _refits_by_blocks(plan: FitPlan, Xs, sample_weight) -> bool:
    """Whether the run on all rows reads them by blocks (see REFIT_BY_BLOCKS_ROWS): one
    unweighted dataset in memory on CPU, whose starts compete on a subsample; not where
    verbose traces Lloyd, which reads every row's label at each iteration."""
    return (
        plan.device == "cpu"
        and len(Xs) == 1
        and sample_weight is None
        and isinstance(Xs[0], np.ndarray)
        and Xs[0].shape[0] > REFIT_BY_BLOCKS_ROWS
        and plan.n_runs > 1
        and not (isinstance(plan, KMeansPlan) and plan.trace)
    )


def _fit_then_refit_by_blocks(plan: FitPlan, X: np.ndarray, order: np.ndarray, dtype):
    """:func:`fit` of one dataset ``X`` (n, d), in canonical order and in its own dtype: the
    starts built, run and chosen on a subsample as :func:`_fit_on_device` does (the same
    draw, the same bits), then the chosen start on every row by blocks."""
    check_range(X.max(axis=0), X.min(axis=0), X.shape[0], dtype)
    generator = seeded_generator(plan.seed, plan.device)
    index, _ = subsample_rows((1, X.shape[0]), None, SELECTION_ROWS, generator)
    x = tensor(X[index[0].numpy()], plan.device, torch.float64)[None]  # (1, S, d)
    solver = _solver(plan, [order])
    first = solver.run_starts(x, None, None, generator, index)
    best = solver.choose(first, x, None, None)
    final = solver.refit_by_blocks(first, best, X)
    return solver.result(final, best, order, first=first)


def _in_canonical_order(
    Xs: list[np.ndarray] | np.ndarray, sample_weight: list[np.ndarray] | np.ndarray | None
) -> tuple:
    """Each dataset's rows in the canonical order of :mod:`transformer_gmm.engine.row_order`,
    each with its weight; and each dataset's order (n_i,)."""
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
    return Xs, sample_weight, orders


def _in_canonical_order_on_device(
    Xs: list[np.ndarray] | np.ndarray,
    sample_weight: list[np.ndarray] | np.ndarray | None,
    device: str,
) -> tuple:
    """:func:`_in_canonical_order` for datasets of one size, hashed, sorted and reordered
    on ``device`` (a GPU), whose rows come back as tensors there: on the host the hash of
    10^7 rows takes longer than their whole fit on a GPU. The same order, to the bit."""
    X = Xs if isinstance(Xs, np.ndarray) else Xs[0][None]  # (B, n, d)
    # One copy to the device, in the data's dtype (torch.tensor copies: read-only is fine).
    X = torch.tensor(X, device=device)
    weights = None
    if sample_weight is not None:
        weights = sample_weight if isinstance(Xs, np.ndarray) else [sample_weight[0]]
        weights = torch.tensor(np.asarray(weights), device=device)  # (B, n)
    order = row_order.canonical_order_on_device(X, weights)  # (B, n)
    X = X.gather(1, order[..., None].expand_as(X))
    if weights is not None:
        weights = weights.gather(1, order)
    return X, weights, list(order.cpu().numpy())


def _selection_rows(
    x: torch.Tensor, mask: torch.Tensor | None, n_runs: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Where starts are built and compared: every row, or a uniform subsample of
    ``SELECTION_ROWS`` rows; returns the rows, their mask (or None) and their index (or None).
    """
    if n_runs == 1 or x.shape[1] <= SELECTION_ROWS:
        return x, mask, None
    index, sub_mask = subsample_rows(tuple(x.shape[:2]), mask, SELECTION_ROWS, generator)
    return take_rows(x, index), sub_mask, index


class _Mixtures:
    """EM's part of :func:`fit`: its starts, runs, choice, refit and result."""

    def __init__(self, plan: MixturePlan, given: starts.GivenStarts | None):
        self.plan, self.given = plan, given
        # Each dataset's run chosen by screening (_run_screened), whose result then holds
        # that run alone: (B,), or None where the runs compete at full width.
        self.screened_winner: torch.Tensor | None = None

    def starts(self, x, mask, weights, generator, index) -> m_step.MixtureParams:
        return starts.mixture_starts(  # (B * R, ...), dataset-major
            x, mask, generator, self.plan, sample_weight=weights, given=self.given, index=index,
            covariances=not self._drops_start_covariances(x),
        )

    def _drops_start_covariances(self, x) -> bool:
        """Whether EM starts from the starts' precisions alone: on wide data, where their
        covariances would only take memory (R K d^2 when full), and its first M-step
        replaces them."""
        return self.plan.max_iter > 0 and x.shape[-1] >= ONE_MATRIX_AT_A_TIME

    def run_starts(self, x, mask, weights, generator, index) -> em.EMResult:
        """EM from every start (:meth:`solve` of :meth:`starts`), or, where the plan says so,
        EM is costly (``GATED_FROM_VALUES``) and the runs fit in memory at once, from the
        k-means++ starts only of the datasets whose transformer starts disagree
        (:meth:`_run_gated`)."""
        plan = self.plan
        if _screens(plan, x):
            return self._run_screened(x, mask, weights, generator, index)
        if (
            plan.kmeans_if_starts_disagree
            and x.shape[1] * x.shape[2] >= GATED_FROM_VALUES
            and runs_per_chunk(x, plan) >= plan.n_runs
        ):
            return self._run_gated(x, mask, weights, generator, index)
        return self.solve(x, mask, weights, self.starts(x, mask, weights, generator, index))

    def _run_screened(self, x, mask, weights, generator, index) -> em.EMResult:
        """Every start made and run to convergence in the data's leading principal
        directions, the runs chosen there as at full width (:func:`runs.choose`); the
        winner's responsibilities give one M-step at full width, and EM runs from it alone:
        here, or, where ``x`` is a subsample (``index``), only in the refit on every row
        (EM on the subsample too would run the same start twice). The result holds the
        winner's run alone (its start, with the screening's bound, where the refit runs
        it), which :meth:`choose` then keeps: copies of wide covariances for the other
        runs would only take memory. Its history of lower bounds has a row for every run,
        NaN but the winner's, as :meth:`result` reads it."""
        plan, n_datasets, n_runs = self.plan, x.shape[0], self.plan.n_runs
        n_dims = screening.screening_dims(x.shape[-1], plan.n_components)
        project = screening.principal_projection(x, mask, weights, n_dims)
        params = starts.mixture_starts(
            x, mask, generator, plan, sample_weight=weights, index=index, project=project
        )
        z = project(x)  # (B, N, p)
        screened = self._em(z, mask, weights, params, n_runs)
        winner = self.choose(screened, z, mask, weights)  # (B,)
        kept = self._kept(winner)
        chosen = m_step.MixtureParams(*(getattr(screened.params, f)[kept] for f in runs.FIELDS))
        _, log_resp = e_step.e_step(z, chosen, plan.covariance_type, mask, weights)
        start = m_step.estimate_gaussian_parameters(
            x, logspace.responsibilities(log_resp), covariance_type=plan.covariance_type,
            reg_covar=plan.reg_covar,
            mask=mask, sample_weight=weights,
        )
        if index is None:
            if self._drops_start_covariances(x):  # EM reads the precisions (see solve)
                start.covariances = None
            full = self._em(x, mask, weights, start, 1)
        else:
            full = em.EMResult(
                start,
                screened.lower_bound[kept],
                torch.zeros(n_datasets, dtype=torch.long, device=x.device),
                torch.zeros(n_datasets, dtype=torch.bool, device=x.device),
                lower_bounds=x.new_empty((n_datasets, 0)),
                iteration_times=[],
            )
        places = winner + n_runs * torch.arange(n_datasets, device=x.device)  # winners' rows
        history = full.lower_bounds.new_full(
            (n_datasets * n_runs, full.lower_bounds.shape[1]), math.nan
        )
        history[places] = full.lower_bounds
        self.screened_winner = winner
        return em.EMResult(
            full.params, full.lower_bound, full.n_iter, full.converged,
            lower_bounds=history, iteration_times=full.iteration_times,
        )

    def _em(self, x, mask, weights, params, n_runs: int, **extra) -> em.EMResult:
        plan = self.plan
        return em.fit_em(
            runs.repeat(x, n_runs),
            params,
            covariance_type=plan.covariance_type,
            reg_covar=plan.reg_covar,
            max_iter=plan.max_iter,
            tol=plan.tol,
            mask=None if mask is None else runs.repeat(mask, n_runs),
            **runs.weighted(weights, n_runs),
            **extra,
            consume_start=True,  # no caller reads its start again
        )

    def solve(self, x, mask, weights, params) -> em.EMResult:
        given, plan = self.given, self.plan
        extra = (
            {} if given is None else {"initial_lower_bound": x.new_full((1,), given.lower_bound)}
        )
        if self._drops_start_covariances(x):
            params = dataclasses.replace(params, covariances=None)
        n_runs = plan.n_runs
        per_chunk = runs_per_chunk(x, plan)
        if per_chunk >= n_runs:
            return self._em(x, mask, weights, params, n_runs, **extra)
        # Wide data: each dataset's runs in chunks of per_chunk, one after the other. Each
        # run's iterations are its own whatever the batch around it, so the result is the
        # batch's, in a fraction of its memory.
        n_datasets = x.shape[0]
        results = []
        for first in range(0, n_runs, per_chunk):
            chunk = slice(first, min(first + per_chunk, n_runs))
            params_in_chunk = m_step.MixtureParams(*(
                None if t is None else t.unflatten(0, (n_datasets, n_runs))[:, chunk].flatten(0, 1)
                for t in (getattr(params, f) for f in runs.FIELDS)
            ))
            n_in_chunk = chunk.stop - chunk.start
            results.append(self._em(x, mask, weights, params_in_chunk, n_in_chunk, **extra))
        return _joined(results, n_datasets)

    def _run_gated(self, x, mask, weights, generator, index) -> em.EMResult:
        """EM from the transformer's starts of every dataset; then k-means++'s starts are
        built, and EM run from them, only for the datasets whose transformer runs ended
        more than ``STARTS_AGREE`` apart. Where they agree, their optimum is taken as
        found: the k-means++ runs stay at a lower bound of -inf (never chosen), holding the
        best transformer run's parameters. The starts are drawn in the ungated order (the
        transformer's, then k-means++'s), and each run's iterations are its own whatever
        the batch, so a single dataset that runs every start gets the ungated fit."""
        plan, n_datasets = self.plan, x.shape[0]
        n_runs, n_transformer = plan.n_runs, plan.n_transformer_inits
        transformer_plan = dataclasses.replace(plan, n_kmeans_inits=0)
        kmeans_plan = dataclasses.replace(plan, n_transformer_inits=0)
        params = starts.mixture_starts(
            x, mask, generator, transformer_plan, sample_weight=weights, index=index
        )
        first = _Mixtures(transformer_plan, None).solve(x, mask, weights, params)
        bounds = first.lower_bound.view(n_datasets, n_transformer)
        spread = bounds.max(1).values - bounds.min(1).values  # NaN where a run broke down
        datasets = (~(spread <= STARTS_AGREE)).nonzero().flatten()
        every = torch.arange(n_datasets, device=x.device)
        kmeans_runs = range(n_transformer, n_runs)
        second = None
        if len(datasets) > 0:
            x_k, mask_k, weights_k = x, mask, weights
            if len(datasets) < n_datasets:
                x_k = x[datasets]
                mask_k = None if mask is None else mask[datasets]
                weights_k = None if weights is None else weights[datasets]
            params_k = starts.mixture_starts(
                x_k, mask_k, generator, kmeans_plan, sample_weight=weights_k, index=index
            )
            second = _Mixtures(kmeans_plan, None).solve(x_k, mask_k, weights_k, params_k)
        # Every dataset's R runs, dataset-major: the transformer's, then k-means++'s.
        best = _first_best_run(bounds)  # (B,)
        result_params = []
        for name in runs.FIELDS:
            field = getattr(first.params, name)
            full = field.new_empty((n_datasets * n_runs, *field.shape[1:]))
            full[_places(every, range(n_transformer), n_runs)] = field
            # Runs not taken hold the best transformer run's parameters (never chosen).
            best_params = field.reshape(n_datasets, n_transformer, *field.shape[1:])[every, best]
            full[_places(every, kmeans_runs, n_runs)] = best_params.repeat_interleave(
                len(kmeans_runs), dim=0
            )
            if second is not None:
                full[_places(datasets, kmeans_runs, n_runs)] = getattr(second.params, name)
            result_params.append(full)
        lower_bound = first.lower_bound.new_full((n_datasets * n_runs,), -math.inf)
        n_iter = first.n_iter.new_zeros(n_datasets * n_runs)
        converged = first.converged.new_zeros(n_datasets * n_runs)
        parts = [(first, every, range(n_transformer))]
        if second is not None:
            parts.append((second, datasets, kmeans_runs))
        n_steps = max(part.lower_bounds.shape[1] for part, _, _ in parts)
        history = first.lower_bounds.new_full((n_datasets * n_runs, n_steps), math.nan)
        for part, rows, run_range in parts:
            places = _places(rows, run_range, n_runs)
            lower_bound[places] = part.lower_bound
            n_iter[places] = part.n_iter
            converged[places] = part.converged
            history[places, : part.lower_bounds.shape[1]] = part.lower_bounds
        times = _joined_times([part for part, _, _ in parts], n_steps)
        return em.EMResult(
            m_step.MixtureParams(*result_params), lower_bound, n_iter, converged,
            lower_bounds=history, iteration_times=times,
        )

    def choose(self, result: em.EMResult, x, mask, weights) -> torch.Tensor:
        n_rows = x.shape[1] if mask is None else mask.sum(dim=1)  # rows each bound is over
        if weights is not None:  # frequency weights: the bound is over their sum
            n_rows = weights.sum(dim=1)
        if self.screened_winner is not None:
            return self.screened_winner
        plan, n_datasets = self.plan, x.shape[0]
        lower_bound = result.lower_bound.view(n_datasets, plan.n_runs)
        collapsed = None
        if plan.n_runs > 1:
            collapsed = runs.collapsed_runs(
                result.params, n_datasets, plan.covariance_type, n_rows, plan.reg_covar
            )
        return runs.choose(lower_bound, plan.n_transformer_inits, n_rows, collapsed)  # (B,)

    def _kept(self, best: torch.Tensor) -> torch.Tensor:  # the kept runs' rows of the batch
        every = torch.arange(len(best), device=best.device)
        if self.screened_winner is not None:  # the result holds the kept runs alone
            return every
        return best + self.plan.n_runs * every

    def refit(self, result: em.EMResult, best, x, mask, weights) -> em.EMResult:
        kept = self._kept(best)
        chosen = m_step.MixtureParams(*(getattr(result.params, f)[kept] for f in runs.FIELDS))
        second = self._em(x, mask, weights, chosen, 1)
        second.n_iter.add_(result.n_iter[kept])
        return second

    def refit_by_blocks(self, result: em.EMResult, best, X: np.ndarray) -> em.EMResult:
        """:meth:`refit` on the rows ``X`` (n, d) of one dataset, read by blocks."""
        kept = self._kept(best)
        chosen = m_step.MixtureParams(*(getattr(result.params, f)[kept] for f in runs.FIELDS))
        second = blocks.em_from(blocks.in_memory(X), chosen, X.shape[0], self.plan)
        second.n_iter.add_(result.n_iter[kept])
        return second

    def result(self, result: em.EMResult, best, order, first: em.EMResult | None = None):
        n_datasets = len(best)
        # Where the result holds the kept runs alone, in order, its own tensors: a copy of
        # wide full covariances would double them.
        every_run_kept = (
            first is not None or self.plan.n_runs == 1 or self.screened_winner is not None
        )
        if first is None:
            kept = self._kept(best)
            lower_bounds, times = result.lower_bounds, result.iteration_times
        else:
            kept = torch.arange(n_datasets, device=best.device)
            lower_bounds, times = first.lower_bounds, first.iteration_times
        lower_bounds = lower_bounds.view(n_datasets, self.plan.n_runs, lower_bounds.shape[1])
        if first is not None:
            lower_bounds, times = _followed_by_refit(lower_bounds, times, best, result)
        # One transfer per field for the whole batch: no per-dataset indexing of tensors.
        fields = [result.params.weights, result.params.means, result.params.covariances]
        fields += [result.params.precisions_cholesky, result.lower_bound]
        return MixtureFits(
            *(to_numpy(t if every_run_kept else t[kept]) for t in fields),
            n_iter=result.n_iter[kept].cpu().numpy(),
            converged=result.converged[kept].cpu().numpy(),
            best_run=best.cpu().numpy(),
            lower_bounds=to_numpy(lower_bounds),
            iteration_times=np.asarray(times, dtype=np.float64),
        )


# The transformer's runs of a dataset whose lower bounds (mean log-likelihood per point)
# end within this of each other reached one optimum: n_init="auto" then runs no k-means++
# start for it (docs/benchmarks.md, "Fewer starts where the transformer's agree").
STARTS_AGREE = 1e-3
# ... and only where the starts run on this many values (rows x features) or more: below,
# EM from two more starts in the same batch costs less than a second batch would (small
# real datasets: the gated default was no faster), and the fit stays as it was.
GATED_FROM_VALUES = 1 << 17


def _places(datasets: torch.Tensor, run_range, n_runs: int) -> torch.Tensor:
    """The rows of a dataset-major (B * R, ...) batch of runs that hold runs ``run_range``
    of ``datasets``, dataset by dataset."""
    run_index = torch.as_tensor(list(run_range), device=datasets.device)
    return (datasets[:, None] * n_runs + run_index[None, :]).flatten()


def _first_best_run(bounds: torch.Tensor) -> torch.Tensor:
    """Each dataset's best run (B,) of the (B, R) bounds, NaN last."""
    return torch.nan_to_num(bounds, nan=-math.inf).argmax(1)


def _joined_times(results: list, n_steps: int) -> list[float]:
    """Iteration times of EM results run one after another: step t ended when each had."""
    return [
        sum(r.iteration_times[min(t, len(r.iteration_times) - 1)] for r in results
            if r.iteration_times)
        for t in range(n_steps)
    ]


# The memory that EM's runs on wide data may take at once (their parameters and the
# M-step's temporaries): above it, the runs of a fit go in chunks (see runs_per_chunk).
MEMORY_BUDGET_BYTES = 256 * 2**20


def runs_per_chunk(x: torch.Tensor, plan: MixturePlan) -> int:
    """How many runs of each dataset of ``x`` (B, N, d) EM takes at once: all of them,
    unless they would take more than ``MEMORY_BUDGET_BYTES``, and only where even one run
    is too large for EM to take every component at once (gaussian.all_components_at_once,
    whose choice depends on the batch's size: chunks then change no rounding)."""
    n_datasets, n_rows, n_features = x.shape
    n_components, n_runs = plan.n_components, plan.n_runs
    if n_runs == 1 or all_components_at_once(x[:1], x.new_empty((1, n_components, 1))):
        return n_runs
    covariance = {"full": n_features**2, "tied": n_features**2 / n_components}.get(
        plan.covariance_type, n_features
    )
    # About what EM holds a run: the parameters of two iterations, the M-step's new
    # covariances and their factors (covariance-sized, three times), and the E-step's and
    # M-step's (N, K) and (N, d) arrays.
    per_run = 8 * n_datasets * (
        7 * n_components * covariance + 4 * n_rows * n_components + n_rows * n_features
    )
    return int(min(n_runs, max(1, MEMORY_BUDGET_BYTES // per_run)))


def _joined(results: list[em.EMResult], n_datasets: int) -> em.EMResult:
    """The EM results of chunks of each dataset's runs, as one result over all of them
    (dataset-major); lower bounds past a chunk's last iteration are NaN, as EM leaves them.
    Takes the chunks' parameters out of ``results`` as it copies them."""
    def join(tensors: list[torch.Tensor | None]) -> torch.Tensor | None:
        if tensors[0] is None:
            return None
        return torch.cat([t.unflatten(0, (n_datasets, -1)) for t in tensors], dim=1).flatten(0, 1)

    def join_freeing(name: str) -> torch.Tensor | None:
        # The chunks' parameters copied into one tensor, each chunk's released once copied:
        # on wide data they are most of the fit's memory, and a concatenation would hold
        # them twice.
        parts = [getattr(r.params, name) for r in results]
        if parts[0] is None:
            return None
        shape = (n_datasets, sum(t.shape[0] // n_datasets for t in parts), *parts[0].shape[1:])
        joined = parts[0].new_empty(shape)
        first = 0
        for i, r in enumerate(results):
            part = parts[i].unflatten(0, (n_datasets, -1))
            joined[:, first : first + part.shape[1]] = part
            first += part.shape[1]
            parts[i] = part = None
            emptied = dataclasses.replace(r.params, **{name: None})
            results[i] = dataclasses.replace(r, params=emptied)
        return joined.flatten(0, 1)

    n_iterations = max(r.lower_bounds.shape[1] for r in results)
    lower_bounds = [
        torch.nn.functional.pad(r.lower_bounds, (0, n_iterations - r.lower_bounds.shape[1]),
                                value=math.nan)
        for r in results
    ]
    # The chunks ran one after another: iteration t ended when every chunk had run it.
    times = _joined_times(results, n_iterations)
    params = m_step.MixtureParams(*(join_freeing(f) for f in runs.FIELDS))
    return em.EMResult(
        params,
        join([r.lower_bound for r in results]),
        join([r.n_iter for r in results]),
        join([r.converged for r in results]),
        lower_bounds=join(lower_bounds),
        iteration_times=times,
    )


def _followed_by_refit(
    lower_bounds: torch.Tensor, times: list[float], best: torch.Tensor, second: em.EMResult
) -> tuple[torch.Tensor, list[float]]:
    """The lower bounds (B, R, T) and iteration times of EM on a subsample, followed by
    those of ``second``, the kept runs ``best`` (B,) going on over every row."""
    more = lower_bounds.new_full((*lower_bounds.shape[:2], second.lower_bounds.shape[1]), math.nan)
    more[torch.arange(len(best), device=best.device), best] = second.lower_bounds
    elapsed = times[-1] if times else 0.0
    times = times + [elapsed + t for t in second.iteration_times]
    return torch.cat([lower_bounds, more], dim=2), times


class _KMeans:
    """Lloyd's part of :func:`fit` (one dataset): its starts, runs, choice, refit and
    result, the runs as a :class:`~transformer_gmm.engine.kmeans.LloydResult`."""

    def __init__(self, plan: KMeansPlan):
        self.plan = plan
        self.stages = [[], []] if plan.trace else None

    def starts(self, x, mask, weights, generator, index) -> torch.Tensor:
        return starts.kmeans_starts(x, generator, self.plan, sample_weight=weights)  # (R, K, d)

    def _lloyd(self, x, centers, weights, stage: int) -> kmeans.LloydResult:
        return kmeans.lloyd(
            x,
            centers,
            max_iter=self.plan.max_iter,
            tol=self.plan.tol,
            sample_weight=weights,
            trace=None if self.stages is None else self.stages[stage],
        )

    def run_starts(self, x, mask, weights, generator, index) -> kmeans.LloydResult:
        centers = self.starts(x, mask, weights, generator, index)
        if _screens(self.plan, x):
            return self._run_screened(x, weights, centers, index)
        return self.solve(x, mask, weights, centers)

    def _run_screened(self, x, weights, centers, index) -> kmeans.LloydResult:
        """Lloyd from every start's centres in the data's leading principal directions,
        the lowest inertia there kept; the means of its clusters start Lloyd at full
        width, here or (on a subsample, ``index``) in the refit on every row. As
        :meth:`_Mixtures._run_screened`, the result holds every run: the others with an
        inertia of +inf (never chosen) and the winner's centres and labels."""
        plan, n_runs = self.plan, centers.shape[0]
        n_dims = screening.screening_dims(x.shape[-1], plan.n_components)
        project = screening.principal_projection(x, None, weights, n_dims)
        screened = kmeans.lloyd(
            project.projected.expand(n_runs, -1, -1), project(centers), max_iter=plan.max_iter,
            tol=plan.tol, sample_weight=weights,
        )
        best = int(torch.argmin(screened.inertia))
        labels = screened.labels[best]  # (N,)
        one_hot = torch.nn.functional.one_hot(labels, plan.n_components).to(x.dtype)  # (N, K)
        if weights is not None:
            one_hot = one_hot * weights[0, :, None]
        counts = one_hot.sum(dim=0)  # (K,)
        sums = one_hot.mT @ x[0]  # (K, d)
        # A cluster the projection left empty keeps its start's centre.
        start = torch.where(counts[:, None] > 0, sums / counts.clamp_min(1e-300)[:, None],
                            centers[best])[None]  # (1, K, d)
        if index is None:
            full = self._lloyd(x, start, weights, 0)
        else:
            full = kmeans.LloydResult(
                start, labels[None], screened.inertia[best : best + 1], screened.n_iter[:1] * 0
            )
        inertia = full.inertia.new_full((n_runs,), math.inf)
        inertia[best] = full.inertia[0]
        n_iter = full.n_iter.new_zeros(n_runs)
        n_iter[best] = full.n_iter[0]
        return kmeans.LloydResult(
            full.centers.expand(n_runs, -1, -1), full.labels.expand(n_runs, -1), inertia, n_iter
        )

    def solve(self, x, mask, weights, centers) -> kmeans.LloydResult:
        return self._lloyd(x.expand(centers.shape[0], -1, -1), centers, weights, 0)

    def choose(self, result: kmeans.LloydResult, x, mask, weights) -> int:
        return int(torch.argmin(result.inertia))

    def refit(self, result: kmeans.LloydResult, best: int, x, mask, weights) -> kmeans.LloydResult:
        second = self._lloyd(x, result.centers[best : best + 1], weights, 1)
        return second._replace(n_iter=second.n_iter + result.n_iter[best])

    def refit_by_blocks(
        self, result: kmeans.LloydResult, best: int, X: np.ndarray
    ) -> kmeans.LloydResult:
        """:meth:`refit` on the rows ``X`` (n, d), read by blocks."""
        mean, sum_of_squares = blocks.mean_and_sum_of_squares(X)
        centers, n_iter, final = blocks.lloyd_from(
            blocks.in_memory(X), result.centers[best : best + 1], X.shape[0], mean,
            sum_of_squares, self.plan,
        )
        labels = blocks.labels_of(X, centers[0], mean)[None]  # (1, n)
        return kmeans.LloydResult(centers, labels, final.inertia, n_iter + result.n_iter[best])

    def result(
        self, result: kmeans.LloydResult, best: int, order, first: kmeans.LloydResult | None = None
    ) -> KMeansFit:
        kept = best if first is None else 0
        labels_in_order = result.labels[kept].cpu().numpy().astype(np.int32)
        labels = np.empty_like(labels_in_order)
        labels[order] = labels_in_order  # back in the rows' own order
        centers, labels = _empty_clusters_last(to_numpy(result.centers[kept]), labels)
        return KMeansFit(
            centers=centers,
            labels=labels,
            inertia=float(result.inertia[kept]),
            n_iter=int(result.n_iter[kept]),
            best_run=best,
            n_distinct=len(np.unique(labels)),
            trace=self.stages,
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
