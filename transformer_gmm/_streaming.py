"""``partial_fit`` of the estimators: a stream of batches, the first fitted as ``fit`` fits
it, each later one a step of :mod:`transformer_gmm.engine.online` from the fitted
attributes. The stream's state is those attributes and a few counts, so a pickled
estimator goes on where it stopped. No torch here."""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
from scipy import sparse
from sklearn.utils.validation import validate_data

from . import _dask
from ._fitting import densified
from ._initialization import checked_sample_weight
from ._mixture_methods import precisions_from_cholesky
from .engine import online

# The attribute a stream's last step set, kept again under this name: a ``fit`` since then
# has replaced the attribute, and the next ``partial_fit`` starts a new stream.
_MARK = "_partial_fit_mark"


def is_streaming(estimator, attribute: str) -> bool:
    """Whether ``estimator``'s ``attribute`` is the one its last ``partial_fit`` set (an
    unfitted estimator, or one a ``fit`` has fitted since, starts a stream)."""
    mark = getattr(estimator, _MARK, None)
    return mark is not None and mark is getattr(estimator, attribute, None)


def check_in_memory(X) -> None:
    if _dask.is_dask_array(X):
        raise ValueError(
            "partial_fit takes a batch in memory; pass batch.compute(), or fit the whole "
            "dask array with fit."
        )


@contextmanager
def missing_values_refused(estimator_name: str):
    """scikit-learn's NaN error of a ``partial_fit`` batch, reworded: ``fit`` takes NaN,
    a stream does not (its steps have no estimate of the missing entries)."""
    try:
        yield
    except ValueError as error:
        if not str(error).startswith("Input X contains NaN"):
            raise
        raise ValueError(
            f"Input X contains NaN. {estimator_name}.partial_fit does not take missing "
            "values: impute the batch first (e.g. sklearn.impute.SimpleImputer fitted on "
            "an earlier batch), or fit all the rows at once with fit, which takes NaN as "
            "a missing entry."
        ) from error


def start(estimator, attribute: str, n_samples: int) -> None:
    """Count the first batch, which ``fit`` has just fitted."""
    estimator.n_steps_ = 1
    estimator.n_samples_seen_ = n_samples
    setattr(estimator, _MARK, getattr(estimator, attribute))


def validate_batch(estimator, X, sample_weight, accept_sparse=False):
    """A later batch, checked against the first (its number of features and their names),
    and its weights or None; the step counts it."""
    X = validate_data(
        estimator, X, accept_sparse=accept_sparse, dtype=[np.float64, np.float32], reset=False
    )
    if sparse.issparse(X):
        X = densified(X)
    if sample_weight is not None:
        sample_weight = checked_sample_weight(sample_weight, X.shape[0], 1)
    estimator.n_steps_ += 1
    estimator.n_samples_seen_ += X.shape[0]
    return X, sample_weight


def step_mixture(estimator, X, sample_weight) -> None:
    """One stepwise EM step of the fitted mixture ``estimator`` on the batch ``X``."""
    rho = online.step_size(
        estimator.n_steps_ - 1, estimator.learning_decay, estimator.learning_offset
    )
    dtype = estimator.means_.dtype  # the first batch's, as the fit kept it
    parameters = (
        estimator.weights_,
        estimator.means_,
        estimator.covariances_,
        estimator.precisions_cholesky_,
    )
    fitted, log_likelihood = online.mixture_step(
        X,
        sample_weight,
        parameters,
        rho,
        covariance_type=estimator.covariance_type,
        reg_covar=estimator.reg_covar,
        device=estimator.device_,
    )
    weights, means, covariances, precisions_cholesky = fitted
    estimator.weights_ = weights.astype(dtype, copy=False)
    estimator.means_ = means.astype(dtype, copy=False)
    estimator.covariances_ = covariances.astype(dtype, copy=False)
    # From the float64 factors, as fit computes them.
    precisions = precisions_from_cholesky(precisions_cholesky, estimator.covariance_type)
    estimator.precisions_cholesky_ = precisions_cholesky.astype(dtype, copy=False)
    estimator.precisions_ = precisions.astype(dtype, copy=False)
    estimator.lower_bound_ = log_likelihood
    estimator.n_iter_ += 1
    previous = getattr(estimator, "lower_bounds_", np.empty(0))
    estimator.lower_bounds_ = np.append(previous, log_likelihood)
    estimator._mark_collapsed(X, sample_weight)
    setattr(estimator, _MARK, estimator.means_)


def start_kmeans(estimator, sample_weight) -> None:
    """The per-centre counts of the first batch, which ``fit`` has just clustered."""
    start(estimator, "cluster_centers_", len(estimator.labels_))
    counts = np.bincount(
        estimator.labels_, weights=sample_weight, minlength=len(estimator.cluster_centers_)
    )
    estimator._counts = counts.astype(np.float64)


def step_kmeans(estimator, X, sample_weight) -> None:
    """One mini-batch k-means step of the fitted ``estimator`` on the batch ``X``."""
    dtype = estimator.cluster_centers_.dtype
    centers, counts, labels, inertia = online.kmeans_step(
        X, sample_weight, estimator.cluster_centers_, estimator._counts, device=estimator.device_
    )
    estimator.cluster_centers_ = centers.astype(dtype, copy=False)
    estimator._counts = counts
    estimator.labels_ = labels
    estimator.inertia_ = inertia
    setattr(estimator, _MARK, estimator.cluster_centers_)
