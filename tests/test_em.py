"""The torch EM and k-means agree with scikit-learn, batched as well as one at a time."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.cluster import KMeans
from sklearn.mixture import GaussianMixture
from sklearn.mixture._gaussian_mixture import (
    _compute_precision_cholesky,
    _compute_precision_cholesky_from_precisions,
    _estimate_gaussian_parameters,
    _estimate_log_gaussian_prob,
)

from transformer_gmm import TransformerGMM, _initialization
from transformer_gmm.engine import batching, e_step, em, gaussian, kmeans, m_step

COVARIANCE_TYPES = gaussian.COVARIANCE_TYPES
SKLEARN_MESSAGE = "Fitting the mixture model failed because some components have ill-defined"


# --- data ------------------------------------------------------------------------------


def gaussian_blobs(centers, n_per_cluster, seed, scale=1.0):
    """Anisotropic Gaussian blobs (each with its own random covariance) and their truth."""
    rng = np.random.default_rng(seed)
    centers = np.asarray(centers, dtype=float)
    d = centers.shape[1]
    parts, covariances = [], []
    for center in centers:
        A = scale * (np.eye(d) + 0.4 * rng.standard_normal((d, d)))
        parts.append(center + rng.standard_normal((n_per_cluster, d)) @ A.T)
        covariances.append(A @ A.T)
    X = np.vstack(parts)
    return X[rng.permutation(len(X))], centers, np.array(covariances)


SEPARATED = ([[0, 0, 0], [6, 0, 0], [0, 6, 3]], 70, 0)  # N = 210, d = 3
OVERLAPPING = ([[0, 0, 0], [1.5, 0.5, 0], [0, 1.5, 1.0]], 65, 1)  # N = 195, d = 3
DATASETS = {"separated": SEPARATED, "overlapping": OVERLAPPING}


def initial_parameters(centers, covariances, covariance_type, seed):
    """Perturbed true parameters in scikit-learn's init format: weights, means, precisions."""
    rng = np.random.default_rng(seed)
    k = len(centers)
    weights = rng.dirichlet(10 * np.ones(k))
    means = centers + 0.5 * rng.standard_normal(centers.shape)
    covariances = 1.5 * covariances
    precisions = {
        "full": lambda: np.linalg.inv(covariances),
        "tied": lambda: np.linalg.inv(covariances.mean(0)),
        "diag": lambda: 1 / np.diagonal(covariances, axis1=1, axis2=2),
        "spherical": lambda: 1 / np.diagonal(covariances, axis1=1, axis2=2).mean(1),
    }[covariance_type]()
    return weights, means, precisions


def t(array):
    return torch.as_tensor(np.asarray(array), dtype=torch.float64)


def torch_params(weights, means, precisions, covariance_type):
    """Batch-1 MixtureParams from scikit-learn-style init arrays."""
    precisions_chol = t(_initialization.precisions_cholesky(precisions, covariance_type))
    return m_step.MixtureParams(
        weights=t(weights)[None],
        means=t(means)[None],
        covariances=gaussian.covariances_from_precisions_cholesky(
            precisions_chol, covariance_type
        )[None],
        precisions_cholesky=precisions_chol[None],
    )


def stack_params(params_list):
    return m_step.MixtureParams(
        *(
            torch.cat([getattr(p, f) for p in params_list])
            for f in ("weights", "means", "covariances", "precisions_cholesky")
        )
    )


def assert_params_close(params, reference, index=0, rtol=1e-10, atol=1e-12):
    for field in ("weights", "means", "covariances", "precisions_cholesky"):
        np.testing.assert_allclose(
            getattr(params, field)[index].numpy(),
            getattr(reference, field)[0].numpy(),
            rtol=rtol,
            atol=atol,
            err_msg=field,
        )


# --- 1. EM against scikit-learn --------------------------------------------------------


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
@pytest.mark.parametrize("dataset", DATASETS)
@pytest.mark.parametrize(
    "max_iter, tol, reg_covar, expect_converged",
    [(500, 1e-6, 1e-6, True), (3, 1e-12, 1e-3, False)],
    ids=["converges", "max_iter"],
)
def test_fit_em_matches_sklearn(
    covariance_type, dataset, max_iter, tol, reg_covar, expect_converged
):
    X, centers, covariances = gaussian_blobs(*DATASETS[dataset])
    weights, means, precisions = initial_parameters(centers, covariances, covariance_type, 5)
    reference = GaussianMixture(
        n_components=len(centers),
        covariance_type=covariance_type,
        weights_init=weights,
        means_init=means,
        precisions_init=precisions,
        max_iter=max_iter,
        tol=tol,
        reg_covar=reg_covar,
    ).fit(X)

    result = em.fit_em(
        t(X)[None],
        torch_params(weights, means, precisions, covariance_type),
        covariance_type=covariance_type,
        reg_covar=reg_covar,
        max_iter=max_iter,
        tol=tol,
    )

    assert reference.converged_ is expect_converged
    assert bool(result.converged[0]) is reference.converged_
    assert int(result.n_iter[0]) == reference.n_iter_
    for ours, theirs in [
        (result.params.weights, reference.weights_),
        (result.params.means, reference.means_),
        (result.params.covariances, reference.covariances_),
        (result.params.precisions_cholesky, reference.precisions_cholesky_),
    ]:
        np.testing.assert_allclose(ours[0].numpy(), theirs, rtol=1e-6, atol=1e-10)
    np.testing.assert_allclose(float(result.lower_bound[0]), reference.lower_bound_, rtol=1e-6)


def test_fit_em_max_iter_zero_returns_start():
    X, centers, covariances = gaussian_blobs(*SEPARATED)
    params = torch_params(*initial_parameters(centers, covariances, "full", 0), "full")
    result = em.fit_em(
        t(X)[None], params, covariance_type="full", reg_covar=1e-6, max_iter=0, tol=1e-3
    )
    assert_params_close(result.params, params, rtol=0, atol=0)
    assert result.n_iter.tolist() == [0]
    assert result.converged.tolist() == [False]
    log_prob_norm, _ = e_step.e_step(t(X)[None], params, "full")
    assert torch.equal(result.lower_bound, log_prob_norm)


# --- 2. batched equals one at a time ---------------------------------------------------


def padded_batch(datasets):
    """Stack datasets of different sizes; padded rows hold NaN, which must never leak."""
    n_max = max(len(X) for X in datasets)
    X = torch.full((len(datasets), n_max, datasets[0].shape[1]), float("nan"), dtype=torch.float64)
    mask = torch.zeros(len(datasets), n_max, dtype=torch.bool)
    for i, data in enumerate(datasets):
        X[i, : len(data)] = t(data)
        mask[i, : len(data)] = True
    return X, mask


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_fit_em_batched_with_padding_equals_one_at_a_time(covariance_type):
    specs = [
        ([[0, 0, 0], [6, 0, 0], [0, 6, 3]], 50, 0),
        ([[0, 0, 0], [1.5, 0.5, 0], [0, 1.5, 1.0]], 65, 1),
        ([[0, 0, 0], [3, 1, 0], [0, 3, 2]], 40, 2),
    ]
    datasets, starts = [], []
    for i, spec in enumerate(specs):
        X, centers, covariances = gaussian_blobs(*spec)
        datasets.append(X)
        starts.append(
            torch_params(
                *initial_parameters(centers, covariances, covariance_type, i), covariance_type
            )
        )
    options = dict(covariance_type=covariance_type, reg_covar=1e-6, max_iter=200, tol=1e-6)
    X, mask = padded_batch(datasets)

    batched = em.fit_em(X, stack_params(starts), mask=mask, **options)

    assert batched.n_iter.unique().numel() > 1  # datasets stop at different iterations
    for i, (data, start) in enumerate(zip(datasets, starts, strict=True)):
        alone = em.fit_em(t(data)[None], start, **options)
        assert batched.n_iter[i] == alone.n_iter[0]
        assert batched.converged[i] == alone.converged[0]
        assert_params_close(batched.params, alone.params, index=i)
        np.testing.assert_allclose(batched.lower_bound[i], alone.lower_bound[0], rtol=1e-10)


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_fit_em_restarts_share_one_dataset(covariance_type):
    X, centers, covariances = gaussian_blobs(*OVERLAPPING)
    starts = stack_params(
        [
            torch_params(
                *initial_parameters(centers, covariances, covariance_type, seed), covariance_type
            )
            for seed in range(4)
        ]
    )
    options = dict(covariance_type=covariance_type, reg_covar=1e-6, max_iter=100, tol=1e-6)

    shared = em.fit_em(t(X)[None], starts, **options)  # X of batch 1, parameters of batch 4
    copied = em.fit_em(t(X)[None].repeat(4, 1, 1), starts, **options)

    assert shared.lower_bound.shape == (4,)
    assert torch.equal(shared.n_iter, copied.n_iter)
    for i in range(4):
        assert_params_close(
            shared.params,
            m_step.MixtureParams(
                *(
                    getattr(copied.params, f)[i : i + 1]
                    for f in ("weights", "means", "covariances", "precisions_cholesky")
                )
            ),
            index=i,
        )
    np.testing.assert_allclose(shared.lower_bound, copied.lower_bound, rtol=1e-12)


def test_e_step_ignores_padding():
    X, centers, covariances = gaussian_blobs(*SEPARATED)
    params = torch_params(*initial_parameters(centers, covariances, "diag", 0), "diag")
    padded, mask = padded_batch([X, X[:100]])
    log_prob_norm, log_resp = e_step.e_step(padded, stack_params([params, params]), "diag", mask)
    for i, n in enumerate([len(X), 100]):
        expected_norm, expected_resp = e_step.e_step(t(X[:n])[None], params, "diag")
        np.testing.assert_allclose(log_prob_norm[i], expected_norm[0], rtol=1e-12)
        np.testing.assert_allclose(log_resp[i, :n], expected_resp[0], rtol=1e-12, atol=1e-12)
        assert torch.all(log_resp[i, n:] == -torch.inf)


# --- 3. M-step, precisions and log-probabilities against scikit-learn's helpers --------


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_m_step_and_log_prob_match_sklearn_helpers(covariance_type):
    rng = np.random.default_rng(3)
    X, _, _ = gaussian_blobs(*OVERLAPPING)
    resp = rng.dirichlet(np.ones(3), size=len(X))

    nk, means, covariances = _estimate_gaussian_parameters(X, resp, 1e-4, covariance_type)
    precisions_chol = _compute_precision_cholesky(covariances, covariance_type)
    log_prob = _estimate_log_gaussian_prob(X, means, precisions_chol, covariance_type)

    params = m_step.estimate_gaussian_parameters(
        t(X)[None], t(resp)[None], covariance_type=covariance_type, reg_covar=1e-4
    )
    np.testing.assert_allclose(params.weights[0], nk / len(X), rtol=1e-10)
    np.testing.assert_allclose(params.means[0], means, rtol=1e-10)
    np.testing.assert_allclose(params.covariances[0], covariances, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(
        params.precisions_cholesky[0], precisions_chol, rtol=1e-10, atol=1e-12
    )
    ours = gaussian.estimate_log_gaussian_prob(
        t(X)[None], t(means)[None], t(precisions_chol)[None], covariance_type
    )
    np.testing.assert_allclose(ours[0], log_prob, rtol=1e-10)
    weighted = e_step.estimate_weighted_log_prob(
        t(X)[None],
        m_step.MixtureParams(params.weights, params.means, None, params.precisions_cholesky),
        covariance_type,
    )
    np.testing.assert_allclose(weighted[0], log_prob + np.log(nk / len(X)), rtol=1e-10)


@pytest.mark.parametrize("at_once", [True, False], ids=["all-components", "one-buffer"])
def test_full_covariance_paths_with_and_without_autograd_agree(at_once, monkeypatch):
    # Without autograd, the full-covariance M-step and log-probabilities take every
    # component at once (small problems; EM's E-step asks for it) or work in place in one
    # reused buffer (large ones); with it, they take the out-of-place formulas. Same
    # numbers, and gradients flow through the last. Batched: X shared (1, N, d),
    # parameters (2, ...).
    monkeypatch.setattr(gaussian, "ALL_COMPONENTS_AT_ONCE", 10**9 if at_once else 0)
    rng = np.random.default_rng(5)
    X, _, _ = gaussian_blobs(*OVERLAPPING)
    assert gaussian.all_components_at_once(t(X)[None], t(np.zeros((2, 3, 2)))) == at_once
    resp = t(np.stack([rng.dirichlet(np.ones(3), size=len(X)) for _ in range(2)]))  # (2, N, 3)
    fast = m_step.estimate_gaussian_parameters(
        t(X)[None], resp, covariance_type="full", reg_covar=1e-4
    )
    log_prob = gaussian.estimate_log_gaussian_prob(
        t(X)[None], fast.means, fast.precisions_cholesky, "full", at_once=at_once
    )
    tracked = resp.clone().requires_grad_(True)
    slow = m_step.estimate_gaussian_parameters(
        t(X)[None], tracked, covariance_type="full", reg_covar=1e-4
    )
    slow_log_prob = gaussian.estimate_log_gaussian_prob(
        t(X)[None], slow.means, slow.precisions_cholesky, "full", at_once=at_once
    )  # autograd: the loop, whatever at_once says
    torch.testing.assert_close(slow.covariances.detach(), fast.covariances, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(slow_log_prob.detach(), log_prob, rtol=1e-12, atol=1e-12)
    slow_log_prob.sum().backward()
    assert tracked.grad is not None and torch.isfinite(tracked.grad).all()


def test_scores_do_not_depend_on_how_the_rows_are_chunked():
    # Scoring never takes EM's all-components path, whose rounding depends on the number of
    # rows: a dask array's chunks score as the whole array does, to the bit.
    # 24,000 rows in d = 4 (where the two paths round differently): whole, above the
    # threshold; in chunks, below it.
    X, _, _ = gaussian_blobs([[0, 0, 0, 0], [3, 0, 1, 0], [0, 3, 0, 1]], 8000, 2)
    gmm = TransformerGMM(3, covariance_type="full", checkpoint=None, random_state=0).fit(X)
    whole = gmm.score_samples(X)
    chunks = np.concatenate([gmm.score_samples(X[i : i + 300]) for i in range(0, len(X), 300)])
    assert gaussian.all_components_at_once(t(X[:300])[None], t(gmm.means_)[None])
    assert not gaussian.all_components_at_once(t(X)[None], t(gmm.means_)[None])
    np.testing.assert_array_equal(chunks, whole)


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_precision_conversions_match_sklearn(covariance_type):
    X, centers, covariances = gaussian_blobs(*SEPARATED)
    _, _, precisions = initial_parameters(centers, covariances, covariance_type, 0)
    expected = _compute_precision_cholesky_from_precisions(precisions, covariance_type, xp=np)

    precisions_chol = t(_initialization.precisions_cholesky(precisions, covariance_type))
    np.testing.assert_allclose(precisions_chol, expected, rtol=1e-10, atol=1e-14)
    # Back to covariances, and forward again as scikit-learn computes it.
    recovered = gaussian.covariances_from_precisions_cholesky(
        precisions_chol[None], covariance_type
    )
    inverse = np.linalg.inv(precisions) if covariance_type in ("full", "tied") else 1 / precisions
    np.testing.assert_allclose(recovered[0], inverse, rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(
        gaussian.compute_precision_cholesky(recovered, covariance_type)[0],
        _compute_precision_cholesky(inverse, covariance_type),
        rtol=1e-9,
        atol=1e-13,
    )


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_m_step_with_given_means_and_padding(covariance_type):
    rng = np.random.default_rng(4)
    X, _, _ = gaussian_blobs(*SEPARATED)
    resp = rng.dirichlet(np.ones(3), size=len(X))
    given = rng.standard_normal((3, 3))
    padded, mask = padded_batch([X, X[:150]])
    resp_padded = torch.full((2, len(X), 3), float("nan"), dtype=torch.float64)
    resp_padded[0], resp_padded[1, :150] = t(resp), t(resp[:150])

    params = m_step.estimate_gaussian_parameters(
        padded,
        resp_padded,
        covariance_type=covariance_type,
        reg_covar=1e-3,
        means=t(given)[None].repeat(2, 1, 1),
        mask=mask,
    )

    for i, n in enumerate([len(X), 150]):
        x, r = X[:n], resp[:n]
        nk = r.sum(0) + 10 * np.finfo(float).eps
        diff = x[:, None, :] - given[None]  # (n, K, d): the definition, around the given means
        full = np.einsum("nk,nki,nkj->kij", r, diff, diff) / nk[:, None, None]
        expected = {
            "full": full + 1e-3 * np.eye(3),
            "tied": (full * nk[:, None, None]).sum(0) / nk.sum() + 1e-3 * np.eye(3),
            "diag": np.diagonal(full, axis1=1, axis2=2) + 1e-3,
            "spherical": np.diagonal(full, axis1=1, axis2=2).mean(1) + 1e-3,
        }[covariance_type]
        np.testing.assert_allclose(params.weights[i], nk / n, rtol=1e-12)
        np.testing.assert_allclose(params.means[i], given, rtol=0)
        np.testing.assert_allclose(params.covariances[i], expected, rtol=1e-9, atol=1e-12)


def test_shape_errors_are_raised_not_broadcast():
    X = torch.zeros(2, 10, 3, dtype=torch.float64)
    params = m_step.MixtureParams(
        weights=torch.full((2, 2), 0.5, dtype=torch.float64),
        means=torch.zeros(2, 3, dtype=torch.float64),  # missing batch dim
        covariances=None,
        precisions_cholesky=torch.ones(2, 2, 3, dtype=torch.float64),
    )
    with pytest.raises(ValueError, match="means"):
        e_step.e_step(X, params, "diag")
    params.means = torch.zeros(3, 2, 3, dtype=torch.float64)  # batch 3 against X's 2
    with pytest.raises(ValueError, match="batch"):
        e_step.e_step(X, params, "diag")
    with pytest.raises(ValueError, match="covariance_type"):
        gaussian.compute_precision_cholesky(torch.ones(2, 2), "bogus")


# --- 4. k-means++ ----------------------------------------------------------------------


def test_kmeans_plusplus_is_seeded_and_picks_real_points():
    X, _, _ = gaussian_blobs(*OVERLAPPING)
    far = np.full((40, 3), 1e6)  # padding this far away would be picked if it counted
    padded, mask = padded_batch([X, X[:120]])
    padded[1, 120:160] = t(far)

    def seeds(seed):
        generator = torch.Generator().manual_seed(seed)
        return kmeans.kmeans_plusplus(padded, 4, generator=generator, mask=mask)

    first = seeds(0)
    assert first.shape == (2, 4, 3)
    assert torch.equal(first, seeds(0))
    assert not torch.equal(first, seeds(1))
    for i, n in enumerate([len(X), 120]):
        # every seed is one of the dataset's real rows, and they are distinct
        matches = (first[i][:, None, :] == t(X[:n])[None]).all(-1)  # (K, n)
        assert matches.any(1).all()
        assert len(set(matches.int().argmax(1).tolist())) == 4


def test_kmeans_plusplus_spreads_seeds_over_separated_blobs():
    centers = np.array([[0, 0], [30, 0], [0, 30], [30, 30]], dtype=float)
    X, _, _ = gaussian_blobs(centers, 40, 7)
    generator = torch.Generator().manual_seed(0)
    draws = t(X)[None].expand(20, -1, -1)  # 20 seedings of one dataset
    seeds = kmeans.kmeans_plusplus(draws, 4, generator=generator)
    blob = np.linalg.norm(seeds.numpy()[:, :, None] - centers[None, None], axis=-1).argmin(-1)
    one_per_blob = sum(len(set(row)) == 4 for row in blob.tolist())
    assert one_per_blob >= 18


def test_kmeans_plusplus_with_fewer_distinct_points_than_clusters():
    X = torch.tensor([[0.0, 0.0]] * 5 + [[1.0, 1.0]] * 5 + [[9.0, 9.0]] * 3, dtype=torch.float64)
    mask = torch.tensor([True] * 10 + [False] * 3)
    generator = torch.Generator().manual_seed(0)
    seeds = kmeans.kmeans_plusplus(
        X[None].expand(8, -1, -1), 4, generator=generator, mask=mask[None]
    )
    assert not (seeds == 9.0).any()  # padding is never a seed, even when all distances are 0
    assert torch.isfinite(seeds).all()


def test_weighted_kmeans_plusplus_seeds_every_blob_as_sklearn_does():
    """Weights enter the draws and the potentials once, as in scikit-learn: a blob ten
    times as heavy as the others gets one seed of three in most seedings, as in 0.84 of
    scikit-learn's here (counting its weights twice gave 0.06)."""
    rng = np.random.default_rng(3)
    centers = np.array([[-6.0, 0.0], [0.0, 6.0], [6.0, 0.0]])
    X = np.repeat(centers, 40, axis=0) + rng.normal(size=(120, 2))
    weights = np.repeat([10.0, 1.0, 1.0], 40)
    seeds = kmeans.kmeans_plusplus(
        t(X)[None].expand(1000, -1, -1),
        3,
        generator=torch.Generator().manual_seed(0),
        sample_weight=t(weights)[None].expand(1000, -1),
    )
    blob = torch.cdist(seeds, t(centers)[None].expand(1000, -1, -1)).argmin(-1)  # (1000, 3)
    every_blob = (blob.sort(-1).values == torch.arange(3)).all(-1).double().mean()
    assert every_blob > 0.75


# --- 5. Lloyd --------------------------------------------------------------------------


@pytest.mark.parametrize("max_iter, tol", [(300, 1e-4), (2, 1e-4), (300, 0.0)])
def test_lloyd_matches_sklearn(max_iter, tol):
    X, _, _ = gaussian_blobs(*OVERLAPPING)
    rng = np.random.default_rng(0)
    init = X[rng.choice(len(X), 4, replace=False)]
    reference = KMeans(4, init=init, n_init=1, algorithm="lloyd", max_iter=max_iter, tol=tol)
    reference.fit(X)

    centers, labels, inertia, n_iter = kmeans.lloyd(
        t(X)[None], t(init)[None], max_iter=max_iter, tol=tol
    )

    np.testing.assert_array_equal(labels[0], reference.labels_)
    np.testing.assert_allclose(centers[0], reference.cluster_centers_, rtol=1e-6)
    np.testing.assert_allclose(float(inertia[0]), reference.inertia_, rtol=1e-6)
    assert int(n_iter[0]) == reference.n_iter_
    distances = torch.cdist(t(X)[None], centers)
    assert torch.equal(labels, distances.argmin(-1))


def test_assign_is_the_first_nearest_centre_ties_and_nan_included():
    rng = np.random.default_rng(0)
    for _ in range(50):
        # Integer points and centres, a centre repeated: exact ties between centres.
        X = torch.from_numpy(rng.integers(-3, 4, size=(2, 40, 3)).astype(np.float64))
        centers = torch.from_numpy(rng.integers(-3, 4, size=(2, 5, 3)).astype(np.float64))
        centers[:, 4] = centers[:, 1]
        distances = ((X[:, :, None, :] - centers[:, None, :, :]) ** 2).sum(-1)  # (2, 40, 5)
        np.testing.assert_array_equal(kmeans.assign(X, centers), distances.argmin(-1))
    X[0, 0, 0] = float("nan")
    centers[1, 2, 0] = float("nan")
    labels = kmeans.assign(X, centers)
    assert labels[0, 0] == 0  # a NaN row's scores are all NaN: the first centre
    assert (labels[1] == 2).all()  # a NaN centre's score is NaN, and NaN comes first


@pytest.mark.parametrize("n_clusters", [1, 2, 7, 300])
def test_first_minimum_is_min_indices_on_many_rows(n_clusters):
    # Past the few scores where it calls min itself: integer scores (exact ties), a repeated
    # centre, NaN in a row and in a whole centre, infinities, float64 and float32.
    n_rows = max(5000, kmeans._INDEXED_MIN_SCORES // n_clusters)
    rng = np.random.default_rng(n_clusters)
    scores = torch.from_numpy(rng.integers(-3, 4, size=(2, n_clusters, n_rows)).astype(float))
    scores[:, -1] = scores[:, 0]
    scores[0, n_clusters // 2, 10] = float("nan")
    scores[1, :, 11] = float("nan")
    scores[1, n_clusters // 2] = float("nan")
    scores[0, -1, 12] = -float("inf")
    for dtype in (torch.float64, torch.float32):
        s = scores.to(dtype)
        np.testing.assert_array_equal(kmeans.first_minimum(s), s.min(1).indices)
    finite = torch.from_numpy(rng.normal(size=(3, n_clusters, n_rows)))
    np.testing.assert_array_equal(kmeans.first_minimum(finite), finite.argmin(1))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_first_minimum_and_one_hot_where_a_nan_row_and_a_tie_balance_the_hits(dtype):
    # The one-hot path counts one hit a row: a NaN row has none and a tie two, so one of
    # each leaves the count right; argmin's rule must still decide both rows.
    n_rows = kmeans._INDEXED_MIN_SCORES  # past the few scores where min itself decides
    scores = torch.from_numpy(np.random.default_rng(5).normal(size=(1, 3, n_rows))).to(dtype)
    scores[0, :, 5] = torch.tensor([0.5, float("nan"), 0.1])  # argmin: the NaN, 1
    scores[0, :, 9] = torch.tensor([2.0, -4.0, -4.0])  # a tie: the first, 1
    labels = kmeans.first_minimum(scores)
    np.testing.assert_array_equal(labels, scores.min(1).indices)
    assert labels[0, 5] == 1 and labels[0, 9] == 1
    expected = torch.nn.functional.one_hot(labels, 3).mT.to(dtype)
    assert torch.equal(kmeans.nearest_one_hot(scores), expected)


@pytest.mark.parametrize("n_clusters, n_features", [(3, 6), (6, 6), (32, 9), (1, 2)])
@pytest.mark.parametrize("shared_rows", [True, False])
def test_cluster_totals_are_the_sums_by_label(n_clusters, n_features, shared_rows):
    # Both layouts (fewer clusters than features, and more) give each cluster its weight
    # and its rows' sum; an empty cluster gets zeros.
    rng = np.random.default_rng(n_clusters)
    n_runs, n_rows = 3, 500
    X = torch.from_numpy(rng.normal(size=(1 if shared_rows else n_runs, n_rows, n_features)))
    weights = torch.from_numpy(rng.uniform(0, 2, size=(1, n_rows, 1)))
    labels = torch.from_numpy(rng.integers(0, max(n_clusters - 1, 1), size=(n_runs, n_rows)))
    counts, sums = kmeans.cluster_totals(labels, n_clusters, X, weights)
    assert counts.shape == (n_runs, n_clusters, 1)
    assert sums.shape == (n_runs, n_clusters, n_features)
    rows = X.expand(n_runs, -1, -1)
    for run in range(n_runs):
        for k in range(n_clusters):
            taken = labels[run] == k
            torch.testing.assert_close(counts[run, k, 0], weights[0, taken, 0].sum())
            torch.testing.assert_close(sums[run, k], rows[run, taken].sum(0))


def test_nearest_one_hot_marks_the_first_nearest_centre():
    # The one-hot from the scores' minimum is that of the labels, also where two centres
    # coincide (a tie: the first wins) and where a score is NaN (argmin's first NaN).
    rng = np.random.default_rng(4)
    X = torch.from_numpy(rng.normal(size=(1, 300, 3)))
    centers = torch.from_numpy(rng.normal(size=(2, 4, 3)))
    centers[1, 2] = centers[1, 0]  # run 1: clusters 0 and 2 coincide
    with_nan = torch.tensor([[[1.0, 0.0], [np.nan, 2.0]]])
    for scores in (kmeans.nearest_scores(X, centers), with_nan):
        labels = scores.min(1).indices
        expected = torch.nn.functional.one_hot(labels, scores.shape[1]).mT.to(scores.dtype)
        assert torch.equal(kmeans.nearest_one_hot(scores), expected)
    assert kmeans.nearest_one_hot(kmeans.nearest_scores(X, centers))[1, 2].sum() == 0


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_nearest_scores_read_offset_rows_without_centring_them(dtype):
    # Rows far from the origin are labelled as their centred copies are, when the centres
    # come less the offset: the offset costs digits only on the centres' side.
    rng = np.random.default_rng(5)
    spread = rng.normal(size=(1, 2000, 4)) + 6.0 * rng.integers(0, 3, size=(1, 2000, 1))
    offset = np.full((1, 1, 4), 1e4 if dtype == torch.float32 else 1e9)
    centers = 6.0 * np.arange(3.0)[None, :, None] + 0.3 * rng.normal(size=(1, 3, 4))
    centers = torch.from_numpy(centers)
    X, o = torch.from_numpy(spread + offset).to(dtype), torch.from_numpy(offset).to(dtype)
    centred = kmeans.assign(torch.from_numpy(spread), centers)
    assert torch.equal(kmeans.assign(X, centers.to(dtype), o), centred)
    assert not torch.equal(kmeans.assign(X, (centers + o.double()).to(dtype)), centred)


def test_lloyd_batched_with_padding_equals_one_at_a_time():
    datasets = [gaussian_blobs(*spec)[0] for spec in (SEPARATED, OVERLAPPING)]
    datasets[1] = datasets[1][:150]
    padded, mask = padded_batch(datasets)
    init = torch.stack([t(data[:3]) for data in datasets])
    centers, labels, inertia, n_iter = kmeans.lloyd(padded, init, max_iter=100, mask=mask)
    for i, data in enumerate(datasets):
        alone = kmeans.lloyd(t(data)[None], init[i : i + 1], max_iter=100)
        np.testing.assert_allclose(centers[i], alone[0][0], rtol=1e-10)
        assert torch.equal(labels[i, : len(data)], alone[1][0])
        assert (labels[i, len(data) :] == -1).all()
        np.testing.assert_allclose(inertia[i], alone[2][0], rtol=1e-10)
        assert n_iter[i] == alone[3][0]


def test_lloyd_max_iter_zero_only_assigns():
    X, _, _ = gaussian_blobs(*SEPARATED)
    init = t(X[:3])[None]
    centers, labels, inertia, n_iter = kmeans.lloyd(t(X)[None], init, max_iter=0)
    assert torch.equal(centers, init)
    assert n_iter.tolist() == [0]
    assert torch.equal(labels, torch.cdist(t(X)[None], init).argmin(-1))
    expected = ((t(X) - init[0][labels[0]]) ** 2).sum()
    np.testing.assert_allclose(float(inertia[0]), float(expected), rtol=1e-10)


def test_lloyd_relocates_an_empty_cluster_to_a_far_point():
    # The third centre holds no point: as in KMeans, it takes the point farthest from its
    # centre (0.1 or 10.1, a tie), and every cluster ends up holding a point.
    X = torch.tensor([[0.0], [0.1], [10.0], [10.1]], dtype=torch.float64)[None]
    init = torch.tensor([[0.0], [10.0], [1000.0]], dtype=torch.float64)[None]
    centers, labels, inertia, _ = kmeans.lloyd(X, init, max_iter=10)
    assert set(labels[0].tolist()) == {0, 1, 2}
    assert min(abs(centers[0, 2, 0].item() - p) for p in (0.1, 10.1)) < 1e-12
    assert inertia.item() == pytest.approx(0.005)


def test_lloyd_inertia_read_in_row_chunks_is_the_whole_sum(monkeypatch):
    # The final inertia reads rows in chunks (no (B, N, d) temporary at large N): chunks
    # that do not divide N, and padding across a chunk boundary, must not change it.
    datasets = [gaussian_blobs(*spec)[0] for spec in (SEPARATED, OVERLAPPING)]
    datasets[1] = datasets[1][:137]
    padded, mask = padded_batch(datasets)
    init = torch.stack([t(data[:3]) for data in datasets])
    whole = kmeans.lloyd(padded, init, max_iter=100, mask=mask)
    monkeypatch.setattr(kmeans, "_INERTIA_CHUNK_VALUES", 7 * 3)  # 7 rows in 3-D
    chunked = kmeans.lloyd(padded, init, max_iter=100, mask=mask)
    for i, data in enumerate(datasets):
        direct = ((t(data) - whole[0][i][whole[1][i, : len(data)]]) ** 2).sum()
        np.testing.assert_allclose(float(chunked[2][i]), float(direct), rtol=1e-12)
    np.testing.assert_allclose(chunked[2], whole[2], rtol=1e-12)


# --- 6. ill-defined covariances --------------------------------------------------------


SINGULAR_COVARIANCES = {  # the second component (or the tied matrix) is singular
    "full": np.stack([np.eye(3), np.ones((3, 3))]),
    "tied": np.ones((3, 3)),
    "diag": np.array([[1.0, 1.0, 1.0], [1.0, 0.0, 1.0]]),
    "spherical": np.array([1.0, 0.0]),
}


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_singular_covariance_raises_sklearn_error(covariance_type):
    covariances = SINGULAR_COVARIANCES[covariance_type]
    with pytest.raises(ValueError) as theirs:
        _compute_precision_cholesky(covariances, covariance_type)
    with pytest.raises(ValueError) as ours:
        gaussian.compute_precision_cholesky(t(covariances)[None], covariance_type)
    assert str(ours.value) == str(theirs.value)
    assert str(ours.value).startswith(SKLEARN_MESSAGE)


@pytest.mark.parametrize("covariance_type", ["full", "diag", "spherical"])
def test_m_step_on_collapsed_component_raises(covariance_type):
    # A component owning only points at the origin: with reg_covar=0 its covariance is
    # exactly zero, and scikit-learn fails on the same input.
    rng = np.random.default_rng(0)
    X = np.vstack([np.zeros((3, 3)), rng.standard_normal((6, 3))])
    resp = np.zeros((9, 2))
    resp[:3, 0], resp[3:, 1] = 1.0, 1.0
    _, _, covariances = _estimate_gaussian_parameters(X, resp, 0.0, covariance_type)
    with pytest.raises(ValueError, match=SKLEARN_MESSAGE):
        _compute_precision_cholesky(covariances, covariance_type)
    with pytest.raises(ValueError, match=SKLEARN_MESSAGE):
        m_step.estimate_gaussian_parameters(
            t(X)[None], t(resp)[None], covariance_type=covariance_type, reg_covar=0.0
        )


def test_singular_matrix_message_mentions_float64_for_float32():
    singular = torch.ones(1, 2, 2, dtype=torch.float32)  # rank 1
    with pytest.raises(ValueError, match="passing float64"):
        gaussian.compute_precision_cholesky(singular, "tied")


@pytest.mark.parametrize("covariance_type", ["full", "diag", "spherical"])
def test_fit_em_raises_when_a_component_collapses(covariance_type):
    X, _, _ = gaussian_blobs([[20, 0, 0], [-20, 0, 0]], 30, 0)
    X = np.vstack([X, np.zeros((1, 3))])  # an isolated point, which component 2 captures
    weights, means = np.full(3, 1 / 3), np.array([[20.0, 0, 0], [-20.0, 0, 0], [0, 0, 0]])
    precisions = {
        "full": np.stack([np.eye(3), np.eye(3), 100 * np.eye(3)]),
        "diag": np.array([[1.0] * 3, [1.0] * 3, [100.0] * 3]),
        "spherical": np.array([1.0, 1.0, 100.0]),
    }[covariance_type]
    params = torch_params(weights, means, precisions, covariance_type)
    with pytest.raises(ValueError, match=SKLEARN_MESSAGE):
        em.fit_em(
            t(X)[None],
            params,
            covariance_type=covariance_type,
            reg_covar=0.0,
            max_iter=10,
            tol=1e-3,
        )


# --- 7. k-means initialisation and EM recover the truth --------------------------------


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_initialize_kmeans_then_em_recovers_means(covariance_type):
    # Far apart, so that even the misspecified models (tied, spherical) find the true means.
    X, centers, _ = gaussian_blobs([[0, 0, 0], [12, 0, 0], [0, 12, 6]], 70, 0)
    x = t(X)[None]
    generator = torch.Generator().manual_seed(0)
    start = m_step.initialize_kmeans(
        x.expand(3, -1, -1),
        3,
        covariance_type=covariance_type,
        reg_covar=1e-6,
        generator=generator,
    )
    assert start.weights.shape == (3, 3)
    np.testing.assert_allclose(start.weights.sum(-1), 1.0, rtol=1e-12)
    result = em.fit_em(
        x, start, covariance_type=covariance_type, reg_covar=1e-6, max_iter=100, tol=1e-4
    )
    assert result.converged.all()
    for means in result.params.means.numpy():
        matched = means[np.linalg.norm(means[:, None] - centers[None], axis=-1).argmin(0)]
        np.testing.assert_allclose(matched, centers, atol=0.4)


def test_initialize_kmeans_with_padding_ignores_padded_points():
    X, _, _ = gaussian_blobs(*SEPARATED)
    padded, mask = padded_batch([X, X[:150]])
    generator = torch.Generator().manual_seed(0)
    params = m_step.initialize_kmeans(
        padded, 3, covariance_type="full", reg_covar=1e-6, generator=generator, mask=mask
    )
    for field in ("weights", "means", "covariances", "precisions_cholesky"):
        assert torch.isfinite(getattr(params, field)).all()
    np.testing.assert_allclose(params.weights.sum(-1), 1.0, rtol=1e-12)


# --- 8. float32 ------------------------------------------------------------------------


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_float32_runs_and_agrees_with_float64(covariance_type):
    X, centers, covariances = gaussian_blobs(*SEPARATED)
    x64 = t(X)[None]
    x32 = x64.float()
    generator = torch.Generator().manual_seed(0)
    start = m_step.initialize_kmeans(
        x32, 3, covariance_type=covariance_type, reg_covar=1e-6, generator=generator
    )
    result = em.fit_em(
        x32, start, covariance_type=covariance_type, reg_covar=1e-6, max_iter=100, tol=1e-4
    )
    for field in ("weights", "means", "covariances", "precisions_cholesky"):
        value = getattr(result.params, field)
        assert value.dtype == torch.float32
        assert torch.isfinite(value).all()
    assert result.lower_bound.dtype == torch.float32

    start64 = m_step.MixtureParams(
        *(
            getattr(start, f).double()
            for f in ("weights", "means", "covariances", "precisions_cholesky")
        )
    )
    result64 = em.fit_em(
        x64, start64, covariance_type=covariance_type, reg_covar=1e-6, max_iter=100, tol=1e-4
    )
    np.testing.assert_allclose(result.params.means.double(), result64.params.means, atol=1e-3)
    np.testing.assert_allclose(float(result.lower_bound), float(result64.lower_bound), rtol=1e-4)


# --- 9. converged datasets leave the batch ---------------------------------------------


def index_params(params, index):
    """The parameters of one dataset, as a batch of one."""
    return m_step.MixtureParams(
        *(
            getattr(params, f)[index : index + 1]
            for f in ("weights", "means", "covariances", "precisions_cholesky")
        )
    )


def spread_out_problems(covariance_type):
    """Nine padded datasets whose EM runs stop anywhere from a few iterations to never."""
    specs = [
        ([[0, 0, 0], [6, 0, 0], [0, 6, 3]], 50, 0),  # separated: a few iterations
        ([[0, 0, 0], [1.5, 0.5, 0], [0, 1.5, 1.0]], 65, 1),  # overlapping: many
        ([[0, 0, 0], [3, 1, 0], [0, 3, 2]], 40, 2),
    ]
    datasets, starts = [], []
    for i in range(9):
        centers, n_per_cluster, seed = specs[i % 3]
        X, centers, covariances = gaussian_blobs(centers, n_per_cluster - 3 * i, seed + 10 * i)
        datasets.append(X)
        start = initial_parameters(centers, covariances, covariance_type, i)
        starts.append(torch_params(*start, covariance_type))
    return datasets, starts


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_fit_em_shrinking_batch_equals_each_problem_alone(covariance_type, monkeypatch):
    datasets, starts = spread_out_problems(covariance_type)
    options = dict(covariance_type=covariance_type, reg_covar=1e-6, max_iter=60, tol=1e-6)
    X, mask = padded_batch(datasets)
    sizes = []  # the batch size of every E-step
    original = e_step.e_step_unchecked

    def recording_e_step(X, params, *args, **kwargs):
        sizes.append(params.weights.shape[0])
        return original(X, params, *args, **kwargs)

    monkeypatch.setattr(em, "e_step_unchecked", recording_e_step)
    shrunk = em.fit_em(X, stack_params(starts), mask=mask, **options)
    monkeypatch.undo()
    monkeypatch.setattr(batching, "SHRINK_WHEN_STOPPED", 1.0)  # the whole batch throughout
    whole = em.fit_em(X, stack_params(starts), mask=mask, **options)

    assert shrunk.n_iter.unique().numel() >= 4  # stops spread over the iterations
    assert shrunk.converged.any() and not shrunk.converged.all()  # some reach max_iter
    # Each iteration ran on the datasets still iterating, plus at most a third as many
    # that had stopped (the batch shrinks once a quarter of it has stopped).
    assert len(sizes) == int(shrunk.n_iter.max())
    assert sizes[0] == len(datasets) and sizes == sorted(sizes, reverse=True)
    for iteration, size in enumerate(sizes, start=1):
        running = int((shrunk.n_iter >= iteration).sum())
        assert running <= size and 3 * size <= 4 * running
    # What the whole batch gives. Only to the last bit: a row gathered to another offset
    # in memory can be summed in another order by the vectorised kernels.
    assert torch.equal(shrunk.n_iter, whole.n_iter)
    assert torch.equal(shrunk.converged, whole.converged)
    np.testing.assert_allclose(shrunk.lower_bound, whole.lower_bound, rtol=1e-14)
    for i, (data, start) in enumerate(zip(datasets, starts, strict=True)):
        assert_params_close(shrunk.params, index_params(whole.params, i), index=i, rtol=1e-12)
        alone = em.fit_em(t(data)[None], start, **options)
        assert shrunk.n_iter[i] == alone.n_iter[0]
        assert shrunk.converged[i] == alone.converged[0]
        assert_params_close(shrunk.params, alone.params, index=i)
        np.testing.assert_allclose(shrunk.lower_bound[i], alone.lower_bound[0], rtol=1e-12)


def test_fit_em_shrinking_batch_keeps_a_shared_dataset_and_mask(monkeypatch):
    # Restarts on one padded dataset: X and mask stay of batch 1 while the runs leave.
    X, centers, covariances = gaussian_blobs(*OVERLAPPING)
    n_real = 150
    padded, mask = padded_batch([X[:n_real], X])
    padded, mask = padded[:1], mask[:1]  # (1, N, d) with NaN padding rows, (1, N)
    starts = [
        torch_params(*initial_parameters(centers, covariances, "full", seed), "full")
        for seed in range(6)
    ]
    options = dict(covariance_type="full", reg_covar=1e-6, max_iter=200, tol=1e-8)
    batches = set()  # (X, parameters, mask) batch sizes seen by the E-steps
    original = e_step.e_step_unchecked

    def recording_e_step(X, params, covariance_type, mask, **kwargs):
        batches.add((X.shape[0], params.weights.shape[0], mask.shape[0]))
        return original(X, params, covariance_type, mask, **kwargs)

    monkeypatch.setattr(em, "e_step_unchecked", recording_e_step)
    shared = em.fit_em(padded, stack_params(starts), mask=mask, **options)
    monkeypatch.undo()

    assert {(x, m) for x, _, m in batches} == {(1, 1)}
    assert len({runs for _, runs, _ in batches}) >= 3  # 6 runs, then fewer, twice or more
    for i, start in enumerate(starts):
        alone = em.fit_em(t(X[:n_real])[None], start, **options)
        assert shared.n_iter[i] == alone.n_iter[0]
        assert shared.converged[i] == alone.converged[0]
        assert_params_close(shared.params, alone.params, index=i)
        np.testing.assert_allclose(shared.lower_bound[i], alone.lower_bound[0], rtol=1e-12)


def test_lloyd_shrinking_batch_equals_each_problem_alone():
    datasets, _ = spread_out_problems("full")
    padded, mask = padded_batch(datasets)
    init = torch.stack([t(data[[0, 1, 2]]) for data in datasets])
    centers, labels, inertia, n_iter = kmeans.lloyd(padded, init, max_iter=100, tol=0.0, mask=mask)
    assert n_iter.unique().numel() > 2
    for i, data in enumerate(datasets):
        alone = kmeans.lloyd(t(data)[None], init[i : i + 1], max_iter=100, tol=0.0)
        np.testing.assert_allclose(centers[i], alone[0][0], rtol=1e-10)
        assert torch.equal(labels[i, : len(data)], alone[1][0])
        assert (labels[i, len(data) :] == -1).all()
        np.testing.assert_allclose(inertia[i], alone[2][0], rtol=1e-10)
        assert n_iter[i] == alone[3][0]


@pytest.mark.parametrize(
    "a_shape, b_shape",
    [((1, 50, 30), (4, 30, 3)), ((4, 50, 30), (4, 30, 3)), ((4, 50, 30), (1, 30, 3)),
     ((1, 50, 30), (1, 30, 3))],
)
def test_batched_products_with_shared_rows_equal_torchs(a_shape, b_shape):
    # Shared rows (batch 1) are multiplied once against every start's matrix side by side.
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(a_shape, generator=generator, dtype=torch.float64)
    b = torch.randn(b_shape[0], b_shape[2], b_shape[1], generator=generator, dtype=torch.float64)
    found = batching.matmul(a, b.mT)  # a transposed right-hand side, as the callers pass
    expected = a @ b.mT
    assert found.shape == expected.shape and found.is_contiguous()
    torch.testing.assert_close(found, expected, rtol=1e-13, atol=1e-13)
