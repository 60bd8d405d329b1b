"""A float32 fit (a GPU's dtype) whose covariances float32 cannot hold is refitted in
float64 on the same device, not failed: emulated here on the CPU, whose float64 fit is the
reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from transformer_gmm import TransformerGMM, fit_many
from transformer_gmm.engine import fit
from transformer_gmm.engine.gaussian import IllDefinedCovariance


def _near_singular(seed: int) -> np.ndarray:
    """Four clusters of 6 points in 12 dimensions: each covariance is singular but for
    reg_covar, which float32 loses next to the clusters' spread."""
    rng = np.random.default_rng(seed)
    return (rng.normal(0, 30, (4, 1, 12)) + rng.normal(0, 5, (4, 6, 12))).reshape(24, 12)


@pytest.fixture
def float32_fits(monkeypatch):
    monkeypatch.setattr(fit, "dtype_for", lambda device: torch.float32)


@pytest.mark.parametrize("checkpoint", [None, "default"])
def test_float32_alone_cannot_fit_it(float32_fits, checkpoint, monkeypatch):
    """The premise: with no float64 to fall back on, the float32 fit fails."""
    on_device = fit._on_device
    monkeypatch.setattr(fit, "_on_device", lambda plan, Xs, sample_weight, dtype, dtypes: (
        on_device(plan, Xs, sample_weight, torch.float32, dtypes)))
    with pytest.raises(IllDefinedCovariance, match="float64 data"):
        TransformerGMM(4, checkpoint=checkpoint, random_state=0).fit(_near_singular(1))


@pytest.mark.parametrize("checkpoint", [None, "default"])
def test_a_failing_float32_fit_is_the_float64_fit(float32_fits, checkpoint, monkeypatch):
    X = _near_singular(1)
    params = dict(n_components=4, checkpoint=checkpoint, random_state=0)
    refitted = TransformerGMM(**params).fit(X)
    monkeypatch.undo()  # the CPU's own float64 fit
    reference = TransformerGMM(**params).fit(X)
    np.testing.assert_array_equal(refitted.means_, reference.means_)
    np.testing.assert_array_equal(refitted.covariances_, reference.covariances_)
    assert refitted.lower_bound_ == reference.lower_bound_


def test_one_failing_dataset_does_not_fail_a_batch(float32_fits):
    datasets = np.stack([_near_singular(seed) for seed in range(3)])
    fits = fit_many(datasets, 4, checkpoint=None, random_state=0, output="arrays")
    assert np.isfinite(fits.lower_bound).all() and fits.converged.all()
