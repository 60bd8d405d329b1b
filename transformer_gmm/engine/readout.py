"""From a batch of datasets to the transformer's starting points, all in torch.

One pass over B padded datasets (B, N, d) on their device: standardize them
(:mod:`transformer_gmm.engine.standardize`), subsample each to the model's context, run the
backbone, score every point under the transformer's own mixture in model space, and read
the weights and means out with one M-step in the user's space. No step loops over the
datasets in Python, so the cost per dataset is that of the tensor work alone.

Conventions are those of :mod:`transformer_gmm.engine.em`: ``mask`` (bool, (B, N), optional) is
True for real rows; work happens in ``x``'s dtype (float64 on CPU, float32 on CUDA),
except the backbone, which runs in float32, and the standardization, in float64.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import islice
from typing import NamedTuple

import torch
from torch import Tensor

from ..nn.model import MixtureOutput
from . import e_step, logspace, m_step
from .batching import cat_batch, groups_on_shared_rows
from .standardize import Standardization, fit_standardization, subsample_rows, take_rows
from .summary import SUMMARY_ROWS, summarize_views

__all__ = [
    "MixtureInit",
    "KUnknownPass",
    "cholesky_on_kept",
    "cluster_centers",
    "forward",
    "mixture_inits",
    "model_space_responsibilities",
    "reflections",
    "weights_and_means_from_responsibilities",
]

# Tokens per forward chunk. On a GPU, large chunks fill the device while bounding the
# activations (about 6 KB a token at d_model=128, more under attention's math path with a
# mask) whatever the number of datasets. On CPU, chunks whose activations stay in cache
# run faster: on one core, the bundled checkpoint read 300 datasets of 128 points a second
# in chunks of 2,048 tokens, and 180 in chunks of a million.
_TOKENS_PER_CHUNK = {"cpu": 1 << 11, "cuda": 1 << 20}


@dataclass(frozen=True)
class MixtureInit:
    """One of the transformer's starts for B datasets, in the user's space and ``x``'s
    dtype: responsibilities of some rows, and the weights and means they give."""

    x: Tensor  # (B, M, d) the rows the responsibilities are for: all, or those read
    mask: Tensor | None  # (B, M) which of those rows are real; None when all are
    resp: Tensor  # (B, M, K) responsibilities, zero on padded rows
    weights: Tensor  # (B, K)
    means: Tensor  # (B, K, d)


def forward(
    model: torch.nn.Module,
    z: Tensor,
    n_components: int,
    mask: Tensor | None,
    gaps: Tensor | None = None,
    weights: Tensor | None = None,
):
    """The backbone on standardized points (B, C, d_max), on their ``gaps`` (B, C, d_max)
    where the model reads them, and with their ``weights`` (B, C) where they are weighted
    (a summary's cells), in chunks of datasets.

    Float32 by default: bfloat16 moves the readout's means beyond the pinned outputs'
    tolerance (docs/performance.md). A model from ``model_cache.model_on`` multiplies in
    bfloat16 where the user allowed it (:mod:`~transformer_gmm.engine.precision`).
    """
    tokens = _TOKENS_PER_CHUNK.get(z.device.type, _TOKENS_PER_CHUNK["cuda"])
    per_chunk = max(1, tokens // max(1, z.shape[1]))
    chunks = []
    # inference_mode, not no_grad: no autograd bookkeeping at all on the outputs.
    with torch.inference_mode():
        for start in range(0, z.shape[0], per_chunk):
            part = None if mask is None else mask[start : start + per_chunk]
            gaps_part = None if gaps is None else gaps[start : start + per_chunk]
            weights_part = None if weights is None else weights[start : start + per_chunk]
            chunks.append(model(
                z[start : start + per_chunk], n_components, part, gaps_part, weights_part
            ))
    if len(chunks) == 1:
        return chunks[0]
    return MixtureOutput(*(torch.cat(fields) for fields in zip(*chunks, strict=True)))


def model_space_responsibilities(
    z: Tensor, kept: int | Tensor, out: MixtureOutput, mask: Tensor | None
) -> Tensor:
    """Posterior (B, N, K) of each point under the transformer's own mixture, in model space.

    Padded coordinates (``kept``: an int, or a bool (B, d_max)) are scored at mean 0, unit
    variance (uncorrelated with the others under a full covariance), the same constant for
    every component, so none is favoured.
    """
    dtype, d_max = z.dtype, z.shape[-1]
    if isinstance(kept, int):
        kept = torch.arange(d_max, device=z.device)[None] < kept  # (1, d_max)
    kept = kept[:, None, :]  # (B | 1, 1, d_max)
    means = out.means.to(dtype).masked_fill(~kept, 0.0)  # (B, K, d_max)
    if out.scales.dim() == 4:  # full: lower Cholesky factors (B, K, d_max, d_max)
        lower = cholesky_on_kept(out.scales.to(dtype), kept)
        eye = torch.eye(d_max, dtype=dtype, device=z.device)
        # scikit-learn's precisions_cholesky of L L^T is L^-T (its precision is L^-T L^-1).
        inverse = torch.linalg.solve_triangular(lower, eye.expand_as(lower), upper=False)
        covariance_type, covariances, precisions_cholesky = (
            "full", lower @ lower.mT, inverse.mT
        )
    else:
        variances = out.scales.expand(-1, -1, d_max).to(dtype) ** 2
        variances = torch.where(kept, variances, 1.0)  # (B, K, d_max)
        covariance_type, covariances, precisions_cholesky = "diag", variances, variances.rsqrt()
    params = m_step.MixtureParams(
        weights=out.weights.to(dtype),  # (B, K)
        means=means,
        covariances=covariances,
        precisions_cholesky=precisions_cholesky,
    )
    _, log_resp = e_step.e_step(z, params, covariance_type, mask)  # -inf on padded rows
    return logspace.responsibilities(log_resp)


def cholesky_on_kept(lower: Tensor, kept: Tensor) -> Tensor:
    """Cholesky factors (B, K, d_max, d_max) whose rows and columns at padded coordinates
    (``kept`` False; bool, broadcastable to (B, 1, d_max)) are the identity's: there a
    component has unit variance, uncorrelated with the data's coordinates."""
    both_kept = kept[..., :, None] & kept[..., None, :]  # (B | 1, 1, d_max, d_max)
    eye = torch.eye(lower.shape[-1], dtype=lower.dtype, device=lower.device)
    return torch.where(both_kept, lower, eye)


def weights_and_means_from_responsibilities(
    x: Tensor, resp: Tensor, mask: Tensor | None, fallback_weights: Tensor, fallback_means: Tensor
) -> tuple[Tensor, Tensor]:
    """One M-step: weights (B, K) and means (B, K, d) from ``resp`` (B, N, K) on the user's
    points; a component with (almost) no responsibility keeps the head's fallback.
    """
    if mask is None:
        n_real = x.new_full((x.shape[0], 1), x.shape[1])  # (B, 1)
    else:
        resp = resp.masked_fill(~mask[..., None], 0.0)
        x = x.masked_fill(~mask[..., None], 0.0)
        n_real = mask.sum(dim=1, keepdim=True).to(x.dtype)
    mass = resp.sum(dim=1)  # (B, K)
    empty = mass <= 1e-6 * n_real
    means = resp.mT @ x / torch.where(empty, 1.0, mass)[..., None]  # (B, K, d)
    means = torch.where(empty[..., None], fallback_means.to(x.dtype), means)
    weights = torch.where(empty, fallback_weights.to(x.dtype), mass / n_real)
    return weights / weights.sum(dim=-1, keepdim=True), means


def reflections(n_views: int, width: int) -> Tensor:
    """Signs (n_views, width) of the model-space axes in each view: view v negates axis i when
    ``v & (2i + 1)`` has an odd number of bits (view 0 is the data, view 1 negates all).
    """
    return torch.tensor(
        [[(-1.0) ** bin(v & (2 * i + 1)).count("1") for i in range(width)] for v in range(n_views)]
    )


class ReadViews(NamedTuple):
    """What the backbone reads of B datasets in V views, and how it got there.

    A view reads C of its rows, or, where the checkpoint reads summaries
    (``ReadingConfig.summary_cells``), C weighted cells of every row
    (:mod:`~transformer_gmm.engine.summary`): then the rows read are all of them, and
    ``token_of_row`` says which cell each is, so a per-point start labels every row as
    its cell.
    """

    standardization: Standardization
    z: Tensor  # (B, N, d_max) float32, every row in model space
    rows_index: Tensor | None  # (V * B, C) each view's rows, view-major; None: all rows
    rows_mask: Tensor | None  # (V * B, C | N) which rows read are real; None when all are
    signs: Tensor  # (V, d_max) each view's reflection
    views: Tensor  # (V * B, C, d_max), view-major
    views_mask: Tensor | None  # (V * B, C)
    # (V * B, C, d_max) each row's share of each coordinate that was missing, for a model
    # that reads gaps; None where no gaps were given
    views_gaps: Tensor | None = None
    views_weights: Tensor | None = None  # (V * B, C) each cell's count; None: rows are read
    token_of_row: Tensor | None = None  # (V * B, N) each row's cell; None: row i is token i

    def rows(self, x: Tensor) -> Tensor:
        """The rows of ``x`` (B, N, d) each view read, in the user's space: (V * B, C, d),
        or every row, (V * B, N, d), where views read cells or all rows fit."""
        if self.rows_index is None:  # one view reads x itself: no copy
            n_views = self.signs.shape[0]
            return x if n_views == 1 else x.repeat(n_views, 1, 1)
        return _take_each_view(x, self.rows_index)


@dataclass(frozen=True)
class KUnknownPass:
    """The backbone's pass over B datasets under the "K unknown" embedding, kept for the
    starts: every readout head reads its tokens (``MixtureTransformer.read_out``), so the
    fit of the K that P(K | X) chose, or of each candidate that BIC compares, needs no pass
    of its own (:mod:`~transformer_gmm.engine.k_posterior`)."""

    standardization: Standardization  # as for the largest K: every direction up to d_max
    rows: Tensor  # (V * B, C, d) the rows each view read, in the user's space, view-major
    rows_mask: Tensor | None  # (V * B, C) which of them are real; None when all are
    signs: Tensor  # (V, d_max) each view's reflection
    tokens: Tensor  # (V * B, C, D), view-major
    tokens_mask: Tensor | None  # (V * B, C)

    @property
    def n_views(self) -> int:
        return self.signs.shape[0]


def read_views(
    model,
    x: Tensor,
    mask: Tensor | None,
    n_components: int,
    generator,
    n_views: int,
    gaps: Tensor | None = None,
    summary: bool = True,
) -> ReadViews:
    """Standardize ``x`` (B, N, d) as for ``n_components`` and stack ``n_views`` views for
    the backbone ``model``: view v reads its own draw of at most
    ``model.reading_config.context_size`` rows (the same rows in every view where all fit),
    reflected by :func:`reflections`.

    Where a dataset has more rows than the context, each view reads other rows: a second
    look at large data, which a reflection of the same rows is not. ``gaps`` (B, N, d),
    for a model that reads them (the plan keeps them for no other), marks the entries of
    ``x`` that were missing (and filled): the model reads each row's share of each
    coordinate that they make up (a share is unsigned, so no view reflects it).

    Where the checkpoint reads summaries (``summary_cells``) and ``summary`` allows, each
    view reads its own draw of weighted cells (:mod:`~transformer_gmm.engine.summary`)
    instead; never with ``gaps``, whose shares are those of rows.
    """
    reads = model.reading_config
    standardization = fit_standardization(
        x, mask, model.config.d_max, n_components, reads.noise_directions
    )
    shape = tuple(x.shape[:2])
    z = standardization.transform(x)  # (B, N, d_max) float32
    signs = reflections(n_views, z.shape[-1]).to(z)  # (V, d_max)
    if reads.summary_cells and summary and gaps is None and z.shape[1] <= SUMMARY_ROWS:
        summaries = summarize_views(
            z, mask, reads.summary_cells, generator, n_views, reads.summary_iterations
        )
        if summaries is not None:
            return _summary_views(standardization, z, mask, signs, summaries)
    # View by view, so that view 0's draw is the same for any number of views.
    draws = [subsample_rows(shape, mask, reads.context_size, generator) for _ in range(n_views)]
    if draws[0][0] is None:  # every row fits: each view reads them all
        rows_index, z_read = None, z.repeat(n_views, 1, 1)  # (V * B, N, d_max)
        rows_mask = None if mask is None else mask.repeat(n_views, 1)
    else:
        rows_index = torch.cat([index for index, _ in draws])  # (V * B, C), view-major
        z_read = _take_each_view(z, rows_index)  # (V * B, C, d_max)
        rows_mask = None
        if any(read_mask is not None for _, read_mask in draws):
            all_real = draws[0][0].new_ones(draws[0][0].shape, dtype=torch.bool)
            rows_mask = torch.cat([all_real if m is None else m for _, m in draws])
    views = signs.repeat_interleave(x.shape[0], dim=0)[:, None, :] * z_read  # (V * B, C, d_max)
    views_gaps = None
    if gaps is not None:
        shares = standardization.transform_gaps(gaps)  # (B, N, d_max)
        if rows_index is None:
            views_gaps = shares.repeat(n_views, 1, 1)
        else:
            views_gaps = _take_each_view(shares, rows_index)
    return ReadViews(
        standardization, z, rows_index, rows_mask, signs, views, rows_mask, views_gaps
    )


def _summary_views(standardization, z, mask, signs, summaries) -> ReadViews:
    """:class:`ReadViews` of the views' summaries (:func:`summary.summarize`, view-major):
    each view's cells of every row."""
    n_datasets, n_views = z.shape[0], len(summaries)
    centres = torch.cat([cells.centres for cells in summaries])  # (V * B, C, d_max)
    views = signs.repeat_interleave(n_datasets, dim=0)[:, None, :] * centres
    rows_mask = None if mask is None else mask.repeat(n_views, 1)  # (V * B, N)
    counts = torch.cat([cells.counts for cells in summaries])  # (V * B, C)
    token_of_row = torch.cat([cells.cell_of_row for cells in summaries])  # (V * B, N)
    return ReadViews(
        standardization, z, None, rows_mask, signs, views, None, None, counts, token_of_row
    )


def _take_each_view(t: Tensor, rows_index: Tensor) -> Tensor:
    """Each view's rows of ``t`` (B, N, F), for ``rows_index`` (V * B, C): (V * B, C, F)."""
    per_view = rows_index.split(t.shape[0])
    return torch.cat([take_rows(t, index) for index in per_view])


class View(NamedTuple):
    """One view's output, mapped back to the unreflected space, and the rows it read."""

    out: MixtureOutput
    rows: Tensor  # (B, C | N, d) in the user's space
    rows_mask: Tensor | None  # (B, C | N) which are real; None when all are
    token_of_row: Tensor | None = None  # (B, N) the cell each row was read in; None: its own


def _read(
    model: torch.nn.Module,
    x: Tensor,
    mask: Tensor | None,
    n_components: int,
    generator,
    n_starts: int,
    k_unknown_pass: KUnknownPass | None = None,
    gaps: Tensor | None = None,
) -> tuple[Standardization, Tensor, list[View]]:
    """Standardize, subsample, and run the backbone on every view ``n_starts`` needs in one
    batch (reading ``gaps`` where the model does), or read K's head on ``k_unknown_pass``'s
    tokens; returns the standardization, every row in model space, and the views.
    """
    n_views, n_datasets = -(-n_starts // 2), x.shape[0]
    if k_unknown_pass is None:
        read = read_views(model, x, mask, n_components, generator, n_views, gaps)
        out = forward(
            model, read.views, n_components, read.views_mask, read.views_gaps,
            read.views_weights,
        )
        standardization, z, signs = read.standardization, read.z, read.signs
        rows, rows_mask = read.rows(x), read.rows_mask  # (V * B, C | N, d), (V * B, C | N)
        token_of_row = read.token_of_row
    else:
        if n_views > k_unknown_pass.n_views:
            raise ValueError(f"{n_starts} starts need {n_views} views; the pass has fewer.")
        n_tokens = n_views * n_datasets
        tokens_mask = k_unknown_pass.tokens_mask
        tokens_mask = None if tokens_mask is None else tokens_mask[:n_tokens]
        with torch.inference_mode():
            out = model.read_out(k_unknown_pass.tokens[:n_tokens], n_components, tokens_mask)
        standardization, signs = k_unknown_pass.standardization, k_unknown_pass.signs[:n_views]
        z = standardization.transform(x)
        rows, rows_mask = k_unknown_pass.rows, k_unknown_pass.rows_mask
        token_of_row = None  # the pass reads rows (k_posterior.py)
    views = []
    for v, sign in enumerate(signs):
        part = slice(v * n_datasets, (v + 1) * n_datasets)
        view = MixtureOutput(*(field[part] for field in out))
        view_mask = None if rows_mask is None else rows_mask[part]
        cells = None if token_of_row is None else token_of_row[part]
        # Where the part is every row read (one view), the rows themselves: x, as read.
        view_rows = rows if rows.shape[0] == n_datasets else rows[part]
        views.append(View(view._replace(means=view.means * sign), view_rows, view_mask, cells))
    return standardization, z, views


class _Responsibilities(NamedTuple):
    """A start before its M-step: the rows, their mask, their responsibilities, and the
    view's output (whose weights and means an empty component keeps)."""

    rows: Tensor
    rows_mask: Tensor | None
    resp: Tensor
    out: MixtureOutput


def _starts(
    pending: list[_Responsibilities], standardization: Standardization
) -> tuple[MixtureInit, ...]:
    """One M-step (weights and means) on each start's responsibilities, zero on padded
    rows; an empty component keeps the head's. Starts on the same rows of one dataset
    share one batched product."""
    starts = []
    for group in groups_on_shared_rows(pending, lambda p: (p.rows, p.rows_mask)):
        weights, means = weights_and_means_from_responsibilities(
            group[0].rows,
            cat_batch([p.resp for p in group]),  # start s is row s
            group[0].rows_mask,
            fallback_weights=cat_batch(
                [p.out.weights / p.out.weights.sum(dim=-1, keepdim=True) for p in group]
            ),
            fallback_means=cat_batch(
                [standardization.inverse_transform_means(p.out.means) for p in group]
            ),
        )
        parts = zip(group, weights.chunk(len(group)), means.chunk(len(group)), strict=True)
        starts += [MixtureInit(p.rows, p.rows_mask, p.resp, w, m) for p, w, m in parts]
    return tuple(starts)


def mixture_inits(
    model: torch.nn.Module,
    x: Tensor,
    mask: Tensor | None,
    n_components: int,
    generator: torch.Generator,
    n_starts: int = 2,
    k_unknown_pass: KUnknownPass | None = None,
    gaps: Tensor | None = None,
) -> tuple[MixtureInit, ...]:
    """The transformer's starts, two from each view of the data, in one forward pass.

    Per view, one start from the transformer's mixture (scoring all N rows) and one from its
    per-point head (the rows it read), each turned into weights and means in the user's space
    by one M-step. The two often lead EM to different optima (docs/benchmarks.md); starts
    beyond two come from :func:`reflections` of the data.

    Parameters
    ----------
    model : MixtureTransformer
        On ``x``'s device.
    x : Tensor of shape (B, N, d)
        The datasets, padded.
    mask : bool Tensor of shape (B, N), optional
        True for real rows.
    n_components : int
        K, which the model must have a head for.
    generator : torch.Generator
        Draws the rows read where a dataset has more than ``context_size``.
    n_starts : int, default=2
        How many starts, view by view (``ceil(n_starts / 2)`` views).
    k_unknown_pass : KUnknownPass, optional
        The pass under the "K unknown" embedding to read K's head on, instead of a pass of
        K's own; ``x`` then holds the rows the mixture starts score.
    gaps : bool Tensor of shape (B, N, d), optional
        True where an entry of ``x`` was missing and filled (with its column's mean), for a
        model that reads gaps (:func:`read_views`).

    Returns
    -------
    starts : tuple of MixtureInit
    """
    return _view_starts(
        model, x, mask, n_components, generator, n_starts, _point_probs, True, k_unknown_pass,
        gaps,
    )


def _point_probs(out: MixtureOutput, read_mask: Tensor | None, dtype: torch.dtype) -> Tensor:
    """The per-point head's probabilities (B, C, K), zero on padded rows."""
    point_probs = out.point_logits.softmax(dim=-1).to(dtype)
    return point_probs if read_mask is None else point_probs.masked_fill(~read_mask[..., None], 0.0)


def _point_labels(out: MixtureOutput, read_mask: Tensor | None, dtype: torch.dtype) -> Tensor:
    """The per-point head's labels (B, C, K), one-hot."""
    labels = out.point_logits.argmax(dim=-1)  # (B, C)
    return torch.nn.functional.one_hot(labels, out.weights.shape[-1]).to(dtype)


def _view_starts(
    model,
    x,
    mask,
    n_components,
    generator,
    n_starts,
    point_resp,
    mixture_first: bool,
    k_unknown_pass,
    gaps=None,
) -> tuple[MixtureInit, ...]:
    """The first ``n_starts`` of, view by view, the start from the transformer's mixture and
    the one from ``point_resp(out, read_mask, dtype)`` on the rows read (in that order, or
    the per-point one first); a start past ``n_starts`` is never built (the mixture start
    scores every row)."""
    standardization, z, views = _read(
        model, x, mask, n_components, generator, n_starts, k_unknown_pass, gaps
    )

    def mixture(view: View) -> _Responsibilities:  # every row, under the view's mixture
        resp = model_space_responsibilities(z.to(x.dtype), standardization.n_kept, view.out, mask)
        return _Responsibilities(x, mask, resp, view.out)

    def per_point(view: View) -> _Responsibilities:
        if view.token_of_row is None:
            resp = point_resp(view.out, view.rows_mask, x.dtype)
        else:  # every row takes its cell's probabilities
            resp = take_rows(point_resp(view.out, None, x.dtype), view.token_of_row)
            if view.rows_mask is not None:
                resp = resp.masked_fill(~view.rows_mask[..., None], 0.0)
        return _Responsibilities(view.rows, view.rows_mask, resp, view.out)

    order = (mixture, per_point) if mixture_first else (per_point, mixture)
    pending = list(islice((make(view) for view in views for make in order), n_starts))
    return _starts(pending, standardization)


def cluster_centers(
    model: torch.nn.Module,
    x: Tensor,
    mask: Tensor | None,
    n_clusters: int,
    generator: torch.Generator,
    n_starts: int = 2,
    k_unknown_pass: KUnknownPass | None = None,
) -> tuple[Tensor, ...]:
    """The transformer's sets of centres (B, K, d), two from each view, in one forward pass:
    the mean of the read points of each head label, then :func:`mixture_inits`' means.
    Arguments as :func:`mixture_inits`.
    """
    starts = _view_starts(
        model, x, mask, n_clusters, generator, n_starts, _point_labels, False, k_unknown_pass
    )
    return tuple(start.means for start in starts)
