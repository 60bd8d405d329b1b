"""No fit keeps an empty component: EM re-seeds one that loses all its responsibility, in
memory and by blocks of rows alike; Lloyd by blocks relocates an empty cluster as in memory."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from transformer_gmm import TransformerGMM
from transformer_gmm.engine import e_step, em, gaussian, kmeans, m_step, sufficient_stats
from transformer_gmm.training import PRIORS, sample_task

COVARIANCE_TYPES = gaussian.COVARIANCE_TYPES


def offset_task(generator: str, seed: int) -> np.ndarray:
    """1e-3 * (a mixture of K = 4 unit Gaussians in d = 4) + 1e4, N = 200: the points sit
    10^4 from the origin, where an empty component's mean lands."""
    rng = np.random.default_rng(seed)
    if generator == "normal":  # centres drawn N(0, 3^2 I)
        centres = rng.normal(0.0, 3.0, (4, 4))
        X = centres[rng.integers(0, 4, 200)] + rng.standard_normal((200, 4))
    else:  # centres uniform in [-5, 5]^d, Dirichlet weights
        X = sample_task(rng, PRIORS["tgmm-2d"], K=4, d=4, n=200, d_max=8).X
    return 1e-3 * X + 1e4


def assert_no_empty_component(means, weights, X):
    """Every mean in the bounding box of the points, no weight below EMPTY_COUNT's."""
    means, weights, X = (np.asarray(a, dtype=float) for a in (means, weights, X))
    assert np.all(means >= X.min(0)) and np.all(means <= X.max(0)), means
    assert np.all(weights * len(X) >= em.EMPTY_COUNT), weights


def counting_reseeds(monkeypatch) -> list[int]:
    """Make em._reseed record how many components it re-seeds at each call."""
    counts, reseed = [], em._reseed

    def recording(X, params, counts_, empty, *args):
        counts.append(int(empty.sum()))
        return reseed(X, params, counts_, empty, *args)

    monkeypatch.setattr(em, "_reseed", recording)
    return counts


# Tasks where a component emptied and was kept, 10^4 from the data (each for some state
# of the starts), then the first 30 of each generator.
PINNED = [("normal", 1), ("normal", 42), ("uniform", 16), ("uniform", 27), ("uniform", 30)]
PINNED += [("uniform", seed) for seed in (49, 66, 98, 121, 130, 131, 133)]
SWEEP = PINNED + [(g, seed) for g in ("normal", "uniform") for seed in range(30)]


@pytest.mark.parametrize("checkpoint", ["default", None])
def test_offset_data_keeps_every_component_in_the_data(checkpoint, monkeypatch):
    reseeds = counting_reseeds(monkeypatch)
    for generator, seed in SWEEP:
        X = offset_task(generator, seed)
        model = TransformerGMM(
            4, covariance_type="spherical", checkpoint=checkpoint, random_state=seed
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # ConvergenceWarning: EM's bound is noisy here
            model.fit(X)
        assert_no_empty_component(model.means_, model.weights_, X)
        assert np.all(np.isfinite(model.covariances_)) and np.all(model.covariances_ > 0)
    assert reseeds  # some component did empty, and was re-seeded


@pytest.mark.parametrize("checkpoint", ["default", None])
def test_own_estimate_has_no_empty_component(checkpoint):
    for generator, seed in PINNED:
        X = offset_task(generator, seed)
        model = TransformerGMM(
            4, covariance_type="spherical", checkpoint=checkpoint, random_state=seed, max_iter=0
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.fit(X)
        assert_no_empty_component(model.means_, model.weights_, X)


# --- batched EM ------------------------------------------------------------------------


def two_blobs(n: int = 60, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 2, generator=g, dtype=torch.float64)
    X[: n // 2] += torch.tensor([6.0, 0.0], dtype=torch.float64)
    return X


def start(means, covariance_type: str, weights=None) -> m_step.MixtureParams:
    """A batch-1 start: the given means, unit covariances, equal weights unless given."""
    means = torch.as_tensor(means, dtype=torch.float64)[None]  # (1, K, d)
    n_components, d = means.shape[1:]
    shape = {
        "full": (1, n_components, d, d),
        "tied": (1, d, d),
        "diag": (1, n_components, d),
        "spherical": (1, n_components),
    }[covariance_type]
    covariances = torch.ones(shape, dtype=torch.float64)
    if covariance_type in ("full", "tied"):
        covariances = torch.eye(d, dtype=torch.float64).expand(shape).clone()
    if weights is None:
        weights = torch.full((1, n_components), 1.0 / n_components, dtype=torch.float64)
    else:
        weights = torch.as_tensor(weights, dtype=torch.float64)[None]
    precisions_cholesky = gaussian.compute_precision_cholesky(covariances, covariance_type)
    return m_step.MixtureParams(weights, means, covariances, precisions_cholesky)


def stack(*params: m_step.MixtureParams) -> m_step.MixtureParams:
    fields = ("weights", "means", "covariances", "precisions_cholesky")
    return m_step.MixtureParams(*(torch.cat([getattr(p, f) for p in params]) for f in fields))


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_fit_em_reseeds_a_component_far_from_the_data(covariance_type):
    X = two_blobs()
    good = [[6.0, 0.0], [0.0, 0.0], [3.0, 1.0]]
    one_far = [[6.0, 0.0], [0.0, 0.0], [1e6, 0.0]]
    two_far = [[6.0, 0.0], [1e6, 1e6], [-1e6, 0.0]]
    starts = stack(*(start(m, covariance_type) for m in (good, one_far, two_far)))
    result = em.fit_em(
        X[None], starts, covariance_type=covariance_type, reg_covar=1e-6, max_iter=200, tol=1e-6
    )
    for b in range(3):
        assert_no_empty_component(result.params.means[b], result.params.weights[b], X)
    assert bool(result.converged.all())
    assert torch.isfinite(result.lower_bound).all()


def test_float32_reseeds_above_its_coarser_guard():
    # In float32 the M-step's 10 eps guard is 1.2e-6 of a point, above EMPTY_COUNT.
    X = two_blobs().float()
    far = start([[6.0, 0.0], [0.0, 0.0], [1e6, 0.0]], "diag")
    far = m_step.MixtureParams(
        *(
            getattr(far, f).float()
            for f in ("weights", "means", "covariances", "precisions_cholesky")
        )
    )
    result = em.fit_em(X[None], far, covariance_type="diag", reg_covar=1e-6, max_iter=100, tol=1e-4)
    assert_no_empty_component(result.params.means[0], result.params.weights[0], X)
    assert float(result.params.weights.min()) * len(X) > 1e3 * 10 * torch.finfo(torch.float32).eps


def test_reseeded_component_takes_the_worst_explained_points():
    X = two_blobs()
    X = torch.cat([X, torch.tensor([[3.0, 9.0], [3.0, -12.0]], dtype=torch.float64)])
    means = [[6.0, 0.0], [0.0, 0.0], [1e6, 0.0], [-1e6, 0.0]]
    params = start(means, "diag")
    result = em.fit_em(X[None], params, covariance_type="diag", reg_covar=1e-6, max_iter=1, tol=0)
    fitted = result.params
    # The two outliers, the worst explained first; each empty component takes one.
    assert fitted.means[0, 2].tolist() == [3.0, -12.0]
    assert fitted.means[0, 3].tolist() == [3.0, 9.0]
    n = len(X)
    # One point's weight beside the others' counts; the others' covariance, averaged.
    torch.testing.assert_close(fitted.weights[0, 2:], torch.full((2,), 1.0 / (n + 2)).double())
    kept = fitted.weights[0, :2] * (n + 2)  # the two counts
    pooled = (kept[:, None] * fitted.covariances[0, :2]).sum(0) / kept.sum()
    torch.testing.assert_close(fitted.covariances[0, 2], pooled)
    torch.testing.assert_close(fitted.covariances[0, 3], pooled)
    expected = gaussian.compute_precision_cholesky(fitted.covariances, "diag")
    torch.testing.assert_close(fitted.precisions_cholesky, expected)


def test_reseed_skips_padding_and_rows_of_weight_zero():
    X = two_blobs()
    n = len(X)
    # Row n: an outlier of weight 0; rows n + 1, n + 2: padding, NaN, far outside.
    outlier = torch.tensor([[50.0, 50.0]], dtype=torch.float64)
    padded = torch.cat([X, outlier, torch.full((2, 2), torch.nan, dtype=torch.float64)])
    mask = torch.ones(1, n + 3, dtype=torch.bool)
    mask[0, n + 1 :] = False
    weights = torch.ones(1, n + 3, dtype=torch.float64)
    weights[0, n:] = 0.0
    params = start([[6.0, 0.0], [0.0, 0.0], [1e6, 0.0]], "full")
    options = dict(covariance_type="full", reg_covar=1e-6, mask=mask, sample_weight=weights)
    one_step = em.fit_em(padded[None], params, max_iter=1, tol=0, **options)
    reseeded = one_step.params.means[0, 2]
    assert any(torch.equal(reseeded, x) for x in X)  # a weighted real point
    fitted = em.fit_em(padded[None], params, max_iter=200, tol=1e-6, **options)
    assert_no_empty_component(fitted.params.means[0], fitted.params.weights[0], X)


def test_reseed_does_not_count_as_convergence():
    X = two_blobs()
    # With this tol every iteration after the first would converge.
    options = dict(covariance_type="spherical", reg_covar=1e-6, max_iter=50, tol=1e9)
    plain = em.fit_em(X[None], start([[6.0, 0.0], [0.0, 0.0]], "spherical"), **options)
    assert plain.n_iter.tolist() == [2]
    far = start([[6.0, 0.0], [0.0, 0.0], [1e6, 0.0]], "spherical")
    reseeded = em.fit_em(X[None], far, **options)
    # Re-seeded on the first iteration: neither it nor the next, which compares the
    # re-seeded mixture's bound with the one before, converges.
    assert reseeded.n_iter.tolist() == [3] and bool(reseeded.converged.all())
    assert torch.isfinite(reseeded.lower_bounds).all()


def test_reseed_with_sample_weights_and_a_batch_matches_each_run_alone():
    X = two_blobs(80, seed=3)
    g = torch.Generator().manual_seed(1)
    weights = 0.5 + torch.rand(1, len(X), generator=g, dtype=torch.float64)
    means = [
        [[6.0, 0.0], [0.0, 0.0], [3.0, 0.5]],
        [[6.0, 0.0], [0.0, 0.0], [1e6, 0.0]],
        [[6.0, 0.0], [-1e6, 0.0], [1e6, 0.0]],
        [[5.0, 0.0], [1.0, 0.0], [2.0, 2.0]],
    ]
    starts = [start(m, "full") for m in means]
    options = dict(covariance_type="full", reg_covar=1e-6, max_iter=100, tol=1e-8)
    batched = em.fit_em(X[None], stack(*starts), sample_weight=weights, **options)
    for b, params in enumerate(starts):
        alone = em.fit_em(X[None], params, sample_weight=weights, **options)
        assert batched.n_iter[b] == alone.n_iter[0]
        torch.testing.assert_close(batched.params.means[b], alone.params.means[0])
        torch.testing.assert_close(batched.params.weights[b], alone.params.weights[0])
        torch.testing.assert_close(batched.lower_bound[b], alone.lower_bound[0])
        assert_no_empty_component(batched.params.means[b], batched.params.weights[b], X)


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_max_iter_zero_reseeds_an_empty_start(covariance_type):
    X = two_blobs()
    params = start([[6.0, 0.0], [0.0, 0.0], [1e6, 0.0]], covariance_type, weights=[0.5, 0.5, 0.0])
    result = em.fit_em(
        X[None], params, covariance_type=covariance_type, reg_covar=1e-6, max_iter=0, tol=1e-3
    )
    assert_no_empty_component(result.params.means[0], result.params.weights[0], X)
    log_prob_norm, _ = e_step.e_step(X[None], result.params, covariance_type)
    torch.testing.assert_close(result.lower_bound, log_prob_norm)
    # Without an empty component the start comes back as it was.
    kept = start([[6.0, 0.0], [0.0, 0.0], [3.0, 0.0]], covariance_type)
    again = em.fit_em(
        X[None], kept, covariance_type=covariance_type, reg_covar=1e-6, max_iter=0, tol=1e-3
    )
    for field in ("weights", "means", "covariances", "precisions_cholesky"):
        assert torch.equal(getattr(again.params, field), getattr(kept, field))


# --- fits without an empty component are unchanged -------------------------------------


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_fixed_point_stays(covariance_type, monkeypatch):
    X = two_blobs()
    X[:30, 0] += 14.0  # blobs 20 apart, so that EM reaches its fixed point
    # A small but real component: three points far from the rest.
    X = torch.cat([X, torch.tensor([[30.0, 30.0], [30.5, 30.0], [30.0, 30.5]]).double()])
    params = start([[20.0, 0.0], [0.0, 0.0], [30.0, 30.0]], covariance_type)
    options = dict(covariance_type=covariance_type, reg_covar=1e-6)
    fitted = em.fit_em(X[None], params, max_iter=500, tol=1e-12, **options)
    reseeds = counting_reseeds(monkeypatch)
    again = em.fit_em(X[None], fitted.params, max_iter=5, tol=0.0, **options)
    assert reseeds == []
    torch.testing.assert_close(again.params.means, fitted.params.means, rtol=0, atol=1e-9)
    torch.testing.assert_close(again.params.weights, fitted.params.weights, rtol=0, atol=1e-12)
    assert float(fitted.params.weights[0, 2]) == pytest.approx(3 / len(X))


def test_tiny_component_above_the_threshold_is_kept(monkeypatch):
    # A component holding a small fraction of a point is left alone, as scikit-learn
    # leaves it.
    X = two_blobs()
    reseeds = counting_reseeds(monkeypatch)
    params = start([[6.0, 0.0], [0.0, 0.0], [3.0, 8.0]], "spherical")
    result = em.fit_em(
        X[None], params, covariance_type="spherical", reg_covar=1e-6, max_iter=1, tol=0
    )
    counts = result.params.weights[0] * len(X)
    assert em.EMPTY_COUNT < float(counts[2]) < 1e-4
    assert reseeds == []


# --- by blocks of rows, as in memory ----------------------------------------------------

# Blocks of uneven sizes, two of them with fewer rows than the components.
BLOCK_SIZES = [1, 25, 2, 32]


def by_blocks(X: torch.Tensor, n: int, statistics, candidates, *, largest: bool):
    """``statistics_of`` and the candidates' function that EM or Lloyd by blocks reads, over
    blocks of the rows of ``X`` (1, N, d): each block's statistics summed, each block's ``n``
    candidate rows merged by :func:`~transformer_gmm.engine.sufficient_stats.top_rows`."""
    blocks = X.split(BLOCK_SIZES, 1)

    def statistics_of(*args):
        parts = [statistics(x, *args) for x in blocks]
        return sum(parts[1:], parts[0])

    def candidates_of(*args):
        parts = [candidates(x, *args, n) for x in blocks]
        return sufficient_stats.top_rows(torch.cat(parts, 1), n, largest=largest)

    return statistics_of, candidates_of


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_em_by_blocks_reseeds_as_in_memory(covariance_type, monkeypatch):
    X = two_blobs()[None]
    # A run that keeps its components, one with a component far from every row, one with two.
    means = ([[6.0, 0.0], [0.0, 0.0], [3.0, 1.0]], [[6.0, 0.0], [0.0, 0.0], [40.0, 0.0]])
    means += ([[6.0, 0.0], [0.0, 40.0], [-40.0, 0.0]],)
    starts = stack(*(start(m, covariance_type) for m in means))
    statistics_of, worst_of = by_blocks(
        X,
        3,
        lambda x, params: sufficient_stats.mixture_statistics(x, params, covariance_type),
        lambda x, params, empty, n: sufficient_stats.worst_explained(
            x, params, empty, covariance_type, n
        ),
        largest=False,
    )
    options = dict(covariance_type=covariance_type, reg_covar=1e-6, tol=1e-6)
    reseeds = counting_reseeds(monkeypatch)
    for max_iter in (1, 200):
        in_memory = em.fit_em(X, starts, max_iter=max_iter, **options)
        blocks = sufficient_stats.fit_em_from_statistics(
            starts,
            statistics_of,
            lambda params, empty: worst_of(params, empty)[..., 1:],  # the rows alone
            X.shape[1],
            max_iter=max_iter,
            **options,
        )
        for field in ("weights", "means", "covariances", "precisions_cholesky"):
            expected = getattr(in_memory.params, field)
            torch.testing.assert_close(
                getattr(blocks.params, field), expected, rtol=1e-9, atol=1e-9
            )
        assert blocks.n_iter.tolist() == in_memory.n_iter.tolist()
        assert blocks.converged.tolist() == in_memory.converged.tolist()
    assert reseeds[0] == 3  # the second run's one component and the third's two


def test_lloyd_by_blocks_relocates_as_in_memory():
    X = two_blobs()[None]
    # A run that keeps its clusters, one with a cluster far from every row, one with a centre
    # twice (the second gets no row) and one far.
    centers = [[[6.0, 0.0], [0.0, 0.0], [3.0, 1.0]], [[6.0, 0.0], [0.0, 0.0], [40.0, 0.0]]]
    centers += [[[6.0, 0.0], [6.0, 0.0], [-40.0, 0.0]]]
    centers = torch.tensor(centers, dtype=torch.float64)
    offset = X.mean(1, keepdim=True)
    statistics_of, farthest_of = by_blocks(
        X,
        3,
        lambda x, c: sufficient_stats.lloyd_statistics(x, c, offset),
        lambda x, c, n: sufficient_stats.farthest(x, c, offset, n),
        largest=True,
    )
    threshold = 1e-4 * (X - offset).square().mean().item()
    for max_iter in (1, 300):
        expected, _, _, n_iter = kmeans.lloyd(X, centers, max_iter=max_iter)
        fitted, blocks_n_iter = sufficient_stats.lloyd_from_statistics(
            centers, statistics_of, farthest_of, offset, threshold, max_iter
        )
        torch.testing.assert_close(fitted, expected, rtol=0, atol=1e-12)
        assert blocks_n_iter.tolist() == n_iter.tolist()
