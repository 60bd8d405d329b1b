"""Collapsed components: found after every fit, said in a warning, and passed over by the
choice of K with BIC."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from sklearn.datasets import load_wine
from sklearn.preprocessing import StandardScaler

from transformer_gmm import CollapsedComponentWarning, TransformerGMM, fit_many
from transformer_gmm._collapsed import collapsed_components


@pytest.fixture(scope="module")
def wine() -> np.ndarray:
    return StandardScaler().fit_transform(load_wine().data)


def test_the_rule_on_each_covariance_type():
    weights = np.array([0.5, 0.45, 0.05])  # of 100 points: 50, 45 and 5
    means = np.array([[0.0, 0.0, 0.0], [4.0, 0.0, 0.0], [0.0, 4.0, 0.0]])
    full = np.stack([np.eye(3), np.diag([1.0, 1.0, 5e-6]), np.eye(3)])
    # A variance at 5 x reg_covar is at the floor; 5 points suffice for d = 3 (4 needed).
    assert collapsed_components(weights, means, full, "full", 100, 1e-6).tolist() == [
        False, True, False]
    assert collapsed_components(weights, means, full, "full", 60, 1e-6).tolist() == [
        False, True, True]
    diag = np.array([[1.0, 1.0], [1.0, 5e-6], [1.0, 1.0]])
    assert collapsed_components(weights, means[:, :2], diag, "diag", 100, 1e-6).tolist() == [
        False, True, False]
    spherical = np.array([1.0, 5e-6, 1.0])
    assert collapsed_components(weights, means, spherical, "spherical", 20, 1e-6).tolist() == [
        False, True, True  # 20 * 0.05 = 1 point: a variance needs 2
    ]
    tied = np.diag([1.0, 1e-6])
    assert collapsed_components(weights, means[:, :2], tied, "tied", 100, 1e-6).tolist() == [
        True] * 3
    batch = collapsed_components(np.stack([weights] * 2), np.stack([means[:, :2]] * 2),
                                 np.stack([diag] * 2), "diag", np.array([100.0, 100.0]), 1e-6)
    assert batch.shape == (2, 3)


def test_data_whose_variances_are_near_reg_covar_have_nothing_collapsed():
    """Every variance near reg_covar is no collapse where the data vary no more than that:
    the floor is judged against the mixture's own variance."""
    weights, means = np.array([0.5, 0.5]), np.array([[0.0, 0.0], [3e-3, 3e-3]])
    tiny = np.array([[2e-6, 3e-6], [4e-6, 2e-6]])  # diag
    assert not collapsed_components(weights, means, tiny, "diag", 100, 1e-6).any()
    scaled = np.array([[2.0, 3.0], [4.0, 2e-6]])  # the same shape, a million times wider
    assert collapsed_components(weights, means * 1e3, scaled, "diag", 100, 1e-6).tolist() == [
        False, True]


def test_a_direction_the_data_do_not_vary_in_is_no_collapse():
    """A constant feature, or a feature that totals others, puts every component at the
    floor along it: that is the data's; a component at the floor along a direction the
    data vary in still collapsed."""
    weights = np.array([0.5, 0.45, 0.05])  # of 100 points: 50, 45 and 5
    means = np.array([[0.0, 0.0, 1.0], [4.0, 0.0, 1.0], [0.0, 4.0, 1.0]])  # feature 2 constant
    flat = np.stack([np.diag([1.0, 1.0, 1e-6])] * 3)
    for covariance_type, covariances in [
        ("full", flat), ("tied", flat[0]), ("diag", flat.diagonal(axis1=1, axis2=2)),
    ]:
        assert not collapsed_components(
            weights, means, covariances, covariance_type, 100, 1e-6).any(), covariance_type
    thin = flat.copy()
    thin[1, 1, 1] = 5e-6  # component 1 at the floor along feature 1, which the data vary in
    assert collapsed_components(weights, means, thin, "full", 100, 1e-6).tolist() == [
        False, True, False]
    assert collapsed_components(
        weights, means, thin.diagonal(axis1=1, axis2=2), "diag", 100, 1e-6).tolist() == [
        False, True, False]
    # Feature 2 = feature 0 + feature 1 in every component: a direction of no variance.
    total = np.array([[1.0, 0.0, 1.0], [0.0, 1.0, 1.0], [1.0, 1.0, 2.0]]) + 1e-6 * np.eye(3)
    summed = means.copy()
    summed[:, 2] = summed[:, 0] + summed[:, 1]
    assert not collapsed_components(weights, summed, np.stack([total] * 3), "full", 100,
                                    1e-6).any()


@pytest.mark.parametrize("covariance_type", ["full", "tied", "diag", "spherical"])
def test_a_constant_feature_fits_without_a_collapse_warning(covariance_type):
    X = np.random.default_rng(0).normal(size=(200, 3))
    X[:100] += 4.0
    with warnings.catch_warnings():
        warnings.simplefilter("error", CollapsedComponentWarning)
        gmm = TransformerGMM(2, covariance_type=covariance_type, random_state=0)
        gmm.fit(np.c_[X, np.ones(200)])
    assert not gmm.collapsed_components_.any()
    assert np.bincount(gmm.predict(np.c_[X, np.ones(200)])).tolist() == [100, 100]


@pytest.mark.parametrize("covariance_type", ["full", "diag", "spherical"])
def test_the_warning_offers_another_covariance_type(covariance_type):
    X = np.r_[np.random.default_rng(0).normal(size=(200, 3)), [[30.0, 30.0, 30.0]]]
    with pytest.warns(CollapsedComponentWarning) as record:
        TransformerGMM(3, covariance_type=covariance_type, random_state=0).fit(X)
    (message,) = [str(w.message) for w in record if w.category is CollapsedComponentWarning]
    offer = message.split("Use ")[1]
    assert f"'{covariance_type}'" not in offer and "'tied'" in offer


@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e3])
def test_the_same_collapse_at_every_scale(wine, scale):
    """wine with K = 5 from one start: one component holds 13 points or fewer in 13
    dimensions whatever the units (reg_covar in the same units, so the problem is one).
    Near a collapse EM amplifies rounding, so the seed is one whose fits collapse at
    every scale (of seeds 0 to 7, 6 is)."""
    with pytest.warns(CollapsedComponentWarning):
        gmm = TransformerGMM(5, n_init=1, reg_covar=1e-6 * scale**2, random_state=6)
        gmm.fit(wine * scale)
    assert gmm.collapsed_components_.sum() == 1


def test_a_fit_with_a_collapsed_component_says_so(wine):
    with pytest.warns(CollapsedComponentWarning, match=r"components \[2\].*fewer than 14"):
        gmm = TransformerGMM(5, n_init=1, random_state=6).fit(wine)
    assert gmm.collapsed_components_.tolist() == [False, False, True, False, False]
    smallest = np.linalg.eigvalsh(gmm.covariances_[2])[0]
    assert smallest <= 10 * gmm.reg_covar and gmm.weights_[2] * len(wine) < 14


def test_the_choice_of_run_passes_over_collapsed_runs(wine):
    """Of several runs, one without a collapsed component is kept where one exists, though
    a collapsed one is likelier; where every run collapses, the likeliest is kept."""
    with pytest.warns(CollapsedComponentWarning):  # both of the transformer's runs collapse
        every_run_collapsed = TransformerGMM(5, n_init=2, random_state=2).fit(wine)
    assert every_run_collapsed.collapsed_components_.any()
    with warnings.catch_warnings():
        warnings.simplefilter("error", CollapsedComponentWarning)
        four = TransformerGMM(5, n_init=4, random_state=2).fit(wine)  # and two k-means++ runs
    assert not four.collapsed_components_.any()
    assert four.init_method_ == "k-means++"
    assert four.score(wine) < every_run_collapsed.score(wine) - 1.0


def test_a_clean_fit_is_silent(wine):
    with warnings.catch_warnings():
        warnings.simplefilter("error", CollapsedComponentWarning)
        gmm = TransformerGMM(3, random_state=0).fit(wine)
    assert not gmm.collapsed_components_.any()
    diag = TransformerGMM(4, covariance_type="diag", random_state=0).fit(wine)
    assert diag.collapsed_components_.shape == (4,)


def test_bic_passes_over_collapsed_candidates(wine):
    """On standardized wine, BIC used to choose K = 10, six components collapsed; it now
    chooses among clean candidates, within one of the three cultivars."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", CollapsedComponentWarning)
        gmm = TransformerGMM(n_components="auto", criterion="bic", random_state=0).fit(wine)
    assert abs(len(gmm.weights_) - 3) <= 1 and not gmm.collapsed_components_.any()
    # ... and BIC would have chosen a collapsed candidate: the rule made the difference.
    best = gmm.candidates_[np.argmin(gmm.criterion_)]
    assert best > len(gmm.weights_)


def test_fit_many_marks_and_warns_once(wine):
    with pytest.warns(CollapsedComponentWarning, match="1 of 2 mixtures") as record:
        fits = fit_many([wine, wine[:60]], 4, random_state=0, output="arrays")
    assert len([w for w in record if w.category is CollapsedComponentWarning]) == 1
    assert fits.collapsed.shape == (2, 4)
    estimators = fit_many([wine, wine[:60]], 4, random_state=0)
    for i, estimator in enumerate(estimators):
        np.testing.assert_array_equal(estimator.collapsed_components_, fits.collapsed[i])


@pytest.mark.parametrize("criterion", ["posterior", "bic"])
def test_a_chosen_k_with_collapsed_components_warns(wine, criterion):
    """Where every candidate collapses (9 or 10 components for 178 wines in 13
    dimensions), the chosen one is kept, and says so, whichever criterion chose it."""
    with pytest.warns(CollapsedComponentWarning):
        gmm = TransformerGMM(n_components=[9, 10], criterion=criterion, random_state=0).fit(wine)
    assert gmm.selection_criterion_ == criterion and gmm.collapsed_components_.any()
