"""Learning from batches that arrive one at a time: stepwise EM for a mixture, mini-batch
k-means for a clustering, in torch.

Both read a batch only through the sums of :mod:`transformer_gmm.engine.sufficient_stats`
(the statistics EM and Lloyd by blocks of rows use), and handle an emptied component or
cluster with the rules of :mod:`transformer_gmm.engine.em` and
:mod:`transformer_gmm.engine.kmeans`; only the way the sums are combined is new.

Stepwise EM (Cappé & Moulines, 2009, "On-line expectation-maximization algorithm for
latent data models") keeps a running average of the normalized sufficient statistics,
``s <- (1 - rho) s + rho s_batch``, and takes the M-step from it. The M-step is
invertible: the weights, means and covariances it returns determine the statistics it
read (the weights the counts, the means the sums, the covariances less ``reg_covar`` the
scatter). So the running average needs no state of its own: it is rebuilt from the
current parameters (:func:`statistics_of_parameters`), which is also what lets a stream go
on from a pickled or re-seeded mixture. With ``rho = 1`` a step is one EM iteration of
``fit`` on the batch. A batch with missing entries (NaN) enters by its expected statistics
given each row's observed entries (:func:`stepwise_em_step_missing`), the same average and
M-step; a clustering's, by its rows filled from their nearest centres, as k-POD fills them
(:func:`minibatch_kmeans_step_missing`).

Mini-batch k-means (Sculley, 2010, as :class:`sklearn.cluster.MiniBatchKMeans`) moves
each centre to the mean of every row it has taken so far: a per-centre learning rate of
``batch count / total count``, from cumulative counts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from . import kpod, missing
from .device import entry_point, shared_tensor, tensor, to_numpy
from .em import as_tuple, empty_threshold, reseed_means, reseed_weights_and_covariances
from .gaussian import IllDefinedCovariance
from .kmeans import assign, centers_from_sums, inertia_of, relocate_empty
from .m_step import MixtureParams
from .sufficient_stats import (  # the M-step's divisors of the scatter, multiplied back here
    SCATTER_SCALE,
    MixtureStatistics,
    farthest,
    lloyd_statistics,
    mixture_statistics,
    parameters_from_statistics,
    worst_explained,
)

__all__ = [
    "StepResult",
    "kmeans_step",
    "minibatch_kmeans_step",
    "minibatch_kmeans_step_missing",
    "mixture_step",
    "statistics_of_parameters",
    "step_size",
    "stepwise_em_step",
    "stepwise_em_step_missing",
]

# Rows of a batch read at once: the E-step's (rows, K, d) temporaries stay near 32 MB in
# float64, whatever the batch size (the statistics of slices add up).
_SLICE_ELEMENTS = 1 << 22
# Rows of a batch that a mini-batch k-means step reads at once: its temporaries (rows x d
# and rows x K) stay a few MB, which the allocator reuses, rather than as large as the
# batch and made afresh by every operation.
_LLOYD_SLICE_ROWS = 1 << 15


def step_size(step: int, learning_decay: float, learning_offset: float) -> float:
    """The weight ``rho_t = (t + t0) ** -kappa`` of batch ``t`` (the first is ``t = 0``,
    which the fit of that batch starts; steps count from 1).

    ``kappa`` in (0.5, 1] makes the steps sum to infinity and their squares converge,
    Robbins and Monro's conditions under which stepwise EM converges; ``kappa = 0`` makes
    every step 1, each batch's statistics replacing the average (batch EM when every
    batch is the whole data).

    Examples
    --------
    >>> from transformer_gmm.engine.online import step_size
    >>> round(step_size(1, 0.7, 10.0), 4), step_size(5, 0.0, 10.0)
    (0.1866, 1.0)
    """
    return float((step + learning_offset) ** -learning_decay)


def _slices(X: Tensor, sample_weight: Tensor | None, n_rows: int):
    """``(rows, weights)`` of ``X`` (1, n, d), ``n_rows`` at a time."""
    for start in range(0, X.shape[1], n_rows):
        rows = slice(start, start + n_rows)
        yield X[:, rows], None if sample_weight is None else sample_weight[:, rows]


def statistics_of_parameters(
    params: MixtureParams, total: Tensor | float, covariance_type: str, reg_covar: float
) -> MixtureStatistics:
    """The statistics of rows of weight ``total`` that
    :func:`~transformer_gmm.engine.sufficient_stats.parameters_from_statistics` maps to
    ``params`` (to rounding): counts ``total * weights``, sums ``counts * means`` and the
    scatter about the means, ``counts * (covariances - reg_covar)``; log-likelihood zero.

    Examples
    --------
    >>> import torch
    >>> from transformer_gmm.engine import m_step, online, sufficient_stats
    >>> X = torch.randn(1, 50, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    >>> resp = torch.rand(1, 50, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    >>> params = m_step.estimate_gaussian_parameters(
    ...     X, resp / resp.sum(-1, keepdim=True), covariance_type="full", reg_covar=1e-6)
    >>> stats = online.statistics_of_parameters(params, 50.0, "full", 1e-6)
    >>> again, _ = sufficient_stats.parameters_from_statistics(stats, params.means, "full", 1e-6)
    >>> torch.allclose(again.covariances, params.covariances)
    True
    """
    covariances = params.covariances
    if covariance_type in ("full", "tied"):
        eye = torch.eye(covariances.shape[-1], dtype=covariances.dtype, device=covariances.device)
        excess = covariances - reg_covar * eye
    else:
        # A variance at reg_covar, stored in float32, may read a hair below it.
        excess = (covariances - reg_covar).clamp_min(0.0)
    nk = params.weights * total
    scatter = excess * SCATTER_SCALE[covariance_type](nk)
    log_likelihood = nk.new_zeros(nk.shape[:1])
    return MixtureStatistics(log_likelihood, nk, nk[..., None] * params.means, scatter)


def _blend(running: MixtureStatistics, batch: MixtureStatistics, rho: float) -> MixtureStatistics:
    """``(1 - rho) * running + rho * batch``, field by field."""
    pairs = zip(running._fields(), batch._fields(), strict=True)
    return MixtureStatistics(*((1.0 - rho) * a + rho * b for a, b in pairs))


@dataclass
class StepResult:
    """What :func:`stepwise_em_step` returns.

    Attributes
    ----------
    params : MixtureParams
        The parameters after the step.
    log_likelihood : float
        The mean log-likelihood (weighted) of the batch under the parameters before the
        step, at its E-step.
    reseeded : int
        Components re-seeded by the step.
    """

    params: MixtureParams
    log_likelihood: float
    reseeded: int


def stepwise_em_step(
    X: Tensor,
    params: MixtureParams,
    rho: float,
    *,
    covariance_type: str,
    reg_covar: float,
    sample_weight: Tensor | None = None,
) -> StepResult:
    """One step of stepwise EM on the batch ``X`` (1, n, d), from ``params`` (of batch 1,
    with covariances).

    The batch's statistics under ``params`` and those the parameters stand for, both for
    rows of the batch's weight, are averaged with weights ``rho`` and ``1 - rho``; the
    M-step reads the average with ``reg_covar``. A component whose averaged count falls
    below :func:`~transformer_gmm.engine.em.empty_threshold` is re-seeded as
    :func:`~transformer_gmm.engine.em.fit_em` re-seeds one, onto a row of the batch that
    the others explain worst. With ``rho = 1`` this is an iteration of ``fit_em`` on ``X``.

    Parameters
    ----------
    X : Tensor of shape (1, n, d)
    params : MixtureParams
    rho : float
        The step size, in (0, 1] (see :func:`step_size`).
    covariance_type, reg_covar : as in :func:`~transformer_gmm.engine.em.fit_em`
    sample_weight : Tensor of shape (1, n), optional
        Non-negative weights of the rows, at least one positive.

    Returns
    -------
    StepResult
        ValueError (:class:`~transformer_gmm.engine.gaussian.IllDefinedCovariance`) if a
        covariance is not positive definite.

    Examples
    --------
    With ``rho = 1`` the step is an EM iteration:

    >>> import torch
    >>> from transformer_gmm.engine import em, m_step, online
    >>> X = torch.randn(1, 200, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    >>> X[0, :100] += 4.0
    >>> start = m_step.initialize_kmeans(X, 2, covariance_type="diag", reg_covar=1e-6,
    ...                                  generator=torch.Generator().manual_seed(0))
    >>> step = online.stepwise_em_step(X, start, 1.0, covariance_type="diag", reg_covar=1e-6)
    >>> iteration = em.fit_em(X, start, covariance_type="diag", reg_covar=1e-6,
    ...                       max_iter=1, tol=0.0)
    >>> torch.allclose(step.params.means, iteration.params.means)
    True
    """
    n_components, n_features = params.means.shape[1:]
    batch = None
    n_rows = max(1, _SLICE_ELEMENTS // (n_components * n_features))
    for rows, weights in _slices(X, sample_weight, n_rows):
        part = mixture_statistics(rows, params, covariance_type, weights)
        batch = part if batch is None else batch + part
    total, n_points, unit = _batch_weight(
        X.shape[1], None if sample_weight is None else sample_weight[0]
    )

    def worst(new: MixtureParams, empty: Tensor) -> Tensor:  # (1, min(K, n_points), d)
        candidates = X if sample_weight is None else X[:, sample_weight[0] > 0]
        n_worst = min(n_components, n_points)
        return worst_explained(candidates, new, empty, covariance_type, n_worst)[..., 1:]

    return _update(
        batch, worst, params, rho, total, n_points, unit, covariance_type, reg_covar, X.dtype
    )


def stepwise_em_step_missing(
    X: np.ndarray,
    params: MixtureParams,
    rho: float,
    *,
    covariance_type: str,
    reg_covar: float,
    sample_weight: np.ndarray | None = None,
    device: str | torch.device = "cpu",
) -> StepResult:
    """:func:`stepwise_em_step` on a batch ``X`` (n, d) with missing entries (NaN, missing
    at random; every row with an observed feature), from ``params`` (float64, of batch 1,
    with covariances) on ``device``.

    The batch's statistics are the expected ones given each row's observed entries
    (:func:`~transformer_gmm.engine.missing.missing_statistics`, those of ``fit``'s EM for
    missing values), so with ``rho = 1`` a step is an iteration of that EM (without its
    covariance prior) on ``X``; the M-step and the re-seeding of an emptied component are
    :func:`stepwise_em_step`'s, a re-seeded mean going to the row the others explain worst
    over its observed features, its missing entries at the batch's observed means (the
    mixture's mean where the batch observes a feature nowhere).
    """
    dtype = torch.float64
    x = torch.as_tensor(X, dtype=dtype, device=device)
    is_missing = torch.isnan(x)
    x = torch.where(is_missing, 0.0, x)
    row_weight = (
        torch.ones(len(X), dtype=dtype, device=device)
        if sample_weight is None
        else torch.as_tensor(sample_weight, dtype=dtype, device=device)
    )
    n_components = params.means.shape[1]
    runs = missing.Patterns.of(X, device).runs(x, n_components, row_weight)
    batch = missing.missing_statistics(runs, params, covariance_type, row_weight)
    total, n_points, unit = _batch_weight(len(X), None if sample_weight is None else row_weight)

    def worst(new: MixtureParams, empty: Tensor) -> Tensor:  # (1, min(K, n), d)
        observed = (~is_missing).sum(0)  # (d,)
        mixture_mean = params.weights[0] @ params.means[0]  # (d,)
        column_means = torch.where(observed > 0, x.sum(0) / observed.clamp_min(1), mixture_mean)
        filled = torch.where(is_missing, column_means, x)
        return missing.worst_explained(
            runs, filled, row_weight > 0, new, empty, covariance_type
        )

    return _update(
        batch, worst, params, rho, total, n_points, unit, covariance_type, reg_covar, dtype
    )


def _batch_weight(n_rows: int, sample_weight: Tensor | None) -> tuple[float, int, float]:
    """A batch's total weight, its rows of positive weight, and an average such row's
    weight (fit_em's unit)."""
    if sample_weight is None:
        return float(n_rows), n_rows, 1.0
    total, n_points = float(sample_weight.sum()), int((sample_weight > 0).sum())
    return total, n_points, total / n_points


def _update(
    batch: MixtureStatistics,
    worst: Callable[[MixtureParams, Tensor], Tensor],
    params: MixtureParams,
    rho: float,
    total: float,
    n_points: int,
    unit: float,
    covariance_type: str,
    reg_covar: float,
    dtype: torch.dtype,
) -> StepResult:
    """The step from a batch's statistics: averaged with those ``params`` stand for, the
    M-step, and the re-seeding of emptied components onto the rows ``worst(new, empty)``
    gives (those the others explain worst, worst first), in the batch's ``dtype``."""
    running = statistics_of_parameters(params, total, covariance_type, reg_covar)
    averaged = _blend(running, batch, rho)
    new, failed = parameters_from_statistics(averaged, params.means, covariance_type, reg_covar)
    # fit_em's rule for an emptied component: the M-step's counts below the bound.
    counts = averaged.nk + 10 * torch.finfo(dtype).eps
    empty = counts < empty_threshold(unit, dtype)  # (1, K)
    reseeded = int(empty.sum())
    if bool(failed.any()) and not reseeded:
        raise IllDefinedCovariance(dtype)
    if reseeded:
        new, failed = reseed_weights_and_covariances(new, counts, empty, unit, covariance_type)
        if bool(failed.any()):
            raise IllDefinedCovariance(dtype)
        n_rows = torch.full((1, 1), n_points, device=counts.device)
        new.means = reseed_means(new.means, empty, worst(new, empty), n_rows)
    return StepResult(new, float(batch.log_likelihood[0]) / total, reseeded)


def minibatch_kmeans_step(
    X: Tensor,
    centers: Tensor,
    counts: Tensor,
    *,
    sample_weight: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """One mini-batch k-means step on the batch ``X`` (1, n, d), as
    :meth:`sklearn.cluster.MiniBatchKMeans.partial_fit` takes it: each of ``centers``
    (1, K, d) moves to the mean of the rows it took so far, of weight ``counts`` (1, K),
    and this batch's nearest rows; the batch is then labelled under the new centres.

    A centre that has still taken no row takes the row of the batch farthest from its
    centre, as :func:`~transformer_gmm.engine.kmeans.lloyd` relocates an empty cluster
    (the row leaves the sums of the cluster it was in). Returns the new centres, the new
    counts, the batch's labels (1, n) and its inertia (1,) under the new centres.

    Examples
    --------
    >>> import torch
    >>> from transformer_gmm.engine import online
    >>> X = torch.tensor([[[0.0], [2.0], [10.0]]], dtype=torch.float64)
    >>> centers = torch.tensor([[[0.0], [10.0]]], dtype=torch.float64)
    >>> counts = torch.tensor([[2.0, 1.0]], dtype=torch.float64)
    >>> new, counts, labels, inertia = online.minibatch_kmeans_step(X, centers, counts)
    >>> new[0, :, 0].tolist(), counts.tolist()  # (2 * 0 + 0 + 2) / 4, (10 + 10) / 2
    ([0.5, 10.0], [[4.0, 2.0]])
    >>> labels.tolist(), inertia.tolist()  # 0.5 ** 2 + 1.5 ** 2
    ([[0, 0, 1]], [2.5])
    """
    # Distances relative to an offset, as Lloyd centres its data, so that they are taken
    # between numbers of the data's spread more than of its offset: the mean of every row
    # taken so far (the centres weighed by their counts), which needs no pass over the
    # batch. Only the centres are moved by it (kmeans.nearest_scores): the batch is read
    # as it is, never copied.
    taken = counts.sum()
    if bool(taken > 0):
        offset = counts[:, None, :] @ centers / taken  # (1, 1, d)
    else:  # nothing taken yet: the batch's own mean
        offset = X.mean(1, keepdim=True)
    slices = list(_slices(X, sample_weight, _LLOYD_SLICE_ROWS))
    batch = None
    for rows, weights in slices:
        part = lloyd_statistics(rows, centers, offset, sample_weight=weights)
        batch = part if batch is None else batch + part
    total = (counts + batch.counts)[..., None]  # (1, K, 1)
    sums = counts[..., None] * (centers - offset) + batch.sums  # every row taken, less offset
    empty = bool((total == 0).any())
    if empty:
        candidates = X if sample_weight is None else X[:, sample_weight[0] > 0]
        n_far = min(centers.shape[1], candidates.shape[1])
        far = farthest(candidates, centers, offset, n_far)  # (1, M, d + 2)
        far_weights = torch.ones_like(far[..., 0])
        if sample_weight is not None:
            far_weights = _weights_of(far[..., 1:-1] + offset, candidates, sample_weight)
        total, sums = relocate_empty(
            total, sums, far[..., 0], far[..., 1:-1], far[..., -1].long(), far_weights
        )
    new = centers_from_sums(total, sums, offset, may_be_empty=empty)
    labels, inertia, centred = [], [], new - offset
    for rows, weights in slices:
        labels.append(assign(rows, centred, offset))  # (1, n)
        weights = None if weights is None else weights[..., None]
        inertia.append(inertia_of(rows, new, labels[-1], weights))
    if len(slices) == 1:
        return new, total[..., 0], labels[0], inertia[0]
    return new, total[..., 0], torch.cat(labels, dim=1), torch.stack(inertia).sum(0)


def minibatch_kmeans_step_missing(
    X: np.ndarray,
    centers: Tensor,
    counts: Tensor,
    *,
    sample_weight: np.ndarray | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """:func:`minibatch_kmeans_step` on a batch ``X`` (n, d) with missing entries (NaN;
    every row with an observed feature), from ``centers`` (1, K, d) and ``counts`` (1, K)
    in float64, as k-POD (:mod:`~transformer_gmm.engine.kpod`) steps on complete data:
    each row's missing entries take its nearest centre's (over its observed coordinates)
    coordinates, and the step runs on the filled rows, whose nearest centres are those
    same ones. The batch's labels and inertia under the new centres are over each row's
    observed coordinates, as ``fit`` reports them."""
    x = torch.as_tensor(X, dtype=torch.float64, device=centers.device)
    observed = ~torch.isnan(x)

    def nearest(c: Tensor) -> tuple[Tensor, Tensor]:  # labels (n,), squared distances (n,)
        squared = kpod.centred_observed_squared_distances(x, observed, c)
        labels = squared.argmin(1)
        return labels, squared.gather(1, labels[:, None])[:, 0]

    labels, _ = nearest(centers[0])
    filled = torch.where(observed, x, centers[0][labels])[None]  # (1, n, d)
    weights = (
        None if sample_weight is None
        else torch.as_tensor(sample_weight, dtype=torch.float64, device=x.device)[None]
    )
    new, total, _, _ = minibatch_kmeans_step(filled, centers, counts, sample_weight=weights)
    labels, squared = nearest(new[0])
    inertia = squared.sum() if weights is None else (squared * weights[0]).sum()
    return new, total, labels[None], inertia[None]


def _weights_of(rows: Tensor, X: Tensor, sample_weight: Tensor) -> Tensor:
    """The weights (1, M) of ``rows`` (1, M, d), rows of ``X`` (1, m, d) of positive weight."""
    positive = sample_weight[:, sample_weight[0] > 0]  # (1, m)
    match = torch.cdist(rows[0], X[0]).argmin(-1)  # the row each is (to rounding)
    return positive[:, match]


# --- numpy in, numpy out, for the estimators -------------------------------------------


def _on_device(array: np.ndarray | None, device: str) -> Tensor | None:
    return None if array is None else tensor(array, device)[None]


@entry_point
def mixture_step(
    X: np.ndarray,
    sample_weight: np.ndarray | None,
    parameters: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    rho: float,
    *,
    covariance_type: str,
    reg_covar: float,
    device: str,
    gaps: bool = False,
) -> tuple[tuple[np.ndarray, ...], float]:
    """:func:`stepwise_em_step` on a batch ``X`` (n, d) and a fitted mixture's
    ``(weights, means, covariances, precisions_cholesky)``, computed on ``device`` in its
    dtype, or, where ``X`` has ``gaps`` (NaN), :func:`stepwise_em_step_missing` in
    float64; returns the new parameters, float64, and the batch's mean log-likelihood."""
    if gaps:
        params = MixtureParams(*(_on_device(np.asarray(a, np.float64), device) for a in parameters))
        result = stepwise_em_step_missing(
            X, params, rho, covariance_type=covariance_type, reg_covar=reg_covar,
            sample_weight=sample_weight, device=device,
        )
    else:
        params = MixtureParams(*(_on_device(a, device) for a in parameters))
        result = stepwise_em_step(
            _on_device(X, device),
            params,
            rho,
            covariance_type=covariance_type,
            reg_covar=reg_covar,
            sample_weight=_on_device(sample_weight, device),
        )
    fitted = (to_numpy(t[0]) for t in as_tuple(result.params))
    return tuple(fitted), result.log_likelihood


@entry_point
def kmeans_step(
    X: np.ndarray,
    sample_weight: np.ndarray | None,
    centers: np.ndarray,
    counts: np.ndarray,
    *,
    device: str,
    gaps: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """:func:`minibatch_kmeans_step` on a batch ``X`` (n, d), computed on ``device`` in its
    dtype, or, where ``X`` has ``gaps`` (NaN), :func:`minibatch_kmeans_step_missing` in
    float64; returns the new centres and counts (float64), then the batch's labels (int32)
    and weighted inertia under the new centres, as MiniBatchKMeans reports them."""
    if gaps:
        new, total, labels, inertia = minibatch_kmeans_step_missing(
            X,
            _on_device(np.asarray(centers, np.float64), device),
            _on_device(np.asarray(counts, np.float64), device),
            sample_weight=sample_weight,
        )
    else:
        new, total, labels, inertia = minibatch_kmeans_step(
            shared_tensor(X, device)[None],  # read, never written
            _on_device(centers, device),
            _on_device(counts, device),
            sample_weight=_on_device(sample_weight, device),
        )
    return (
        to_numpy(new[0]),
        to_numpy(total[0]),
        labels[0].cpu().numpy().astype(np.int32),
        float(inertia[0]),
    )
