"""The estimators on data with missing entries (NaN): the checks, the start, and, for
TransformerGMM, EM on the observed entries (:mod:`transformer_gmm.engine.missing`); for
TransformerClusterer, k-POD (:mod:`transformer_gmm.engine.kpod`). Data without NaN never
come here.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
from scipy import sparse
from sklearn.exceptions import ConvergenceWarning

from . import _dask
from .engine import kpod, missing, row_order


def has_missing(X) -> bool:
    """Whether the validated ``X`` (in memory, dense or sparse) holds a NaN."""
    if _dask.is_dask_array(X):
        return False
    if sparse.issparse(X):  # NaN can only be a stored value
        return has_missing(X.data)
    # A sum is one pass with no (n, d) mask; it is NaN where X holds one, and also where
    # finite values overflowed to inf of both signs: then the exact check decides.
    with np.errstate(over="ignore", invalid="ignore"):
        total = np.sum(X)
    return bool(np.isnan(total)) and bool(np.isnan(X).any())


def check_fit_data(estimator, X: np.ndarray) -> None:
    """What a fit on ``X`` with NaN needs that a fit without does not."""
    if _dask.is_dask_array(X):
        return
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


def fit_k(
    estimator, X: np.ndarray, imputed: np.ndarray, sample_weight, n_components: int,
    reading=None,
) -> missing.MissingEMResult:
    """EM of ``n_components`` on ``X`` with NaN: the usual fit (transformer or k-means++
    starts, and EM; the transformer's from ``reading`` where it chose K) of ``estimator``
    on the ``imputed`` rows gives the start, then EM for data missing at random runs on
    the observed entries alone; its estimate is returned, for the estimator to keep."""
    with warnings.catch_warnings():
        # Whether EM converged on the imputed rows does not matter: they only start the
        # EM below, whose convergence is reported.
        warnings.simplefilter("ignore", ConvergenceWarning)
        estimator._fit_k(imputed, sample_weight, n_components, reading)
    return missing.fit_em_missing(
        X,
        estimator.weights_.astype(np.float64),
        estimator.means_.astype(np.float64),
        estimator.covariances_.astype(np.float64),
        covariance_type=estimator.covariance_type,
        reg_covar=estimator.reg_covar,
        max_iter=estimator.max_iter,
        tol=estimator.tol,
        sample_weight=sample_weight,
        device=estimator.device_,
    )


def fit_clusters(
    estimator, X: np.ndarray, imputed: np.ndarray, sample_weight, n_clusters: int,
    reading=None,
) -> tuple[kpod.KPODResult, np.ndarray]:
    """k-POD of ``n_clusters`` on ``X`` with NaN: the usual fit (the transformer's or
    k-means++ starts, and Lloyd) of ``estimator`` on the ``imputed`` rows gives the start,
    then k-POD (:func:`~transformer_gmm.engine.kpod.fit_kpod`) minimises the inertia over
    the observed entries; returns its result and the labels in the rows' own order, for
    the estimator to keep."""
    estimator._fit_k(imputed, sample_weight, n_clusters, reading)
    # In the rows' canonical order, as every fit reads them: the same result, to the bit,
    # whatever their order.
    order = row_order.canonical_order(X, sample_weight)
    result = kpod.fit_kpod(
        X[order],
        estimator.cluster_centers_.astype(np.float64),
        max_iter=estimator.max_iter,
        tol=estimator.tol,
        sample_weight=None if sample_weight is None else sample_weight[order],
        device=estimator.device_,
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
    observed = ~torch.isnan(x)
    squared = kpod.observed_squared_distances(
        torch.where(observed, x, 0.0), observed, torch.as_tensor(centers, dtype=torch.float64)
    )
    return squared.sqrt_().numpy().astype(X.dtype, copy=False)
