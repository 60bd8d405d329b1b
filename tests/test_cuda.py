"""The CUDA path end to end. Skipped where PyTorch sees no GPU (CI has none); run it on a
GPU machine with `python -m pytest tests/test_cuda.py`."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from conftest import TINY_CHECKPOINT, make_blobs
from sklearn.metrics import adjusted_rand_score

from transformer_gmm import TransformerClusterer, TransformerGMM, fit_many

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("checkpoint", [TINY_CHECKPOINT, None])
def test_gmm_on_cuda_matches_cpu(checkpoint):
    X = make_blobs(60, [[-6.0, 0.0, 1.0], [0.0, 6.0, 0.0], [6.0, 0.0, -1.0]], seed=11)
    on_gpu = TransformerGMM(3, checkpoint=checkpoint, device="cuda", n_init=3, random_state=0)
    on_cpu = TransformerGMM(3, checkpoint=checkpoint, device="cpu", n_init=3, random_state=0)
    on_gpu.fit(X)
    on_cpu.fit(X)
    assert on_gpu.device_.startswith("cuda")
    # float32 on the GPU against float64 on the CPU: the same optimum, not the same bits.
    assert on_gpu.lower_bound_ == pytest.approx(on_cpu.lower_bound_, abs=1e-3)
    # The fitted state is numpy: it unpickles and predicts without a GPU.
    loaded = pickle.loads(pickle.dumps(on_gpu))
    assert isinstance(loaded.means_, np.ndarray)
    np.testing.assert_array_equal(loaded.predict(X), on_gpu.predict(X))


def test_clusterer_and_fit_many_on_cuda():
    X = make_blobs(50, [[-5.0, 0.0], [5.0, 0.0]], seed=12)
    km = TransformerClusterer(2, checkpoint=TINY_CHECKPOINT, device="cuda", random_state=0)
    assert np.bincount(km.fit(X).labels_).tolist() == [50, 50]
    fits = fit_many([X, X[:60]], 2, checkpoint=TINY_CHECKPOINT, device="cuda", random_state=0)
    assert all(f.device_.startswith("cuda") and f.converged_ for f in fits)


def test_views_on_cuda_match_cpu():
    """Four readings of the data in one batch on the GPU: the transformer's own estimate
    reaches the optimum the CPU reaches (float32 there, float64 here). 60 rows, within the
    tiny model's context of 64: the rows read are all of them, with no draw (a CUDA
    generator gives other random numbers than the CPU's)."""
    X = make_blobs(20, [[-6.0, 0.0, 1.0], [0.0, 6.0, 0.0], [6.0, 0.0, -1.0]], seed=13)
    # n_init=8: the four views' eight starts, and no k-means++ start to draw.
    params = dict(checkpoint=TINY_CHECKPOINT, max_iter=0, n_views=4, n_init=8, random_state=0)
    on_gpu = TransformerGMM(3, device="cuda", **params).fit(X)
    on_cpu = TransformerGMM(3, device="cpu", **params).fit(X)
    assert on_gpu.lower_bound_ == pytest.approx(on_cpu.lower_bound_, abs=1e-3)


def test_clusterer_and_fit_many_on_cuda_match_cpu():
    """The same optimum on both devices (float32 there, float64 here), for the clusterer
    and for a batch of mixtures."""
    X = make_blobs(50, [[-5.0, 0.0, 2.0], [5.0, 0.0, 0.0], [0.0, 6.0, -2.0]], seed=14)
    on = {device: TransformerClusterer(3, device=device, random_state=0).fit(X)
          for device in ("cuda", "cpu")}
    assert on["cuda"].inertia_ == pytest.approx(on["cpu"].inertia_, rel=1e-4)
    # The k-means++ draws differ between the devices' generators: the same clusters,
    # perhaps numbered otherwise.
    assert adjusted_rand_score(on["cuda"].labels_, on["cpu"].labels_) == 1.0
    datasets = np.stack([X, X[::-1] + 1.0, 2.0 * X])
    fits = {device: fit_many(datasets, 3, device=device, random_state=0, output="arrays")
            for device in ("cuda", "cpu")}
    np.testing.assert_allclose(fits["cuda"].lower_bound, fits["cpu"].lower_bound, atol=1e-3)


def test_rows_are_ordered_on_the_gpu_as_on_the_host():
    """The canonical row order hashed on the GPU (int64 arithmetic there) is numpy's."""
    from transformer_gmm.engine import row_order

    X = np.random.default_rng(0).normal(size=(3, 1000, 6)).astype(np.float32)
    on_gpu = row_order.canonical_order_on_device(torch.from_numpy(X).cuda()).cpu().numpy()
    np.testing.assert_array_equal(on_gpu, row_order.canonical_order(X))


def test_both_estimators_on_cuda_tensors_match_cpu(monkeypatch):
    """With scikit-learn's array API dispatch, a CUDA tensor goes in and the fitted arrays
    and predictions come back as tensors on that GPU, at the optimum the numpy fit reaches."""
    import sklearn

    monkeypatch.setenv("SCIPY_ARRAY_API", "1")
    X = make_blobs(50, [[-5.0, 0.0, 2.0], [5.0, 0.0, 0.0], [0.0, 6.0, -2.0]], seed=15)
    tensor = torch.from_numpy(X).cuda()
    reference_gmm = TransformerGMM(3, random_state=0).fit(X)
    reference_km = TransformerClusterer(3, random_state=0).fit(X)
    with sklearn.config_context(array_api_dispatch=True):
        gmm = TransformerGMM(3, random_state=0).fit(tensor)
        km = TransformerClusterer(3, random_state=0).fit(tensor)
        for value in (gmm.means_, gmm.covariances_, gmm.predict_proba(tensor),
                      km.cluster_centers_, km.predict(tensor)):
            assert isinstance(value, torch.Tensor) and value.device.type == "cuda"
        assert gmm.score(tensor) == pytest.approx(reference_gmm.score(X), abs=1e-3)
        assert km.inertia_ == pytest.approx(reference_km.inertia_, rel=1e-4)
        labels = gmm.predict(tensor).cpu().numpy()
    assert adjusted_rand_score(labels, reference_gmm.predict(X)) == 1.0



def test_fit_many_on_cuda_tensors_under_dispatch(monkeypatch):
    """A list of CUDA tensors in, estimators whose fitted arrays are tensors on that GPU."""
    import sklearn

    monkeypatch.setenv("SCIPY_ARRAY_API", "1")
    X = make_blobs(40, [[-5.0, 0.0], [5.0, 0.0]], seed=17)
    reference = fit_many([X, X[::2]], 2, random_state=0)
    with sklearn.config_context(array_api_dispatch=True):
        fitted = fit_many([torch.from_numpy(X).cuda(), torch.from_numpy(X[::2]).cuda()], 2,
                          random_state=0)
    for ours, theirs in zip(fitted, reference, strict=True):
        assert isinstance(ours.means_, torch.Tensor) and ours.means_.device.type == "cuda"
        assert ours.lower_bound_ == pytest.approx(theirs.lower_bound_, abs=1e-6)
