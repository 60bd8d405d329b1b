"""The plans of the two algorithms, and Lloyd's named result."""

import numpy as np
import pytest
import torch

from transformer_gmm.engine import kmeans
from transformer_gmm.engine.plan import FitPlan, GivenStarts, KMeansPlan, MixturePlan

SETTINGS = dict(n_components=3, max_iter=10, tol=1e-3, device="cpu", seed=0)


def test_a_plan_names_its_algorithm():
    with pytest.raises(TypeError, match="MixturePlan or a KMeansPlan"):
        FitPlan(**SETTINGS)
    with pytest.raises(TypeError):  # EM needs its covariance type
        MixturePlan(**SETTINGS)


def test_each_plan_counts_its_own_given_starts():
    resp = np.full((2, 5, 3), 1 / 3)
    mixture = MixturePlan(
        **SETTINGS, covariance_type="diag", n_kmeans_inits=1, given=GivenStarts(resp=resp)
    )
    assert (mixture.n_given, mixture.n_runs) == (2, 3)
    centers = np.zeros((4, 3, 2))
    assert KMeansPlan(**SETTINGS, n_transformer_inits=1, given=centers).n_runs == 5
    assert not hasattr(mixture, "trace")
    assert not hasattr(KMeansPlan(**SETTINGS), "covariance_type")


def test_lloyd_names_its_result():
    X = torch.tensor([[[0.0], [0.1], [5.0], [5.1]]], dtype=torch.float64)
    result = kmeans.lloyd(X, X[:, [0, 2]], max_iter=10)
    centers, labels, inertia, n_iter = result  # still unpacks, in this order
    assert result.centers is centers and result.n_iter is n_iter
    assert result.labels.tolist() == [[0, 0, 1, 1]]
    assert kmeans.lloyd(X, X[:, [0, 2]], max_iter=10, with_inertia=False).inertia is None
