"""The estimators on data with missing entries (NaN): the checks, the imputed rows that
start the fit, k-POD on the rows in canonical order (:mod:`transformer_gmm.engine.kpod`),
and distances over the observed coordinates. TransformerGMM's EM on the observed entries
is :mod:`transformer_gmm.engine.missing`. Data without NaN never come here.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy import sparse

from .engine import kpod, missing, row_order


def has_missing(X) -> bool:
    """Whether the validated ``X`` (in memory, dense or sparse) holds a NaN."""
    if sparse.issparse(X):  # NaN can only be a stored value
        return has_missing(X.data)
    # A sum is one pass with no (n, d) mask; it is NaN where X holds one, and also where
    # finite values overflowed to inf of both signs: then the exact check decides.
    with np.errstate(over="ignore", invalid="ignore"):
        total = np.sum(X)
    return bool(np.isnan(total)) and bool(np.isnan(X).any())


def check_fit_data(estimator, X: np.ndarray) -> None:
    """What a fit on ``X`` with NaN needs that a fit without does not."""
    empty = np.isnan(X).all(axis=0)
    if empty.any():
        raise ValueError(
            f"Column(s) {np.flatnonzero(empty).tolist()} of X have every value missing "
            "(NaN): nothing can be estimated for them. Drop these columns first."
        )
    missing.check_rows(X)


def mean_imputed(X: np.ndarray) -> np.ndarray:
    """``X`` with each NaN replaced by its column's mean over the observed entries."""
    # Summed in sorted order, so that the means, and with them the imputed rows, the
    # canonical row order and every start, are the same to the bit whatever the row order.
    ordered = np.sort(X, axis=0)  # NaN last
    means = np.nansum(ordered, axis=0) / np.count_nonzero(~np.isnan(X), axis=0)
    return np.where(np.isnan(X), means, X).astype(X.dtype, copy=False)


def kpod_in_canonical_order(
    X: np.ndarray, centers: np.ndarray, sample_weight, *, max_iter: int, tol: float, device: str
) -> tuple[kpod.KPODResult, np.ndarray]:
    """k-POD (:func:`~transformer_gmm.engine.kpod.fit_kpod`) of ``X`` with NaN from
    ``centers``, on the rows in their canonical order, as every fit reads them (the same
    result, to the bit, whatever their order); returns its result and the labels in the
    rows' own order."""
    order = row_order.canonical_order(X, sample_weight)
    result = kpod.fit_kpod(
        X[order],
        centers.astype(np.float64),
        max_iter=max_iter,
        tol=tol,
        sample_weight=None if sample_weight is None else sample_weight[order],
        device=device,
    )
    labels = np.empty_like(result.labels)
    labels[order] = result.labels
    return result, labels


def observed_distances(X, centers: np.ndarray) -> np.ndarray:
    """Euclidean distances (n, K) from the rows of ``X`` (with NaN; dense or sparse) to
    ``centers``, over each row's observed coordinates alone (not rescaled for the missing
    ones, so that the squared distances to the nearest centres sum to the inertia)."""
    if sparse.issparse(X):
        X = X.toarray()
    missing.check_rows(X)
    x = torch.as_tensor(X, dtype=torch.float64)
    squared = kpod.centred_observed_squared_distances(
        x, ~torch.isnan(x), torch.as_tensor(centers, dtype=torch.float64)
    )
    return squared.sqrt_().numpy().astype(X.dtype, copy=False)
