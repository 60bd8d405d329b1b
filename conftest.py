"""The data the engine's examples (doctests under transformer_gmm/engine) share."""

import pytest


@pytest.fixture(autouse=True)
def _engine_example_data(doctest_namespace):
    import torch

    def two_blobs():
        """Two blobs of 20 points around (-4, -4) and (4, 4), as one dataset (1, 40, 2) in
        float64, and their one-hot responsibilities (1, 40, 2)."""
        X = torch.randn(1, 40, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        X[0, :20] -= 4.0
        X[0, 20:] += 4.0
        resp = torch.zeros(1, 40, 2, dtype=torch.float64)
        resp[0, :20, 0] = resp[0, 20:, 1] = 1.0
        return X, resp

    doctest_namespace["two_blobs"] = two_blobs
