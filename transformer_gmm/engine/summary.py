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

from .kmeans import lloyd
from .standardize import subsample_rows, take_rows

__all__ = ["Cells", "SUMMARY_ROWS", "LLOYD_ITERATIONS", "summarize"]

# The most rows a summary is cut from: the size above which the fit already screens its
# starts on a subsample (``engine.fit.SELECTION_ROWS``). There the forward pass is a small
# share of a fit, and 128 drawn rows led EM at least as far as 32 or 128 cells of many
# rows (docs/benchmarks.md, "Reading cells"), so larger datasets are read as rows.
SUMMARY_ROWS = 8192
# Lloyd's iterations from the drawn rows: the cells need only tile the data.
LLOYD_ITERATIONS = 8


class Cells(NamedTuple):
    """B datasets summarized in model space: C weighted centres, and each row's cell."""

    centres: Tensor  # (B, C, d_max) float32, what the backbone reads
    counts: Tensor  # (B, C) real rows in each cell, the centres' weights (0: an empty cell)
    cell_of_row: Tensor  # (B, N) long: each row's cell (0 on padding, which weighs nothing)


def summarize(
    z: Tensor, mask: Tensor | None, n_cells: int, generator: torch.Generator
) -> Cells | None:
    """Lloyd's ``n_cells`` cells of the rows ``z`` (B, N, d_max) in model space, from as many
    drawn rows; None where the rows are no more than the cells or more than
    ``SUMMARY_ROWS`` (a batch by its largest dataset): those are read as rows.

    Examples
    --------
    >>> import torch
    >>> z = torch.cat([torch.zeros(1, 30, 2), torch.ones(1, 10, 2)], dim=1)
    >>> cells = summarize(z, None, 2, torch.Generator().manual_seed(0))
    >>> sorted(cells.counts[0].tolist()), sorted(cells.centres[0, :, 0].tolist())
    ([10.0, 30.0], [0.0, 1.0])
    """
    if z.shape[1] > SUMMARY_ROWS:
        return None
    first, first_mask = subsample_rows(tuple(z.shape[:2]), mask, n_cells, generator)
    if first is None:  # no more rows than cells
        return None
    centres = take_rows(z, first)  # (B, C, d_max): real rows first
    if first_mask is not None:
        # A dataset with fewer rows than cells: its spare cells start on its first row
        # (Lloyd relocates the empty ones), never on padding.
        centres = torch.where(first_mask[..., None], centres, centres[:, :1])
    result = lloyd(z, centres, max_iter=LLOYD_ITERATIONS, mask=mask, with_inertia=False)
    cell_of_row = result.labels.clamp_min(0)  # (B, N); padding (-1) weighs nothing below
    real = z.new_ones(z.shape[:2]) if mask is None else mask.to(z.dtype)
    counts = z.new_zeros(centres.shape[:2]).scatter_add_(1, cell_of_row, real)  # (B, C)
    return Cells(result.centers, counts, cell_of_row)
