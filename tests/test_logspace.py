"""engine.logspace: torch's exp and logsumexp to the bit, on every kind of input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import special

from transformer_gmm.engine import e_step, logspace


def log_probabilities(shape, scale, seed):
    """E-step-like inputs: one value near zero a row, the others down to ``-scale``, some
    in the band of denormal results, some -inf."""
    generator = torch.Generator().manual_seed(seed)
    x = -torch.rand(shape, generator=generator, dtype=torch.float64) * scale
    x[..., 0] = -torch.rand(shape[:-1], generator=generator, dtype=torch.float64)
    draw = torch.rand(shape, generator=generator)
    x[draw < 0.01] = -math.inf
    band = (draw > 0.01) & (draw < 0.03)
    x[band] = torch.empty(int(band.sum()), dtype=torch.float64).uniform_(
        logspace.ZERO_BELOW - 1, logspace.FAST_FROM + 1, generator=generator
    )
    return x


def assert_same_bits(found, expected):
    assert found.dtype == expected.dtype and found.shape == expected.shape
    assert torch.equal(found.nan_to_num(7.0, 8.0, 9.0), expected.nan_to_num(7.0, 8.0, 9.0))
    assert torch.equal(found.isnan(), expected.isnan())


@pytest.mark.parametrize("scale", [1.0, 700.0, 3000.0, 1e5])
@pytest.mark.parametrize("shape", [(3, 7, 5), (2, 20_000, 10), (1, 70_001, 4)])
def test_exp_and_logsumexp_are_torchs(shape, scale):
    # (2, 20,000, 10) and (1, 70,001, 4) span several chunks, the last one partial.
    x = log_probabilities(shape, scale, seed=int(scale) + shape[1])
    assert_same_bits(logspace.exp_(x.clone()), x.exp())
    assert_same_bits(logspace.logsumexp(x, -1), x.logsumexp(-1))
    assert_same_bits(logspace.logsumexp(x, 1), x.logsumexp(1))


def test_infinities_nan_and_strides_are_torchs():
    x = log_probabilities((4, 30_000, 6), 2000.0, seed=1)
    x[0, 0] = -math.inf  # a row of -inf: its logsumexp is -inf
    x[1, 5, 2] = math.inf
    x[2, 7, 1] = math.nan
    assert_same_bits(logspace.exp_(x.clone()), x.exp())
    assert_same_bits(logspace.logsumexp(x, -1), x.logsumexp(-1))
    transposed = x.clone().transpose(0, 1)  # not contiguous: still in place
    assert logspace.exp_(transposed) is transposed
    assert_same_bits(transposed, x.exp().transpose(0, 1))


def test_other_dtypes_and_gradients_take_torchs_own():
    x32 = log_probabilities((2, 30_000, 4), 3000.0, seed=2).float()
    assert_same_bits(logspace.exp_(x32.clone()), x32.exp())
    assert_same_bits(logspace.logsumexp(x32, -1), x32.logsumexp(-1))
    x = log_probabilities((2, 30_000, 4), 3000.0, seed=3).requires_grad_()
    found = logspace.logsumexp(x, -1)
    found.sum().backward()  # torch's own logsumexp, which autograd follows
    torch.testing.assert_close(x.grad, torch.softmax(x.detach(), -1), rtol=0, atol=1e-12)


@pytest.mark.parametrize("n_rows", [10, 20_000])
def test_a_fitted_mixtures_densities_and_probabilities_are_scipys_to_rounding(n_rows):
    # score_samples and predict_proba read these: SciPy's logsumexp gave them before.
    weighted = log_probabilities((n_rows, 6), 3000.0, seed=n_rows).numpy()
    weighted[0] = -math.inf  # a row no component can have drawn
    expected_norm = special.logsumexp(weighted, axis=1)
    with np.errstate(invalid="ignore"):
        expected_resp = np.exp(weighted - expected_norm[:, None])
    norm = e_step.log_norm_of_fitted(weighted)
    resp = e_step.responsibilities_of_fitted(weighted)
    assert norm[0] == -math.inf and np.isnan(resp[0]).all()  # as SciPy's
    np.testing.assert_allclose(norm[1:], expected_norm[1:], rtol=1e-14, atol=1e-14)
    np.testing.assert_allclose(resp[1:], expected_resp[1:], rtol=1e-12, atol=1e-300)
