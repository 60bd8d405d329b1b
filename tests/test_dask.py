"""Fitted estimators score a chunked dask array on worker processes exactly as in memory."""

from __future__ import annotations

import os

import numpy as np
import pytest

da = pytest.importorskip("dask.array", reason='needs dask: pip install "dask[array,distributed]"')
distributed = pytest.importorskip(
    "dask.distributed", reason='needs dask.distributed: pip install "dask[array,distributed]"'
)

from conftest import make_blobs  # noqa: E402

from transformer_gmm import TransformerClusterer, TransformerGMM  # noqa: E402

K = 3


@pytest.fixture
def client(dask_client):
    with dask_client.as_current():
        yield dask_client


@pytest.fixture(scope="module")
def X() -> np.ndarray:
    return make_blobs(4_000, [[-6.0, 0.0, 1.0], [0.0, 6.0, -1.0], [6.0, 0.0, 0.0]], seed=2)


@pytest.fixture(scope="module")
def X_dask(X):
    X_dask = da.from_array(X, chunks=(2_500, -1))
    assert X_dask.numblocks == (5, 1)  # several row chunks, all the columns in each
    return X_dask


@pytest.fixture(scope="module")
def gmm(X) -> TransformerGMM:
    return TransformerGMM(K, checkpoint=None, random_state=0).fit(X[::4])


def test_blocks_run_in_other_processes(client, X_dask):
    pids = X_dask.map_blocks(lambda block: np.full(len(block), os.getpid()), drop_axis=1, dtype=int)
    pids = set(client.compute(pids).result().tolist())
    assert os.getpid() not in pids
    assert pids <= set(client.run(os.getpid).values())


@pytest.mark.parametrize("method", ["predict", "score_samples"])
def test_gmm_per_row_methods(client, X, X_dask, gmm, method):
    expected = getattr(gmm, method)(X)
    lazy = X_dask.map_blocks(
        getattr(gmm, method), drop_axis=1, meta=np.array((), dtype=expected.dtype)
    )
    np.testing.assert_array_equal(client.compute(lazy).result(), expected)


def test_gmm_predict_proba(client, X, X_dask, gmm):
    expected = gmm.predict_proba(X)
    lazy = X_dask.map_blocks(
        gmm.predict_proba, chunks=(X_dask.chunks[0], (K,)), meta=np.array((), dtype=float)
    )
    result = client.compute(lazy).result()
    assert result.shape == (len(X), K)
    np.testing.assert_array_equal(result, expected)


def test_clusterer_predict(client, X, X_dask):
    clusterer = TransformerClusterer(K, checkpoint=None, random_state=0).fit(X[::4])
    expected = clusterer.predict(X)
    lazy = X_dask.map_blocks(
        clusterer.predict, drop_axis=1, meta=np.array((), dtype=expected.dtype)
    )
    np.testing.assert_array_equal(client.compute(lazy).result(), expected)
    assert len(np.unique(expected)) == K  # the comparison covers every cluster
