"""The conjugate prior on the covariances of EM on the observed entries
(``missing_covariance_prior``): its M-step, its log-density, the bound EM climbs with it,
and where the estimator uses it."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from sklearn.utils._param_validation import InvalidParameterError

from transformer_gmm import CollapsedComponentWarning, TransformerGMM
from transformer_gmm.engine import e_step, m_step, missing, sufficient_stats
from transformer_gmm.engine.covariance_prior import CovariancePrior, resolve_count

COVARIANCE_TYPES = ["full", "tied", "diag", "spherical"]


def rows_with_gaps(n=240, d=5, rate=0.3, seed=0):
    rng = np.random.default_rng(seed)
    X = np.vstack([rng.normal(m, 1.0, (n // 3, d)) for m in (-3.0, 0.0, 3.0)])
    X[:, 1] += 0.8 * X[:, 0]  # correlated features: the full covariances differ from diag
    gaps = rng.random(X.shape) < rate
    gaps[gaps.all(axis=1), 0] = False
    return X, np.where(gaps, np.nan, X)


def typed(full: np.ndarray, covariance_type: str, nk: np.ndarray) -> np.ndarray:
    """Full per-component covariances (K, d, d) as ``covariance_type`` keeps them."""
    if covariance_type == "full":
        return full
    if covariance_type == "tied":
        return np.einsum("k,kde->de", nk, full) / nk.sum()
    diagonal = np.diagonal(full, axis1=1, axis2=2).copy()
    return diagonal if covariance_type == "diag" else diagonal.mean(-1)


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_the_m_step_is_the_prior_mode(covariance_type):
    # (scatter + count * scale) / (n_k + count), from the rows and responsibilities directly.
    X, _ = rows_with_gaps()
    rng = np.random.default_rng(1)
    resp = rng.random((len(X), 3))
    resp /= resp.sum(1, keepdims=True)
    x = torch.as_tensor(X)[None]
    start = m_step.estimate_gaussian_parameters(
        x, torch.as_tensor(resp)[None], covariance_type=covariance_type, reg_covar=0.0
    )
    statistics = sufficient_stats.mixture_statistics(x, start, covariance_type)
    _, log_resp = e_step.e_step(x, start, covariance_type)
    r = log_resp[0].exp().numpy()
    nk = r.sum(0)
    means = r.T @ X / nk[:, None]
    centred = X[None] - means[:, None]  # (K, n, d)
    scatter = np.einsum("kn,knd,kne->kde", r.T, centred, centred)  # (K, d, d)
    scale = np.array([0.5, 1.0, 1.5, 2.0, 2.5])
    count = 3.0
    prior = CovariancePrior(count, torch.as_tensor(scale))
    params, failed = sufficient_stats.parameters_from_statistics(
        statistics, start.means, covariance_type, 1e-6, prior
    )
    if covariance_type == "tied":
        expected = (scatter.sum(0) + count * np.diag(scale)) / (nk.sum() + count)
    else:
        mode = (scatter + count * np.diag(scale)) / (nk + count)[:, None, None]
        expected = typed(mode, covariance_type, nk)
    expected = expected + 1e-6 * (np.eye(5) if covariance_type in ("full", "tied") else 1.0)
    np.testing.assert_allclose(params.covariances[0].numpy(), expected, rtol=1e-10)
    np.testing.assert_allclose(params.means[0].numpy(), means, rtol=1e-10)  # flat on means
    assert not failed.any()


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_log_density_is_the_inverse_wishart_kernel(covariance_type):
    # -count / 2 * sum_k (log det S_k + trace(scale S_k^-1)), from the covariances.
    rng = np.random.default_rng(2)
    a = rng.normal(size=(3, 4, 4))
    full = a @ a.transpose(0, 2, 1) + np.eye(4)
    covariances = typed(full, covariance_type, np.array([1.0, 2.0, 3.0]))
    covariances_t = torch.as_tensor(covariances)[None]
    precisions_cholesky = m_step.compute_precision_cholesky(covariances_t, covariance_type)
    scale = np.array([0.3, 1.0, 2.0, 0.7])
    prior = CovariancePrior(2.5, torch.as_tensor(scale))
    as_full = missing.full_covariances(covariances_t[0], covariance_type, 4)
    as_full = as_full.expand(1 if covariance_type == "tied" else 3, -1, -1).numpy()
    expected = -0.5 * 2.5 * sum(
        np.linalg.slogdet(s)[1] + np.trace(np.diag(scale) @ np.linalg.inv(s)) for s in as_full
    )
    got = prior.log_density(precisions_cholesky, covariance_type)
    np.testing.assert_allclose(got.numpy(), [expected], rtol=1e-10)


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_em_with_the_prior_never_loses_ground(covariance_type):
    _, X = rows_with_gaps(rate=0.4)
    gmm = TransformerGMM(
        3, covariance_type=covariance_type, checkpoint=None, random_state=0, tol=1e-10,
        max_iter=300, missing_covariance_prior=2.0,
    ).fit(X)
    assert gmm.converged_
    assert np.all(np.diff(gmm.lower_bounds_) > -1e-10)


def test_the_prior_keeps_full_covariances_wide():
    # Each covariance is at least count * scale / (n_k + count): no direction thinner, and
    # no component collapses, where maximum likelihood collapses two of three.
    _, X = rows_with_gaps(n=60, d=5, rate=0.5)
    for count in (1.0, 10.0):
        with warnings.catch_warnings():
            warnings.simplefilter("error", CollapsedComponentWarning)
            gmm = TransformerGMM(
                3, checkpoint=None, random_state=0, missing_covariance_prior=count
            ).fit(X)
        observed = ~np.isnan(X)
        variance = np.nanvar(X, axis=0)
        scale = variance / 3 ** (2 / 5)
        nk = gmm.weights_ * observed.shape[0]
        for covariance, n in zip(gmm.covariances_, nk, strict=True):
            floor = count * scale.min() / (n + count)
            assert np.linalg.eigvalsh(covariance).min() >= floor * (1 - 1e-9)
    # Maximum likelihood lets them thin out below that.
    with pytest.warns(CollapsedComponentWarning):
        ml = TransformerGMM(
            3, checkpoint=None, random_state=0, missing_covariance_prior=0
        ).fit(X)
    smallest = min(np.linalg.eigvalsh(c).min() for c in ml.covariances_)
    assert smallest < 1.0 * scale.min() / (nk.max() + 1.0)


def test_auto_is_one_row_for_full_covariances_and_none_for_the_others():
    assert resolve_count("auto", "full") == 1.0
    for covariance_type in ("tied", "diag", "spherical"):
        assert resolve_count("auto", covariance_type) == 0.0
    _, X = rows_with_gaps()
    fits = {
        (prior, covariance_type): TransformerGMM(
            3, covariance_type=covariance_type, checkpoint=None, random_state=0,
            missing_covariance_prior=prior,
        ).fit(X)
        for covariance_type in ("full", "diag")
        for prior in ("auto", 0.0)
    }
    full_auto, full_none = fits["auto", "full"], fits[0.0, "full"]
    assert not np.allclose(full_auto.covariances_, full_none.covariances_)
    np.testing.assert_array_equal(fits["auto", "diag"].covariances_, fits[0.0, "diag"].covariances_)


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_without_missing_values_the_prior_is_not_used(covariance_type):
    X, _ = rows_with_gaps()
    fits = [
        TransformerGMM(3, covariance_type=covariance_type, checkpoint=None, random_state=0,
                       missing_covariance_prior=prior).fit(X)
        for prior in (0.0, "auto", 5.0)
    ]
    for fitted in fits[1:]:
        np.testing.assert_array_equal(fitted.covariances_, fits[0].covariances_)
        assert fitted.lower_bound_ == fits[0].lower_bound_


def test_scaling_the_weights_keeps_the_fit():
    # The prior's count is in rows of average weight, so only the weights' ratios matter.
    _, X = rows_with_gaps()
    weight = np.random.default_rng(3).uniform(0.5, 2.0, len(X))
    fits = [
        TransformerGMM(3, checkpoint=None, random_state=0).fit(X, sample_weight=c * weight)
        for c in (1.0, 8.0)
    ]
    np.testing.assert_allclose(fits[1].covariances_, fits[0].covariances_, rtol=1e-9)
    np.testing.assert_allclose(fits[1].means_, fits[0].means_, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("value", [-1.0, np.inf, np.nan, "none"])
def test_a_bad_prior_is_a_clear_error(value):
    _, X = rows_with_gaps()
    with pytest.raises(InvalidParameterError, match="missing_covariance_prior"):
        TransformerGMM(3, checkpoint=None, missing_covariance_prior=value).fit(X)


def test_a_feature_observed_only_in_rows_of_no_weight_takes_no_prior_spread():
    # Its weighted variance is undefined: the prior's scale is 0 there, and the fit goes on.
    X, _ = rows_with_gaps()
    X[10:, 2] = np.nan  # feature 2 observed in the first ten rows alone
    weight = np.ones(len(X))
    weight[:10] = 0.0
    x = torch.as_tensor(X)
    observed = ~torch.isnan(x)
    prior = CovariancePrior.of_data(
        torch.where(observed, x, 0.0), observed, torch.as_tensor(weight), 3, 1.0
    )
    assert prior.scale[2] == 0.0 and torch.all(prior.scale[[0, 1, 3, 4]] > 0)
    # Nothing of weight spreads feature 2: every component's variance sits at the reg_covar
    # floor there, as the data's own does, which is not a collapse onto a few points.
    with warnings.catch_warnings():
        warnings.simplefilter("error", CollapsedComponentWarning)
        gmm = TransformerGMM(3, checkpoint=None, random_state=0).fit(X, sample_weight=weight)
    assert np.isfinite(gmm.covariances_).all() and not gmm.collapsed_components_.any()
