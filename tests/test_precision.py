"""bfloat16 products where the user allows them: the copy, when it is used, and the fits."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import make_blobs

from transformer_gmm import TransformerGMM
from transformer_gmm.engine import model_cache, precision
from transformer_gmm.nn import MixtureTransformer, config_from_preset
from transformer_gmm.storage import checkpoints


@pytest.fixture
def matmul_precision():
    """Set torch's float32 matmul precision for one test; restore it and the cache after."""
    previous = torch.get_float32_matmul_precision()
    yield torch.set_float32_matmul_precision
    torch.set_float32_matmul_precision(previous)
    model_cache.clear_model_cache()


@pytest.fixture
def native(monkeypatch):
    """As if the CPU multiplied bfloat16 natively (torch emulates it where it does not)."""
    monkeypatch.setattr(precision, "native_bfloat16", lambda: True)


def tiny_model() -> MixtureTransformer:
    torch.manual_seed(0)
    return MixtureTransformer(config_from_preset("tiny", n_layer=2)).eval()


def test_copy_multiplies_in_bfloat16_and_leaves_the_model_alone():
    model = tiny_model()
    copied = precision.bfloat16_copy(model)
    linears = [m for m in copied.modules() if isinstance(m, precision.BFloat16Linear)]
    assert len(linears) == sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    assert all(m.weight.dtype == torch.bfloat16 for m in linears)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert not any(isinstance(m, precision.BFloat16Linear) for m in model.modules())
    # Attention reads queries, keys and values in bfloat16; every other layer returns float32.
    block = copied.blocks[0]
    assert block.attn.q.out_dtype == block.attn.kv.out_dtype == torch.bfloat16
    assert block.attn.proj.out_dtype == block.mlp.fc.out_dtype == torch.float32


def test_copy_gives_the_models_outputs_to_bfloat16_rounding():
    model = tiny_model()
    copied = precision.bfloat16_copy(model)
    z = torch.randn(3, 40, model.config.d_max, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        exact, rounded = model(z, 3, None), copied(z, 3, None)
    for name in ("weights", "means", "scales", "point_logits"):
        a, b = getattr(exact, name), getattr(rounded, name)
        assert b.dtype == torch.float32
        # bfloat16 keeps 8 significant bits: about 0.4 % of each product.
        torch.testing.assert_close(b, a, atol=0.05, rtol=0.05)
        assert not torch.equal(a, b)  # it did round


def test_bfloat16_only_where_allowed_and_native(matmul_precision, monkeypatch):
    matmul_precision("highest")
    monkeypatch.setattr(precision, "native_bfloat16", lambda: True)
    assert not precision.bfloat16_matmuls("cpu")
    matmul_precision("medium")
    assert precision.bfloat16_matmuls("cpu")
    assert not precision.bfloat16_matmuls("cuda") and not precision.bfloat16_matmuls("meta")
    monkeypatch.setattr(precision, "native_bfloat16", lambda: False)
    assert not precision.bfloat16_matmuls("cpu")


def test_native_bfloat16_is_a_bool():
    assert isinstance(precision.native_bfloat16(), bool)


def test_model_on_keeps_one_bfloat16_copy(matmul_precision, native):
    model = tiny_model()
    assert model_cache.model_on(model, "cpu") is model
    matmul_precision("medium")
    copied = model_cache.model_on(model, "cpu")
    assert copied is not model and model_cache.model_on(model, "cpu") is copied
    assert isinstance(copied.blocks[0].mlp.fc, precision.BFloat16Linear)
    matmul_precision("highest")
    assert model_cache.model_on(model, "cpu") is model


def test_fit_in_bfloat16_matches_float32_and_stays_deterministic(matmul_precision, native):
    X = make_blobs(60, [[0, 0], [6, 0], [0, 6]], seed=3)
    exact = TransformerGMM(3, max_iter=0, random_state=0).fit(X)
    matmul_precision("medium")
    rounded = TransformerGMM(3, max_iter=0, random_state=0).fit(X)
    again = TransformerGMM(3, max_iter=0, random_state=0).fit(X[::-1])
    # The transformer's own estimate moves by bfloat16 rounding only.
    order = np.argsort(exact.means_[:, 0] + 10 * exact.means_[:, 1])
    order_rounded = np.argsort(rounded.means_[:, 0] + 10 * rounded.means_[:, 1])
    np.testing.assert_allclose(rounded.means_[order_rounded], exact.means_[order], atol=0.05)
    np.testing.assert_allclose(rounded.weights_[order_rounded], exact.weights_[order], atol=0.01)
    # The same random_state gives the same fit, whatever the row order.
    np.testing.assert_array_equal(again.means_, rounded.means_)
    np.testing.assert_array_equal(again.covariances_, rounded.covariances_)
    # EM from that start ends at the same optimum as from the float32 one.
    polished = TransformerGMM(3, random_state=0).fit(X)
    matmul_precision("highest")
    reference = TransformerGMM(3, random_state=0).fit(X)
    # EM stops once its bound moves by less than tol, so two starts of one optimum end
    # within tol of each other (another optimum of these blobs is nats away).
    np.testing.assert_allclose(polished.lower_bound_, reference.lower_bound_, atol=reference.tol)
    np.testing.assert_allclose(polished.means_[np.argsort(polished.means_[:, 0])],
                               reference.means_[np.argsort(reference.means_[:, 0])], atol=1e-3)


def test_bundled_checkpoint_copy_is_close(matmul_precision, native):
    model = checkpoints.load_model("default")
    z = torch.randn(2, 100, model.config.d_max, generator=torch.Generator().manual_seed(2))
    matmul_precision("medium")
    copied = model_cache.model_on(model, "cpu")
    with torch.inference_mode():
        exact, rounded = model(z, 4, None), copied(z, 4, None)
    # Means in model space (the data has unit scale there): within 1 % of that scale.
    torch.testing.assert_close(rounded.means, exact.means, atol=0.01, rtol=0)
    torch.testing.assert_close(rounded.weights, exact.weights, atol=0.01, rtol=0)
