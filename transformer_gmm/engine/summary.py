"""A weighted summary of a dataset for the backbone to read: Lloyd's cells with counts.

Softmax attention over w copies of a point is attention over the point with log w added to
its logits, and every other step of the backbone is per point, so the model reads a point
of weight w exactly as w copies of it (``MixtureTransformer.forward``'s ``weights``). A
dataset cut into C cells, each read as its centre weighted by its count, is then read as
the multiset of the centres: C tokens that summarize every row, where a uniform draw of C
rows would show the model C rows alone, and a forward pass over fewer tokens than the
context costs less. Used where the checkpoint's ``ReadingConfig.summary_cells`` asks for it
(:func:`readout.read_views`), on datasets of at most ``SUMMARY_ROWS`` rows.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ..nn.config import ReadingConfig
from .kmeans import lloyd
from .standardize import subsample_rows, take_rows

__all__ = ["Cells", "SUMMARY_ROWS", "LLOYD_ITERATIONS", "summarize", "summarize_views"]

# The most rows of a dataset that fits read as a summary: the small data where cells were
# measured against rows (the real-data benchmark's tables have at most 1,797 rows), and
# below the subsample of ``engine.fit.SELECTION_ROWS`` rows that larger fits build their
# starts on, so those read rows: there 128 drawn rows led EM at least as far as 32 or 128
# cells of many rows (docs/benchmarks.md, "Reading cells"), and Lloyd's cells of 8,192
# rows cost tens of milliseconds.
SUMMARY_ROWS = 2048
# Lloyd's iterations from the drawn rows where no reading config says: its default.
LLOYD_ITERATIONS = ReadingConfig().summary_iterations


class Cells(NamedTuple):
    """B datasets summarized in model space: C weighted centres, and each row's cell."""

    centres: Tensor  # (B, C, d_max) float32, what the backbone reads
    counts: Tensor  # (B, C) real rows in each cell, the centres' weights (0: an empty cell)
    cell_of_row: Tensor  # (B, N) long: each row's cell (0 on padding, which weighs nothing)


def summarize(
    z: Tensor,
    mask: Tensor | None,
    n_cells: int,
    generator: torch.Generator,
    n_iterations: int = LLOYD_ITERATIONS,
) -> Cells | None:
    """Lloyd's ``n_cells`` cells of the rows ``z`` (B, N, d_max) in model space, from as many
    drawn rows, in at most ``n_iterations`` iterations; None where the rows are no more
    than the cells (a batch by its largest dataset): those are read as rows, as are
    datasets of more than ``SUMMARY_ROWS`` rows (:func:`readout.read_views` decides).

    Examples
    --------
    >>> import torch
    >>> z = torch.cat([torch.zeros(1, 30, 2), torch.ones(1, 10, 2)], dim=1)
    >>> cells = summarize(z, None, 2, torch.Generator().manual_seed(0))
    >>> sorted(cells.counts[0].tolist()), sorted(cells.centres[0, :, 0].tolist())
    ([10.0, 30.0], [0.0, 1.0])
    """
    views = summarize_views(z, mask, n_cells, generator, 1, n_iterations)
    return None if views is None else views[0]


def summarize_views(
    z: Tensor,
    mask: Tensor | None,
    n_cells: int,
    generator: torch.Generator,
    n_views: int,
    n_iterations: int = LLOYD_ITERATIONS,
) -> list[Cells] | None:
    """:func:`summarize` ``n_views`` times, each view from its own draw (in view order, as
    that many calls draw them), in one batched Lloyd: on small data its iterations are a
    few dozen small operations each, which the views then share."""
    draws = [subsample_rows(tuple(z.shape[:2]), mask, n_cells, generator) for _ in range(n_views)]
    if draws[0][0] is None:  # no more rows than cells
        return None
    starts = []
    for first, first_mask in draws:
        centres = take_rows(z, first)  # (B, C, d_max): real rows first
        if first_mask is not None:
            # A dataset with fewer rows than cells: its spare cells start on its first row
            # (Lloyd relocates the empty ones), never on padding.
            centres = torch.where(first_mask[..., None], centres, centres[:, :1])
        starts.append(centres)
    n_datasets = z.shape[0]
    if n_datasets > 1:  # Lloyd's runs read one dataset each, or all the same one
        z = z.repeat(n_views, 1, 1)  # (V * B, N, d_max), view-major
        mask = None if mask is None else mask.repeat(n_views, 1)
    result = lloyd(z, torch.cat(starts), max_iter=n_iterations, mask=mask, with_inertia=False)
    cell_of_row = result.labels.clamp_min(0)  # (V * B, N); padding (-1) weighs nothing below
    real = z.new_ones(cell_of_row.shape)
    if mask is not None:
        real = mask.to(z.dtype).expand_as(cell_of_row)
    counts = z.new_zeros(result.centers.shape[:2]).scatter_add_(1, cell_of_row, real)
    return [
        Cells(*parts)
        for parts in zip(
            result.centers.split(n_datasets),
            counts.split(n_datasets),
            cell_of_row.split(n_datasets),
            strict=True,
        )
    ]
