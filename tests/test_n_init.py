"""More restarts are never worse: with the same random_state, the starts of n_init=k are
the first k starts of any larger n_init, so the kept run can only get better."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import TINY_CHECKPOINT, make_blobs
from sklearn.mixture.tests.test_gaussian_mixture import RandomData

from transformer_gmm import TransformerClusterer, TransformerGMM
from transformer_gmm.engine import em, fit, model_cache, runs
from transformer_gmm.engine.em import as_tuple
from transformer_gmm.engine.kmeans import kmeans_plusplus
from transformer_gmm.engine.m_step import MixtureParams
from transformer_gmm.engine.plan import MixturePlan

COVARIANCE_TYPES = ["full", "tied", "diag", "spherical"]


@pytest.fixture
def starts(monkeypatch) -> list[MixtureParams]:
    """The starts of every call of em.fit_em: each fit's runs, then (above SELECTION_ROWS)
    its best run's, on every row."""
    calls = []
    fit_em = em.fit_em

    def recording(x, params, **options):
        # A copy: EM empties the start it is handed (consume_start) once it has read it.
        calls.append(MixtureParams(*(None if t is None else t.clone() for t in as_tuple(params))))
        return fit_em(x, params, **options)

    monkeypatch.setattr(em, "fit_em", recording)
    return calls


def _assert_first_runs_equal(fewer: MixtureParams, more: MixtureParams, n_datasets=1):
    """Each dataset's runs of ``fewer`` are its first runs of ``more``."""
    fewer, more = runs.unflatten(fewer, n_datasets), runs.unflatten(more, n_datasets)
    n_runs = fewer.means.shape[1]
    for field in runs.FIELDS:
        torch.testing.assert_close(
            getattr(fewer, field), getattr(more, field)[:, :n_runs], rtol=0, atol=1e-12
        )


# --- k-means++ -------------------------------------------------------------------------


@pytest.mark.parametrize("weighted", [False, True])
def test_kmeans_plusplus_seedings_do_not_depend_on_the_batch_size(weighted):
    X = torch.randn(1, 80, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    mask = torch.arange(80)[None] < 70  # ten padded rows
    options = dict(mask=mask)
    if weighted:
        options["sample_weight"] = torch.rand(1, 80, dtype=torch.float64) * mask
    seeds, after = [], []
    for n_batch in (3, 8):
        generator = torch.Generator().manual_seed(1)
        seeds.append(kmeans_plusplus(X.expand(n_batch, -1, -1), 5, generator=generator, **options))
        after.append(torch.rand(4, generator=generator))
    torch.testing.assert_close(seeds[0], seeds[1][:3], rtol=0, atol=0)
    torch.testing.assert_close(after[0], after[1], rtol=0, atol=0)  # the generator moved alike


# --- the starts of a fit ----------------------------------------------------------------


@pytest.mark.parametrize(
    "checkpoint, n_views", [(TINY_CHECKPOINT, 1), (TINY_CHECKPOINT, 2), (None, 1)]
)
def test_the_starts_of_n_init_are_the_first_of_more(starts, checkpoint, n_views):
    # 200 rows: the tiny model (context 64) reads a subsample. No clusters: Lloyd ends
    # where its seeds send it, so different seeds give different starts.
    X = np.random.RandomState(1).randn(200, 3)
    params = dict(checkpoint=checkpoint, n_views=n_views, random_state=0)
    for n_init in (1, 2, 3, 6):
        TransformerGMM(4, n_init=n_init, **params).fit(X)
    for fewer in starts[:-1]:
        _assert_first_runs_equal(fewer, starts[-1])


def test_the_transformers_starts_leave_the_generator_as_they_found_it(starts):
    """k-means++ draws the same seeds after one of the transformer's starts as after two,
    on datasets of different sizes, each above the tiny model's context."""
    datasets = [
        make_blobs(40, [[-4.0, 0.0], [4.0, 1.0]], seed=s)[:n] for s, n in [(2, 80), (3, 71)]
    ]
    backbone = model_cache.load_backbone(TINY_CHECKPOINT)
    options = dict(n_components=2, covariance_type="full", reg_covar=1e-6, max_iter=5, tol=1e-3)
    for n_transformer in (1, 2):
        plan = MixturePlan(
            **options,
            device="cpu",
            seed=0,
            n_kmeans_inits=3,
            backbone=backbone,
            n_transformer_inits=n_transformer,
        )
        fit.fit(plan, datasets)
    one, two = (runs.unflatten(params, 2) for params in starts)
    for field in runs.FIELDS:
        torch.testing.assert_close(getattr(one, field)[:, 1:], getattr(two, field)[:, 2:])


@pytest.mark.parametrize("n_rows", [300, 10_000])  # 10,000 > SELECTION_ROWS
def test_each_datasets_kmeans_starts_nest_in_a_batch(starts, n_rows):
    """Several datasets of one batch: each one's first runs are those of fewer runs.
    Above SELECTION_ROWS, from two runs on (one run is built on every row)."""
    rng = np.random.default_rng(4)
    datasets = [make_blobs(n_rows // 2, rng.uniform(-5, 5, (2, 2)), seed=i) for i in range(3)]
    datasets[1] = datasets[1][: n_rows // 2]  # padding too
    options = dict(n_components=3, covariance_type="diag", reg_covar=1e-6, max_iter=5, tol=1e-3)
    for n_kmeans in (2, 3, 7):
        fit.fit(MixturePlan(**options, device="cpu", seed=0, n_kmeans_inits=n_kmeans), datasets)
    if n_rows > fit.SELECTION_ROWS:  # each fit's second EM goes on from its best start
        starts = starts[::2]
    for fewer in starts[:2]:
        _assert_first_runs_equal(fewer, starts[2], n_datasets=3)


# --- the kept run -----------------------------------------------------------------------


def _multiple_init_data() -> np.ndarray:
    """scikit-learn's test_multiple_init data: 50 standard normal points in 5 dimensions,
    where k-means++ starts end at several local optima."""
    return np.random.RandomState(0).randn(50, 5)


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
@pytest.mark.parametrize("data", ["RandomData", "test_multiple_init"])
def test_more_restarts_never_lower_the_lower_bound(covariance_type, data):
    if data == "RandomData":
        X, n_components = RandomData(np.random.RandomState(0)).X[covariance_type], 2
    else:
        X, n_components = _multiple_init_data(), 2
    bounds = [
        TransformerGMM(
            n_components,
            covariance_type=covariance_type,
            checkpoint=None,
            n_init=n_init,
            random_state=0,
        )
        .fit(X)
        .lower_bound_
        for n_init in range(1, 9)
    ]
    assert all(b >= a - 1e-12 for a, b in zip(bounds, bounds[1:], strict=False)), bounds


def test_more_restarts_never_raise_the_inertia():
    X = _multiple_init_data()
    inertias = [
        TransformerClusterer(3, checkpoint=None, n_init=n_init, random_state=0).fit(X).inertia_
        for n_init in range(1, 9)
    ]
    assert all(b <= a + 1e-9 for a, b in zip(inertias, inertias[1:], strict=False)), inertias
