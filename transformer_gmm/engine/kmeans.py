"""Batched k-means in torch: k-means++ seeding and Lloyd's algorithm.

The seeding and the Lloyd iterations follow scikit-learn's ``sklearn/cluster/_kmeans.py``
(greedy k-means++, Lloyd with its convergence rule), vectorised over a batch of B
datasets. ``X`` is (B, N, d), or (1, N, d) shared by all B runs; an optional bool
``mask`` (B or 1, N) marks real points, so datasets of different sizes can be padded
into one batch (:mod:`transformer_gmm.engine.batching`). Padded points take no part in
anything. :func:`assign`, :func:`nearest_scores`, :func:`nearest_one_hot`,
:func:`inertia_of` and the rules of :func:`relocate_empty` and :func:`centers_from_sums`
are what Lloyd over blocks of rows (:mod:`transformer_gmm.engine.sufficient_stats`) and
the stream's steps share.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from .batching import (
    ShrinkingBatch,
    check_batch,
    compact,
    matmul,
    point_weights,
    take,
    zero_padding,
)

__all__ = [
    "LloydRows",
    "LloydStep",
    "assign",
    "centers_from_sums",
    "cluster_totals",
    "inertia_of",
    "kmeans_plusplus",
    "kmeans_plusplus_indices",
    "lloyd",
    "nearest_one_hot",
    "nearest_scores",
    "relocate_empty",
    "run_lloyd",
]


# The inertia reads rows in chunks of this many values (rows x features): temporaries of
# 2 MB a run in float64, which stay in a core's cache. Chunks of 65,536 rows whatever the
# width took 2 to 4 times as long from 32 features on (one thread).
_INERTIA_CHUNK_VALUES = 262_144
# Below this many scores (runs x K x rows) an index-tracking ``min`` over K is faster than
# :func:`first_minimum`'s few passes; above it, two to three times slower (one thread,
# K = 2 to 20, float32 and float64).
_INDEXED_MIN_SCORES = 16_384


def _squared_norms(X: Tensor) -> Tensor:
    """(B|1, N, d) -> (B|1, N, 1). Computed once per loop: it costs as much as the matmul."""
    return X.square().sum(-1, keepdim=True)


def _squared_distances(X: Tensor, centers: Tensor, x_norms: Tensor) -> Tensor:
    """(B|1, N, d), (B, K, d) -> (B, N, K); expanded as scikit-learn does (one matmul).

    ``x_norms`` is ``_squared_norms(X)``.
    """
    # 2 (X @ C), not (2 X) @ C: the same bits (doubling is exact), without an (N, d) product.
    dist = x_norms - 2.0 * matmul(X, centers.mT) + centers.square().sum(-1)[:, None, :]
    return dist.clamp_min_(0.0)  # rounding can leave tiny negatives


# --- k-means++ -------------------------------------------------------------------------


def _uniforms(
    n_batch: int, n_draws: int, generator: torch.Generator, dtype: torch.dtype, device
) -> Tensor:
    """Uniforms in (0, 1], (n_batch, n_draws), row b depending on b and ``generator`` alone,
    never on n_batch (a CPU generator seeded by one draw; CUDA draws depend on the size).
    """
    seed = torch.randint(2**63 - 1, (1,), generator=generator, device=generator.device)
    rows = torch.Generator().manual_seed(int(seed))
    u = 1.0 - torch.rand(n_batch, n_draws, generator=rows, dtype=torch.float64)
    return u.to(device=device, dtype=dtype)


def _sample(weights: Tensor, u: Tensor) -> Tensor:
    """Indices (B, T) drawn with probability proportional to ``weights`` (B, N), one for
    each of the uniforms ``u`` (B, T) in (0, 1]."""
    cumulative = weights.cumsum(-1)  # (B, N)
    # u in (0, 1] and values at most the last cumulative sum: searchsorted then always
    # lands on a point of positive weight, so never on padding.
    index = torch.searchsorted(cumulative, u * cumulative[:, -1:])
    return index.clamp_max_(weights.shape[1] - 1)


def kmeans_plusplus(
    X: Tensor,
    n_clusters: int,
    *,
    generator: torch.Generator,
    mask: Tensor | None = None,
    sample_weight: Tensor | None = None,
) -> Tensor:
    """Greedy k-means++ seeds for each dataset of the batch, as scikit-learn picks them.

    Parameters
    ----------
    X : Tensor of shape (B, N, d)
        One seeding per dataset; pass ``X.expand(B, N, d)`` for B seedings of one dataset.
    n_clusters : int
        Number of seeds K.
    generator : torch.Generator
        The only source of randomness (on X's device). Each seeding's draws depend on its
        place b in the batch and on the generator's state, not on B: the first B'
        seedings of a batch are those of a batch of B' (so restarts nest, and more of them
        never lose one), and the generator moves on by one draw whatever B is.
    mask : bool Tensor of shape (B, N) or (1, N), optional
        True for real points.
    sample_weight : Tensor of shape (B, N) or (1, N), optional
        Non-negative weights of the points, zero on padding: draws and potentials are
        weighted as in scikit-learn's ``kmeans_plusplus(sample_weight=...)``.

    Returns
    -------
    centers : Tensor of shape (B, K, d)
        Rows of X (real points only). The first is drawn uniformly (proportionally to
        the weights); each next one is the best of ``2 + int(log K)`` candidates drawn
        proportionally to the (weighted) squared distance to the closest seed so far.

    Examples
    --------
    >>> import torch
    >>> from transformer_gmm.engine.kmeans import kmeans_plusplus, lloyd
    >>> X, _ = two_blobs()  # one dataset (B=1) of 40 points in two blobs
    >>> g = torch.Generator().manual_seed(0)
    >>> centers = kmeans_plusplus(X.expand(3, -1, -1), 2, generator=g)  # 3 seedings
    >>> centers.shape
    torch.Size([3, 2, 2])
    >>> is_row = (centers[:, :, None, :] == X[:, None, :, :]).all(-1)  # (3, K, N)
    >>> bool(is_row.any(-1).all())  # every seed is a point of X
    True
    """
    return _kmeans_plusplus(X, n_clusters, generator, mask, sample_weight)[0]


def kmeans_plusplus_indices(
    X: Tensor,
    n_clusters: int,
    *,
    generator: torch.Generator,
    mask: Tensor | None = None,
    sample_weight: Tensor | None = None,
) -> Tensor:
    """The row indices (B, K) of :func:`kmeans_plusplus`'s seeds, drawn as it draws them:
    what :func:`~transformer_gmm.engine.m_step.initialize_kmeans_plusplus` starts from.
    """
    return _kmeans_plusplus(X, n_clusters, generator, mask, sample_weight)[1]


def _kmeans_plusplus(
    X: Tensor,
    n_clusters: int,
    generator: torch.Generator,
    mask: Tensor | None,
    sample_weight: Tensor | None,
) -> tuple[Tensor, Tensor]:
    """:func:`kmeans_plusplus`'s seeds (B, K, d) and their row indices (B, K)."""
    n_batch = check_batch(X, *([] if sample_weight is None else [sample_weight]), mask=mask)
    n_points = X.shape[1]
    X = zero_padding(compact(X), compact(mask))  # (B|1, N, d)
    weights = point_weights(X, compact(mask), sample_weight).expand(n_batch, n_points)  # (B, N)
    n_trials = 2 + int(math.log(n_clusters))
    rows = torch.arange(n_batch, device=X.device)
    points = X.expand(n_batch, -1, -1)  # view, for gathering the chosen rows
    # Every draw of a seeding at once, (B, 1 + (K - 1) * T): one for the first seed, then
    # T candidates for each next one.
    uniforms = _uniforms(n_batch, 1 + (n_clusters - 1) * n_trials, generator, X.dtype, X.device)

    index = _sample(weights, uniforms[:, :1])[:, 0]  # (B,)
    indices = [index]
    centers = [points[rows, index]]  # list of (B, d)
    x_norms = _squared_norms(X)
    # Squared distances to the closest seed, unweighted as in scikit-learn: the weights
    # enter the draws and the potentials, once.
    closest = _squared_distances(X, centers[0][:, None, :], x_norms)[..., 0]  # (B, N)
    for k in range(1, n_clusters):
        weighted = closest * weights  # (B, N)
        # All real points already sit on a seed (fewer distinct points than K): fall back
        # to uniform draws rather than to index 0, which might be padding.
        potential = weighted.sum(-1, keepdim=True)  # (B, 1)
        draws = uniforms[:, 1 + (k - 1) * n_trials : 1 + k * n_trials]  # (B, T)
        candidates = _sample(torch.where(potential > 0, weighted, weights), draws)
        trials = points[rows[:, None], candidates]  # (B, T, d)
        distances = _squared_distances(X, trials, x_norms).mT  # (B, T, N)
        trial_closest = torch.minimum(closest[:, None, :], distances)  # (B, T, N)
        # (B,) the candidate that lowers the potential most
        best = (trial_closest * weights[:, None, :]).sum(-1).argmin(-1)
        closest = trial_closest[rows, best]
        indices.append(candidates[rows, best])
        centers.append(points[rows, indices[-1]])
    return torch.stack(centers, dim=1), torch.stack(indices, dim=1)


# --- Lloyd -----------------------------------------------------------------------------


def nearest_scores(X: Tensor, centers: Tensor, offset: Tensor | None = None) -> Tensor:
    """Scores (B, K, N) whose smallest over K is each row's nearest centre:
    ``||x - c||^2 - ||x - o||^2``, by ``||c'||^2 + 2 o.c' - 2 x.c'`` in one fused
    matmul-and-add, as scikit-learn's Lloyd step (``||x - o||^2`` is the same for every
    centre).

    ``centers`` (B, K, d) come less ``offset`` (1, 1, d), as ``c' = c - o``; the rows
    ``X`` (B|1, N, d) as they are, or already less the offset where ``offset`` is None. A
    caller that reads its rows once need not copy them to centre them: the products
    ``x.c'`` then lose digits to the offset only linearly (about eps ``|o| |c'|``), not as
    with uncentred centres (eps ``|o|^2``).
    """
    # Few operations: on a stream's batches each costs about as much as the product.
    norms = (centers * (centers if offset is None else centers + 2.0 * offset)).sum(-1, True)
    rows = X.mT if X.shape[0] == centers.shape[0] else X.mT.expand(centers.shape[0], -1, -1)
    return torch.baddbmm(norms, centers, rows, alpha=-2.0)  # (B, K, N)


def assign(X: Tensor, centers: Tensor, offset: Tensor | None = None) -> Tensor:
    """Index (B, N) of the closest of ``centers`` (B, K, d) to each row of ``X``, by
    :func:`nearest_scores` (``centers`` less ``offset`` where one is given)."""
    return first_minimum(nearest_scores(X, centers, offset))


def nearest_one_hot(scores: Tensor) -> Tensor:
    """The one-hot matrix (B, K, N) of each row's nearest centre from :func:`nearest_scores`,
    in the scores' dtype: what cluster sums multiply, as :func:`cluster_totals` builds it.

    One index-free reduction (``amin``) and a comparison, without the labels: on CPU,
    ``min``'s index-tracking reduction and the scatter into zeros take three times as long.
    Where a row's smallest score is not unique (centres that coincide) or NaN, the labels
    of :func:`first_minimum` decide, as everywhere else.
    """
    hit = _unique_minimum(scores)
    if hit is None:  # min's labels (first_minimum's rule), without trying the one-hot again
        return torch.zeros_like(scores).scatter_(1, scores.min(1).indices[:, None, :], 1.0)
    return hit


def _unique_minimum(scores: Tensor) -> Tensor | None:
    """The one-hot (B, K, N) of each row's smallest score, in the scores' dtype, or None
    where some row's smallest is not unique (a tie) or NaN (which equals nothing)."""
    smallest = scores.amin(1, keepdim=True)  # (B, 1, N), NaN where a score is NaN
    # Compared straight into the scores' dtype: on CPU a comparison into bool and then a
    # cast take five to ten times as long (two passes, neither vectorized).
    hit = torch.eq(scores, smallest, out=torch.empty_like(scores))
    # A NaN row has no hit and a tie two, so the count alone could balance them; a NaN
    # makes the minima's sum NaN. (Sums: several times faster here than count_nonzero
    # and isnan; counted in float64, exact at any size.)
    n_hits = float(hit.sum(dtype=torch.float64))
    if n_hits != smallest.numel() or math.isnan(float(smallest.sum())):
        return None
    return hit


def cluster_totals(
    labels: Tensor, n_clusters: int, X: Tensor, weights: Tensor
) -> tuple[Tensor, Tensor]:
    """Each cluster's weight (A, K, 1) and sum (A, K, d) of the rows ``X`` (A|1, N, d),
    weighed by ``weights`` (A|1, N, 1) in the counts alone (``X`` is already weighted where
    the sums need it), from the one-hot matrix of ``labels`` (A, N).

    Matmuls rather than scatter_add: deterministic on CUDA too. The layout follows the
    shape: CPU matrix products are several times faster when their output has the wider
    side last, so with more clusters than features the one-hot keeps K last.
    """
    n_batch, n_rows = labels.shape
    if n_clusters > X.shape[-1]:
        one_hot = X.new_zeros(n_batch, n_rows, n_clusters).scatter_(2, labels[..., None], 1.0)
        return (weights.mT @ one_hot).mT, (X.mT @ one_hot).mT
    one_hot = X.new_zeros(n_batch, n_clusters, n_rows).scatter_(1, labels[:, None, :], 1.0)
    return one_hot @ weights, one_hot @ X


def first_minimum(scores: Tensor) -> Tensor:
    """``scores.min(1).indices`` of ``scores`` (B, K, N): for each (b, n), the first k of the
    smallest score, or of the first NaN where there is one, as argmin picks.

    On many scores on CPU, from the one-hot of the minimum (:func:`_unique_minimum`) and
    one product with the indices 0 .. K - 1, exact in floating point: ``min``'s
    index-tracking reduction across the K rows takes two to four times as long. Where a
    row's minimum is a tie or NaN, ``min`` itself decides.
    """
    if scores.device.type != "cpu" or scores.numel() < _INDEXED_MIN_SCORES:
        # One call: cheaper than several on few scores, and measured slower on CPU only.
        return scores.min(1).indices
    hit = _unique_minimum(scores)
    if hit is None:
        return scores.min(1).indices
    index = torch.arange(scores.shape[1], dtype=scores.dtype, device=scores.device)  # (K,)
    return (index @ hit).long()  # (B, N): one 1 in each row's K scores


def inertia_of(X: Tensor, centers: Tensor, labels: Tensor, weights: Tensor | None) -> Tensor:
    """Sum of squared distances of real points to their centre, (B,), from differences
    rather than the expanded form (which loses digits), in row chunks so that no
    (B, N, d) temporary is ever made. ``weights`` (B|1, N, 1) weigh the points; None
    counts each once (each run's differences then summed by one dot product)."""
    n_batch, n_points, n_features = labels.shape[0], X.shape[1], X.shape[2]
    # Each run's labels index its own centres in the (B * K, d) stack: one index_select,
    # several times faster than a gather along K of the same rows (one run: its labels).
    stacked = centers.reshape(-1, n_features)  # (B * K, d)
    if n_batch > 1:
        labels = labels + torch.arange(n_batch, device=labels.device)[:, None] * centers.shape[1]
    # By the width alone: a run's sum must not depend on how many runs share its batch.
    parts, chunk = [], max(1, _INERTIA_CHUNK_VALUES // n_features)
    for start in range(0, n_points, chunk):
        rows = slice(start, start + chunk)
        nearest = stacked.index_select(0, labels[:, rows].reshape(-1))  # (B * n, d)
        difference = X[:, rows] - nearest.view(n_batch, -1, n_features)  # (B, n, d)
        if weights is None:  # each run's differences by one dot product: a fused pass
            flat = difference.reshape(n_batch, -1)
            parts.append(torch.stack([torch.vdot(run, run) for run in flat]))
        else:
            parts.append((difference.square_().sum(-1) * weights[:, rows, 0]).sum(-1))
    return parts[0] if len(parts) == 1 else torch.stack(parts).sum(0)


def relocate_empty(
    counts: Tensor,
    sums: Tensor,
    far_distances: Tensor,
    far_points: Tensor,
    far_labels: Tensor,
    far_weights: Tensor,
) -> tuple[Tensor, Tensor]:
    """scikit-learn's relocation of empty clusters, batched: the j-th empty cluster takes the
    j-th point farthest from its centre; returns ``counts`` (A, K, 1) and ``sums`` (A, K, d)
    updated. The M farthest points come farthest first: their squared distances to their
    centre (A, M), the points (A, M, d), their clusters (A, M) and weights (A, M).
    """
    n_clusters, n_far = counts.shape[1], far_distances.shape[1]
    empty = counts[..., 0] == 0  # (A, K)
    rank = (empty.cumsum(1) - 1).clamp_(0, n_far - 1)  # (A, K): j-th empty cluster -> j
    movable = far_distances[:, :1] > 0  # (A, 1): not every point sits on its centre
    moves = empty & movable & (empty.cumsum(1) <= n_far)  # (A, K)
    weight = far_weights.gather(1, rank) * moves  # (A, K)
    point = far_points.gather(1, rank[..., None].expand(-1, -1, far_points.shape[-1]))
    moved = point * weight[..., None]  # (A, K, d) weighted
    # What leaves each old cluster, summed by a matmul (deterministic on CUDA too).
    old = torch.nn.functional.one_hot(far_labels.gather(1, rank), n_clusters).to(sums.dtype)
    leaving = old * moves[..., None]  # (A, K new, K old)
    sums = torch.where(moves[..., None], moved, sums - leaving.mT @ moved)
    counts = torch.where(
        moves[..., None], weight[..., None], counts - leaving.mT @ weight[..., None]
    )
    return counts, sums


def _relocate_empty(
    X: Tensor,
    weights: Tensor,
    centers: Tensor,
    labels: Tensor,
    counts: Tensor,
    sums: Tensor,
    padded: Tensor,
) -> tuple[Tensor, Tensor]:
    """:func:`relocate_empty` over the points of ``X``: returns ``counts`` and ``sums``
    updated."""
    n_batch, n_clusters = counts.shape[:2]
    nearest = centers.gather(1, labels[..., None].expand(-1, -1, X.shape[-1]))  # (A, N, d)
    distances = (X.expand(n_batch, -1, -1) - nearest).square().sum(-1)  # (A, N)
    distances = distances.masked_fill(padded, -1.0)
    n_far = min(n_clusters, X.shape[1])
    far_distances, far = distances.topk(n_far, dim=1)  # (A, n_far), farthest first
    rows = torch.arange(n_batch, device=X.device)[:, None]
    far_points = X.expand(n_batch, -1, -1)[rows, far]  # (A, n_far, d)
    far_weights = weights.expand(n_batch, -1, -1)[rows, far, 0]  # (A, n_far)
    return relocate_empty(
        counts, sums, far_distances, far_points, labels.gather(1, far), far_weights
    )


def centers_from_sums(
    counts: Tensor, sums: Tensor, offset: Tensor, *, may_be_empty: bool = True
) -> Tensor:
    """Lloyd's new centres (A, K, d): each cluster's mean, from its (weighted) ``counts``
    (A, K, 1) and ``sums`` (A, K, d) of points less ``offset``; a cluster still empty sits
    on the heaviest one, as in scikit-learn. A caller that knows no count is zero says so
    with ``may_be_empty=False``: one division, without the rule's operations (the same
    bits)."""
    if not may_be_empty:
        return sums / counts + offset
    new_centers = sums / torch.where(counts > 0, counts, 1.0) + offset
    heaviest = counts.argmax(1, keepdim=True).expand(-1, -1, sums.shape[-1])  # (A, 1, d)
    return torch.where(counts > 0, new_centers, new_centers.gather(1, heaviest))


class LloydRows:
    """The rows Lloyd reads when they are held in memory, centred on ``offset``: ``X``
    (B|1, N, d), their ``weights`` (B|1, N, 1) and ``weighted_X`` (``X * weights`` when
    they are sample weights), ``padded`` (B|1, N); one assignment and one update of the
    centres at a time (:meth:`step`). It keeps each run's labels, whose standing still
    is Lloyd's strict convergence."""

    def __init__(
        self, X, offset, weights, padded, n_batch: int, weighted_X=None, traced: bool = False
    ):
        self.X, self.offset, self.weights, self.padded = X, offset, weights, padded
        self.weighted_X = weighted_X
        self.labels_old = X.new_full((n_batch, X.shape[1]), -1, dtype=torch.long)
        self.traced = traced  # keep each step's assignment, for inertia()
        self._last = None  # (centred centres, labels) of the last step, where traced

    def step(self, centers: Tensor, active: Tensor) -> tuple[Tensor, Tensor]:
        """New centres (A, K, d) from ``centers`` and, for each run, whether no label
        changed (A,); the labels of the ``active`` runs are kept for the next step."""
        X, offset, weights = self.X, self.offset, self.weights
        n_clusters = centers.shape[1]
        centered = centers - offset
        labels = assign(X, centered)  # (A, N)
        # Padded rows of X are zero, so only the counts need the weights.
        weighted_X = X if self.weighted_X is None else self.weighted_X
        counts, sums = cluster_totals(labels, n_clusters, weighted_X, weights)
        empty = bool((counts == 0).any())
        if empty:
            counts, sums = _relocate_empty(
                X, weights, centered, labels, counts, sums, self.padded
            )
        new_centers = centers_from_sums(counts, sums, offset, may_be_empty=empty)
        strict = ((labels == self.labels_old) | self.padded).all(-1)  # (A,)
        self.labels_old = torch.where(active[:, None], labels, self.labels_old)
        if self.traced:  # else the labels would outlive the step
            self._last = (centered, labels)
        return new_centers, strict

    def inertia(self) -> Tensor:
        """The inertia (A,) of the last step's assignment to the centres it started from."""
        centered, labels = self._last
        return inertia_of(self.X, centered, labels, self.weights)

    def take(self, keep: Tensor) -> LloydRows:
        taken = object.__new__(LloydRows)
        taken.__dict__.update(self.__dict__)
        for name in ("X", "offset", "weights", "padded", "weighted_X"):
            setattr(taken, name, take(getattr(self, name), keep))
        taken.labels_old, taken._last = self.labels_old[keep], None
        return taken


def run_lloyd(
    rows, centers: Tensor, threshold: Tensor, max_iter: int, trace: list | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """The Lloyd loop of every fit, on data seen through ``rows``, held in memory
    (:class:`LloydRows`) or read by blocks
    (:func:`~transformer_gmm.engine.sufficient_stats.lloyd_from_statistics`): from
    ``centers`` (B, K, d) until each run's squared centre shift is at most its
    ``threshold`` (B|1,), or no label changed, or ``max_iter``; returns (centers, n_iter,
    converged), each run's.

    ``rows`` offers ``step(centers, active)`` (the new centres, and whether no label
    changed), ``take(keep)`` (the runs still going) and, for ``trace``, ``inertia()``.
    ``trace``, a list, receives one :class:`LloydStep` per iteration."""
    n_batch = centers.shape[0]
    n_iter = torch.zeros(n_batch, dtype=torch.long, device=centers.device)
    converged = torch.zeros(n_batch, dtype=torch.bool, device=centers.device)
    batch = ShrinkingBatch(n_batch, centers.device)
    for iteration in range(1, max_iter + 1):
        active = ~converged  # (A,) over the working batch of A <= B datasets
        new_centers, strict = rows.step(centers, active)
        shift = (new_centers - centers).square().sum((1, 2))  # (A,)
        if trace is not None:
            trace.append(LloydStep(batch.rows.clone(), active, rows.inertia(), shift, strict))
        centers = torch.where(active[:, None, None], new_centers, centers)
        n_iter = n_iter.masked_fill(active, iteration)
        converged = converged | (active & (strict | (shift <= threshold)))
        n_running = int((~converged).sum())  # the one host sync per iteration
        if n_running == 0:
            break
        if iteration < max_iter and batch.should_shrink(n_running):
            keep = batch.shrink(converged, n_running, (centers, n_iter, converged))
            rows, threshold = rows.take(keep), take(threshold, keep)
            centers, n_iter, converged = centers[keep], n_iter[keep], converged[keep]
    return batch.results((centers, n_iter, converged))


@dataclass(frozen=True)
class LloydStep:
    """One iteration of the working batch, for ``verbose``: which runs it held (``rows``
    of the full batch), which were still running, the inertia of the assignment to the
    centres it started from, the squared centre shift, and whether no label changed."""

    rows: Tensor  # (A,) long
    active: Tensor  # (A,) bool
    inertia: Tensor  # (A,)
    shift: Tensor  # (A,)
    strict: Tensor  # (A,) bool


class LloydResult(NamedTuple):
    """Lloyd's runs (B of them) from their starting centres, to the end."""

    centers: Tensor  # (B, K, d)
    labels: Tensor  # (B, N) long: each point's closest returned centre, -1 on padding
    inertia: Tensor | None  # (B,) (weighted) squared distances to the centres; None if not asked
    n_iter: Tensor  # (B,) long


def lloyd(
    X: Tensor,
    centers: Tensor,
    *,
    max_iter: int,
    tol: float = 1e-4,
    mask: Tensor | None = None,
    sample_weight: Tensor | None = None,
    trace: list | None = None,
    with_inertia: bool = True,
) -> LloydResult:
    """Lloyd's k-means from ``centers``, batched, with scikit-learn's stopping rule.

    A dataset stops when its labels do not change (strict convergence) or when the
    squared centre shift summed over centres is at most ``tol`` times the mean over
    features of the variance of its real points; the others go on, up to ``max_iter``.
    An empty cluster takes the point farthest from its centre, as scikit-learn relocates
    it; where all points sit on their centres, it joins the heaviest cluster.

    Parameters
    ----------
    X : Tensor of shape (B, N, d) or (1, N, d)
    centers : Tensor of shape (B, K, d)
        Initial centres.
    max_iter : int
        Maximum number of iterations; 0 only assigns points to ``centers``.
    tol : float, default=1e-4
        Relative tolerance on the centre shift.
    mask : bool Tensor of shape (B, N) or (1, N), optional
        True for real points.
    sample_weight : Tensor of shape (B, N) or (1, N), optional
        Non-negative weights of the points, zero on padding: centres are weighted means
        and the inertia a weighted sum, as in scikit-learn's ``KMeans``; the tolerance
        stays unweighted, as there.
    trace : list, optional
        Receives a :class:`LloydStep` per iteration (for a ``verbose`` report).
    with_inertia : bool, default=True
        False: no inertia (None), for callers that read the labels alone; on wide data
        its pass over the rows costs several Lloyd iterations.

    Returns
    -------
    LloydResult
        The runs' centres, labels, inertia and iterations, by name (or unpacked in that
        order).

    Examples
    --------
    >>> import torch
    >>> from transformer_gmm.engine.kmeans import kmeans_plusplus, lloyd
    >>> X, _ = two_blobs()  # one dataset (B=1) of 40 points in two blobs
    >>> g = torch.Generator().manual_seed(0)
    >>> seeds = kmeans_plusplus(X, 2, generator=g)
    >>> result = lloyd(X, seeds, max_iter=100)
    >>> sorted(result.centers[0, :, 0].round().tolist())
    [-4.0, 4.0]
    >>> result.labels.shape, bool(result.labels[0, 0] != result.labels[0, -1])
    (torch.Size([1, 40]), True)
    """
    weighted = [] if sample_weight is None else [sample_weight]
    n_batch = check_batch(X, centers, *weighted, mask=mask)
    if centers.dim() != 3 or centers.shape[-1] != X.shape[-1]:
        raise ValueError(f"centers must have shape (B, K, {X.shape[-1]}), got {centers.shape}")
    X, mask = compact(X), compact(mask)
    weights = point_weights(X, mask)[..., None]  # (B|1, N, 1)
    X = zero_padding(X, mask)

    # Centre the data, as scikit-learn does, so the expanded distances lose less to
    # rounding; the variance of the real points scales the tolerance.
    n_real = weights.sum(1, keepdim=True)  # (B|1, 1, 1)
    offset = X.sum(1, keepdim=True) / n_real  # (B|1, 1, d)
    X = X - offset if mask is None else (X - offset) * weights  # (B|1, N, d), padding at 0
    # The mean over features of the variance is the total sum of squares over n_real * d:
    # one contiguous reduction, with no (N, d) temporary.
    total = torch.linalg.vector_norm(X.flatten(1), dim=1).square()  # (B|1,)
    threshold = tol * total / (n_real.reshape(-1) * X.shape[-1])  # (B|1,)

    # Centres stay in X's coordinates, so kept ones come back bit for bit.
    centers = centers.expand(n_batch, -1, -1)
    padded = (
        torch.zeros(1, X.shape[1], dtype=torch.bool, device=X.device) if mask is None else ~mask
    )
    weighted_X = None
    if sample_weight is not None:  # the counts, sums and inertia weigh the points
        weights = point_weights(X, mask, sample_weight)[..., None]  # (B|1, N, 1)
        weighted_X = X * weights
    n_iter = torch.zeros(n_batch, dtype=torch.long, device=X.device)
    if max_iter > 0:
        rows = LloydRows(X, offset, weights, padded, n_batch, weighted_X, trace is not None)
        centers, n_iter, _ = run_lloyd(rows, centers, threshold, max_iter, trace)

    # Final assignment, so that labels and inertia belong to the returned centres.
    centered = centers - offset
    labels = assign(X, centered)  # (B, N)
    inertia = inertia_of(X, centered, labels, weights) if with_inertia else None  # (B,)
    return LloydResult(centers, labels.masked_fill(padded, -1), inertia, n_iter)
