"""The map to the model's input space, in torch: B datasets at once.

The backbone reads points of width ``d_max`` with zero mean and unit average variance per
coordinate. :func:`fit_standardization` fits that map: centre, principal axes, a sign fix,
the top :func:`n_kept_directions` of them, one global scale, zero padding to ``d_max``.
It runs on a padded batch (B, N, d) with an optional bool ``mask`` (B, N) of real rows, on
the batch's device, with no per-dataset Python. Fitting standardizes its batch of datasets
with it, and the training task sampler each task as a batch of one, so the model sees at
inference exactly the distribution it was trained on. The statistics are computed in
float64 whatever the input's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

__all__ = [
    "Standardization",
    "fit_standardization",
    "n_kept_directions",
    "subsample_rows",
    "take_rows",
    "weighted_rows",
]


def n_kept_directions(
    n_features: int, n_components: int, d_max: int, noise_directions: int = 0
) -> int:
    """How many coordinates the model reads: all ``d``, or the top ``K - 1 + noise_directions``
    principal directions (at most ``d_max``), where the means live, plus noise that shows the
    model how wide the components are.
    """
    return min(n_features, d_max, max(n_components - 1, 1) + noise_directions)


@dataclass(frozen=True)
class Standardization:
    """B affine maps ``z = basis.T @ (x - center) / scale``, zero-padded to ``d_max``: ``center``
    (B, d) float64, one ``scale`` (B,) per dataset, orthonormal ``basis`` (B, d, n_kept) of
    principal directions (largest variance first, largest loading positive). Where fitting
    already mapped its own rows (``rows``), their map ``kept`` (B, N, n_kept) is held, and
    :meth:`transform` of those rows reads it instead of another pass over them.
    """

    center: Tensor
    scale: Tensor
    basis: Tensor
    d_max: int
    rows: Tensor | None = None
    kept: Tensor | None = None

    @property
    def n_kept(self) -> int:
        return self.basis.shape[-1]

    def transform(self, x: Tensor) -> Tensor:
        """Map points (B, N, n_features) to float32 model inputs (B, N, d_max)."""
        if x is self.rows and self.kept is not None:
            kept = self.kept
        else:
            centered = x.to(torch.float64) - self.center[:, None, :]
            kept = centered @ self.basis / self.scale[:, None, None]  # (B, N, n_kept)
        return torch.nn.functional.pad(kept.float(), (0, self.d_max - self.n_kept))

    def transform_gaps(self, missing: Tensor) -> Tensor:
        """Each point's share of each model-space coordinate that was missing: ``missing``
        (B, N, n_features) bool, True where an entry was filled, to float32 (B, N, d_max) in
        [0, 1]. A coordinate is a unit direction, so its share is the sum of its squared
        loadings on the filled features: 0 where the point is complete, 1 where the
        coordinate reads filled entries alone."""
        shares = missing.to(torch.float64) @ self.basis.square()  # (B, N, n_kept)
        return torch.nn.functional.pad(shares.float(), (0, self.d_max - self.n_kept))

    def inverse_transform_means(self, means: Tensor) -> Tensor:
        """Map model-space means (B, K, d_max) back to float64 (B, K, n_features)."""
        kept = means[..., : self.n_kept].to(torch.float64)
        return self.center[:, None, :] + self.scale[:, None, None] * kept @ self.basis.mT


def fit_standardization(
    x: Tensor, mask: Tensor | None, d_max: int, n_components: int, noise_directions: int = 0
) -> Standardization:
    """Fit, for each dataset of ``x`` (B, N, d) with real rows ``mask`` (B, N) or None, the map
    to model space.

    Each map depends on the real rows only; translating and scaling a dataset leaves the
    transformed points unchanged (to rounding), so the model's estimate is equivariant.

    Examples
    --------
    >>> import torch
    >>> from transformer_gmm.engine.standardize import fit_standardization
    >>> x = torch.tensor([[[0.0, 0.0], [2.0, 0.0], [4.0, 0.0], [9.0, 9.0]]])
    >>> mask = torch.tensor([[True, True, True, False]])  # the last row is padding
    >>> standardization = fit_standardization(x, mask, d_max=3, n_components=3)
    >>> standardization.center.tolist(), standardization.basis[0, :, 0].tolist()
    ([[2.0, 0.0]], [1.0, 0.0])
    """
    rows, x = x, x.to(torch.float64)
    n_features = x.shape[-1]
    n_kept = n_kept_directions(n_features, n_components, d_max, noise_directions)
    if mask is None:
        counts = x.new_full((x.shape[0], 1), x.shape[1])  # (B, 1)
        center = x.mean(dim=1)  # (B, d)
        offset = center  # x is centred on the fly: no second (B, N, d) array
    else:
        padding = ~mask[..., None]  # (B, N, 1); padded rows may hold NaN: fill, not multiply
        counts = mask.sum(dim=1, keepdim=True).to(torch.float64)  # (B, 1)
        center = x.masked_fill(padding, 0.0).sum(dim=1) / counts  # (B, d)
        x = (x - center[:, None, :]).masked_fill(padding, 0.0)  # centred, zero on padding
        offset = None
    # The principal axes even when every feature is kept: the backbone is not rotation
    # equivariant, and a canonical orientation (largest variance first) is one thing less
    # for it to learn. Ascending eigenvalues: the last n_kept, reversed, are the largest.
    axes = _principal_axes(x, counts, n_kept, offset)
    variances = axes.values.flip(-1)[:, :n_kept].clamp_min(0.0)  # (B, n_kept)
    basis = axes.vectors.flip(-1)[..., :n_kept]  # (B, d, n_kept)
    # Each direction's sign: its largest loading (the first, on ties) is positive.
    largest = basis.abs().argmax(dim=1, keepdim=True)  # (B, 1, n_kept)
    signs = basis.gather(1, largest).sign()
    signs = torch.where(signs == 0, 1.0, signs)
    basis = basis * signs
    scale = variances.mean(dim=-1).sqrt()  # (B,)
    # All points coincide: any scale maps them to the origin.
    degenerate = ~torch.isfinite(scale) | (scale <= torch.finfo(torch.float64).tiny)
    scale = torch.where(degenerate, 1.0, scale)
    kept = None
    if axes.scores is not None:  # the rows on the axes, read while finding them
        kept = axes.scores.flip(-1)[..., :n_kept] * signs / scale[:, None, None]
    return Standardization(
        center=center, scale=scale, basis=basis, d_max=d_max, rows=rows, kept=kept
    )


class Axes(NamedTuple):
    """Principal axes: eigenvalues (B, m), ascending, eigenvectors (B, d, m), and, where
    they were read on the way, every row less the centre on them (B, N, m), else None."""

    values: Tensor
    vectors: Tensor
    scores: Tensor | None


# From this many features (and at least as many rows: with fewer, the rows' span gives
# every axis exactly and cheaply), the few leading axes are found by randomized subspace
# iteration (leading_axes) rather than from every eigenvector of the d x d covariance: at
# d = 768 on 8,192 rows, about 0.05 s instead of 0.28 s on one CPU thread.
RANDOMIZED_FROM_FEATURES = 64
# Its subspace iterations, and the directions drawn beyond those asked for (Halko,
# Martinsson & Tropp 2011). They run in float32 (the products are several times faster on
# CPU); the axes and their variances are then read in float64 within the found subspace.
POWER_ITERATIONS = 3
OVERSAMPLE = 8
# The iterations read at most this many rows (the first: in canonical order, a uniform
# draw); the axes' variances are then read on every row.
AXES_ROWS = 2048
# Up to this many rows per axis sought (and fewer rows than features), the rows' Gram
# matrix gives the axes' subspace exactly, for less than the iterations cost (50 x 2,000:
# 0.8 ms against 2.2 ms on one CPU thread).
GRAM_ROWS_PER_AXIS = 8
# The smallest Gram eigenvalue kept against the largest for which _axes_from_gram's axes
# stay orthonormal to about 1e-10 (their error is about eps times the ratio's inverse).
GRAM_CONDITION = 1e-6


def leading_axes(
    x: Tensor, counts: Tensor, n_axes: int, offset: Tensor | None = None
) -> Axes:
    """The ``n_axes`` leading principal axes of the rows ``x`` (B, N, d) less ``offset`` (B,
    d) (``x`` already centred where None; zero on padding; ``counts`` (B, 1) real rows):
    :class:`Axes` with m >= n_axes eigenvectors, and every row's scores on them. The
    subspace comes from the first ``AXES_ROWS`` rows (real rows come first): exactly, from
    their Gram matrix, where they are few (``GRAM_ROWS_PER_AXIS``) and fewer than the
    features; else by randomized subspace iteration from a generator of its own, so that
    the same rows give the same axes and no other draw of a fit moves. The axes and
    variances within it are then read on every row.

    Examples
    --------
    >>> import torch
    >>> scales = torch.ones(80, dtype=torch.float64)
    >>> scales[0] = 10.0  # the first feature varies most
    >>> x = torch.randn(1, 500, 80, dtype=torch.float64) * scales
    >>> axes = leading_axes(x - x.mean(1, keepdim=True), torch.tensor([[500.0]]), 2)
    >>> axes.vectors.shape[1], round(abs(float(axes.vectors[0, 0, -1])), 2)
    (80, 1.0)
    """
    n_features = x.shape[-1]
    width = min(n_features, n_axes + OVERSAMPLE)
    rows = x[:, :AXES_ROWS]
    if offset is not None:
        rows = rows - offset[:, None, :]
    if width <= rows.shape[1] <= GRAM_ROWS_PER_AXIS * width and rows.shape[1] < n_features:
        # The rows' span holds every axis: the Gram matrix's leading eigenvectors (N x N,
        # no d x d product) map to the leading axes' subspace, refined on every row below.
        gram_values, vectors = torch.linalg.eigh(rows @ rows.mT)  # ascending (B, n, n)
        if x.shape[1] == rows.shape[1]:  # every row: the Gram matrix gives the axes too
            axes = _axes_from_gram(rows, gram_values[..., -width:], vectors[..., -width:], counts)
            if axes is not None:
                return axes
        q = rows.mT @ vectors[..., -width:]  # (B, d, width)
    else:
        generator = torch.Generator(device=x.device).manual_seed(0)
        rows = rows.float()
        q = torch.randn((x.shape[0], n_features, width), generator=generator, device=x.device)
        for _ in range(POWER_ITERATIONS):
            q = torch.linalg.qr(rows.mT @ (rows @ q)).Q  # (B, d, width)
    del rows
    q = torch.linalg.qr(q.to(x.dtype)).Q
    scores = x @ q  # (B, N, width)
    if offset is not None:  # (x - offset) @ q, without the centred copy of x
        scores = scores - offset[:, None, :] @ q
    eigenvalues, vectors = torch.linalg.eigh(scores.mT @ scores / counts[..., None])
    return Axes(eigenvalues, q @ vectors, scores @ vectors)  # ascending


def _axes_from_gram(
    rows: Tensor, values: Tensor, vectors: Tensor, counts: Tensor
) -> Axes | None:
    """The :class:`Axes` of centred ``rows`` (B, N, d), every row (zero on padding), from
    the leading eigenpairs of their Gram matrix, ``values`` (B, m) ascending and
    ``vectors`` (B, N, m): each axis is ``rows.T v / sqrt(value)`` and the rows' scores on
    it ``v sqrt(value)``, with no orthogonalization or second pass over the rows. None
    where an eigenvalue kept is too small against the largest (``GRAM_CONDITION``):
    there the axes so made lose their orthogonality, and the caller orthogonalizes."""
    values = values.clamp_min(0.0)
    if not bool((values[..., 0] > GRAM_CONDITION * values[..., -1]).all()):
        return None
    root = values.sqrt()[:, None, :]  # (B, 1, m)
    axes = rows.mT @ (vectors / root)  # (B, d, m), orthonormal
    return Axes(values / counts, axes, vectors * root)



def _principal_axes(
    x: Tensor, counts: Tensor, n_kept: int, offset: Tensor | None = None
) -> Axes:
    """:class:`Axes` (m >= n_kept) of the covariance of the rows ``x`` (B, N, d) less
    ``offset`` (already centred where None).

    Those of the d x d covariance (O(N d^2) time, O(d^2) memory; no scores) where there
    are at least as many rows as features, or fewer rows than axes kept; the leading ones
    alone (:func:`leading_axes`) on many features, and on wide data (N < d), whose
    covariance lives in the rows' span.
    """
    n_rows, n_features = x.shape[-2:]
    tall_and_wide = n_rows >= n_features >= max(RANDOMIZED_FROM_FEATURES, 4 * n_kept)
    if tall_and_wide or n_kept <= n_rows < n_features:
        return leading_axes(x, counts, n_kept, offset)
    centered = x if offset is None else x - offset[:, None, :]
    covariance = centered.mT @ centered / counts[..., None]  # (B, d, d)
    return Axes(*torch.linalg.eigh(covariance), None)


def subsample_rows(
    shape: tuple[int, int], mask: Tensor | None, context_size: int, generator: torch.Generator
) -> tuple[Tensor | None, Tensor | None]:
    """The rows the backbone reads: ``(index, read_mask)``, a sorted uniform draw of
    ``context_size`` rows per dataset (real rows first), or ``(None, None)`` when every row fits.
    """
    if shape[1] <= context_size:
        return None, mask
    keys = torch.rand(shape, generator=generator, device=generator.device)  # in [0, 1)
    if mask is not None:
        keys = keys.masked_fill(~mask, 2.0)  # padding is read last, only to fill
    index = keys.topk(context_size, dim=1, largest=False, sorted=False).indices
    index = index.sort(dim=1).values  # (B, C)
    read_mask = None if mask is None else mask.gather(1, index)
    if read_mask is not None and bool(read_mask.all()):
        read_mask = None
    return index, read_mask


def take_rows(t: Tensor, index: Tensor) -> Tensor:
    """Rows ``index`` (B, C) of each dataset of ``t`` (B, N, F): (B, C, F)."""
    return t.gather(1, index[..., None].expand(-1, -1, t.shape[-1]))


def weighted_rows(
    x: torch.Tensor, sample_weight: torch.Tensor, context_size: int, generator: torch.Generator
) -> tuple[torch.Tensor, None]:
    """The rows the transformer reads of weighted data: ``min(N, context_size)`` rows of
    each dataset of ``x`` (B, N, d), drawn with replacement in proportion to their weights
    (B, N), so a row of weight w is read about w times as often as one of weight 1; and
    their mask (None: no drawn row is padding, whose weight is zero)."""
    cumulative = sample_weight.cumsum(dim=-1)  # (B, N)
    n_read = min(x.shape[1], context_size)
    u = torch.rand(x.shape[0], n_read, generator=generator, dtype=x.dtype, device=x.device)
    # The first row whose cumulative weight exceeds u * total: never one of weight zero.
    index = torch.searchsorted(cumulative, u * cumulative[:, -1:], right=True)
    return take_rows(x, index.clamp_max_(x.shape[1] - 1)), None
