"""A canonical order of a dataset's rows, so that no fit depends on how they were given.

A fit reads its rows by position: the subsample the transformer reads, the subsample on
which many rows' starts are compared, and k-means++'s draws all pick positions, and the
sums over rows round in the order they are taken. Given the rows in the order this module
returns (sorted by a fixed-key hash of each row's values), a permutation of a dataset's
rows gives the same fit, to rounding. Sorting by a hash rather than by the values leaves
no trend along the rows, so that a block of positions is as good as a random sample, and
favours no column.

Numpy only, vectorised over rows: each float64 row is read as 64-bit words, mixed in
one at a time by splitmix64's finaliser (Steele, Lea & Flood, "Fast splittable
pseudorandom number generators", OOPSLA 2014).
"""

from __future__ import annotations

import numpy as np

__all__ = ["canonical_order", "canonical_orders", "row_hashes"]

# splitmix64's increment and finaliser constants, and a fixed key: the order must not
# change with a fit's random_state, only with the rows.
_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_MIX_1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX_2 = np.uint64(0x94D049BB133111EB)
_KEY = np.uint64(0x5851F42D4C957F2D)


def _mix(h: np.ndarray) -> None:
    """splitmix64's finaliser, in place on uint64 ``h`` (numpy's uint64 arithmetic wraps)."""
    h ^= h >> np.uint64(30)
    h *= _MIX_1
    h ^= h >> np.uint64(27)
    h *= _MIX_2
    h ^= h >> np.uint64(31)


def row_hashes(X: np.ndarray, sample_weight: np.ndarray | None = None) -> np.ndarray:
    """A 64-bit hash (..., n) of each row of ``X`` (..., n, d), and of its weight (...,
    n) where given.

    Rows equal in value hash equally whatever their dtype (float32 rows are read as the
    float64 numbers they are) and whatever the signs of their zeros (-0.0 and 0.0 are the
    same number to every fit). ``sample_weight`` (..., n), where given, is hashed in as
    one more column, so that equal rows of different weights sort apart.

    Examples
    --------
    >>> import numpy as np
    >>> from transformer_gmm.engine.row_order import row_hashes
    >>> h = row_hashes(np.array([[1.0, -0.0], [1.0, 0.0], [0.0, 1.0]]))
    >>> bool(h[0] == h[1]), bool(h[0] == h[2])
    (True, False)
    >>> bool((row_hashes(np.float32([[0.5, 2.0]])) == row_hashes(np.array([[0.5, 2.0]]))).all())
    True
    """
    columns = [X[..., j] for j in range(X.shape[-1])]
    if sample_weight is not None:
        columns.append(sample_weight)
    h = np.full(X.shape[:-1], _KEY, dtype=np.uint64)
    for column in columns:
        # + 0.0 turns -0.0 into 0.0 (and leaves every other number as it is); the result
        # is a fresh float64 array, so the view below may be mixed in place.
        words = (np.asarray(column, dtype=np.float64) + 0.0).view(np.uint64)
        h += _GAMMA
        h ^= words
        _mix(h)
    return h


def canonical_order(X: np.ndarray, sample_weight: np.ndarray | None = None) -> np.ndarray:
    """The permutation (n,) that puts the rows of ``X`` (n, d) in canonical order; for a
    batch ``X`` (B, n, d), each dataset's (B, n).

    ``X[canonical_order(X)]`` is the same array for any order of the rows of ``X``, up to
    the order of rows equal in value (and in ``sample_weight``, where given), which no fit
    can tell apart; and up to collisions of the 64-bit hash between different rows (3e-8
    pairs expected among a million rows), whose order then depends on the input's. Sorting
    also takes the rows out of any order they came in (sorted by a column, grouped by
    class): the canonical order is as good as random.

    Parameters
    ----------
    X : ndarray of shape (n, d) or (B, n, d)
        Float rows.
    sample_weight : ndarray of shape (n,) or (B, n), optional
        The rows' weights, which travel with them and break ties between equal rows.

    Returns
    -------
    order : int ndarray of shape (n,) or (B, n)
        Take ``X[order]``, ``sample_weight[order]``, and any other per-row array the same
        (``np.take_along_axis`` along the rows for a batch).

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
    return np.argsort(row_hashes(X, sample_weight), axis=-1)


def canonical_orders(
    Xs: list[np.ndarray], sample_weight: list[np.ndarray] | None = None
) -> list[np.ndarray]:
    """:func:`canonical_order` of each dataset of ``Xs`` (each (n_i, d)), with its
    ``sample_weight`` (each (n_i,)) where given, in one hash and one sort for all.

    Examples
    --------
    >>> import numpy as np
    >>> from transformer_gmm.engine.row_order import canonical_order, canonical_orders
    >>> rng = np.random.default_rng(0)
    >>> Xs = [rng.normal(size=(n, 2)) for n in (5, 3, 4)]
    >>> orders = canonical_orders(Xs)
    >>> all((o == canonical_order(X)).all() for o, X in zip(orders, Xs))
    True
    """
    if len(Xs) == 1:
        return [canonical_order(Xs[0], None if sample_weight is None else sample_weight[0])]
    lengths = np.array([len(X) for X in Xs])
    real = np.arange(lengths.max())[None] < lengths[:, None]  # (B, n_max)
    # Padding sorts last, and is dropped below wherever it lands among ties.
    hashes = np.full(real.shape, np.iinfo(np.uint64).max, dtype=np.uint64)
    weights = None if sample_weight is None else np.concatenate(sample_weight)
    hashes[real] = row_hashes(np.concatenate(Xs), weights)  # row-major: dataset by dataset
    order = np.argsort(hashes, axis=-1)
    return np.split(order[order < lengths[:, None]], np.cumsum(lengths)[:-1])
