"""TransformerGMM on data with missing entries (NaN): EM for data missing at random,
scores as marginal densities over the observed features, and the untouched path without
NaN."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import TINY_CHECKPOINT
from scipy.special import logsumexp
from scipy.stats import multivariate_normal
from sklearn.impute import SimpleImputer
from sklearn.mixture import GaussianMixture

from transformer_gmm import TransformerClusterer, TransformerGMM, _missing
from transformer_gmm.engine import missing
from transformer_gmm.engine.covariance_prior import CovariancePrior, resolve_count

COVARIANCE_TYPES = ["full", "diag", "tied", "spherical"]
TRUE_MEANS = np.array([[0.0, 0.0, 0.0, 0.0], [6.0, 6.0, 0.0, 2.0], [0.0, 6.0, 6.0, -3.0]])


def mixture_with_gaps(rate: float = 0.15, n_per_component: int = 400, seed: int = 0):
    """Rows of a known 3-component mixture (correlated features), and the same rows with
    ``rate`` of their entries missing completely at random (no row left empty)."""
    rng = np.random.default_rng(seed)
    covariance = 0.6 * np.eye(4) + 0.4  # correlated: the observed features predict the rest
    X = np.vstack([rng.multivariate_normal(m, covariance, n_per_component) for m in TRUE_MEANS])
    gaps = rng.random(X.shape) < rate
    gaps[gaps.all(axis=1), 0] = False
    return X, np.where(gaps, np.nan, X)


def matched_error(means: np.ndarray) -> float:
    """The largest distance from a true mean to the fitted mean nearest to it."""
    distances = np.linalg.norm(TRUE_MEANS[:, None] - means[None], axis=-1)
    return float(distances.min(axis=1).max())


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_means_close_to_truth_and_closer_than_mean_imputation(covariance_type):
    _, X = mixture_with_gaps(rate=0.2)
    gmm = TransformerGMM(3, covariance_type=covariance_type, checkpoint=None, random_state=0)
    gmm.fit(X)
    error = matched_error(gmm.means_)
    imputed = SimpleImputer(strategy="mean").fit_transform(X)
    baseline = GaussianMixture(3, covariance_type=covariance_type, random_state=0).fit(imputed)
    baseline_error = matched_error(baseline.means_)
    assert error < 0.25, error
    # Mean imputation pulls each component's mean towards the mean of all rows.
    assert error < 0.5 * baseline_error, (error, baseline_error)
    assert gmm.converged_
    assert np.isclose(gmm.weights_.sum(), 1.0)


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_score_samples_is_the_marginal_density_of_the_observed_features(covariance_type):
    _, X = mixture_with_gaps()
    gmm = TransformerGMM(3, covariance_type=covariance_type, checkpoint=None, random_state=0)
    gmm.fit(X)
    covariances = missing.full_covariances(
        torch.as_tensor(gmm.covariances_), covariance_type, X.shape[1]
    ).expand(3, -1, -1).numpy()
    rows = X[np.isnan(X).any(axis=1)][:20]
    expected = []
    for row in rows:
        o = ~np.isnan(row)
        expected.append(logsumexp([
            np.log(w) + multivariate_normal(m[o], c[np.ix_(o, o)]).logpdf(row[o])
            for w, m, c in zip(gmm.weights_, gmm.means_, covariances, strict=True)
        ]))
    np.testing.assert_allclose(gmm.score_samples(rows), expected, rtol=1e-10)
    assert np.isclose(gmm.score(rows), np.mean(expected))


def test_predict_and_predict_proba_read_the_observed_features():
    _, X = mixture_with_gaps()
    gmm = TransformerGMM(3, checkpoint=None, random_state=0).fit(X)
    proba = gmm.predict_proba(X)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0)
    np.testing.assert_array_equal(gmm.predict(X), proba.argmax(axis=1))
    np.testing.assert_array_equal(
        TransformerGMM(3, checkpoint=None, random_state=0).fit_predict(X), gmm.predict(X)
    )
    # A row's label comes from its observed features: dropping a feature of a row that
    # sits on a component's mean keeps it there.
    row = TRUE_MEANS[1].copy()
    row[0] = np.nan
    label_full = gmm.predict(TRUE_MEANS[1:2])[0]
    assert gmm.predict(row[None])[0] == label_full
    assert np.isfinite(gmm.bic(X)) and np.isfinite(gmm.aic(X))


def objective(gmm, X) -> float:
    """What EM on the observed entries climbs, per row, for ``gmm``'s fitted parameters:
    the mean observed log-likelihood, plus the covariance prior's log-density per row
    where ``missing_covariance_prior`` asks for one."""
    count = resolve_count(gmm.missing_covariance_prior, gmm.covariance_type)
    if count == 0:
        return gmm.score(X)
    x = torch.as_tensor(X)
    observed = ~torch.isnan(x)
    prior = CovariancePrior.of_data(
        torch.where(observed, x, 0.0), observed, torch.ones(len(X), dtype=x.dtype),
        len(gmm.weights_), count,
    )
    precisions_cholesky = torch.as_tensor(gmm.precisions_cholesky_)[None]
    log_density = float(prior.log_density(precisions_cholesky, gmm.covariance_type))
    return gmm.score(X) + log_density / len(X)


def assert_lower_bound_of_the_last_e_step(gmm, X):
    """As every fit's: lower_bound_ is the objective (the mean observed log-likelihood,
    and the prior's share) of the last E-step, which the last M-step (the fitted
    parameters) raises by less than about tol, as it raised the one before by less than
    tol."""
    assert gmm.converged_
    assert gmm.lower_bound_ == gmm.lower_bounds_[-1]
    assert gmm.lower_bound_ - 1e-12 <= objective(gmm, X) < gmm.lower_bound_ + gmm.tol


@pytest.mark.parametrize("prior", [0.0, "auto"])
def test_lower_bound_is_the_mean_observed_log_likelihood(prior):
    # Without a prior the mean observed log-likelihood; with one (full covariances'
    # "auto"), that plus the prior's log-density per row, the objective EM then climbs.
    _, X = mixture_with_gaps()
    gmm = TransformerGMM(
        3, checkpoint=None, random_state=0, tol=1e-8, missing_covariance_prior=prior
    ).fit(X)
    assert np.isclose(gmm.lower_bound_, objective(gmm, X), rtol=1e-9)
    assert (gmm.score(X) - gmm.lower_bound_ > 1e-6) == (prior == "auto")
    assert np.all(np.diff(gmm.lower_bounds_) > -1e-9)  # EM never loses ground


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
@pytest.mark.parametrize("weighted", [False, True])
def test_the_same_fit_whatever_the_row_order(covariance_type, weighted):
    # EM on the observed entries reads the rows in canonical order, as every fit does: the
    # same parameters to the bit (with a tiny checkpoint, whose starts are the plan's).
    _, X = mixture_with_gaps(rate=0.3, n_per_component=60)
    weight = np.random.default_rng(4).uniform(0.5, 2.0, len(X)) if weighted else None
    order = np.random.default_rng(5).permutation(len(X))
    fits = [
        TransformerGMM(
            3, covariance_type=covariance_type, checkpoint=TINY_CHECKPOINT, random_state=0
        ).fit(rows, sample_weight=w)
        for rows, w in [(X, weight), (X[order], None if weight is None else weight[order])]
    ]
    for name in ("weights_", "means_", "covariances_"):
        np.testing.assert_array_equal(getattr(fits[1], name), getattr(fits[0], name))
    assert fits[1].lower_bound_ == fits[0].lower_bound_


def test_float32_keeps_its_dtype():
    _, X = mixture_with_gaps()
    # Several k-means++ starts: a float32 copy draws other seeds than float64's.
    gmm = TransformerGMM(3, checkpoint=None, n_init=3, random_state=0)
    gmm.fit(X.astype(np.float32))
    assert gmm.means_.dtype == np.float32
    assert gmm.score_samples(X.astype(np.float32)).dtype == np.float32


def test_a_row_with_every_feature_missing_is_an_error():
    _, X = mixture_with_gaps()
    X_bad = X.copy()
    X_bad[5] = np.nan
    with pytest.raises(ValueError, match="every feature missing"):
        TransformerGMM(3, checkpoint=None).fit(X_bad)
    gmm = TransformerGMM(3, checkpoint=None, random_state=0).fit(X)
    for method in (gmm.predict, gmm.predict_proba, gmm.score_samples, gmm.score):
        with pytest.raises(ValueError, match="every feature missing"):
            method(X_bad[:10])


def test_a_column_with_every_value_missing_is_an_error():
    _, X = mixture_with_gaps()
    X[:, 2] = np.nan
    with pytest.raises(ValueError, match=r"Column\(s\) \[2\]"):
        TransformerGMM(3, checkpoint=None).fit(X)


def test_inf_is_still_an_error():
    _, X = mixture_with_gaps()
    X[0, 0] = np.inf
    for estimator in (TransformerGMM(3, checkpoint=None), TransformerClusterer(3, checkpoint=None)):
        with pytest.raises(ValueError, match="Input X contains infinity"):
            estimator.fit(X)


def test_without_nan_the_fit_never_takes_the_missing_data_path(monkeypatch):
    X, _ = mixture_with_gaps()
    reference = TransformerGMM(3, checkpoint=None, random_state=0).fit(X)

    def forbidden(*args, **kwargs):
        raise AssertionError("the missing-data path ran on data without NaN")

    monkeypatch.setattr(_missing, "mean_imputed", forbidden)
    monkeypatch.setattr(missing, "weighted_log_prob", forbidden)
    monkeypatch.setattr(missing, "fit_em_missing", forbidden)
    gmm = TransformerGMM(3, checkpoint=None, random_state=0).fit(X)
    for name in ("weights_", "means_", "covariances_", "precisions_cholesky_", "lower_bound_"):
        np.testing.assert_array_equal(getattr(gmm, name), getattr(reference, name))
    gmm.predict(X), gmm.predict_proba(X), gmm.score_samples(X), gmm.fit_predict(X)


def test_without_nan_the_fit_is_the_fit_of_the_plan():
    """The fit without NaN is exactly the plan's run (the path that existed before NaN
    were accepted), to the bit."""
    from sklearn.utils import check_random_state

    from transformer_gmm import _fitting

    X, _ = mixture_with_gaps()
    gmm = TransformerGMM(3, checkpoint=None, random_state=0).fit(X)
    plan = _fitting.mixture_plan(gmm.get_params(deep=False), X, None, check_random_state(0))
    fits = _fitting.run(plan, X)
    np.testing.assert_array_equal(gmm.means_, fits.means[0])
    np.testing.assert_array_equal(gmm.covariances_, fits.covariances[0])
    np.testing.assert_array_equal(gmm.weights_, fits.weights[0])


def test_rows_are_grouped_by_pattern():
    X = np.array([[1.0, np.nan], [2.0, 3.0], [np.nan, 1.0], [4.0, np.nan], [5.0, 6.0]])
    patterns = missing.Patterns.of(X, "cpu")
    bounds = patterns.bounds
    groups = sorted(
        sorted(patterns.order[bounds[p] : bounds[p + 1]].tolist()) for p in range(len(bounds) - 1)
    )
    assert groups == [[0, 3], [1, 4], [2]]
    assert sorted(patterns.masks.tolist()) == [[False, True], [True, False], [True, True]]


def test_the_transformer_starts_from_the_imputed_rows():
    # The bundled (trained) checkpoint: EM on the observed entries runs from its reading
    # alone, and the random-weight test checkpoint's reading of these rows reaches a
    # collapsed optimum at some seeds (which rows multivariate_normal draws depends on
    # numpy's version).
    _, X = mixture_with_gaps()
    gmm = TransformerGMM(3, random_state=0).fit(X)
    assert gmm.init_method_ in ("transformer", "k-means++")
    assert matched_error(gmm.means_) < 0.25
    assert_lower_bound_of_the_last_e_step(gmm, X)


@pytest.mark.parametrize("n_init", ["auto", 3])
def test_em_on_the_observed_entries_starts_from_the_plan_on_the_imputed_rows(
    n_init, monkeypatch
):
    # n_init="auto": the plan's start at max_iter=0 (the transformer's reading, no EM on
    # the imputed rows); an int: its starts run by EM on the imputed rows, the best kept.
    _, X = mixture_with_gaps(rate=0.3)
    imputed = _missing.mean_imputed(X)
    starts = []
    fit_em_missing = missing.fit_em_missing
    monkeypatch.setattr(
        missing, "fit_em_missing",
        lambda X, weights, means, *args, **kwargs: (
            starts.append(means), fit_em_missing(X, weights, means, *args, **kwargs)
        )[1],
    )
    gmm = TransformerGMM(3, checkpoint=TINY_CHECKPOINT, n_init=n_init, random_state=0).fit(X)
    max_iter = 0 if n_init == "auto" else 100
    on_imputed = TransformerGMM(
        3, checkpoint=TINY_CHECKPOINT, n_init=n_init, max_iter=max_iter, random_state=0
    ).fit(imputed)
    np.testing.assert_array_equal(starts[0], on_imputed.means_)
    assert (on_imputed.n_iter_ == 0) == (n_init == "auto")
    assert gmm.init_method_ == on_imputed.init_method_
    assert_lower_bound_of_the_last_e_step(gmm, X)


def test_the_number_of_components_is_chosen_on_the_imputed_rows():
    # Documented behaviour: K is chosen on the mean-imputed rows (which can favour an
    # extra component), and that K is then fitted on the observed entries.
    _, X = mixture_with_gaps()
    gmm = TransformerGMM("auto", max_components=4, checkpoint=None, random_state=0).fit(X)
    assert gmm.n_components_ == len(gmm.weights_) == gmm.means_.shape[0]
    assert gmm.n_components_ in gmm.candidates_
    assert not np.isnan(gmm.means_).any()
    assert_lower_bound_of_the_last_e_step(gmm, X)


def test_runs_of_patterns_give_the_fit_of_one_run(monkeypatch):
    # The patterns are batched in runs that bound the temporaries' memory: the same fit,
    # up to rounding, whatever the runs.
    _, X = mixture_with_gaps(rate=0.3)
    whole = TransformerGMM(3, checkpoint=None, random_state=0).fit(X)
    monkeypatch.setattr(missing, "_CHUNK_ELEMENTS", 100)
    assert len(missing.Patterns.of(X, "cpu").chunks(3)) > 5
    runs = TransformerGMM(3, checkpoint=None, random_state=0).fit(X)
    np.testing.assert_allclose(runs.means_, whole.means_, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(runs.covariances_, whole.covariances_, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(runs.score_samples(X), whole.score_samples(X), rtol=1e-10)


@pytest.mark.parametrize("n_features", [1, 2, 7, 8, 9, 64, 65, 70])
def test_patterns_are_numpys_unique_rows_in_its_order(n_features):
    # Packed keys group the rows as np.unique(axis=0) does, patterns in the same order, so
    # EM's chunks (and its sums) are those of the row-wise grouping.
    rng = np.random.default_rng(n_features)
    is_missing = rng.random((3000, n_features)) < rng.uniform(0.05, 0.6, n_features)
    is_missing[:40] = rng.random((40, n_features)) < 0.5  # a few more patterns
    patterns, inverse = missing._unique_patterns(is_missing)
    expected, expected_inverse = np.unique(is_missing, axis=0, return_inverse=True)
    np.testing.assert_array_equal(patterns, expected)
    np.testing.assert_array_equal(inverse, expected_inverse.ravel())


def test_verbose_reports_em_on_the_observed_entries(capsys):
    _, X = mixture_with_gaps(rate=0.3)
    gmm = TransformerGMM(3, checkpoint=None, verbose=2, verbose_interval=1, random_state=0)
    gmm.fit(X)
    report = capsys.readouterr().out.split("EM on the observed entries (X has NaN):\n")[1]
    assert report.count("  Iteration ") == gmm.n_iter_ == len(gmm.lower_bounds_)
    assert f"lower bound {gmm.lower_bound_:.5f}." in report
