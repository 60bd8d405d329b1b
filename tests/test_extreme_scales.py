"""Data at the edges of the floating-point range: a mixture whose components cannot
separate says so, and float32 data beyond float32's range are refused before they overflow.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from sklearn.datasets import make_blobs

from transformer_gmm import (
    CollapsedComponentWarning,
    TransformerClusterer,
    TransformerGMM,
    fit_many,
)


@pytest.fixture(scope="module")
def blobs():
    return make_blobs(300, centers=3, random_state=0)[0]


# --- components that cannot separate ------------------------------------------------------


@pytest.mark.parametrize("scale", [1e-300, 1e-160, 1e-5])
@pytest.mark.parametrize("checkpoint", ["default", None])
def test_components_that_repeat_others_warn(blobs, scale, checkpoint):
    """Where X varies far less than reg_covar, every point is as likely under each
    component: EM returns copies of one component, which must not pass in silence."""
    with pytest.warns(CollapsedComponentWarning, match=r"repeat others.*lower reg_covar"):
        gmm = TransformerGMM(3, checkpoint=checkpoint, random_state=0).fit(blobs * scale)
    # Copies indeed: the means a millionth of the data's spread apart at most.
    assert np.ptp(gmm.means_, axis=0).max() <= 1e-6 * scale * np.ptp(blobs)


def test_well_scaled_components_do_not_warn(blobs):
    with warnings.catch_warnings():
        warnings.simplefilter("error", CollapsedComponentWarning)
        gmm = TransformerGMM(3, random_state=0).fit(blobs)
        # The same data, at a scale where reg_covar is still negligible.
        TransformerGMM(3, random_state=0).fit(blobs * 1e-2)
    assert len(np.unique(gmm.predict(blobs))) == 3


def test_fit_many_says_which_mixtures_repeat_components(blobs):
    with pytest.warns(CollapsedComponentWarning, match="1 of 2 mixtures have components"):
        fit_many([blobs, blobs * 1e-200], n_components=3, random_state=0)


@pytest.mark.parametrize("covariance_type", ["full", "tied", "diag", "spherical"])
def test_identical_components_compare_means_and_covariances(covariance_type):
    from transformer_gmm._collapsed import identical_components

    means = np.array([[0.0, 0.0], [0.0, 1e-4], [0.0, 0.5], [0.0, 0.0]])
    variances = np.array([[1.0, 1.0], [1.0, 1.0], [1.0, 1.0], [4.0, 4.0]])  # (K, d)
    covariances = {
        "full": np.stack([np.diag(v) for v in variances]),
        "tied": np.eye(2),
        "diag": variances,
        "spherical": variances[:, 0],
    }[covariance_type]
    if covariance_type == "full":
        factors = np.linalg.inv(np.linalg.cholesky(covariances)).transpose(0, 2, 1)
    elif covariance_type == "tied":
        factors = np.eye(2)
    else:
        factors = 1 / np.sqrt(covariances)
    found = identical_components(means, covariances, factors, covariance_type)
    # Component 1 repeats 0 (a ten-thousandth of a standard deviation away); 2 is half a
    # standard deviation away; 3 has 0's mean but four times its variance (one tied
    # covariance: then the same component).
    assert found.tolist() == [False, True, False, covariance_type == "tied"]
    batch = identical_components(means[None].repeat(2, 0), covariances[None].repeat(2, 0),
                                 factors[None].repeat(2, 0), covariance_type)
    assert batch.tolist() == [found.tolist()] * 2


# --- float32 data beyond float32's range ----------------------------------------------------


@pytest.mark.parametrize("estimator", [TransformerGMM(3, random_state=0),
                                       TransformerGMM(3, checkpoint=None, random_state=0),
                                       TransformerClusterer(3, random_state=0)])
def test_float32_data_beyond_float32_range_are_refused(blobs, estimator):
    """Their covariances (about 1e40) do not fit in the float32 that the fitted
    attributes keep: an infinite covariance, and sample() of NaN, before."""
    X = (blobs * 1e19).astype(np.float32)
    with pytest.raises(ValueError, match=r"too large for float32 .*X\.astype\(np\.float64\)"):
        estimator.fit(X)


def test_the_same_data_in_float64_fit(blobs):
    X = (blobs * 1e19).astype(np.float32).astype(np.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no overflow anywhere
        gmm = TransformerGMM(3, random_state=0).fit(X)
        samples, _ = gmm.sample(10)
    assert gmm.covariances_.dtype == np.float64 and np.isfinite(gmm.covariances_).all()
    assert np.isfinite(samples).all()


def test_float32_data_within_range_fit_in_float32(blobs):
    X = (blobs * 1e12).astype(np.float32)
    gmm = TransformerGMM(3, random_state=0).fit(X)
    assert gmm.covariances_.dtype == np.float32 and np.isfinite(gmm.covariances_).all()
    assert np.isfinite(gmm.sample(10)[0]).all()


# --- data far from the origin -------------------------------------------------------------


@pytest.mark.parametrize("merge", [False, True])
def test_rows_far_from_the_origin_are_predicted_as_fitted(blobs, merge):
    """Rows 1e9 from the origin: scikit-learn's expanded distances lose the unit
    distances there (KMeans's predict then disagrees with its own labels_); the
    clusterer's predict, transform and score, with and without gaps, agree with its fit."""
    far = blobs + 1e9
    kwargs = dict(n_clusters="auto", merge=True) if merge else dict(n_clusters=3)
    km = TransformerClusterer(**kwargs, random_state=0).fit(far)
    np.testing.assert_array_equal(km.predict(far), km.labels_)
    if not merge:
        nearest = km.cluster_centers_[km.labels_]
        np.testing.assert_allclose(km.transform(far).min(axis=1) ** 2,
                                   ((far - nearest) ** 2).sum(axis=1), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(km.score(far), -km.inertia_, rtol=1e-9)
        gaps = far.copy()
        gaps[::7, 1] = np.nan
        fitted = TransformerClusterer(3, random_state=0).fit(blobs)
        np.testing.assert_array_equal(km.predict(gaps) == km.labels_,
                                      fitted.predict(gaps - 1e9) == fitted.labels_)
