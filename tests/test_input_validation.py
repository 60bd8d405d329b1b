"""Bad input gets a clear error that says what to do, never a crash deep in torch."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from conftest import TINY_CHECKPOINT
from sklearn.base import clone

from transformer_gmm import TransformerClusterer, TransformerGMM

ESTIMATORS = [
    TransformerGMM(3, checkpoint=TINY_CHECKPOINT),
    TransformerGMM(3, checkpoint=None),
    TransformerClusterer(3, checkpoint=TINY_CHECKPOINT),
]

X_GOOD = np.random.default_rng(0).normal(size=(30, 2))
X_INF = X_GOOD.copy()
X_INF[5, 0] = np.inf

BAD_INPUTS = {
    "inf": (X_INF, ValueError, "Input X contains infinity"),
    "fewer samples than components": (X_GOOD[:2], ValueError, "Pass more samples or lower"),
    "1-D": (X_GOOD[:, 0], ValueError, "Reshape your data"),
    "empty": (np.empty((0, 2)), ValueError, "minimum of 2 is required"),
    "no features": (np.empty((30, 0)), ValueError, "minimum of 1 is required"),
    "strings": (np.array([["a", "b"]] * 30), ValueError, "could not convert|dtype"),
    "sparse matrix": (sp.csr_matrix(X_GOOD), TypeError, "dense data is required"),
    "complex": (X_GOOD + 1j, ValueError, "Complex data not supported"),
}


# The clusterer takes sparse input, as KMeans does (tests/test_cluster_sklearn_parameters.py);
# both take NaN as missing entries (tests/test_missing_values.py,
# tests/test_missing_clusterer.py).
BAD_INPUT_CASES = [
    pytest.param(estimator, case, id=f"{case}-{estimator!r}")
    for estimator in ESTIMATORS
    for case in BAD_INPUTS
    if not (case == "sparse matrix" and isinstance(estimator, TransformerClusterer))
]


@pytest.mark.parametrize("estimator, case", BAD_INPUT_CASES)
def test_bad_fit_input_raises_a_clear_error(estimator, case):
    X, error, message = BAD_INPUTS[case]
    with pytest.raises(error, match=message):
        estimator.fit(X)


X_WIDE = np.random.default_rng(1).normal(size=(60, 3))  # d = 3 > K - 1: a projection
X_OUTLIER = X_WIDE.copy()
X_OUTLIER[7, 2] = 1e300


@pytest.mark.parametrize("estimator", ESTIMATORS, ids=repr)
@pytest.mark.parametrize(
    "X", [X_WIDE * 1e154, X_WIDE * 1e300, X_OUTLIER], ids=["1e154", "1e300", "one outlier"]
)
def test_values_whose_squares_overflow_ask_to_rescale(estimator, X):
    # Covariances and squared distances of such data overflow float64: no torch error,
    # an error that says what to do.
    with pytest.raises(ValueError, match=r"too large for float64 .* Rescale X"):
        estimator.fit(X)


@pytest.mark.parametrize("estimator", ESTIMATORS, ids=repr)
@pytest.mark.parametrize("scale", [1e100, 1e-100])
def test_large_and_small_scales_within_float64_fit(estimator, scale):
    # At 1e100, reg_covar (absolute, as GaussianMixture's) is no floor: a start that leaves
    # a component two points fails as scikit-learn's does (GaussianMixture(3) on this data
    # fails for random_state 0 and 1 and fits for 2 to 7). Never a torch error, never a
    # silent non-finite fit, and some seeds fit.
    fitted = 0
    for seed in range(5):
        model = clone(estimator).set_params(random_state=seed)
        try:
            model.fit(X_WIDE * scale)
        except ValueError as error:
            assert "ill-defined empirical covariance" in str(error)
            continue
        centres = getattr(model, "means_", None)
        centres = model.cluster_centers_ if centres is None else centres
        assert np.isfinite(centres).all() and np.abs(centres).max() < 10 * scale
        fitted += 1
    assert fitted >= 3


@pytest.mark.parametrize("estimator", ESTIMATORS, ids=repr)
def test_predict_with_the_wrong_number_of_features(estimator):
    estimator.fit(X_GOOD)
    with pytest.raises(ValueError, match="X has 3 features, but .* is expecting 2 features"):
        estimator.predict(np.zeros((4, 3)))


@pytest.mark.parametrize(
    "params, message",
    [
        (dict(n_components=0), "'n_components' parameter .* must be an int in the range"),
        (dict(covariance_type="banana"), "'covariance_type' parameter"),
        (dict(max_iter=-1), "'max_iter' parameter"),
        (dict(reg_covar=-1.0), "'reg_covar' parameter"),
        (dict(n_init=0), "'n_init' parameter"),
        (dict(checkpoint=3), "'checkpoint' parameter"),
        (dict(device="tpu"), "device='tpu' is not"),
        pytest.param(
            dict(device="cuda"),
            "CUDA is not available",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is present here"),
        ),
    ],
)
def test_bad_parameters_raise_on_fit(params, message):
    with pytest.raises(ValueError, match=message):
        TransformerGMM(**{"checkpoint": None, **params}).fit(X_GOOD)
