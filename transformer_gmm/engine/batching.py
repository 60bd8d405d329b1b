"""Batches of datasets, padded, and the loops that shrink them: what every kernel shares.

Every kernel of the engine works on a batch: ``X`` is (B, N, d), or (1, N, d) shared by
all B problems (``X.expand(B, N, d)`` for B restarts of one dataset, worked on once), and
an optional bool ``mask`` (B or 1, N) marks the real rows, so that datasets of different
sizes pad into one batch; per-row tensors (``sample_weight``) follow the same rule. Here
are the checks and helpers for that convention, and :class:`ShrinkingBatch`, with which
Lloyd (:mod:`transformer_gmm.engine.kmeans`) and EM (:mod:`transformer_gmm.engine.em`)
stop working on the problems that have converged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import torch
from torch import Tensor

__all__ = [
    "SHRINK_WHEN_STOPPED",
    "ShrinkingBatch",
    "cat_batch",
    "check_batch",
    "compact",
    "groups_on_shared_rows",
    "matmul",
    "point_weights",
    "take",
    "zero_padding",
]

T = TypeVar("T")


def check_batch(X: Tensor, *batched: Tensor, mask: Tensor | None = None) -> int:
    """Check ``X`` is (B|1, N, d) and every batch size is 1 or B; return B."""
    if X.dim() != 3:
        raise ValueError(f"X must have shape (B, N, d), got {tuple(X.shape)}")
    if mask is not None:
        if mask.dtype != torch.bool or mask.dim() != 2 or mask.shape[1] != X.shape[1]:
            raise ValueError(
                f"mask must be a bool tensor of shape (B, {X.shape[1]}), "
                f"got {mask.dtype} {tuple(mask.shape)}"
            )
        batched = (*batched, mask)
    sizes = {X.shape[0], *(t.shape[0] for t in batched)}
    n_batch = max(sizes)
    if not sizes <= {1, n_batch}:
        raise ValueError(f"batch sizes {sorted(sizes)} do not broadcast")
    return n_batch


def compact(t: Tensor | None) -> Tensor | None:
    """Undo ``expand`` along the batch: one dataset repeated is worked on once."""
    if t is not None and t.shape[0] > 1 and t.stride(0) == 0:
        return t[:1]
    return t


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b`` of (B|1, n, k) by (B, k, m): (B, n, m), a shared ``a`` (batch 1) read once.

    torch's batched product copies a shared left operand B times (8,192 rows of 256
    features shared by four starts: twice as long); here the B right-hand sides lie side
    by side in one product of the shared matrix instead.
    """
    if a.dim() != 3 or b.dim() != 3 or a.shape[0] != 1 or b.shape[0] == 1:
        return a @ b
    n_batch, k, m = b.shape
    products = a[0] @ b.transpose(0, 1).reshape(k, n_batch * m)  # (n, B m)
    return products.view(-1, n_batch, m).transpose(0, 1).contiguous()


def zero_padding(X: Tensor, mask: Tensor | None) -> Tensor:
    # Padded rows may hold anything (even NaN); zeroing them keeps sums over N clean,
    # since 0 * NaN would still be NaN.
    return X if mask is None else X.masked_fill(~mask[..., None], 0.0)


def point_weights(X: Tensor, mask: Tensor | None, sample_weight: Tensor | None = None) -> Tensor:
    """1.0 for real points, 0.0 for padding: (B|1, N) in X's dtype; or ``sample_weight``
    (B|1, N), zero on padding, when given."""
    if sample_weight is not None:
        return compact(sample_weight).to(X.dtype)
    if mask is None:
        return X.new_ones(X.shape[:2])
    return mask.to(X.dtype)


def cat_batch(parts: list[Tensor]) -> Tensor:
    """``parts`` joined along the batch; a part alone is returned itself, not copied."""
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def groups_on_shared_rows(items: Sequence[T], rows_of: Callable[[T], tuple]) -> list[list[T]]:
    """``items`` as groups whose steps (the starts' M-steps, say) can run as one batch, each
    item a row of it, reading the rows once: all of them together where every item's rows
    (``rows_of(item)``: rows (1, N, d) and their mask or None) are the same rows of one
    dataset, else each alone."""
    rows = [rows_of(item) for item in items]
    first, mask = rows[0]
    shared = len(rows) > 1 and first.shape[0] == 1 and all(
        x is first and m is mask for x, m in rows
    )
    return [list(items)] if shared else [[item] for item in items]


def take(t: Tensor | None, index: Tensor) -> Tensor | None:
    """Rows ``index`` of a batched tensor; one of batch 1 is shared by every row, so kept."""
    if t is None or t.shape[0] == 1:
        return t
    return t.index_select(0, index)


# A batched loop runs until its slowest problem stops, and most stop long before it: on
# 10,000 datasets of 128 points (d=8, K=4, tol=1e-3) EM runs 2.3 iterations on average
# and 27 at most. Once a quarter of the working batch has stopped, the loop gathers the
# rest into a smaller one, so later iterations cost in proportion to the problems still
# running; a gather copies X once, far less than the iteration it saves.
SHRINK_WHEN_STOPPED = 0.25


class ShrinkingBatch:
    """The rows of a batch a loop still works on (``rows`` maps them to the full batch), and
    the results of those it left; the first state stored is written into in place later.
    """

    def __init__(self, n_batch: int, device: torch.device) -> None:
        self.rows = torch.arange(n_batch, device=device)
        self._results: tuple[Tensor, ...] | None = None

    def should_shrink(self, n_running: int) -> bool:
        return n_running < (1.0 - SHRINK_WHEN_STOPPED) * len(self.rows)

    def shrink(self, stopped: Tensor, n_running: int, state: tuple[Tensor, ...]) -> Tensor:
        """Store ``state``; return where the running rows sit in the working batch."""
        self.results(state)
        # A stable sort rather than nonzero: the running rows in order, and no host sync.
        keep = torch.argsort(stopped.to(torch.int32), stable=True)[:n_running]
        self.rows = self.rows[keep]
        return keep

    def results(self, state: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        """Write the working batch's ``state`` into the full-size results; return them."""
        if self._results is None:  # nothing has left yet: the working batch is the batch
            self._results = state
        else:
            for result, value in zip(self._results, state, strict=True):
                result.index_copy_(0, self.rows, value)
        return self._results
