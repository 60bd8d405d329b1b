"""Fitting on a Dask array and predicting on one lazily: the estimators' side, no torch.

A fit reads the array in passes, each one Dask computation on whatever scheduler is
active (a ``dask.distributed.Client``, else dask's default):

1. one pass checks the values (NaN, infinity, overflow), takes each feature's mean and
   spread, and draws a uniform sample of at most ``fit.SELECTION_ROWS`` rows, a seeded
   share of each chunk's rows (every row when there are no more);
2. the starts are built on that sample in this process (the transformer reads at most
   its context of it), and chosen there where the in-memory fit would choose them on a
   subsample;
3. every EM or Lloyd iteration is one pass: each chunk's sufficient statistics
   (:mod:`transformer_gmm.engine.sufficient_stats`, computed by the ``block_*`` functions of
   :mod:`transformer_gmm.engine.fit_by_blocks` where the chunk lives) are summed, and this process
   updates the parameters from the sums; an iteration where a component or a cluster
   empties takes one more pass, which brings back each chunk's few candidate rows for it.

Dask is imported here only when the input is a Dask array, so it stays optional.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from sklearn.utils import check_array
from sklearn.utils.validation import _check_feature_names, _check_n_features

from .engine import blocks, fit, fit_by_blocks
from .engine.input_range import check_range
from .engine.plan import KMeansPlan, MixturePlan


def is_dask_array(X) -> bool:
    """Whether ``X`` is a Dask array, told without importing dask. (Other Dask collections,
    such as a Dask DataFrame, go the in-memory way: validation computes them.)"""
    return type(X).__module__.startswith("dask.array") and hasattr(X, "dask")


# --- input -----------------------------------------------------------------------------


def validate(estimator, X, *, reset: bool, min_samples: int = 1):
    """``validate_data``'s checks for a Dask array, without computing it: 2-D, whole rows per
    chunk, numeric (float32 kept, else float64), ``n_features``; NaN and inf are found later.
    """
    if X.ndim != 2:
        raise ValueError(
            f"Expected a 2D array, got a {X.ndim}D dask array of shape {X.shape} instead. "
            "Reshape your data either using X.reshape(-1, 1) if your data has a single "
            "feature or X.reshape(1, -1) if it contains a single sample."
        )
    if any(math.isnan(size) for size in X.chunks[0]):
        raise ValueError(
            "X has chunks of unknown size. Compute them first with X.compute_chunk_sizes() "
            "(or, from a Dask DataFrame, X = frame.to_dask_array(lengths=True))."
        )
    if X.numblocks[1] != 1:
        raise ValueError(
            f"X is chunked along its columns (chunks {X.chunks[1]}), but every block must "
            "hold whole rows. Rechunk it with X = X.rechunk({1: -1}), or create it with "
            "chunks=(rows_per_chunk, -1)."
        )
    if X.dtype.kind not in "biuf":
        raise ValueError(f"Unsupported dtype {X.dtype} for X: expected numbers (float).")
    if X.dtype not in (np.float32, np.float64):
        X = X.astype(np.float64)
    if X.shape[1] < 1:
        raise ValueError(
            f"Found array with 0 feature(s) (shape={X.shape}) while a minimum of 1 is required."
        )
    if X.shape[0] < min_samples:
        raise ValueError(
            f"Found array with {X.shape[0]} sample(s) (shape={X.shape}) while a minimum of "
            f"{min_samples} is required."
        )
    _check_n_features(estimator, X, reset=reset)
    _check_feature_names(estimator, X, reset=reset)
    return X


# --- the first pass: values, moments and the sample ------------------------------------


@dataclass(frozen=True)
class _Summary:
    n_rows: int
    sample: np.ndarray  # (S, d) uniform rows; every row, in order, when S = n_rows
    mean: np.ndarray  # (d,)
    sum_of_squares: float  # sum over rows and features of (x - mean)^2
    highest: np.ndarray  # (d,)
    lowest: np.ndarray  # (d,)


# Rows of a chunk read at once by the first pass: its temporaries stay a few MB.
_SUMMARY_ROWS = 65536


def _block_summary(block: np.ndarray, n_take: int, seed: int) -> dict:
    """One chunk's share of the first pass: finiteness, moments, and ``n_take`` of its
    rows drawn without replacement (kept in their order)."""
    block = np.asarray(block)
    n_rows = block.shape[0]
    if n_rows == 0:
        return dict(finite=True, n_rows=0)
    # A sum is finite when every value is (or the values overflow it, found below).
    total = block.sum(axis=0, dtype=np.float64)
    if not np.isfinite(total).all() and not np.isfinite(block).all():
        return dict(finite=False, nan=bool(np.isnan(block).any()))
    mean = total / n_rows
    squares = np.zeros_like(mean)
    for start in range(0, n_rows, _SUMMARY_ROWS):
        centred = block[start : start + _SUMMARY_ROWS] - mean
        squares += np.einsum("ij,ij->j", centred, centred)
    if n_take >= n_rows:
        rows = block
    else:
        rows = block[np.sort(np.random.default_rng(seed).choice(n_rows, n_take, replace=False))]
    return dict(
        finite=True,
        n_rows=n_rows,
        mean=mean,
        squares=squares,
        highest=block.max(axis=0),
        lowest=block.min(axis=0),
        sample=rows,
    )


def _summarize(X, seed: int, estimator_name: str) -> _Summary:
    import dask

    sizes = np.array(X.chunks[0], dtype=np.int64)
    n_rows = int(sizes.sum())
    rng = np.random.default_rng(seed)
    n_sample = min(n_rows, fit.SELECTION_ROWS)
    # A uniform subset of n_sample rows has a multivariate hypergeometric count per chunk.
    takes = sizes if n_sample == n_rows else rng.multivariate_hypergeometric(sizes, n_sample)
    seeds = rng.integers(np.iinfo(np.int64).max, size=len(sizes))
    summarize = dask.delayed(_block_summary, pure=True)
    blocks = X.to_delayed().ravel()
    parts = dask.compute(
        *(summarize(b, int(t), int(s)) for b, t, s in zip(blocks, takes, seeds, strict=True))
    )
    if not all(part["finite"] for part in parts):
        if any(part.get("nan", False) for part in parts):
            raise ValueError(
                f"Input X contains NaN. {estimator_name} does not accept missing values "
                "encoded as NaN in a dask array: impute them (for example with dask-ml's "
                "SimpleImputer), drop the rows that hold them, or fit on X.compute() in "
                "memory, where NaN marks a missing entry."
            )
        raise ValueError(f"Input X contains infinity or a value too large for {X.dtype!r}.")
    parts = [part for part in parts if part["n_rows"] > 0]
    counts = np.array([part["n_rows"] for part in parts], dtype=np.float64)[:, None]
    means = np.stack([part["mean"] for part in parts])  # (chunks, d)
    mean = (counts * means).sum(axis=0) / n_rows
    # Chan et al.'s combination of the chunks' sums of squares: no cancellation.
    squares = sum(part["squares"] for part in parts) + (counts * (means - mean) ** 2).sum(axis=0)
    return _Summary(
        n_rows=n_rows,
        sample=np.concatenate([part["sample"] for part in parts]),
        mean=mean,
        sum_of_squares=float(squares.sum()),
        highest=np.max([part["highest"] for part in parts], axis=0).astype(np.float64),
        lowest=np.min([part["lowest"] for part in parts], axis=0).astype(np.float64),
    )


# --- the passes of EM and Lloyd -----------------------------------------------------------


def _apply(block: np.ndarray, function, args: tuple) -> np.ndarray:
    return function(block, *args)


def _per_block(X, function, args: tuple, length: int):
    """``function(block, *args)`` (each of shape (1, length)) on each chunk of ``X``,
    lazily: a Dask array of shape (n_chunks, length)."""
    import dask

    # One key that every chunk's task reads, rather than a copy of the parameters in each.
    shared = dask.delayed(args, pure=True, traverse=False)
    return X.map_blocks(
        _apply,
        function,
        shared,
        chunks=((1,) * X.numblocks[0], (length,)),
        dtype=np.float64,
        meta=np.empty((0, 0)),
    )


def _sum_over_blocks(X, function, args: tuple, length: int) -> np.ndarray:
    """``function(block, *args)`` summed over the chunks of ``X``: one Dask computation, a
    tree of sums, so only statistics travel."""
    return _per_block(X, function, args, length).sum(axis=0).compute()


def _stack_blocks(X, function, args: tuple, length: int) -> np.ndarray:
    """``function(block, *args)`` of each chunk of ``X``, (n_chunks, length): one Dask
    computation, for the few rows each chunk offers an empty component or cluster."""
    return _per_block(X, function, args, length).compute()


def _reducer(X) -> blocks.BlockReducer:
    return blocks.BlockReducer(
        sum=lambda function, args, length: _sum_over_blocks(X, function, args, length),
        stack=lambda function, args, length: _stack_blocks(X, function, args, length),
    )


def fit_plan(
    plan: MixturePlan | KMeansPlan, X, sample_weight: None = None
) -> fit.MixtureFits | fit.KMeansFit:
    """:func:`transformer_gmm.engine.fit.fit` of ``plan`` for one Dask array ``X`` (no
    ``sample_weight``: the estimators refuse one on a Dask array); a k-means fit's
    ``labels`` are None (the estimator labels lazily)."""
    is_mixture = isinstance(plan, MixturePlan)
    summary = _summarize(X, plan.seed, "TransformerGMM" if is_mixture else "TransformerClusterer")
    check_range(summary.highest, summary.lowest, summary.n_rows, X.dtype)
    if is_mixture:
        return fit_by_blocks.fit_mixtures_by_blocks(
            _reducer(X), summary.sample, summary.n_rows, plan
        )
    return fit_by_blocks.fit_kmeans_by_blocks(
        _reducer(X), summary.sample, summary.n_rows, summary.mean, summary.sum_of_squares, plan
    )


# --- lazy prediction ---------------------------------------------------------------------


def _checked(block: np.ndarray, function, *args) -> np.ndarray:
    # validate_data's check of values, chunk by chunk as each is computed.
    return function(check_array(block, dtype=[np.float64, np.float32]), *args)


def map_rows(function, X, *args, n_columns: int | None = None, dtype=np.float64):
    """``function(block, *args)`` on each chunk of rows of the Dask array ``X``, lazily:
    of shape (n,), or (n, n_columns). The chunk's values are checked first."""
    dtype = np.dtype(dtype)
    if n_columns is None:
        return X.map_blocks(
            _checked, function, *args, drop_axis=1, dtype=dtype, meta=np.empty((0,), dtype)
        )
    return X.map_blocks(
        _checked,
        function,
        *args,
        chunks=(X.chunks[0], (n_columns,)),
        dtype=dtype,
        meta=np.empty((0, 0), dtype),
    )
