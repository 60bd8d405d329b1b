"""What TransformerGMM takes from GaussianMixture's initialisation, in numpy.

The checks of ``weights_init``, ``means_init`` and ``precisions_init`` give
scikit-learn's messages (``sklearn/mixture/_gaussian_mixture.py``); the random starts are
drawn as its ``BaseMixture._initialize_parameters`` draws them, from the same random
state, so they are the same responsibilities; and ``sample_weight`` is checked here.
No torch: :mod:`transformer_gmm.engine.starts` turns these arrays into starts.
"""

from __future__ import annotations

from numbers import Real

import numpy as np
from sklearn.utils import check_array

# --- shape checkers ----------------------------------------------------------------------

_PRECISION_SHAPES = {
    "full": lambda k, d: (k, d, d),
    "tied": lambda k, d: (d, d),
    "diag": lambda k, d: (k, d),
    "spherical": lambda k, d: (k,),
}


def _check_shape(param: np.ndarray, shape: tuple, name: str) -> None:
    if param.shape != shape:
        raise ValueError(
            f"The parameter '{name}' should have the shape of {shape}, but got {param.shape}"
        )


def check_weights(weights, n_components: int) -> np.ndarray:
    """``weights_init`` as an array of shape (n_components,), in [0, 1], summing to 1."""
    weights = check_array(weights, dtype=[np.float64, np.float32], ensure_2d=False)
    _check_shape(weights, (n_components,), "weights")
    if np.any(weights < 0.0) or np.any(weights > 1.0):
        raise ValueError(
            "The parameter 'weights' should be in the range [0, 1], but got max value "
            f"{np.max(weights):.5f}, min value {np.min(weights):.5f}"
        )
    atol = 1e-6 if weights.dtype == np.float32 else 1e-8
    if not np.allclose(np.abs(1.0 - np.sum(weights)), 0.0, atol=atol):
        raise ValueError(
            "The parameter 'weights' should be normalized, but got sum(weights) = "
            f"{np.sum(weights):.5f}"
        )
    return weights


def check_means(means, n_components: int, n_features: int) -> np.ndarray:
    """``means_init`` as an array of shape (n_components, n_features)."""
    means = check_array(means, dtype=[np.float64, np.float32], ensure_2d=False)
    _check_shape(means, (n_components, n_features), "means")
    return means


def _check_positive(precisions: np.ndarray, covariance_type: str) -> None:
    if np.any(precisions <= 0.0):
        raise ValueError(f"'{covariance_type} precision' should be positive")


def _check_positive_definite(precisions: np.ndarray, covariance_type: str) -> None:
    for precision in precisions.reshape(-1, *precisions.shape[-2:]):
        if not (
            np.allclose(precision, precision.T) and np.all(np.linalg.eigvalsh(precision) > 0.0)
        ):
            raise ValueError(
                f"'{covariance_type} precision' should be symmetric, positive-definite"
            )


_PRECISION_CHECKS = {
    "full": _check_positive_definite,
    "tied": _check_positive_definite,
    "diag": _check_positive,
    "spherical": _check_positive,
}


def check_precisions(
    precisions, covariance_type: str, n_components: int, n_features: int
) -> np.ndarray:
    """``precisions_init``, of the shape of ``covariance_type``'s precisions, positive
    (definite)."""
    precisions = check_array(
        precisions,
        dtype=[np.float64, np.float32],
        ensure_2d=False,
        allow_nd=covariance_type == "full",
    )
    shape = _PRECISION_SHAPES[covariance_type](n_components, n_features)
    _check_shape(precisions, shape, f"{covariance_type} precision")
    _PRECISION_CHECKS[covariance_type](precisions, covariance_type)
    return precisions


def precisions_cholesky(precisions: np.ndarray, covariance_type: str) -> np.ndarray:
    """The factors ``P`` with ``precision = P @ P.T`` (full, tied; upper triangular, as
    scikit-learn's ``_compute_precision_cholesky_from_precisions``) or ``P**2``, in float64."""
    precisions = np.asarray(precisions, dtype=np.float64)
    if covariance_type in ("full", "tied"):
        flipped = precisions[..., ::-1, ::-1]
        return np.ascontiguousarray(np.linalg.cholesky(flipped)[..., ::-1, ::-1])
    return np.sqrt(precisions)


def initial_parameters(params: dict, n_features: int) -> dict[str, np.ndarray]:
    """The starting parameters an estimator was given (its ``get_params()``), checked and in
    float64, by name: ``weights``, ``means`` and ``precisions_cholesky`` (from
    ``precisions_init``)."""
    n_components, covariance_type = params["n_components"], params["covariance_type"]
    given = {}
    if params["weights_init"] is not None:
        given["weights"] = check_weights(params["weights_init"], n_components)
    if params["means_init"] is not None:
        given["means"] = check_means(params["means_init"], n_components, n_features)
    if params["precisions_init"] is not None:
        precisions = check_precisions(
            params["precisions_init"], covariance_type, n_components, n_features
        )
        given["precisions_cholesky"] = precisions_cholesky(precisions, covariance_type)
    return {name: np.asarray(value, dtype=np.float64) for name, value in given.items()}


# --- random starts -------------------------------------------------------------------------


def _random(X, n_components, random_state, sample_weight) -> np.ndarray:
    resp = random_state.uniform(size=(X.shape[0], n_components)).astype(X.dtype)
    return resp / resp.sum(axis=1)[:, np.newaxis]


def _random_from_data(X, n_components, random_state, sample_weight) -> np.ndarray:
    p = None if sample_weight is None else sample_weight / sample_weight.sum()
    indices = random_state.choice(X.shape[0], size=n_components, replace=False, p=p)
    resp = np.zeros((X.shape[0], n_components), dtype=X.dtype)
    resp[indices, np.arange(n_components)] = 1.0
    return resp


_RANDOM_STARTS = {"random": _random, "random_from_data": _random_from_data}


def random_responsibilities(
    init_params: str,
    X: np.ndarray,
    n_components: int,
    n_init: int,
    random_state: np.random.RandomState,
    sample_weight: np.ndarray | None = None,
) -> np.ndarray:
    """``n_init`` starting responsibilities (n_init, n_samples, n_components), drawn from
    ``random_state`` as scikit-learn's ``"random"`` or ``"random_from_data"`` draws them.
    """
    draw = _RANDOM_STARTS[init_params]
    return np.stack([draw(X, n_components, random_state, sample_weight) for _ in range(n_init)])


# --- sample weights ------------------------------------------------------------------------


def checked_sample_weight(sample_weight, n_samples: int, min_positive: int = 1) -> np.ndarray:
    """``sample_weight`` as float64 (n_samples,), finite and non-negative, with at least
    ``min_positive`` positive weights; a number weighs every sample alike.
    """
    if isinstance(sample_weight, Real):
        sample_weight = np.full(n_samples, sample_weight, dtype=np.float64)
    sample_weight = check_array(
        sample_weight, ensure_2d=False, dtype=np.float64, input_name="sample_weight"
    )
    if sample_weight.shape != (n_samples,):
        raise ValueError(f"sample_weight.shape == {sample_weight.shape}, expected {(n_samples,)}!")
    if np.any(sample_weight < 0):
        raise ValueError("Negative values in data passed to sample_weight")
    n_positive = int(np.count_nonzero(sample_weight))
    if n_positive < min_positive:
        raise ValueError(
            f"Expected at least {min_positive} samples of non-zero weight, got {n_positive}. "
            "Give more samples a positive sample_weight."
        )
    return sample_weight


def check_sample_weight(sample_weight, X: np.ndarray, n_components: int) -> np.ndarray | None:
    """The weights of a fit: :func:`checked_sample_weight`, at least ``n_components``
    positive; None when ``sample_weight`` is None or every weight is the same (the fit is
    then the unweighted one, to the bit)."""
    if sample_weight is None:
        return None
    sample_weight = checked_sample_weight(sample_weight, X.shape[0], max(n_components, 1))
    if np.all(sample_weight == sample_weight[0]):
        return None
    return sample_weight
