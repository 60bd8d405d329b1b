"""A canonical order of a dataset's rows, so that no fit depends on how they were given.

Fits pick rows by position (subsamples, k-means++ draws) and round sums in row order;
sorting rows by a fixed-key hash of their values (splitmix64's finaliser, Steele, Lea &
Flood, OOPSLA 2014) makes a permutation of the rows give the same fit, to rounding, and
leaves no trend along the rows. In numpy for data on the host, and in torch, to the bit, for
data already on a GPU, where hashing on the host would cost more than the fit.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["canonical_order", "canonical_order_on_device", "canonical_orders", "row_hashes"]

# splitmix64's increment and finaliser constants, and a fixed key: the order must not
# change with a fit's random_state, only with the rows.
_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_MIX_1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX_2 = np.uint64(0x94D049BB133111EB)
_KEY = np.uint64(0x5851F42D4C957F2D)

# From this many columns, a row's hash mixes every value at once, each with its column's
# key, and sums them (wrapping), instead of chaining the columns one after another: with
# few rows and many columns the chain's cost per column, not the rows, decided a fit's
# time (50 x 2,000: 15 ms of a 30 ms fit). Both are functions of the values alone.
WIDE_FROM_COLUMNS = 64
# Values mixed at once on the host (512 KiB of words), rows by rows: each step of the mix
# is a pass over its block, and blocks that stay in a core's cache hash 2 to 4 times as
# fast as blocks of 2^20 values (one thread: 10^6 x 64 rows 0.34 s against 1.25 s,
# 10^4 x 768 45 against 122 ms, 50 x 16,000 4.4 against 15.8 ms); the same hashes.
_BLOCK_VALUES = 1 << 16
# On a device, blocks of 2^20 values (8 MiB of words): each step is a kernel launch, and
# the blocks only bound the temporaries.
_DEVICE_BLOCK_VALUES = 1 << 20


def _mix(h: np.ndarray) -> None:
    """splitmix64's finaliser, in place on uint64 ``h`` (numpy's uint64 arithmetic wraps)."""
    h ^= h >> np.uint64(30)
    h *= _MIX_1
    h ^= h >> np.uint64(27)
    h *= _MIX_2
    h ^= h >> np.uint64(31)


def _signed(word: np.uint64) -> int:
    """The int64 with the bits of ``word``: torch's integers are signed."""
    return int(word) - (1 << 64) if int(word) >= 1 << 63 else int(word)


def _shift_right(h: torch.Tensor, bits: int) -> torch.Tensor:
    """uint64's logical shift of the bits of int64 ``h`` (torch's shift is arithmetic)."""
    return (h >> bits) & ((1 << (64 - bits)) - 1)


def _mix_on_device(h: torch.Tensor) -> torch.Tensor:
    """:func:`_mix` on int64 ``h`` (torch's int64 arithmetic wraps as numpy's uint64 does)."""
    h = h ^ _shift_right(h, 30)
    h = h * _signed(_MIX_1)
    h = h ^ _shift_right(h, 27)
    h = h * _signed(_MIX_2)
    return h ^ _shift_right(h, 31)


def _column_keys(d: int) -> np.ndarray:
    """One mixed key (d,) per column, for the wide hash."""
    keys = _KEY + _GAMMA * np.arange(1, d + 1, dtype=np.uint64)  # wraps, as splitmix64
    _mix(keys)
    return keys


def _row_blocks(n_rows: int, d: int, block_values: int | None = None) -> list[slice]:
    """Slices of rows, ``block_values`` (``_BLOCK_VALUES``) values, at least a row, each."""
    step = max(1, (_BLOCK_VALUES if block_values is None else block_values) // d)
    return [slice(start, start + step) for start in range(0, n_rows, step)]


def _wide_hashes_on_device(X: torch.Tensor) -> torch.Tensor:
    """:func:`_wide_hashes` as int64, on X's device."""
    flat = X.reshape(-1, X.shape[-1])
    keys = torch.from_numpy(_column_keys(X.shape[-1]).view(np.int64)).to(X.device)
    h = torch.empty(len(flat), dtype=torch.int64, device=X.device)
    for rows in _row_blocks(*flat.shape, _DEVICE_BLOCK_VALUES):
        words = (flat[rows].to(torch.float64) + 0.0).view(torch.int64)  # -0.0 -> 0.0
        h[rows] = _mix_on_device(words ^ keys).sum(dim=-1)
    return _mix_on_device(h).reshape(X.shape[:-1])


def _row_hashes_on_device(X: torch.Tensor) -> torch.Tensor:
    """:func:`row_hashes` as int64, on X's device."""
    if X.shape[-1] >= WIDE_FROM_COLUMNS:
        return _wide_hashes_on_device(X)
    h = torch.full(X.shape[:-1], _signed(_KEY), dtype=torch.int64, device=X.device)
    for j in range(X.shape[-1]):
        words = (X[..., j].to(torch.float64) + 0.0).view(torch.int64)  # -0.0 -> 0.0
        h = _mix_on_device((h + _signed(_GAMMA)) ^ words)
    return h


def canonical_order_on_device(
    X: torch.Tensor, sample_weight: torch.Tensor | None = None
) -> torch.Tensor:
    """:func:`canonical_order` of ``X`` (..., n, d) and its weights (..., n) where they
    live: the same hashes, to the bit, as int64 (so the same order, but for rows equal in
    value, whose order no fit sees), sorted on X's device.

    Examples
    --------
    >>> import numpy as np, torch
    >>> from transformer_gmm.engine.row_order import canonical_order, canonical_order_on_device
    >>> X = np.random.default_rng(0).normal(size=(6, 2))
    >>> canonical_order_on_device(torch.from_numpy(X)).tolist() == canonical_order(X).tolist()
    True
    """
    h = _row_hashes_on_device(X)
    h = h ^ (-(1 << 63))  # flipping the sign bit orders int64 as their bits order as uint64
    if sample_weight is None:
        return torch.argsort(h, dim=-1)
    # numpy's lexsort by (hash, weight): by weight, then stably by hash.
    by_weight = torch.argsort(sample_weight, dim=-1, stable=True)
    by_hash = torch.argsort(h.gather(-1, by_weight), dim=-1, stable=True)
    return by_weight.gather(-1, by_hash)


def row_hashes(X: np.ndarray) -> np.ndarray:
    """A 64-bit hash (..., n) of each row of ``X`` (..., n, d), equal for rows equal in value
    whatever their dtype or the signs of their zeros.
    """
    if X.shape[-1] >= WIDE_FROM_COLUMNS:
        return _wide_hashes(X)
    flat = X.reshape(-1, X.shape[-1])
    h = np.full(len(flat), _KEY, dtype=np.uint64)
    for rows in _row_blocks(len(flat), 1):  # the chain over the columns, block by block
        block = h[rows]  # a view: mixed in place
        for j in range(flat.shape[-1]):
            # + 0.0 turns -0.0 into 0.0 (and leaves every other number as it is); the
            # result is a fresh float64 array, so the view below may be mixed in place.
            words = (np.asarray(flat[rows, j], dtype=np.float64) + 0.0).view(np.uint64)
            block += _GAMMA
            block ^= words
            _mix(block)
    return h.reshape(X.shape[:-1])


def _wide_hashes(X: np.ndarray) -> np.ndarray:
    """:func:`row_hashes` of rows of many values: each value mixed with its column's key,
    the row's sum (wrapping) mixed again; in blocks of rows."""
    flat = X.reshape(-1, X.shape[-1])
    keys = _column_keys(X.shape[-1])
    h = np.empty(len(flat), dtype=np.uint64)
    for rows in _row_blocks(*flat.shape):
        words = (np.asarray(flat[rows], dtype=np.float64) + 0.0).view(np.uint64)  # fresh
        words ^= keys
        _mix(words)
        h[rows] = words.sum(axis=-1, dtype=np.uint64)
    _mix(h)
    return h.reshape(X.shape[:-1])


def canonical_order(X: np.ndarray, sample_weight: np.ndarray | None = None) -> np.ndarray:
    """The permutation (n,) that puts the rows of ``X`` (n, d) in canonical order; for a batch
    ``X`` (B, n, d), each dataset's (B, n).

    Examples
    --------
    >>> import numpy as np
    >>> from transformer_gmm.engine.row_order import canonical_order
    >>> X = np.random.default_rng(0).normal(size=(6, 2))
    >>> shuffled = X[[3, 0, 5, 1, 4, 2]]
    >>> bool((X[canonical_order(X)] == shuffled[canonical_order(shuffled)]).all())
    True
    """
    # Not a stable sort, which is 5 times slower on 64-bit keys and would buy nothing:
    # rows whose hashes tie are equal, the same to every fit in any order, or (rarely)
    # collide, and then a stable sort too would leave them in the input's order.
    if sample_weight is None:
        return np.argsort(row_hashes(X), axis=-1)
    # Equal rows of different weights, by weight: an order that scaling every weight by
    # one constant keeps (a hash of the weights would not), so the fit keeps it too.
    return np.lexsort((np.asarray(sample_weight), row_hashes(X)), axis=-1)


def canonical_orders(
    Xs: list[np.ndarray], sample_weight: list[np.ndarray] | None = None
) -> list[np.ndarray]:
    """:func:`canonical_order` of each dataset of ``Xs``, in one hash and one sort for all."""
    if len(Xs) == 1:
        return [canonical_order(Xs[0], None if sample_weight is None else sample_weight[0])]
    lengths = np.array([len(X) for X in Xs])
    real = np.arange(lengths.max())[None] < lengths[:, None]  # (B, n_max)
    # Padding sorts last, and is dropped below wherever it lands among ties.
    hashes = np.full(real.shape, np.iinfo(np.uint64).max, dtype=np.uint64)
    hashes[real] = row_hashes(np.concatenate(Xs))  # row-major: dataset by dataset
    if sample_weight is None:
        order = np.argsort(hashes, axis=-1)
    else:
        weights = np.full(real.shape, np.inf)
        weights[real] = np.concatenate(sample_weight)
        order = np.lexsort((weights, hashes), axis=-1)
    return np.split(order[order < lengths[:, None]], np.cumsum(lengths)[:-1])
