"""Running out of GPU memory raises DeviceMemoryError, which says what to make smaller.

No GPU is needed: the EM and Lloyd steps are replaced by functions that raise the errors
PyTorch raises when CUDA memory runs out.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from transformer_gmm import (
    DeviceMemoryError,
    TransformerClusterer,
    TransformerGMM,
    fit_many,
)
from transformer_gmm.engine import e_step, em, kmeans, model_cache

CUDA_OOM = "CUDA out of memory. Tried to allocate 2.00 GiB"


def raising(error: Exception):
    def fail(*args, **kwargs):
        raise error

    return fail


@pytest.fixture
def X() -> np.ndarray:
    return np.random.default_rng(0).normal(size=(50, 2))


def assert_helpful(excinfo: pytest.ExceptionInfo, original: Exception) -> None:
    message = str(excinfo.value)
    for advice in ("fit_many", "n_init", "samples or features", "device='cpu'"):
        assert advice in message
    assert isinstance(excinfo.value, MemoryError)  # `except MemoryError` catches it too
    assert excinfo.value.__cause__ is original  # PyTorch's own report stays in the chain


@pytest.mark.parametrize(
    "original",
    [
        torch.cuda.OutOfMemoryError(CUDA_OOM),
        RuntimeError("CUDA error: out of memory"),  # what older PyTorch versions raised
    ],
    ids=["OutOfMemoryError", "RuntimeError"],
)
def test_fit_explains_out_of_memory(monkeypatch, X, original):
    monkeypatch.setattr(em, "fit_em", raising(original))
    with pytest.raises(DeviceMemoryError) as excinfo:
        TransformerGMM(2, checkpoint=None, random_state=0).fit(X)
    assert_helpful(excinfo, original)


def test_fit_many_explains_out_of_memory(monkeypatch, X):
    original = torch.cuda.OutOfMemoryError(CUDA_OOM)
    monkeypatch.setattr(em, "fit_em", raising(original))
    with pytest.raises(DeviceMemoryError) as excinfo:
        fit_many([X, X[:30]], 2, checkpoint=None, random_state=0)
    assert_helpful(excinfo, original)


def test_clusterer_explains_out_of_memory(monkeypatch, X):
    original = torch.cuda.OutOfMemoryError(CUDA_OOM)
    monkeypatch.setattr(kmeans, "lloyd", raising(original))
    with pytest.raises(DeviceMemoryError) as excinfo:
        TransformerClusterer(2, checkpoint=None, random_state=0).fit(X)
    assert_helpful(excinfo, original)


def test_scoring_explains_out_of_memory(monkeypatch, X):
    gmm = TransformerGMM(2, checkpoint=None, random_state=0).fit(X)
    original = torch.cuda.OutOfMemoryError(CUDA_OOM)
    monkeypatch.setattr(e_step, "estimate_weighted_log_prob", raising(original))
    with pytest.raises(DeviceMemoryError) as excinfo:
        gmm.predict(X)
    assert_helpful(excinfo, original)


def test_transformer_forward_pass_explains_out_of_memory(monkeypatch, X, tiny_checkpoint):
    original = torch.cuda.OutOfMemoryError(CUDA_OOM)
    monkeypatch.setattr(model_cache, "model_on", raising(original))
    with pytest.raises(DeviceMemoryError) as excinfo:
        TransformerGMM(2, checkpoint=tiny_checkpoint, random_state=0).fit(X)
    assert_helpful(excinfo, original)


def test_other_runtime_errors_pass_through_unchanged(monkeypatch, X):
    original = RuntimeError("shape mismatch")
    monkeypatch.setattr(em, "fit_em", raising(original))
    with pytest.raises(RuntimeError) as excinfo:
        TransformerGMM(2, checkpoint=None, random_state=0).fit(X)
    assert excinfo.value is original
