"""Several EM runs per dataset in one batch: laying them out, and keeping one.

Parameters of B datasets' R runs travel as (B, R, ...) tensors, or flattened to
(B * R, ...), dataset-major, for EM. All torch: the fits (:mod:`transformer_gmm.engine.fit`,
:mod:`transformer_gmm.engine.fit_by_blocks`) make them from numpy arrays and back.
"""

from __future__ import annotations

import math

import torch

from . import collapse, m_step

# A k-means++ start replaces the transformer's only when its total log-likelihood is
# higher by more than this many nats: a likelihood ratio above e^5, "very strong"
# evidence on Kass & Raftery's scale. On a few hundred overlapping points, local optima
# a few nats apart are noise, and the higher one is often the worse estimate (on 600
# fresh tasks of benchmarks/accuracy.py at d = 2, K = 5, max-likelihood selection gave a
# mean error of 0.216 and this margin 0.165). A missed component costs far more than
# this, so k-means++ still rescues; and on many rows the margin is negligible.
KMEANS_MARGIN_NATS = 5.0


def choose(
    lower_bound: torch.Tensor,
    n_transformer_inits: int,
    n_rows: int | torch.Tensor,
    collapsed: torch.Tensor | None = None,
) -> torch.Tensor:
    """Index (B,) of each dataset's kept run, of the (B, R) lower bounds whose first
    ``n_transformer_inits`` runs started from the transformer: its best, unless a
    k-means++ run's total log-likelihood is higher by more than ``KMEANS_MARGIN_NATS``.
    A NaN bound (a run that broke down) never wins, nor does a run with a ``collapsed``
    component (bool (B, R)) where a run without one exists: its likelihood is that of a
    handful of points (:mod:`~transformer_gmm.engine.collapse`)."""
    lower_bound = torch.nan_to_num(lower_bound, nan=-math.inf)
    if collapsed is not None:
        passed_over = collapsed & ~collapsed.all(dim=1, keepdim=True)  # (B, R)
        lower_bound = lower_bound.masked_fill(passed_over, -math.inf)
    n_t = n_transformer_inits
    if n_t == 0 or n_t == lower_bound.shape[1]:
        return _first_best(lower_bound)[1]
    transformer_bound, transformer_best = _first_best(lower_bound[:, :n_t])
    kmeans_bound, kmeans_best = _first_best(lower_bound[:, n_t:])
    gain = (kmeans_bound - transformer_bound) * n_rows  # nats; NaN when both are -inf
    return torch.where(gain > KMEANS_MARGIN_NATS, kmeans_best + n_t, transformer_best)


def collapsed_runs(
    params: m_step.MixtureParams,
    n_datasets: int,
    covariance_type: str,
    n_rows: int | torch.Tensor,
    reg_covar: float,
) -> torch.Tensor:
    """Whether each run of ``params`` (B * R, ...), dataset-major, has a collapsed
    component: bool (B, R). ``n_rows`` (int or (B,)): the rows, or total weight, of each
    dataset."""
    n_rows = torch.as_tensor(n_rows, dtype=torch.float64, device=params.weights.device)
    n_runs = params.weights.shape[0] // n_datasets
    per_run = n_rows.expand(n_datasets).repeat_interleave(n_runs)  # (B * R,)
    components = collapse.collapsed(
        params.weights, params.means, params.covariances, covariance_type, per_run, reg_covar
    )
    return components.any(dim=-1).view(n_datasets, n_runs)


# Runs whose bounds differ by less than this (relative) reached one optimum: rounding, not
# the data, tells them apart.
TIED = 1e-12


def _first_best(lower_bound: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The best bound (B,) of the (B, R) bounds and the first run (B,) within ``TIED`` of it.

    Two runs that reach one optimum may hold its components in different orders; taking
    the first of them, not whichever rounding favours, keeps the labels of a fit the same
    when the data change only in ways that move the last bits (weights scaled by a
    constant, say)."""
    best = lower_bound.max(dim=1).values  # (B,)
    near = lower_bound >= (best - TIED * (1.0 + best.abs()))[:, None]  # (B, R)
    return best, near.int().argmax(dim=1)  # argmax: the first True


def repeat(tensor: torch.Tensor, n_runs: int, run_major: bool = False) -> torch.Tensor:
    """Each dataset's rows n_runs times, dataset-major (or, with ``run_major``, the B
    datasets n_runs times over, so that row ``r * B + i``, run r of dataset i, does not
    depend on n_runs); copied only when both B and n_runs exceed one (one dataset is
    broadcast; one run per dataset is the tensor itself)."""
    if n_runs == 1:
        return tensor
    if tensor.shape[0] == 1:
        return tensor.expand(n_runs, *tensor.shape[1:])
    if run_major:
        return tensor.repeat(n_runs, *[1] * (tensor.dim() - 1))
    return tensor.repeat_interleave(n_runs, dim=0)


def weighted(sample_weight: torch.Tensor | None, n_runs: int, run_major: bool = False) -> dict:
    """``sample_weight=`` for ``n_runs`` runs on each dataset (laid out as :func:`repeat`
    lays them), or nothing when unweighted."""
    if sample_weight is None:
        return {}
    return {"sample_weight": repeat(sample_weight, n_runs, run_major)}


FIELDS = ("weights", "means", "covariances", "precisions_cholesky")


def unflatten(
    params: m_step.MixtureParams, n_datasets: int, run_major: bool = False
) -> m_step.MixtureParams:
    """(B * R, ...) parameters, dataset-major (or run-major), as (B, R, ...); absent
    covariances (None) stay absent."""
    def one(t: torch.Tensor | None) -> torch.Tensor | None:
        if t is None:
            return None
        if run_major:
            return t.unflatten(0, (-1, n_datasets)).transpose(0, 1)
        return t.unflatten(0, (n_datasets, -1))

    return m_step.MixtureParams(*(one(getattr(params, f)) for f in FIELDS))


def flatten(params: m_step.MixtureParams) -> m_step.MixtureParams:
    return m_step.MixtureParams(*(
        None if t is None else t.flatten(0, 1) for t in (getattr(params, f) for f in FIELDS)
    ))


def concatenate(runs: list[m_step.MixtureParams]) -> m_step.MixtureParams:
    """Join parameters of shape (B, R_i, ...) along the runs axis, taking each part's
    tensors out of ``runs`` as they are copied (on wide data, the parts and their join
    would otherwise be held at once)."""
    joined = {}
    for field in FIELDS:
        parts = [getattr(p, field) for p in runs]
        if any(t is None for t in parts):
            joined[field] = None
            continue
        for p in runs:
            setattr(p, field, None)
        if len(parts) == 1:
            joined[field] = parts.pop()
            continue
        first = parts[0]
        out = first.new_empty((first.shape[0], sum(t.shape[1] for t in parts), *first.shape[2:]))
        start = 0
        while parts:  # each part freed once copied (where nothing else holds it)
            part = parts.pop(0)
            out[:, start : start + part.shape[1]] = part
            start += part.shape[1]
            del part
        joined[field] = out
    return m_step.MixtureParams(**joined)
