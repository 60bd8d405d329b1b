"""What TransformerClusterer takes from KMeans's initialisation, in numpy.

The checks of ``init`` give scikit-learn's messages (``sklearn/cluster/_kmeans.py``), and
the random starts are drawn as its ``_init_centroids`` draws them, from the same random
state, so they are the same rows. No torch: :mod:`transformer_gmm.engine.starts` turns these
arrays into starts.
"""

from __future__ import annotations

import warnings

import numpy as np
from sklearn.utils import check_array
from sklearn.utils.validation import _is_arraylike_not_scalar

# KMeans's n_init="auto": one run from k-means++ or given centres, ten from random rows
# or a callable, whose starts vary more.
_AUTO_N_INIT = {"k-means++": 1, "random": 10, "callable": 10, "array": 1}


def init_kind(init) -> str:
    """``"transformer"``, ``"k-means++"``, ``"random"``, ``"array"`` or ``"callable"``."""
    if isinstance(init, str):
        return str(init)  # a numpy str_ too
    return "array" if _is_arraylike_not_scalar(init) else "callable"


def n_runs(init, n_init, name: str) -> int:
    """How many runs an ``init`` other than the transformer asks for, with KMeans's
    ``n_init="auto"`` and its warning (naming the estimator ``name``) when centres are given
    with ``n_init`` above one."""
    kind = init_kind(init)
    n_init = _AUTO_N_INIT[kind] if n_init == "auto" else n_init
    if kind == "array" and n_init != 1:
        warnings.warn(
            "Explicit initial center position passed: performing only one init in "
            f"{name} instead of n_init={n_init}.",
            RuntimeWarning,
            stacklevel=3,
        )
        n_init = 1
    return n_init


def check_centers(centers, n_clusters: int, n_features: int) -> np.ndarray:
    """Given centres as a float64 array (n_clusters, n_features), with KMeans's messages."""
    centers = check_array(centers, dtype=np.float64, copy=True, input_name="init")
    if centers.shape[0] != n_clusters:
        raise ValueError(
            f"The shape of the initial centers {centers.shape} does not match "
            f"the number of clusters {n_clusters}."
        )
    if centers.shape[1] != n_features:
        raise ValueError(
            f"The shape of the initial centers {centers.shape} does not match "
            f"the number of features of the data {n_features}."
        )
    return centers


def given_centers(
    init,
    X: np.ndarray,
    n_clusters: int,
    n_init: int,
    random_state: np.random.RandomState,
    sample_weight: np.ndarray | None,
) -> np.ndarray:
    """The starting centres (n_init, n_clusters, n_features) of ``"random"`` (rows drawn
    without replacement in proportion to their weights, as scikit-learn draws them), of
    an array, or of a callable ``init(X, n_clusters, random_state=random_state)``."""
    kind = init_kind(init)
    if kind == "array":
        return check_centers(init, n_clusters, X.shape[1])[None]
    if kind == "callable":
        return np.stack(
            [
                check_centers(
                    init(X, n_clusters, random_state=random_state), n_clusters, X.shape[1]
                )
                for _ in range(n_init)
            ]
        )
    # scikit-learn passes p even without weights (uniform), and numpy's draw depends on it.
    weights = np.ones(X.shape[0]) if sample_weight is None else sample_weight
    p = weights / weights.sum()
    rows = [
        random_state.choice(X.shape[0], size=n_clusters, replace=False, p=p) for _ in range(n_init)
    ]
    return X[np.array(rows)].astype(np.float64)
