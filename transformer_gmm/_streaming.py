"""What the estimators' ``partial_fit`` share: the checks of a batch. A stream's first batch
is fitted as ``fit`` fits it, each later one is a step of
:mod:`transformer_gmm.engine.online` from the fitted attributes, which each estimator
takes and sets itself (``TransformerMixtureBase._start_stream`` and the estimators'
``_partial_fit``)."""

from __future__ import annotations

import numpy as np
from scipy import sparse
from sklearn.utils.validation import validate_data

from ._fitting import densified
from ._initialization import checked_sample_weight
from ._missing import has_missing
from .engine.missing import check_rows


def validate_batch(estimator, X, sample_weight, accept_sparse=False):
    """A later batch, checked against the first (its number of features and their names,
    as scikit-learn's ``validate_data`` reads them off ``estimator``; NaN, a missing entry,
    in rows with an observed feature), its weights or None, and whether it has gaps: the
    one decision of which step reads it."""
    gaps = False
    if not _is_plain_batch(estimator, X):
        X = validate_data(
            estimator, X, accept_sparse=accept_sparse, dtype=[np.float64, np.float32],
            reset=False, ensure_all_finite="allow-nan",
        )
        if sparse.issparse(X):
            X = densified(X)
        gaps = has_missing(X)
        if gaps:
            check_rows(X)
    if sample_weight is not None:
        sample_weight = checked_sample_weight(sample_weight, X.shape[0], 1)
    return X, sample_weight, gaps


def _is_plain_batch(estimator, X) -> bool:
    """Whether ``X`` is a batch that ``validate_data`` would return as it is: a finite
    float ndarray of the first batch's width, for an estimator fitted without feature
    names. A stream's step costs about as much as scikit-learn's checks of its batch, so
    this common case skips them; any other input (and any doubt, such as a sum that
    overflows) takes ``validate_data``, with its errors and warnings."""
    if not (
        type(X) is np.ndarray
        and X.dtype in (np.float64, np.float32)
        and X.ndim == 2
        and X.shape[0] > 0
        and X.shape[1] == getattr(estimator, "n_features_in_", None)
        and not hasattr(estimator, "feature_names_in_")
    ):
        return False
    with np.errstate(over="ignore", invalid="ignore"):
        return bool(np.isfinite(X.sum()))  # NaN and inf make the sum non-finite
