"""fit_many: one forward pass and one batched EM give what a loop of fits gives."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import TINY_CHECKPOINT, make_blobs

from transformer_gmm import TransformerGMM, fit_many

ATTRIBUTES = ["weights_", "means_", "covariances_", "lower_bound_"]


def _datasets(sizes, n_features=3, seed=0):
    rng = np.random.default_rng(seed)
    return [
        make_blobs(n, rng.uniform(-6, 6, (3, n_features)), seed=seed + i)
        for i, n in enumerate(sizes)
    ]


@pytest.mark.parametrize("covariance_type", ["full", "spherical"])
def test_transformer_path_equals_a_loop_of_fits(covariance_type):
    # Sizes within the tiny model's context (64): nothing is subsampled, so each fit
    # is deterministic and the batch must reproduce it despite the padding.
    datasets = _datasets([7, 15, 21])  # 21, 45 and 63 points
    # n_init=1: the transformer's start only (the batch draws its k-means++ starts from
    # one generator, so those differ from a loop's).
    params = dict(covariance_type=covariance_type, checkpoint=TINY_CHECKPOINT, n_init=1)
    batch = fit_many(datasets, 3, **params)
    for X, fitted in zip(datasets, batch, strict=True):
        alone = TransformerGMM(3, **params)
        alone.fit(X)
        assert fitted.init_method_ == alone.init_method_ == "transformer"
        assert fitted.n_iter_ == alone.n_iter_
        for name in ATTRIBUTES:
            np.testing.assert_allclose(
                getattr(fitted, name), getattr(alone, name), rtol=1e-4, atol=1e-6, err_msg=name
            )
        np.testing.assert_array_equal(fitted.predict(X), alone.predict(X))


def test_views_in_a_batch_reach_what_a_loop_of_fits_reaches():
    """With several views, starts whose runs end on one optimum tie to rounding, and the
    float32 backbone rounds a padded batch's readings a little differently from one
    dataset's: the kept run may be another of the tied ones (its components in another
    order, EM an iteration apart), so compare the optimum, not the run."""
    datasets = _datasets([7, 15, 21])
    params = dict(covariance_type="spherical", checkpoint=TINY_CHECKPOINT, n_init=6, n_views=3)
    for X, fitted in zip(datasets, fit_many(datasets, 3, **params), strict=True):
        alone = TransformerGMM(3, **params).fit(X)
        assert fitted.init_method_ == alone.init_method_ == "transformer"
        np.testing.assert_allclose(fitted.lower_bound_, alone.lower_bound_, rtol=1e-4)
        order = [np.lexsort(gmm.means_.T[::-1]) for gmm in (fitted, alone)]
        np.testing.assert_allclose(
            fitted.means_[order[0]], alone.means_[order[1]], rtol=1e-3, atol=1e-4
        )


def test_fallback_path_finds_the_same_optima():
    datasets = _datasets([40, 60, 100], seed=3)
    # Run r of dataset i is seeding r * B + i of the batch's k-means++, not seeding r as
    # in a fit alone: enough starts that both find the best optimum (the last dataset
    # has another, 4e-4 lower, the best of the batch's first five runs on it).
    batch = fit_many(datasets, 3, checkpoint=None, n_init=8, random_state=0)
    for X, fitted in zip(datasets, batch, strict=True):
        alone = TransformerGMM(3, checkpoint=None, n_init=8, random_state=0).fit(X)
        assert fitted.lower_bound_ == pytest.approx(alone.lower_bound_, abs=1e-6)
        assert fitted.n_features_in_ == 3


def test_a_three_dimensional_array_is_a_batch_of_equal_datasets():
    stacked = np.stack(_datasets([20, 20]))
    fits = fit_many(stacked, 3, checkpoint=TINY_CHECKPOINT)
    assert len(fits) == 2 and all(f.means_.shape == (3, 3) for f in fits)


def test_bad_batches_raise_clear_errors():
    with pytest.raises(ValueError, match="at least one dataset"):
        fit_many([], 2, checkpoint=None)
    with pytest.raises(ValueError, match="same number of features; got \\[2, 3\\]"):
        fit_many(
            [np.zeros((10, 2)) + np.arange(10)[:, None], _datasets([5])[0]], 2, checkpoint=None
        )
    with pytest.raises(ValueError, match="n_components"):
        fit_many(_datasets([5]), 0, checkpoint=None)
    # TransformerGMM.fit takes gaps; fit_many says so, and which dataset has them.
    gaps = [X.copy() for X in _datasets([5, 5])]
    gaps[1][3, 1] = np.nan
    for bad, which in ((gaps, r"\(dataset 1\)"), (np.stack(gaps), r"\(dataset 1\)"),
                       ([gaps[0], gaps[1][:12]], r"\(dataset 1\)")):
        with pytest.raises(ValueError, match=r"fit_many takes no missing values.*" + which
                           + r".*TransformerGMM\(...\)\.fit"):
            fit_many(bad, 2, checkpoint=None)


def test_datasets_of_one_shape_are_validated_as_fit_validates_them():
    # Equal float arrays are validated together; errors must still be those of fit.
    datasets = _datasets([10, 10, 10])  # three datasets of 30 points
    state = np.random.RandomState(0)
    fits = fit_many(datasets, 3, checkpoint=None, random_state=state)
    assert [fit.n_features_in_ for fit in fits] == [3, 3, 3]
    assert not any(hasattr(fit, "feature_names_in_") for fit in fits)
    assert len({id(fit.random_state) for fit in fits} | {id(state)}) == 4  # copies, as clone
    for fit in fits:  # no estimator holds a view of the batch's arrays
        assert fit.means_.flags.owndata and fit.covariances_.flags.owndata

    broken = [X.copy() for X in datasets]
    broken[1][4, 2] = np.inf
    few = [X[:2] for X in datasets]  # fewer samples than components
    for bad in (broken, few, np.stack(broken)):
        with pytest.raises(ValueError) as ours:
            fit_many(bad, 3, checkpoint=None)
        with pytest.raises(ValueError) as theirs:
            TransformerGMM(3, checkpoint=None).fit(bad[1])
        assert str(ours.value) == str(theirs.value)


def test_equal_datasets_batched_together_or_one_by_one_agree():
    datasets = _datasets([12, 12, 12, 12], seed=5)  # 36 points each
    together = fit_many(datasets, 3, checkpoint=None, random_state=0)
    # A list of lists is not a float array: validated one dataset at a time.
    one_by_one = fit_many([X.tolist() for X in datasets], 3, checkpoint=None, random_state=0)
    float32 = fit_many(np.stack(datasets).astype(np.float32), 3, checkpoint=None, random_state=0)
    for a, b, c in zip(together, one_by_one, float32, strict=True):
        # Rounded to float32, the rows are other numbers, in another canonical order, so
        # k-means++ seeds the same optimum with its components in another order.
        orders = [np.lexsort(fit.means_.T[::-1]) for fit in (a, c)]
        for name in ATTRIBUTES:
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
            ours, theirs = getattr(a, name), getattr(c, name)
            if name != "lower_bound_":
                ours, theirs = ours[orders[0]], theirs[orders[1]]
            np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6, err_msg=name)
        assert a.n_iter_ == b.n_iter_ and a.converged_ == b.converged_


def test_arrays_output_holds_what_the_estimators_hold():
    datasets = _datasets([7, 15, 30])  # 21, 45 and 90 points: the last is subsampled
    params = dict(checkpoint=TINY_CHECKPOINT, n_init=2, random_state=0)
    estimators = fit_many(datasets, 3, **params)
    arrays = fit_many(datasets, 3, output="arrays", **params)
    assert len(arrays) == 3 and arrays.device == "cpu" and arrays.covariance_type == "full"
    for i, gmm in enumerate(estimators):
        for name in ATTRIBUTES + ["precisions_cholesky_", "n_iter_", "converged_"]:
            np.testing.assert_array_equal(getattr(arrays, name[:-1])[i], getattr(gmm, name))
        assert arrays.init_method[i] == gmm.init_method_
    with pytest.raises(ValueError, match="output must be 'estimators' or 'arrays'"):
        fit_many(datasets, 3, checkpoint=None, output="dict")


def test_subsampled_datasets_are_deterministic_and_a_batch_of_one_is_fit():
    # 150 points > the tiny model's context of 64: random_state draws the rows it reads.
    (X,) = _datasets([50], seed=7)
    params = dict(checkpoint=TINY_CHECKPOINT, max_iter=5, random_state=4)
    (batched,) = fit_many([X], 3, **params)
    alone = TransformerGMM(3, **params).fit(X)
    again = TransformerGMM(3, **params).fit(X)
    for name in ATTRIBUTES:
        np.testing.assert_array_equal(getattr(batched, name), getattr(alone, name), err_msg=name)
        np.testing.assert_array_equal(getattr(again, name), getattr(alone, name), err_msg=name)
    other = TransformerGMM(3, checkpoint=TINY_CHECKPOINT, max_iter=0, n_init=1, random_state=5)
    first = TransformerGMM(3, checkpoint=TINY_CHECKPOINT, max_iter=0, n_init=1, random_state=4)
    # Another seed reads other rows, so the transformer's start differs.
    assert not np.allclose(other.fit(X).means_, first.fit(X).means_)


def test_a_batch_mixing_sizes_above_and_below_the_selection_subsample(monkeypatch):
    from transformer_gmm.engine import fit

    monkeypatch.setattr(fit, "SELECTION_ROWS", 100)  # 50 rows small, 400 large
    datasets = _datasets([130, 17, 40])  # 390, 51 and 120 points
    params = dict(checkpoint=TINY_CHECKPOINT, covariance_type="spherical", random_state=0)
    fitted = fit_many(datasets, 3, **params)
    for X, gmm in zip(datasets, fitted, strict=True):
        # The final EM ran on each dataset's own rows, padding excluded.
        assert gmm.converged_ and gmm.lower_bound_ == pytest.approx(gmm.score(X), abs=1e-3)
    # The small dataset's fit is what fitting it alone finds (same optimum).
    alone = TransformerGMM(3, **params).fit(datasets[1])
    np.testing.assert_allclose(
        np.sort(fitted[1].means_, axis=0), np.sort(alone.means_, axis=0), atol=1e-3
    )
