"""Shared fixtures: a tiny random-weight checkpoint drives the whole transformer path."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from transformer_gmm.engine import model_cache, readout
from transformer_gmm.engine.device import pad, to_numpy
from transformer_gmm.engine.standardize import fit_standardization
from transformer_gmm.nn import (
    MixtureTransformer,
    ReadingConfig,
    config_from_preset,
    reading_from_preset,
)
from transformer_gmm.storage import save_checkpoint


def make_tiny_checkpoint(folder: Path, seed: int = 0, **config_changes) -> Path:
    """Save an untrained model of the "tiny" preset (heads for K = 2..4, d_max = 4,
    context 64), with ``config_changes`` (fields of its ModelConfig or ReadingConfig), to
    ``folder``. Its estimates are poor, which is what the tests want: EM must still polish
    them into a good fit."""
    torch.manual_seed(seed)
    reading_names = set(ReadingConfig.__dataclass_fields__)
    reading = {k: v for k, v in config_changes.items() if k in reading_names}
    model_changes = {k: v for k, v in config_changes.items() if k not in reading_names}
    model = MixtureTransformer(
        config_from_preset("tiny", **model_changes), reading_from_preset("tiny", **reading)
    )
    # The training initialisation is deliberately small (every slot starts near the data
    # mean); unit-variance weights give components that differ, like a trained model's.
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() > 1:
                parameter.normal_(0.0, parameter.shape[1] ** -0.5)
    return save_checkpoint(model, folder, model_card="Random weights, for tests only.")


_TINY_ROOT = Path(tempfile.mkdtemp(prefix="transformer_gmm_tests_"))
atexit.register(shutil.rmtree, _TINY_ROOT, ignore_errors=True)
# Built at import: sklearn's parametrize_with_checks needs the path at collection time.
TINY_CHECKPOINT = str(make_tiny_checkpoint(_TINY_ROOT / "tiny"))
# The same weights, reading one principal direction beyond the K - 1 where the data has it.
TINY_NOISE_CHECKPOINT = str(make_tiny_checkpoint(_TINY_ROOT / "tiny-noise", noise_directions=1))
# With a (random) head that reads P(K | X) for K = 1..4.
TINY_K_CHECKPOINT = str(make_tiny_checkpoint(_TINY_ROOT / "tiny-k", k_posterior_seeds=2))


@pytest.fixture(autouse=True)
def _torch_threads_restored():
    """Every test starts with the process's torch thread count. A benchmark script or a
    training run called in-process sets one thread; the tests after it would otherwise run
    on one thread in the suite and on several alone, and float32 sums round by the thread
    count."""
    threads = torch.get_num_threads()
    yield
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


@pytest.fixture
def tiny_checkpoint() -> str:
    return TINY_CHECKPOINT


def make_blobs(n_per_cluster: int, centers, scale: float = 1.0, seed: int = 0) -> np.ndarray:
    """Points around each centre, shuffled, as one array."""
    rng = np.random.default_rng(seed)
    centers = np.asarray(centers, dtype=float)
    X = np.vstack(
        [c + scale * rng.standard_normal((n_per_cluster, centers.shape[1])) for c in centers]
    )
    return X[rng.permutation(len(X))]


class OneStandardization:
    """The engine's standardization of one numpy dataset (a batch of one), numpy in and
    out: for references that standardize dataset by dataset, as fitting did before it
    was batched and as the training sampler does."""

    def __init__(self, X, d_max: int, n_components: int, noise_directions: int = 0):
        x = torch.as_tensor(np.asarray(X, dtype=np.float64))[None]
        self.map = fit_standardization(x, None, d_max, n_components, noise_directions)
        self.center = self.map.center[0].numpy()  # (d,)
        self.scale = self.map.scale[0].item()
        self.basis = self.map.basis[0].numpy()  # (d, kept)

    def transform(self, points) -> np.ndarray:
        """(m, d) points as float32 model inputs (m, d_max)."""
        points = torch.as_tensor(np.asarray(points, dtype=np.float64))[None]
        return self.map.transform(points)[0].numpy()

    def inverse_transform_means(self, means) -> np.ndarray:
        """(K, d_max) model-space means as float64 (K, d)."""
        means = torch.as_tensor(np.asarray(means, dtype=np.float64))[None]
        return self.map.inverse_transform_means(means)[0].numpy()


@dataclass(frozen=True)
class TransformerEstimate:
    """The backbone's raw answer for one dataset, in model space, to inspect and test it
    (fitting reads the backbone through :mod:`transformer_gmm.engine.readout`)."""

    weights: np.ndarray  # (K,)
    means: np.ndarray  # (K, d_max)
    scales: np.ndarray  # (K, 1) or (K, d_max) standard deviations, or (K, d_max, d_max) Cholesky
    point_probs: np.ndarray  # (n, K), the per-point head's cluster probabilities


def transformer_estimates(
    backbone: MixtureTransformer, Zs: list[np.ndarray], n_components: int, device: str
) -> list[TransformerEstimate]:
    """One forward pass over B standardized datasets, each of shape (n_i, d_max)."""
    model = model_cache.model_on(backbone, device)
    x, mask = pad(Zs, device, torch.float32)  # (B, N, d_max), (B, N) or None
    out = readout.forward(model, x, n_components, mask)
    point_probs = to_numpy(out.point_logits.softmax(dim=-1))  # (B, N, K)
    weights, means, scales = (to_numpy(t) for t in (out.weights, out.means, out.scales))
    return [
        TransformerEstimate(weights[i], means[i], scales[i], point_probs[i, : len(Z)])
        for i, Z in enumerate(Zs)
    ]


@pytest.fixture
def three_blobs() -> np.ndarray:
    return make_blobs(60, [[-8.0, 0.0], [0.0, 8.0], [8.0, 0.0]], seed=1)


@pytest.fixture
def no_bundled_checkpoint(tmp_path, monkeypatch) -> None:
    """Hide the bundled checkpoints, as in an installation that ships none."""
    from transformer_gmm.storage import checkpoints

    empty = tmp_path / "no_bundled_checkpoints"
    empty.mkdir()
    monkeypatch.setattr(checkpoints, "_bundled_root", lambda: empty)


@pytest.fixture(scope="session")
def dask_client():
    """A 2-process LocalCluster for every Dask test: worker processes, not threads, so
    estimators and statistics must survive pickling to reach them. One for the session:
    starting and stopping a cluster takes seconds."""
    distributed = pytest.importorskip(
        "distributed", reason='needs dask: pip install "dask[array,distributed]"'
    )
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster, set_as_default=False) as client,
    ):
        yield client


# --- slow tests --------------------------------------------------------------------------
# A test marked `@pytest.mark.slow` runs for many seconds (a benchmark script's quick run in
# fresh processes, training on two processes). The README's `python -m pytest` skips them
# on a developer's machine, to stay well under 3 minutes; CI runs the same command with CI
# set (.ci/run exports CI=true, as most CI services do), and then runs them too. Run them
# here with `CI=true python -m pytest` (all tests) or `CI=true python -m pytest -m slow`.


def run_slow_tests() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def pytest_collection_modifyitems(config, items):
    if run_slow_tests():
        return
    skip = pytest.mark.skip(reason="slow, runs in CI: CI=true python -m pytest runs it here")
    for item in items:
        if item.get_closest_marker("slow") is not None:
            item.add_marker(skip)
