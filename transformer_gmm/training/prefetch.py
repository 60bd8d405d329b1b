"""Batches that are pure functions of the step, drawn ahead by worker processes.

Both training loops (the backbone's in ``train.py``, the K-posterior head's in
``k_posterior.py``) draw step ``s``'s batch from seeds that depend on ``s`` alone, so a
resumed run draws what it would have drawn and workers can draw in any order; a
DataLoader hands them back in step order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TypeVar

import torch

T = TypeVar("T")


class _Steps(torch.utils.data.Dataset):
    """Item ``i`` is ``draw(start + i)``: what a DataLoader's workers call."""

    def __init__(self, draw: Callable[[int], T], start: int, stop: int) -> None:
        self.draw, self.start, self.stop = draw, start, stop

    def __len__(self) -> int:
        return self.stop - self.start

    def __getitem__(self, index: int) -> T:
        return self.draw(self.start + index)


def step_batches(
    draw: Callable[[int], T], start: int, stop: int, workers: int = 0, pin_memory: bool = False
) -> Iterator[T]:
    """``draw(step)`` for steps ``start .. stop - 1`` in order: drawn ahead by ``workers``
    processes (``draw`` must pickle: a module-level function or a ``functools.partial`` of
    one), or with none one at a time in this process.

    Examples
    --------
    >>> from transformer_gmm.training.prefetch import step_batches
    >>> list(step_batches(abs, -3, 0))
    [3, 2, 1]
    >>> list(step_batches(abs, -3, 0, workers=2))
    [3, 2, 1]
    """
    if workers == 0:
        yield from map(draw, range(start, stop))
        return
    # batch_size=None: each item is already a batch; the sequential sampler keeps step order.
    yield from torch.utils.data.DataLoader(
        _Steps(draw, start, stop),
        batch_size=None,
        num_workers=workers,
        prefetch_factor=4,
        pin_memory=pin_memory,
    )
