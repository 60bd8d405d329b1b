"""scikit-learn's own estimator checks, on the transformer path and on the EM path."""

from __future__ import annotations

import pickle

import joblib
import numpy as np
import pytest
from conftest import TINY_CHECKPOINT, TINY_K_CHECKPOINT, make_blobs
from sklearn.base import BaseEstimator, clone
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import parametrize_with_checks

from transformer_gmm import TransformerClusterer, TransformerGMM

ESTIMATORS = [
    # The tiny checkpoint has heads for 2..4 components and d_max = 4, so the checks'
    # data exercise zero-padding, projection (n_features > 4) and subsampling (n > 64).
    TransformerGMM(n_components=2, checkpoint=TINY_CHECKPOINT),
    TransformerGMM(n_components=2, covariance_type="spherical", checkpoint=TINY_CHECKPOINT),
    TransformerGMM(n_components=2, checkpoint=None),
    TransformerClusterer(n_clusters=3, checkpoint=TINY_CHECKPOINT),
    TransformerClusterer(n_clusters=3, checkpoint=None),
    # K chosen by the learned posterior (a random one here), and by BIC (the default
    # criterion="auto" without a checkpoint).
    TransformerGMM(n_components="auto", criterion="posterior", checkpoint=TINY_K_CHECKPOINT),
    TransformerGMM(n_components="auto", checkpoint=None, max_components=4),
    TransformerClusterer(n_clusters="auto", criterion="posterior", checkpoint=TINY_K_CHECKPOINT),
    TransformerClusterer(n_clusters="auto", checkpoint=None, max_clusters=4),
]


def expected_failed_checks(estimator) -> dict[str, str]:
    """The failures scikit-learn expects of its own KMeans: with random starts, weighted
    rows and repeated rows draw different starts, so the fits differ. From the same
    start they are the same (tests/test_gmm_sklearn_parameters.py,
    tests/test_cluster_sklearn_parameters.py)."""
    reason = (
        "the k-means++ seeds and the rows the transformer reads are random draws, which "
        "differ between weighted and repeated rows, as KMeans's seeds do"
    )
    params = estimator.get_params()
    by_bic = params["criterion"] == "bic" or params["checkpoint"] is None  # "auto" too
    if isinstance(params.get("n_components"), str) and by_bic:
        # On the check's data (15 samples of 30 features) BIC chooses K = 1, weighted or
        # repeated, and a fit of one component draws nothing at random.
        return {}
    checks = ["check_sample_weight_equivalence_on_dense_data"]
    if isinstance(estimator, TransformerClusterer):  # the one that takes sparse input
        checks.append("check_sample_weight_equivalence_on_sparse_data")
    return dict.fromkeys(checks, reason)


# The only skips are scikit-learn's own: check_array_api_input (the estimators declare
# array API support) runs where SCIPY_ARRAY_API=1 is set, and skips otherwise.
@parametrize_with_checks(ESTIMATORS, expected_failed_checks=expected_failed_checks)
def test_sklearn_estimator_checks(estimator, check):
    check(estimator)


@pytest.mark.filterwarnings("ignore::transformer_gmm.FallbackWarning")
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_grid_search_picks_three_components_on_three_blobs(seed):
    # Held-out log-likelihood (the default scoring) separates K = 3 from K = 4 clearly
    # only when an extra component costs enough parameters: full covariances in d = 5.
    # The default estimator is what a user would search over (the random-weight test
    # checkpoint, by design, often leads EM to a poor local optimum).
    centers = np.zeros((3, 5))
    centers[0, 0], centers[1, 1], centers[2, 0] = -10.0, 10.0, 10.0
    X = make_blobs(50, centers, seed=seed)
    search = GridSearchCV(TransformerGMM(random_state=0), {"n_components": [1, 2, 3, 4, 5]}).fit(X)
    assert search.best_params_ == {"n_components": 3}


def test_pipeline_with_scaler(three_blobs):
    pipeline = make_pipeline(
        StandardScaler(), TransformerGMM(n_components=3, checkpoint=TINY_CHECKPOINT, random_state=0)
    )
    labels = pipeline.fit(three_blobs).predict(three_blobs)
    assert np.bincount(labels, minlength=3).tolist() == [60, 60, 60]
    assert np.isfinite(pipeline.score(three_blobs))


@pytest.mark.parametrize("Estimator", [TransformerGMM, TransformerClusterer])
def test_clone_keeps_parameters_and_drops_fit(Estimator, three_blobs):
    estimator = Estimator(3, checkpoint=TINY_CHECKPOINT, random_state=0).fit(three_blobs)
    copy = clone(estimator)
    assert copy.get_params() == estimator.get_params()
    assert not hasattr(copy, "n_features_in_")


@pytest.mark.parametrize("Estimator", [TransformerGMM, TransformerClusterer])
def test_parameter_names_are_scikit_learns_read_once(Estimator):
    # The names are read from the constructor once per class; a subclass with a
    # constructor of its own gets its own names, as scikit-learn reads them.
    class Subclass(Estimator):
        def __init__(self, extra=1, checkpoint=None):
            super().__init__(checkpoint=checkpoint)
            self.extra = extra

    for cls in (Estimator, Subclass):
        assert cls._get_param_names() == BaseEstimator._get_param_names.__func__(cls)
    assert Subclass._get_param_names() == ["checkpoint", "extra"]
    names = Estimator._get_param_names()
    names.append("not a parameter")  # a caller's copy: the next call is unchanged
    assert "not a parameter" not in Estimator._get_param_names()


@pytest.mark.parametrize("Estimator", [TransformerGMM, TransformerClusterer])
@pytest.mark.parametrize("round_trip", ["pickle", "joblib"])
def test_serialisation_round_trip(Estimator, round_trip, three_blobs, tmp_path):
    estimator = Estimator(3, checkpoint=TINY_CHECKPOINT, random_state=0).fit(three_blobs)
    if round_trip == "pickle":
        loaded = pickle.loads(pickle.dumps(estimator))
    else:
        joblib.dump(estimator, tmp_path / "model.joblib")
        loaded = joblib.load(tmp_path / "model.joblib")
    np.testing.assert_array_equal(loaded.predict(three_blobs), estimator.predict(three_blobs))
    assert loaded.score(three_blobs) == estimator.score(three_blobs)
    # Fitted state is plain numpy (no tensors), so a fit on CUDA unpickles on a CPU machine.
    for name, value in vars(loaded).items():
        if name.endswith("_"):
            assert type(value).__module__.split(".")[0] in ("numpy", "builtins"), name
