"""The batched standardization and readout (torch): the map's properties, and the readout
against a per-dataset reference.

The reference is what fitting did dataset by dataset before the path was batched: the
standardization of the dataset alone (the engine's map on a batch of one), one forward
pass per dataset, the E-step of the transformer's own mixture and one M-step in numpy.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from conftest import (
    TINY_CHECKPOINT,
    TINY_NOISE_CHECKPOINT,
    OneStandardization,
    TransformerEstimate,
    transformer_estimates,
)
from scipy.special import logsumexp

from transformer_gmm.engine import model_cache, readout
from transformer_gmm.engine.device import pad
from transformer_gmm.engine.standardize import (
    fit_standardization,
    n_kept_directions,
    subsample_rows,
    take_rows,
)
from transformer_gmm.nn.model import MixtureOutput

# --- the numpy reference -----------------------------------------------------------------


def reference_responsibilities(estimate, Z: np.ndarray, n_kept: int) -> np.ndarray:
    """Posterior under the transformer's diagonal mixture, on the first n_kept coordinates."""
    z = Z[:, :n_kept].astype(np.float64)
    variances = np.broadcast_to(estimate.scales, estimate.means.shape)[:, :n_kept] ** 2
    log_prob = -0.5 * (
        ((z[:, None, :] - estimate.means[None, :, :n_kept]) ** 2 / variances).sum(-1)
        + np.log(2 * np.pi * variances).sum(-1)
    )
    weighted = log_prob + np.log(estimate.weights)
    return np.exp(weighted - logsumexp(weighted, axis=1, keepdims=True))


def reference_weights_and_means(X, resp, fallback_weights, fallback_means):
    n_samples = X.shape[0]
    mass = resp.sum(axis=0)
    empty = mass <= 1e-6 * n_samples
    means = resp.T @ X / np.where(empty, 1.0, mass)[:, None]
    means[empty] = fallback_means[empty]
    weights = np.where(empty, fallback_weights, mass / n_samples)
    return weights / weights.sum(), means


def reference_init(backbone, X: np.ndarray, n_components: int, rows: np.ndarray):
    """The old per-dataset path: standardize, read ``rows``, score all rows, one M-step."""
    config = backbone.config
    noise = backbone.reading_config.noise_directions
    standardization = OneStandardization(X, config.d_max, n_components, noise)
    (estimate,) = transformer_estimates(
        backbone, [standardization.transform(X[rows])], n_components, "cpu"
    )
    n_kept = standardization.basis.shape[1]
    resp = reference_responsibilities(estimate, standardization.transform(X), n_kept)
    head_means = standardization.inverse_transform_means(estimate.means)
    weights, means = reference_weights_and_means(
        X, resp, estimate.weights / estimate.weights.sum(), head_means
    )
    return resp, weights, means, estimate, head_means


def padded(datasets):
    x, mask = pad(datasets, "cpu", torch.float64)
    return x, mask


def random_datasets(sizes, n_features, seed=0):
    rng = np.random.default_rng(seed)
    # Anisotropic, shifted data: the principal axes and the scale are well defined.
    stretch = rng.uniform(0.2, 3.0, n_features)
    return [rng.normal(size=(n, n_features)) * stretch + rng.normal(size=n_features) for n in sizes]


# --- standardization ---------------------------------------------------------------------

CASES = {  # (n_features, n_components, d_max, noise_directions)
    "d > K - 1": (6, 3, 4, 0),
    "d < K - 1": (2, 6, 9, 0),
    "d > d_max": (12, 10, 9, 0),
    "d = K - 1": (3, 4, 9, 0),
    "d > K, one noise direction": (6, 3, 4, 1),
    "d = K, one noise direction": (2, 2, 9, 1),
    "d > d_max, one noise direction": (12, 10, 9, 1),
}


def _standardize(case, sizes, seed=0):
    """A padded batch of datasets, NaN in its padding, and its standardization."""
    n_features, n_components, d_max, noise_directions = CASES[case]
    datasets = random_datasets(sizes, n_features, seed)
    x, mask = padded(datasets)
    if mask is not None:
        x = x.masked_fill(~mask[..., None], float("nan"))  # padding never leaks in
    return datasets, x, mask, fit_standardization(x, mask, d_max, n_components, noise_directions)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("sizes", [[40, 40, 40], [13, 70, 41]], ids=["equal n", "unequal n"])
def test_standardization_is_centred_whitened_principal_and_padded(case, sizes):
    n_features, n_components, d_max, noise_directions = CASES[case]
    datasets, x, mask, batched = _standardize(case, sizes)
    expected_kept = min(n_features, d_max, n_components - 1 + noise_directions)
    assert batched.n_kept == n_kept_directions(n_features, n_components, d_max, noise_directions)
    assert batched.n_kept == expected_kept
    Z = batched.transform(x)
    assert Z.dtype == torch.float32 and Z.shape == (3, max(sizes), d_max)
    assert bool((Z[..., expected_kept:] == 0).all())  # zero padding to d_max
    for i, X in enumerate(datasets):
        basis = batched.basis[i].numpy()
        np.testing.assert_allclose(batched.center[i].numpy(), X.mean(0), rtol=1e-12)
        np.testing.assert_allclose(basis.T @ basis, np.eye(expected_kept), atol=1e-12)
        # The top principal directions, largest variance first, and one global scale:
        # the root mean variance of the kept coordinates, which it brings to one.
        eigenvalues, eigenvectors = np.linalg.eigh(np.cov(X.T, bias=True).reshape(n_features, -1))
        top = eigenvalues[::-1][:expected_kept]
        np.testing.assert_allclose(
            np.abs(eigenvectors[:, ::-1][:, :expected_kept].T @ basis),
            np.eye(expected_kept),
            atol=1e-8,
        )
        assert batched.scale[i].item() == pytest.approx(np.sqrt(top.mean()), rel=1e-12)
        z = Z[i, : len(X), :expected_kept].double().numpy()
        np.testing.assert_allclose(z.mean(0), 0.0, atol=1e-6)
        np.testing.assert_allclose(z.var(0), top / top.mean(), rtol=1e-5)
        assert z.var(0).mean() == pytest.approx(1.0)
        # The sign rule: each direction's largest loading is positive.
        assert bool((basis[np.abs(basis).argmax(0), np.arange(expected_kept)] > 0).all())


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_dataset_gets_the_map_it_gets_alone(case):
    """Padding rows (NaN here) and the other datasets of the batch change no dataset's map."""
    n_features, n_components, d_max, noise_directions = CASES[case]
    datasets, x, mask, batched = _standardize(case, [13, 70, 41])
    Z = batched.transform(x)
    means = torch.randn(3, 5, d_max, generator=torch.Generator().manual_seed(1))
    lifted = batched.inverse_transform_means(means)
    for i, X in enumerate(datasets):
        alone = fit_standardization(
            torch.tensor(X)[None], None, d_max, n_components, noise_directions
        )
        torch.testing.assert_close(batched.center[i], alone.center[0], rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(batched.scale[i], alone.scale[0], rtol=1e-12, atol=0.0)
        torch.testing.assert_close(batched.basis[i], alone.basis[0], rtol=0.0, atol=1e-10)
        torch.testing.assert_close(
            Z[i, : len(X)], alone.transform(torch.tensor(X)[None])[0], rtol=1e-6, atol=1e-6
        )
        torch.testing.assert_close(
            lifted[i], alone.inverse_transform_means(means[i : i + 1])[0], rtol=0, atol=1e-10
        )


@pytest.mark.parametrize("case", sorted(CASES))
def test_standardization_is_translation_and_scale_equivariant(case):
    """x -> a x + b moves the centre to a center + b and the scale to a scale, keeps the
    basis and the model's input, and lifts model-space means to a mu + b."""
    n_features, n_components, d_max, noise_directions = CASES[case]
    datasets, x, mask, batched = _standardize(case, [13, 70, 41])
    shift = torch.tensor(np.random.default_rng(2).normal(size=n_features) * 10.0)
    moved_x = 3.5 * x + shift
    moved = fit_standardization(moved_x, mask, d_max, n_components, noise_directions)
    torch.testing.assert_close(moved.center, 3.5 * batched.center + shift)
    torch.testing.assert_close(moved.scale, 3.5 * batched.scale)
    torch.testing.assert_close(moved.basis, batched.basis, rtol=0.0, atol=1e-9)
    real = mask[..., None]
    Z, moved_Z = batched.transform(x), moved.transform(moved_x)
    torch.testing.assert_close(
        moved_Z.masked_fill(~real, 0), Z.masked_fill(~real, 0), rtol=1e-5, atol=1e-5
    )
    means = torch.randn(
        3, 5, d_max, dtype=torch.float64, generator=torch.Generator().manual_seed(1)
    )
    torch.testing.assert_close(
        moved.inverse_transform_means(means), 3.5 * batched.inverse_transform_means(means) + shift
    )
    # Round trip: a point mapped in and lifted back is its part in the kept subspace.
    lifted = batched.inverse_transform_means(Z.double())  # NaN on padding rows only
    for i, X in enumerate(datasets):
        back = lifted[i, : len(X)].numpy()
        center, basis = batched.center[i].numpy(), batched.basis[i].numpy()
        projected = center + (X - center) @ basis @ basis.T
        np.testing.assert_allclose(back, projected, rtol=1e-5, atol=1e-5 * np.abs(X).max())


def test_the_sign_rule_makes_the_largest_loading_positive():
    """The map is deterministic: each direction's largest loading is positive. Reflecting
    a feature turns the basis with it, then the rule fixes each direction's sign again."""
    X = random_datasets([60], 3, seed=5)[0]
    x = torch.tensor(X)[None]
    flipped = x * torch.tensor([-1.0, 1.0, 1.0])
    st, st_flipped = (fit_standardization(t, None, 4, 4) for t in (x, flipped))
    basis, basis_flipped = st.basis[0], st_flipped.basis[0]
    for b in (basis, basis_flipped):
        assert bool((b[b.abs().argmax(dim=0), torch.arange(3)] > 0).all())
    # Each direction turns with the reflected feature, then its sign is fixed again.
    turned = basis * torch.tensor([-1.0, 1.0, 1.0])[:, None]
    signs = turned[turned.abs().argmax(dim=0), torch.arange(3)].sign()
    torch.testing.assert_close(basis_flipped, turned * signs, rtol=0.0, atol=1e-10)
    # A direction whose largest loading is on the reflected feature reads the points
    # reflected; the others read them as they were.
    assert signs.tolist() == [-1.0, 1.0, 1.0]
    torch.testing.assert_close(
        st_flipped.transform(flipped)[0, :, :3], st.transform(x)[0, :, :3] * signs.float()
    )


def test_coincident_points_get_unit_scale():
    x = torch.ones(2, 10, 3, dtype=torch.float64)
    standardization = fit_standardization(x, None, 4, 3)
    assert standardization.scale.tolist() == [1.0, 1.0]
    assert bool((standardization.transform(x) == 0).all())


def test_subsample_reads_each_datasets_own_rows_in_order():
    lengths = torch.tensor([200, 64, 30, 65])
    mask = torch.arange(200)[None] < lengths[:, None]
    index, read_mask = subsample_rows((4, 200), mask, 64, torch.Generator().manual_seed(0))
    assert index.shape == read_mask.shape == (4, 64)
    for i, n in enumerate(lengths.tolist()):
        real = index[i][read_mask[i]]
        assert len(real) == min(n, 64) and bool((real < n).all())
        assert bool((real.diff() > 0).all())  # distinct and ascending
        if n <= 64:
            assert real.tolist() == list(range(n))  # a small dataset reads every row
    # Nothing to draw when every dataset fits the context.
    assert subsample_rows((4, 64), None, 64, torch.Generator()) == (None, None)


# --- the transformer's start -------------------------------------------------------------


@pytest.mark.parametrize(
    "checkpoint", [TINY_CHECKPOINT, TINY_NOISE_CHECKPOINT], ids=["K - 1", "K - 1 + noise"]
)
@pytest.mark.parametrize(
    "sizes, n_features, n_components",
    [([20, 45, 63], 3, 3), ([30, 64, 50], 2, 4), ([40, 41], 7, 2), ([150, 20, 90], 5, 3)],
    ids=["unequal n", "d < K - 1", "d > d_max", "n > context"],
)
def test_mixture_inits_match_the_per_dataset_reference(sizes, n_features, n_components, checkpoint):
    backbone = model_cache.load_backbone(checkpoint)  # d_max 4, context 64
    datasets = random_datasets(sizes, n_features, seed=n_components)
    x, mask = padded(datasets)
    init, from_labels = readout.mixture_inits(
        backbone, x, mask, n_components, torch.Generator().manual_seed(3)
    )
    index, read_mask = subsample_rows(
        tuple(x.shape[:2]),
        mask,
        backbone.reading_config.context_size,
        torch.Generator().manual_seed(3),
    )
    for i, X in enumerate(datasets):
        rows = np.arange(len(X))
        if index is not None:
            chosen = index[i] if read_mask is None else index[i][read_mask[i]]
            rows = chosen.numpy()
        resp, weights, means, estimate, head_means = reference_init(backbone, X, n_components, rows)
        np.testing.assert_allclose(init.resp[i, : len(X)].numpy(), resp, rtol=1e-5, atol=1e-7)
        assert bool((init.resp[i, len(X) :] == 0).all())
        np.testing.assert_allclose(init.weights[i].numpy(), weights, rtol=1e-5, atol=1e-7)
        # float32 forward passes round by the thread count: 1e-6 is their spread here.
        np.testing.assert_allclose(init.means[i].numpy(), means, rtol=1e-5, atol=1e-5)
        # The second start: the per-point head's probabilities of the rows read.
        real = slice(None) if from_labels.mask is None else from_labels.mask[i]
        np.testing.assert_array_equal(from_labels.x[i][real].numpy(), X[rows])
        probs = from_labels.resp[i][real].numpy()
        np.testing.assert_allclose(probs, estimate.point_probs, rtol=1e-5, atol=1e-7)
        if from_labels.mask is not None:
            assert bool((from_labels.resp[i][~from_labels.mask[i]] == 0).all())
        weights, means = reference_weights_and_means(
            X[rows], estimate.point_probs, estimate.weights / estimate.weights.sum(), head_means
        )
        np.testing.assert_allclose(from_labels.weights[i].numpy(), weights, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(from_labels.means[i].numpy(), means, rtol=1e-5, atol=1e-6)


def test_cluster_centers_match_the_per_dataset_reference():
    backbone = model_cache.load_backbone(TINY_CHECKPOINT)
    X = random_datasets([100], 3, seed=4)[0]  # above the context: one subsample
    x = torch.tensor(X)[None]
    centers, from_mixture = readout.cluster_centers(
        backbone, x, None, 3, torch.Generator().manual_seed(5)
    )
    index, _ = subsample_rows((1, 100), None, 64, torch.Generator().manual_seed(5))
    rows = index[0].numpy()
    standardization = OneStandardization(X, backbone.config.d_max, 3)
    (estimate,) = transformer_estimates(
        backbone, [standardization.transform(X[rows])], 3, "cpu"
    )
    labels = estimate.point_probs.argmax(axis=1)
    _, expected = reference_weights_and_means(
        X[rows],
        np.eye(3)[labels],
        np.full(3, 1 / 3),
        standardization.inverse_transform_means(estimate.means),
    )
    np.testing.assert_allclose(centers[0].numpy(), expected, rtol=1e-6, atol=1e-8)
    # The second set: the means of the mixture start, over every row.
    resp = reference_responsibilities(
        estimate, standardization.transform(X), standardization.basis.shape[1]
    )
    _, expected = reference_weights_and_means(
        X, resp, np.full(3, 1 / 3), standardization.inverse_transform_means(estimate.means)
    )
    np.testing.assert_allclose(from_mixture[0].numpy(), expected, rtol=1e-5, atol=1e-6)


def test_a_component_without_responsibility_keeps_the_heads_estimate():
    X = torch.tensor([[[0.0, 0.0], [2.0, 0.0], [10.0, 10.0], [7.0, 7.0]]], dtype=torch.float64)
    mask = torch.tensor([[True, True, True, False]])  # the last row is padding
    resp = torch.tensor([[[1.0, 0, 0], [1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0]]], dtype=X.dtype)
    head_means = torch.tensor([[[9.0, 9.0], [8.0, 8.0], [-3.0, 4.0]]], dtype=X.dtype)
    weights, means = readout.weights_and_means_from_responsibilities(
        X, resp, mask, torch.tensor([[0.2, 0.2, 0.6]], dtype=X.dtype), head_means
    )
    np.testing.assert_allclose(means[0], [[1.0, 0.0], [10.0, 10.0], [-3.0, 4.0]])
    np.testing.assert_allclose(weights[0], np.array([2 / 3, 1 / 3, 0.6]) / (1 + 0.6))


def test_model_space_responsibilities_score_only_real_coordinates():
    # Two real coordinates, two of padding where the model's means hold junk.
    weights = torch.tensor([[0.3, 0.7]])
    means = torch.tensor([[[0.0, 0.0, 9.0, 9.0], [1.0, 0.5, -9.0, 9.0]]])
    scales = torch.tensor([[[0.5], [2.0]]])
    out = MixtureOutput(weights.log(), weights, means, scales, torch.empty(1, 6, 2))
    z = torch.zeros(1, 6, 4, dtype=torch.float64)
    z[0, :, :2] = torch.tensor(np.random.default_rng(0).normal(size=(6, 2)))
    resp = readout.model_space_responsibilities(z, 2, out, None)
    estimate = TransformerEstimate(
        weights[0].double().numpy(), means[0].double().numpy(), scales[0].double().numpy(), None
    )
    expected = reference_responsibilities(estimate, z[0].numpy(), 2)
    np.testing.assert_allclose(resp[0].numpy(), expected, rtol=1e-10)


def test_full_covariance_responsibilities_follow_the_cholesky_factors():
    """A diagonal Cholesky factor scores as the diagonal scales do; an elongated one as
    scikit-learn's full-covariance mixture; padded coordinates change nothing."""
    rng = np.random.default_rng(1)
    weights = torch.tensor([[0.4, 0.6]])
    means = torch.tensor([[[0.0, 0.0, 5.0], [1.5, -0.5, -5.0]]])
    stds = torch.tensor([[[0.5, 1.5, 3.0], [2.0, 0.7, 0.1]]])
    z = torch.zeros(1, 30, 3, dtype=torch.float64)
    z[0, :, :2] = torch.tensor(rng.normal(size=(30, 2)))
    diag = MixtureOutput(weights.log(), weights, means, stds, torch.empty(1, 30, 2))
    full = diag._replace(scales=torch.diag_embed(stds))
    torch.testing.assert_close(
        readout.model_space_responsibilities(z, 2, full, None),
        readout.model_space_responsibilities(z, 2, diag, None),
    )
    lower = torch.tensor([[[[0.5, 0.0, 0.0], [1.2, 0.3, 0.0], [7.0, 7.0, 2.0]],
                           [[1.0, 0.0, 0.0], [-0.8, 0.6, 0.0], [7.0, 7.0, 2.0]]]])  # fmt: skip
    elongated = diag._replace(scales=lower)
    resp = readout.model_space_responsibilities(z, 2, elongated, None)
    from sklearn.mixture import GaussianMixture

    reference = GaussianMixture(2, covariance_type="full")
    reference.weights_ = weights[0].double().numpy()
    reference.means_ = means[0, :, :2].double().numpy()
    factors = lower[0, :, :2, :2].double()  # the data's coordinates
    covariances = (factors @ factors.mT).numpy()
    reference.covariances_ = covariances
    reference.precisions_cholesky_ = np.linalg.cholesky(np.linalg.inv(covariances))
    expected = reference.predict_proba(z[0, :, :2].numpy())
    np.testing.assert_allclose(resp[0].numpy(), expected, rtol=1e-8)


def test_each_view_reads_a_reflection_of_the_data():
    """View v runs the backbone on the model-space rows times reflections(v); its
    estimate, reflected back, gives that view's starts, and view 0 is the data itself."""
    backbone = model_cache.load_backbone(TINY_NOISE_CHECKPOINT)
    x, mask = padded(random_datasets([40, 55], 3, seed=6))
    starts = readout.mixture_inits(backbone, x, mask, 3, torch.Generator(), n_starts=5)
    assert len(starts) == 5  # two views' starts, and the first of a third view's
    first_view = readout.mixture_inits(backbone, x, mask, 3, torch.Generator())
    # The backbone runs in float32, and a larger batch may sum in another order.
    for alone, batched in zip(first_view, starts[:2], strict=True):
        torch.testing.assert_close(alone.means, batched.means, rtol=1e-5, atol=1e-6)
    config = backbone.config
    noise = backbone.reading_config.noise_directions
    standardization = fit_standardization(x, mask, config.d_max, 3, noise)
    z = standardization.transform(x)
    signs = readout.reflections(3, config.d_max)
    assert signs[1].tolist() == [-1.0] * config.d_max
    for view in (1, 2):
        with torch.no_grad():
            out = backbone(z * signs[view], 3, mask)
        out = out._replace(means=out.means * signs[view])  # back to the data's axes
        resp = readout.model_space_responsibilities(
            z.to(x.dtype), standardization.n_kept, out, mask
        )
        torch.testing.assert_close(starts[2 * view].resp, resp, rtol=1e-5, atol=1e-7)
        if view == 1:
            probs = out.point_logits.softmax(dim=-1).to(x.dtype).masked_fill(~mask[..., None], 0)
            torch.testing.assert_close(starts[3].resp, probs, rtol=1e-5, atol=1e-7)
    assert not torch.allclose(starts[0].means, starts[2].means)  # the tiny model is unsure


def test_views_of_large_data_read_other_rows():
    """Where a dataset has more rows than the context, view v reads the v-th draw of the
    fit's generator, reflected; a dataset that fits the context is read whole in each."""
    backbone = model_cache.load_backbone(TINY_NOISE_CHECKPOINT)  # context: 64 rows
    x, mask = padded(random_datasets([150, 40], 3, seed=8))
    starts = readout.mixture_inits(
        backbone, x, mask, 3, torch.Generator().manual_seed(1), n_starts=4
    )
    generator = torch.Generator().manual_seed(1)
    draws = [subsample_rows((2, 150), mask, 64, generator) for _ in range(2)]
    config = backbone.config
    noise = backbone.reading_config.noise_directions
    standardization = fit_standardization(x, mask, config.d_max, 3, noise)
    z = standardization.transform(x)
    signs = readout.reflections(2, config.d_max)
    for view, (index, read_mask) in enumerate(draws):
        per_point = starts[2 * view + 1]  # the per-point start scores the rows it read
        torch.testing.assert_close(per_point.x, take_rows(x, index))
        with torch.no_grad():
            out = backbone(take_rows(z, index) * signs[view], 3, read_mask)
        probs = out.point_logits.softmax(dim=-1).to(x.dtype).masked_fill(~read_mask[..., None], 0)
        torch.testing.assert_close(per_point.resp, probs, rtol=1e-5, atol=1e-7)
    first, second = (index[0] for index, _ in draws)
    assert not torch.equal(first, second)  # 150 rows: two draws of 64 differ
    real = [index[1][read_mask[1]] for index, read_mask in draws]
    assert real[0].tolist() == real[1].tolist() == list(range(40))  # 40 rows: all, twice
    one_view = readout.mixture_inits(backbone, x, mask, 3, torch.Generator().manual_seed(1))
    for alone, batched in zip(one_view, starts[:2], strict=True):  # view 0 is unchanged
        torch.testing.assert_close(alone.means, batched.means, rtol=1e-5, atol=1e-6)


def test_cluster_centers_come_two_per_view():
    backbone = model_cache.load_backbone(TINY_CHECKPOINT)
    x = torch.tensor(random_datasets([50], 3, seed=7)[0])[None]
    one = readout.cluster_centers(backbone, x, None, 3, torch.Generator())
    three = readout.cluster_centers(backbone, x, None, 3, torch.Generator(), n_starts=6)
    assert len(three) == 6
    for alone, batched in zip(one, three[:2], strict=True):  # float32 backbone: rounding
        torch.testing.assert_close(alone, batched, rtol=1e-5, atol=1e-6)


def test_wide_data_axes_come_from_the_rows_span():
    """Fewer rows than features: the principal axes from the rows' Gram matrix are those of
    the d x d covariance (to rounding), padding included; and a fit of 40 x 600 data needs
    no d x d eigendecomposition."""
    from transformer_gmm.engine import standardize

    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.normal(size=(2, 40, 600)))
    x[:, :20] += 3.0
    mask = torch.ones(2, 40, dtype=torch.bool)
    mask[1, 30:] = False
    wide = standardize.fit_standardization(x, mask, 9, 3, 1)
    centered = []
    for b in range(2):
        rows = x[b, mask[b]]
        centered.append(rows - rows.mean(0))
    for b, rows in enumerate(centered):
        eigenvalues, eigenvectors = torch.linalg.eigh(rows.T @ rows / len(rows))
        basis = eigenvectors.flip(-1)[:, : wide.basis.shape[-1]]
        signs = basis.gather(0, basis.abs().argmax(0, keepdim=True)).sign()
        torch.testing.assert_close(wide.basis[b], basis * signs, atol=1e-10, rtol=0)
        variances = eigenvalues.flip(-1)[: wide.basis.shape[-1]]
        torch.testing.assert_close(wide.scale[b], variances.mean().sqrt(), atol=1e-10, rtol=0)
    calls = []
    eigh = torch.linalg.eigh

    def counted(matrix, *args, **kwargs):
        calls.append(matrix.shape[-1])
        return eigh(matrix, *args, **kwargs)

    from unittest import mock

    from transformer_gmm import TransformerGMM

    with mock.patch.object(torch.linalg, "eigh", counted):
        TransformerGMM(2, covariance_type="diag", random_state=0).fit(x[0].numpy())
    assert calls and max(calls) <= 40


@pytest.mark.parametrize("shape", [(1, 300, 80), (2, 40, 90)], ids=["tall", "wide"])
def test_standardization_holds_the_map_of_its_own_rows(shape):
    # Where the leading axes are read on every row, the rows' scores on them are their
    # map: transform reads it, and it is the map of any copy of those rows to rounding.
    x = torch.from_numpy(np.random.default_rng(3).normal(size=shape) * np.linspace(5, 1, shape[-1]))
    st = fit_standardization(x, None, 9, 4, 2)
    assert st.kept is not None and st.rows is x
    held, recomputed = st.transform(x), st.transform(x.clone())
    assert held.dtype == torch.float32 and held.shape == recomputed.shape
    torch.testing.assert_close(held, recomputed, rtol=1e-6, atol=1e-6)
    direct = (x - st.center[:, None, :]) @ st.basis / st.scale[:, None, None]
    torch.testing.assert_close(st.kept, direct, rtol=1e-12, atol=1e-12)


def test_axes_from_every_rows_gram_match_the_orthogonalized_ones(monkeypatch):
    """With every row in the Gram matrix its eigenpairs give the axes, their variances and
    the rows' scores directly: those of the orthogonalized subspace, to rounding; where
    the rows span fewer directions than are sought, the orthogonalized path is taken."""
    from transformer_gmm.engine import standardize

    rng = np.random.default_rng(1)
    x = torch.from_numpy(rng.normal(size=(2, 40, 500)))
    x[:, :20] += 2.0
    centred = x - x.mean(1, keepdim=True)
    counts = torch.full((2, 1), 40.0, dtype=torch.float64)
    values, vectors = torch.linalg.eigh(centred @ centred.mT)
    assert standardize._axes_from_gram(centred, values[:, -14:], vectors[..., -14:], counts)
    direct = standardize.leading_axes(centred, counts, 6)  # 6 + OVERSAMPLE axes, from it
    monkeypatch.setattr(standardize, "_axes_from_gram", lambda *args: None)
    orthogonalized = standardize.leading_axes(centred, counts, 6)
    monkeypatch.undo()
    torch.testing.assert_close(direct.values, orthogonalized.values, rtol=1e-10, atol=0)
    eye = torch.eye(direct.vectors.shape[-1], dtype=torch.float64).expand(2, -1, -1)
    torch.testing.assert_close(direct.vectors.mT @ direct.vectors, eye, rtol=0, atol=1e-10)
    signs = (direct.vectors * orthogonalized.vectors).sum(1, keepdim=True).sign()  # (2, 1, m)
    torch.testing.assert_close(direct.vectors, orthogonalized.vectors * signs, rtol=0, atol=1e-8)
    torch.testing.assert_close(direct.scores, orthogonalized.scores * signs, rtol=0, atol=1e-8)
    # Four distinct rows, repeated: rank 3 after centring, fewer than the 14 axes sought.
    few = centred[:1, :4].repeat(1, 10, 1)
    few = few - few.mean(1, keepdim=True)
    axes = standardize.leading_axes(few, counts[:1], 6)
    gram = standardize._axes_from_gram(
        few, *[t[..., -axes.vectors.shape[-1]:] for t in torch.linalg.eigh(few @ few.mT)],
        counts[:1],
    )
    assert gram is None  # ill-conditioned: orthogonalized instead
    eye = torch.eye(axes.vectors.shape[-1], dtype=torch.float64)[None]
    torch.testing.assert_close(axes.vectors.mT @ axes.vectors, eye, rtol=0, atol=1e-10)


@pytest.mark.parametrize("covariance_type", ["full", "diag", "tied", "spherical"])
def test_starts_on_the_same_rows_share_one_m_step(covariance_type):
    """The transformer's starts on one dataset's rows get their covariances from one
    batched M-step: the parameters of each are those of its own M-step, to the bit."""
    from transformer_gmm.engine import starts

    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.normal(size=(1, 60, 3)))
    inits = []
    for seed in (1, 2):
        resp = torch.from_numpy(np.random.default_rng(seed).dirichlet(np.ones(2), 60))[None]
        means = (resp.mT @ x) / resp.sum(1)[..., None]
        inits.append(readout.MixtureInit(x, None, resp, resp.mean(1), means))
    shared = starts._transformer_start_params(tuple(inits), lambda t: t, covariance_type, 1e-6)
    apart = [  # the same starts on copies of the rows: an M-step each
        starts._transformer_start_params((dataclasses.replace(init, x=x.clone()),), lambda t: t,
                                         covariance_type, 1e-6)[0]
        for init in inits
    ]
    for one, alone in zip(shared, apart, strict=True):
        for field in ("weights", "means", "covariances", "precisions_cholesky"):
            assert torch.equal(getattr(one, field), getattr(alone, field)), field
