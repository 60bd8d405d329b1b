"""Training: the task sampler, the symmetric losses, and the loop (tiny preset, CPU)."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import OneStandardization

from transformer_gmm import TransformerGMM
from transformer_gmm.engine.readout import mixture_inits, model_space_responsibilities
from transformer_gmm.nn import MixtureOutput, MixtureTransformer, config_from_preset
from transformer_gmm.storage import load_checkpoint
from transformer_gmm.training import (
    PRIORS,
    Prior,
    collate,
    hungarian_loss,
    m_step_mean_loss,
    match_components,
    matched_mean_error,
    mixture_nll,
    point_cross_entropy,
    sample_batch,
    sample_task,
    training_loss,
)
from transformer_gmm.training import train as T
from transformer_gmm.training.losses import distillation_loss, m_step_means, m_step_nll
from transformer_gmm.training.weights import kept_blocks, load_initial_weights

pytest.importorskip("tqdm")

# --- the sampler ---------------------------------------------------------------------


def test_priors_cover_tgmm_and_beyond():
    for name, d_range in (("tgmm-2d", (2, 2)), ("tgmm", (2, 128))):
        tgmm = PRIORS[name]
        assert (tgmm.k_range, tgmm.n_range, tgmm.half_width) == ((2, 5), (64, 128), (5.0, 5.0))
        assert tgmm.scale_range == (1.0, 1.0) and tgmm.diag_prob == tgmm.heavy_prob == 0.0
        assert tgmm.d_range == d_range
    broad = PRIORS["broad"]
    assert broad.k_range[0] <= 2 and broad.k_range[1] >= 10
    assert broad.d_range[0] == 1 and broad.d_range[1] >= 128 and broad.n_range[1] >= 256
    assert broad.half_width[0] < broad.half_width[1] and broad.diag_prob > 0 < broad.heavy_prob


def test_separated_means_stand_apart_and_other_priors_draw_as_before():
    rng = np.random.default_rng(3)
    separated = Prior(d_range=(2, 2), half_width=(3.0, 3.0), min_separation=4.0)
    for K in (2, 6, 10):  # ten means 4 apart do not fit in [-3, 3]^2: the box widens
        means = sample_task(rng, separated, K, 2, 64, d_max=4).means
        gaps = np.linalg.norm(means[:, None] - means[None], axis=-1)[~np.eye(K, dtype=bool)]
        assert gaps.min() >= 4.0
    crowded = dataclasses.replace(separated, min_separation=0.0)
    a = sample_task(np.random.default_rng(0), crowded, 6, 2, 64, d_max=4)
    b = sample_task(
        np.random.default_rng(0), Prior(d_range=(2, 2), half_width=(3.0, 3.0)), 6, 2, 64, d_max=4
    )
    assert np.array_equal(a.X, b.X)


def test_sample_batch_shapes_ranges_and_seeding():
    prior = PRIORS["tiny"]
    batch = sample_batch(np.random.default_rng(0), prior, 3, 16, d_max=4, context_size=40)
    B, N = batch.mask.shape
    assert batch.x.shape == (B, N, 4) and batch.x.dtype == torch.float32 and B == 16
    assert batch.means.shape == (16, 3, 4) and batch.scales.shape == (16, 3, 4)
    n = batch.mask.sum(-1)
    assert n.min() >= prior.n_range[0] and n.max() <= 40 == N  # n clipped to the context
    assert torch.all(batch.x[~batch.mask] == 0) and batch.labels.max() == 2
    assert torch.allclose(batch.weights.sum(-1), torch.ones(16))
    assert batch.weights.min() >= prior.weight_floor / 3 - 1e-6
    for b, task in enumerate(batch.tasks):  # every component has a point
        assert np.array_equal(np.unique(task.labels), np.arange(3))
        assert torch.equal(batch.labels[b, : len(task.X)], torch.from_numpy(task.labels))
    again = sample_batch(np.random.default_rng(0), prior, 3, 16, d_max=4, context_size=40)
    other = sample_batch(np.random.default_rng(1), prior, 3, 16, d_max=4, context_size=40)
    assert torch.equal(batch.x, again.x) and torch.equal(batch.means, again.means)
    assert not torch.equal(batch.x[:, : other.x.shape[1]], other.x[:, : batch.x.shape[1]])


@pytest.mark.parametrize("noise_directions", [0, 1])
@pytest.mark.parametrize("d", [1, 2, 3, 4, 9, 40])  # d below, at and above K - 1 = 2
def test_inputs_and_targets_are_fits_standardization(d, noise_directions):
    d_max, K = 4, 3
    rng = np.random.default_rng(d)
    tasks = [sample_task(rng, PRIORS["tiny"], K, d, 50, d_max, noise_directions) for _ in range(3)]
    batch = collate(tasks, d_max)
    for b, task in enumerate(tasks):
        st = OneStandardization(task.X, d_max, K, noise_directions)  # fit's map, one dataset
        n = len(task.X)
        assert np.array_equal(batch.x[b, :n].numpy(), st.transform(task.X))  # exactly it
        assert np.array_equal(batch.x[b, :n].numpy(), task.to_model_space(task.X))
        kept = min(d, K - 1 + noise_directions)
        mu = (task.means - st.center) @ st.basis / st.scale  # (K, kept)
        np.testing.assert_allclose(batch.means[b, :, :kept].numpy(), mu, rtol=1e-5, atol=1e-5)
        assert torch.all(batch.means[b, :, kept:] == 0)
        assert batch.dim_mask[b].sum() == kept
        # The estimator's inverse gives back the means' part in the kept subspace (all of
        # them when d <= K - 1).
        back = task.from_model_space(batch.means[b].numpy())
        np.testing.assert_array_equal(back, st.inverse_transform_means(batch.means[b].numpy()))
        projected = st.center + (task.means - st.center) @ st.basis @ st.basis.T
        np.testing.assert_allclose(back, projected, rtol=1e-4, atol=1e-4)


def test_spherical_noise_scale_in_model_units():
    prior = Prior(d_range=(12, 12), scale_range=(0.5, 2.0))
    task = sample_task(np.random.default_rng(0), prior, 3, 12, 100, d_max=4)
    batch = collate([task], 4)
    expected = task.stds[:, :1] / task.scale  # (K, 1): a rotation keeps it
    kept = 2  # K - 1 directions; the padding's scale is 1
    np.testing.assert_allclose(batch.scales[0, :, :kept].numpy(), np.repeat(expected, kept, 1))
    assert torch.all(batch.scales[0, :, kept:] == 1)


@pytest.mark.parametrize(
    ("name", "x_sum", "means_sum"),
    [
        ("broad", 1202.9809970604256, 42.2679418430198),
        ("tgmm", 1148.618222005549, 39.49351443973137),
    ],
)
def test_priors_without_real_data_features_draw_the_tasks_they_always_drew(name, x_sum, means_sum):
    # Pinned before the real-data features existed: those draw from the generator only
    # when their probability is > 0, so earlier runs and benchmarks keep their tasks.
    batch = sample_batch(np.random.default_rng(5), PRIORS[name], 3, 6, 9, 128, 1)
    assert float(batch.x.double().abs().sum()) == pytest.approx(x_sum, rel=1e-6)
    assert float(batch.means.double().abs().sum()) == pytest.approx(means_sum, rel=1e-6)


@pytest.mark.parametrize("name", ["real", "tiny-real"])
def test_real_prior_tasks_are_consistent(name):
    rng = np.random.default_rng(0)
    for K in (2, 5):
        batch = sample_batch(rng, PRIORS[name], K, 16, 9, 128, 1)
        assert torch.isfinite(batch.x).all() and torch.isfinite(batch.means).all()
        assert torch.all(batch.scales > 0) and torch.isfinite(batch.scales).all()
        for task in batch.tasks:
            assert np.bincount(task.labels, minlength=K).min() >= 1
            if task.factors is not None:
                covariances = task.factors @ task.factors.transpose(0, 2, 1)
                diagonal = np.diagonal(covariances, axis1=1, axis2=2)
                np.testing.assert_allclose(task.stds, np.sqrt(diagonal))


def test_full_covariances_are_elongated_rotated_and_read_in_model_space():
    prior = Prior(k_range=(2, 2), full_prob=1.0, max_condition=100.0, scale_range=(0.5, 2.0))
    task = sample_task(np.random.default_rng(1), prior, 2, 3, 40_000, d_max=9)
    assert task.factors is not None
    for k in range(2):
        true_cov = task.factors[k] @ task.factors[k].T
        eigenvalues = np.linalg.eigvalsh(true_cov)
        assert eigenvalues.max() / eigenvalues.min() <= 100.0 * (1 + 1e-9)
        assert abs(true_cov[0, 1]) > 1e-3  # rotated: not axis-aligned
        empirical = np.cov(task.X[task.labels == k].T)
        np.testing.assert_allclose(empirical, true_cov, atol=0.05 * np.abs(true_cov).max())
        # The target scales are the stds along the kept principal directions.
        z = task.to_model_space(task.X[task.labels == k])[:, : task.basis.shape[1]]
        np.testing.assert_allclose(task.model_space_stds()[k], z.std(0), rtol=0.03)


def test_outliers_are_far_and_take_the_likeliest_components_label():
    prior = Prior(k_range=(3, 3), outlier_prob=1.0, half_width=(8.0, 8.0))
    clean = Prior(k_range=(3, 3), full_prob=1e-12, half_width=(8.0, 8.0))
    far = []
    for p in (prior, clean):
        task = sample_task(np.random.default_rng(4), p, 3, 2, 400, d_max=9)
        cov = task.factors @ task.factors.transpose(0, 2, 1)
        diff = task.X[:, None, :] - task.means[None]  # (n, K, d)
        maha = np.einsum("nki,kij,nkj->nk", diff, np.linalg.inv(cov), diff)
        own = maha[np.arange(len(task.X)), task.labels]
        far.append(int((own > 25).sum()))  # beyond 5 standard deviations
        log_p = np.log(task.weights) - 0.5 * maha - 0.5 * np.log(np.linalg.det(cov))
        outliers = own > 25
        np.testing.assert_array_equal(task.labels[outliers], log_p[outliers].argmax(1))
    assert far[0] >= 2 and far[1] == 0


# --- the losses ----------------------------------------------------------------------


def _batch_and_output(K=4, seed=0):
    prior = Prior(d_range=(2, 6), n_range=(60, 80))
    batch = sample_batch(np.random.default_rng(seed), prior, K, 6, d_max=4, context_size=80)
    g = torch.Generator().manual_seed(seed)
    log_weights = torch.randn(6, K, generator=g).log_softmax(-1)
    out = MixtureOutput(
        log_weights,
        log_weights.exp(),
        torch.randn(6, K, 4, generator=g),
        torch.rand(6, K, 1, generator=g) + 0.5,
        torch.randn(6, batch.x.shape[1], K, generator=g),
    )
    return batch, out


def _permute_truth(batch, perm):
    inverse = torch.argsort(perm)  # true component perm[j] becomes component j
    return dataclasses.replace(
        batch,
        means=batch.means[:, perm],
        weights=batch.weights[:, perm],
        scales=batch.scales[:, perm],
        labels=inverse[batch.labels],
    )


@pytest.mark.parametrize(
    "loss",
    [
        hungarian_loss,
        mixture_nll,
        m_step_mean_loss,
        lambda o, b: point_cross_entropy(o.point_logits, b),
    ],
)
def test_losses_ignore_the_numbering_of_true_components(loss):
    batch, out = _batch_and_output()
    permuted = _permute_truth(batch, torch.tensor([2, 0, 3, 1]))
    assert torch.allclose(loss(out, batch), loss(out, permuted), rtol=1e-6, atol=1e-6)


def _truth_as_output(batch):
    scales = batch.scales[..., :1]  # the prior below has spherical noise
    logits = 20.0 * torch.nn.functional.one_hot(batch.labels, batch.n_components).float()
    log_w = batch.weights.log()
    return MixtureOutput(log_w, batch.weights, batch.means, scales, logits)


def test_losses_are_minimised_by_the_truth():
    prior = Prior(d_range=(2, 6), n_range=(400, 400), scale_range=(0.5, 2.0))
    batch = sample_batch(np.random.default_rng(3), prior, 3, 8, d_max=4, context_size=400)
    truth = _truth_as_output(batch)
    assert hungarian_loss(truth, batch) < 1e-6 and point_cross_entropy(truth[4], batch) < 1e-6
    # Slot order of the output does not matter either.
    shuffled = MixtureOutput(
        *(
            t[:, [1, 2, 0]] if t.dim() < 3 or i < 4 else t[..., [1, 2, 0]]
            for i, t in enumerate(truth)
        )
    )
    assert hungarian_loss(shuffled, batch) < 1e-6 and point_cross_entropy(shuffled[4], batch) < 1e-6
    for factor in (0.7, 1.4):
        worse = truth._replace(scales=truth.scales * factor)
        assert mixture_nll(worse, batch) > mixture_nll(truth, batch)
        assert hungarian_loss(worse, batch) > hungarian_loss(truth, batch)
    moved = truth._replace(means=truth.means + 0.3 * batch.dim_mask[:, None, :])
    assert mixture_nll(moved, batch) > mixture_nll(truth, batch)
    assert hungarian_loss(moved, batch) > 0.1


@pytest.mark.parametrize("seed", [0, 1])  # d of 1 to 8 around d_max = 4: some projected
def test_m_step_loss_reads_out_what_the_estimator_returns(seed):
    # The starts TransformerGMM(max_iter=0) chooses from, mapped into model space.
    model = MixtureTransformer(config_from_preset("tiny")).eval()
    batch = sample_batch(np.random.default_rng(seed), PRIORS["tiny"], 3, 6, 4, 64)
    with torch.no_grad():
        trained_on = m_step_means(model(batch.x, 3, batch.mask), batch)
    for b, task in enumerate(batch.tasks):
        starts = mixture_inits(model, torch.from_numpy(task.X)[None], None, 3, torch.Generator())
        for start, means in zip(starts, trained_on, strict=True):
            expected = task.to_model_space(start.means[0].numpy())
            np.testing.assert_allclose(means[b].numpy(), expected, atol=2e-4)


def test_m_step_loss_trains_the_scales_through_the_responsibilities():
    batch, out = _batch_and_output()
    scales = out.scales.clone().requires_grad_(True)
    m_step_mean_loss(out._replace(scales=scales), batch).backward()
    assert scales.grad is not None and scales.grad.abs().sum() > 0
    assert training_loss(out, batch, "hungarian", 1.0)[1].keys() == {"params", "points"}
    loss, parts = training_loss(out, batch, "hungarian", 1.0, m_step_weight=2.0)
    assert loss.item() == pytest.approx(
        parts["params"] + parts["points"] + 2.0 * parts["m_step"], rel=1e-5
    )


def _em_steps_nll_reference(batch, out, em_steps: int) -> float:
    """m_step_nll by scipy, one task and start at a time: an M-step on the model's
    responsibilities, then (E-step, M-step) em_steps - 1 times, then the data's NLL."""
    from scipy.stats import multivariate_normal

    from transformer_gmm.engine.readout import model_space_responsibilities

    K = out.means.shape[1]
    expected = []
    for resp_all in (
        model_space_responsibilities(batch.x, batch.dim_mask, out, batch.mask),
        out.point_logits.softmax(-1),
    ):
        per_task = []
        for b in range(batch.x.shape[0]):
            n, d = int(batch.mask[b].sum()), int(batch.dim_mask[b].sum())
            x = batch.x[b, :n, :d].double().numpy()
            resp = resp_all[b, :n].double().numpy()
            for _ in range(em_steps):
                mass = resp.sum(0)
                means = resp.T @ x / mass[:, None]
                joint = np.empty((n, K))
                for k in range(K):
                    diff = x - means[k]
                    cov = (resp[:, k, None] * diff).T @ diff / mass[k] + 1e-3 * np.eye(d)
                    joint[:, k] = mass[k] / n * multivariate_normal(means[k], cov).pdf(x)
                resp = joint / joint.sum(1, keepdims=True)
            per_task.append(-np.log(joint.sum(1)).mean() / d)
        expected.append(np.mean(per_task))
    return float(np.mean(expected))


def test_m_step_nll_is_the_likelihood_of_the_full_covariance_m_step():
    from transformer_gmm.training.losses import m_step_nll

    batch, out = _batch_and_output(K=3, seed=1)
    expected = _em_steps_nll_reference(batch, out, em_steps=1)
    assert m_step_nll(out, batch).item() == pytest.approx(expected, rel=1e-5)
    # Trained through both starts: the mixture's scales and the per-point logits.
    scales = out.scales.clone().requires_grad_(True)
    logits = out.point_logits.clone().requires_grad_(True)
    m_step_nll(out._replace(scales=scales, point_logits=logits), batch).backward()
    assert scales.grad.abs().sum() > 0 and logits.grad.abs().sum() > 0
    loss, parts = training_loss(out, batch, "hungarian", 1.0, m_step_nll_weight=0.5)
    assert loss.item() == pytest.approx(
        parts["params"] + parts["points"] + 0.5 * parts["m_step_nll"], rel=1e-5
    )


def test_m_step_nll_after_em_steps_is_the_likelihood_after_them():
    """em_steps=3: the likelihood after an M-step and two (E, M) steps, differentiable
    through all three, and no worse than after the M-step alone (EM does not lower it)."""
    from transformer_gmm.training.losses import m_step_nll

    batch, out = _batch_and_output(K=3, seed=1)
    after_three = m_step_nll(out, batch, em_steps=3)
    expected = _em_steps_nll_reference(batch, out, em_steps=3)
    assert after_three.item() == pytest.approx(expected, rel=1e-5)
    assert after_three.item() <= m_step_nll(out, batch).item() + 1e-6
    scales = out.scales.clone().requires_grad_(True)
    m_step_nll(out._replace(scales=scales), batch, em_steps=3).backward()
    assert scales.grad.abs().sum() > 0
    _, parts = training_loss(out, batch, "hungarian", 1.0, m_step_nll_weight=0.5, em_steps=3)
    assert parts["m_step_nll"] == pytest.approx(after_three.item(), rel=1e-6)
    with pytest.raises(ValueError, match="em_steps"):
        m_step_nll(out, batch, em_steps=0)


def test_matching_is_the_least_cost_permutation():
    cost = torch.rand(20, 5, 5, generator=torch.Generator().manual_seed(0))
    match = match_components(cost)
    got = cost.gather(2, match[..., None]).sum((1, 2))
    brute = (
        torch.stack([cost[:, range(5), list(p)].sum(-1) for p in itertools.permutations(range(5))])
        .min(0)
        .values
    )
    assert torch.allclose(got, brute)
    assert match_components(torch.rand(64, 10, 10)).shape == (64, 10)  # 10! is out of reach
    truth = np.array([[0.0, 0.0], [3.0, 4.0]])
    assert matched_mean_error(truth[::-1] + [0.0, 1.0], truth) == pytest.approx(np.sqrt(2))


# --- the loop ------------------------------------------------------------------------


def _tiny(tmp_path, name, **changes) -> T.TrainConfig:
    fields = {**T.PRESETS["tiny"], "preset": "tiny", "out_dir": str(tmp_path / name)}
    return T.TrainConfig(**{**fields, **changes})


def _held_out_loss(model, cfg) -> float:
    mc = model.config
    total = 0.0
    for K in model.supported_n_components:
        b = sample_batch(np.random.default_rng([7, K]), PRIORS[cfg.prior], K, 32, mc.d_max, 64)
        with torch.no_grad():
            total += training_loss(model(b.x, K, b.mask), b, "hungarian", 1.0)[0].item()
    return total


def test_training_lowers_the_loss_and_writes_a_usable_checkpoint(tmp_path):
    cfg = _tiny(tmp_path, "run")
    torch.manual_seed(cfg.seed)
    before = _held_out_loss(MixtureTransformer(T.model_config(cfg)), cfg)
    out_dir = T.train(cfg)
    model = load_checkpoint(out_dir / "checkpoint")
    assert _held_out_loss(model, cfg) < before - 0.3
    card = (out_dir / "checkpoint" / "README.md").read_text()
    assert "| tiny | 30 | 240 |" in card and "| K | model | readout | oracle |" in card
    # Thirty steps teach the model little: this checks the plumbing, not the estimate.
    X = np.random.default_rng(0).normal(size=(120, 6))  # d = 6 > d_max = 4: the projection
    gmm = TransformerGMM(3, checkpoint=str(out_dir / "checkpoint"), n_init=1, random_state=0)
    gmm.fit(X)
    assert gmm.init_method_ == "transformer" and np.isfinite(gmm.means_).all()
    assert gmm.means_.shape == (3, 6)


def test_m_step_loss_is_trained_logged_and_on_the_card(tmp_path):
    cfg = _tiny(tmp_path, "m_step", max_steps=4, eval_every=100, m_step_weight=0.5)
    out_dir = T.train(dataclasses.replace(cfg, m_step_nll_weight=0.25, prior="tiny-real"))
    records = [json.loads(line) for line in (out_dir / "log.jsonl").read_text().splitlines()]
    assert len(records) == 4 and all(record["m_step"] > 0 for record in records)
    assert all(np.isfinite(record["m_step_nll"]) for record in records)
    card = (out_dir / "checkpoint" / "README.md").read_text()
    assert "error with weight 0.5." in card and "gives added with weight 0.25." in card


def test_resuming_gives_the_same_weights_as_training_straight_through(tmp_path):
    straight = T.train(_tiny(tmp_path, "straight", max_steps=12, eval_every=100))
    T.train(_tiny(tmp_path, "resumed", max_steps=12, eval_every=100, stop_at=5))
    state = torch.load(tmp_path / "resumed" / "state.pt", weights_only=True)
    assert state["step"] == 5
    with open(tmp_path / "resumed" / "log.jsonl", "a") as log:  # as if it crashed at step 6
        log.write(json.dumps({"step": 6, "loss": 0.0}) + "\n")
    resumed = T.train(_tiny(tmp_path, "resumed", max_steps=12, eval_every=100, resume=True))
    steps = [json.loads(line)["step"] for line in (resumed / "log.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 13))
    a = torch.load(straight / "state.pt", weights_only=True)
    b = torch.load(resumed / "state.pt", weights_only=True)
    assert a["step"] == b["step"] == 12
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name
    exp_avg = [s["exp_avg"] for s in a["optimizer"]["state"].values()]
    assert all(
        torch.equal(x, s["exp_avg"])
        for x, s in zip(exp_avg, b["optimizer"]["state"].values(), strict=True)
    )


def test_worker_processes_train_the_same_weights(tmp_path):
    """Batches drawn ahead in two worker processes are the batches of the loop itself."""
    in_loop = T.train(_tiny(tmp_path, "in_loop", max_steps=6, eval_every=100))
    ahead = T.train(_tiny(tmp_path, "ahead", max_steps=6, eval_every=100, workers=2))
    a = torch.load(in_loop / "state.pt", weights_only=True)["model"]
    b = torch.load(ahead / "state.pt", weights_only=True)["model"]
    assert all(torch.equal(tensor, b[name]) for name, tensor in a.items())


def test_time_limit_stops_and_saves_a_resumable_state(tmp_path):
    cfg = _tiny(tmp_path, "timed", max_steps=1000, eval_every=10_000, time_limit=1e-9)
    T.train(cfg)
    state = torch.load(tmp_path / "timed" / "state.pt", weights_only=True)
    assert state["step"] == 10  # the limit is checked every 10 steps
    assert (
        "| K | model | readout | oracle |"
        in (tmp_path / "timed" / "checkpoint" / "README.md").read_text()
    )
    T.train(dataclasses.replace(cfg, time_limit=0.0, max_steps=13, resume=True))
    assert torch.load(tmp_path / "timed" / "state.pt", weights_only=True)["step"] == 13


def test_resume_without_a_saved_state_starts_the_run(tmp_path):
    fresh = T.train(_tiny(tmp_path, "fresh", max_steps=3, eval_every=100))
    resumed = T.train(_tiny(tmp_path, "resumed", max_steps=3, eval_every=100, resume=True))
    a = torch.load(fresh / "state.pt", weights_only=True)
    b = torch.load(resumed / "state.pt", weights_only=True)
    assert a["step"] == b["step"] == 3
    assert all(torch.equal(tensor, b["model"][name]) for name, tensor in a["model"].items())


def test_init_from_starts_from_a_checkpoints_weights(tmp_path):
    first = T.train(_tiny(tmp_path, "first", max_steps=3, eval_every=100))
    init = str(first / "checkpoint")
    tuned = T.train(
        _tiny(tmp_path, "tuned", max_steps=1, eval_every=100, init_from=init, lr=0.0, min_lr=0.0)
    )
    a = load_checkpoint(first / "checkpoint").state_dict()
    b = load_checkpoint(tuned / "checkpoint").state_dict()
    # lr = 0: one step leaves the loaded weights as they were (AdamW's decay is lr-scaled).
    assert all(torch.equal(tensor, b[name]) for name, tensor in a.items())


def test_init_from_a_shallower_model_starts_deeper_with_the_same_outputs(tmp_path):
    first = T.train(_tiny(tmp_path, "first", max_steps=3, eval_every=100))
    source = load_checkpoint(first / "checkpoint")
    deeper_cfg = _tiny(
        tmp_path, "deeper", max_steps=1, eval_every=100, lr=0.0, min_lr=0.0,
        init_from=str(first / "checkpoint"), n_layer=source.config.n_layer + 2,
    )  # fmt: skip
    deeper = load_checkpoint(T.train(deeper_cfg) / "checkpoint")
    assert deeper.config.n_layer == source.config.n_layer + 2
    x = torch.randn(3, 40, source.config.d_max, generator=torch.Generator().manual_seed(0))
    for k in source.supported_n_components:
        a, b = source(x, k), deeper(x, k)
        assert all(torch.allclose(u, v, atol=1e-6) for u, v in zip(a, b, strict=True))
    wider = _tiny(tmp_path, "wider", max_steps=1, init_from=str(first / "checkpoint"), d_model=32)
    with pytest.raises(ValueError, match=r"only n_layer, k_max \(upward\), a spherical"):
        T.train(wider)


def test_init_from_a_model_with_fewer_heads_grows_them(tmp_path):
    """Heads K = 5, 6 grown onto a model with heads to 4: every K the source has reads out
    as before, and each new head starts from the source's largest."""
    source = load_checkpoint(T.train(_tiny(tmp_path, "first", max_steps=3)) / "checkpoint")
    grown = MixtureTransformer(dataclasses.replace(source.config, k_max=6)).eval()
    load_initial_weights(grown, source)
    assert grown.supported_n_components == range(2, 7)
    x = torch.randn(3, 40, source.config.d_max, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for k in source.supported_n_components:
            a, b = source(x, k), grown(x, k)
            assert all(torch.equal(u, v) for u, v in zip(a, b, strict=True))
        assert grown(x, 6).means.shape == (3, 6, source.config.d_max)
    a, b = source.state_dict(), grown.state_dict()
    for k in (5, 6):
        seeds = b[f"heads.{k}.seeds"]
        assert torch.equal(seeds[:4], a["heads.4.seeds"])
        assert len(torch.unique(seeds, dim=0)) == k  # the new components can tell apart
        assert torch.equal(b[f"heads.{k}.out.weight"], a["heads.4.out.weight"])
    embedding = b["k_embedding.weight"]  # rows K = 2..6
    assert torch.equal(embedding[:3], a["k_embedding.weight"])
    assert torch.equal(embedding[3], embedding[2]) and torch.equal(embedding[4], embedding[2])
    fewer = MixtureTransformer(dataclasses.replace(source.config, k_max=3))
    with pytest.raises(ValueError, match=r"only n_layer, k_max \(upward\)"):
        load_initial_weights(fewer, source)


def test_init_from_a_deeper_model_keeps_evenly_spaced_blocks(tmp_path):
    """A shallower model starts from the source's first and last blocks and evenly spaced
    ones between, renumbered, with every other weight (embeddings, heads) the source's."""
    assert kept_blocks(6, 3) == [0, 2, 5] and kept_blocks(6, 2) == [0, 5]
    assert kept_blocks(4, 4) == [0, 1, 2, 3] and kept_blocks(6, 1) == [5]
    source = load_checkpoint(T.train(_tiny(tmp_path, "first", max_steps=3, n_layer=3))
                             / "checkpoint")
    shallow = MixtureTransformer(dataclasses.replace(source.config, n_layer=2)).eval()
    load_initial_weights(shallow, source)
    a, b = source.state_dict(), shallow.state_dict()
    for name, tensor in b.items():
        if name.startswith("blocks.0."):
            assert torch.equal(tensor, a[name])
        elif name.startswith("blocks.1."):
            assert torch.equal(tensor, a[name.replace("blocks.1.", "blocks.2.", 1)])
        else:
            assert torch.equal(tensor, a[name])
    # Without the middle block, its output is no longer the source's.
    x = torch.randn(2, 30, source.config.d_max, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert not torch.allclose(source(x, 2).means, shallow(x, 2).means)


def _distill_loss(student, teacher, mc) -> float:
    total = 0.0
    for K in student.supported_n_components:
        b = sample_batch(np.random.default_rng([11, K]), PRIORS["tiny"], K, 16, mc.d_max, 64)
        with torch.no_grad():
            total += distillation_loss(student(b.x, K, b.mask), teacher(b.x, K, b.mask), b).item()
    return total


def test_distillation_brings_a_student_toward_its_teacher(tmp_path):
    """A student trained against a teacher ends closer to the teacher's outputs on held-out
    tasks than a twin trained without it; the part is logged."""
    source = T.train(_tiny(tmp_path, "teacher", max_steps=30, n_layer=2)) / "checkpoint"
    teacher = load_checkpoint(source).eval()
    assert _distill_loss(teacher, teacher, teacher.config) == 0.0
    common = dict(max_steps=30, n_layer=1, seed=3)
    taught = T.train(_tiny(tmp_path, "taught", distill_from=str(source), distill_weight=5.0,
                           **common))  # fmt: skip
    alone = T.train(_tiny(tmp_path, "alone", **common))
    distance = {
        name: _distill_loss(load_checkpoint(out / "checkpoint").eval(), teacher, teacher.config)
        for name, out in (("taught", taught), ("alone", alone))
    }
    assert distance["taught"] < 0.7 * distance["alone"], distance
    record = json.loads((taught / "log.jsonl").read_text().splitlines()[-1])
    assert record["distill"] >= 0.0 and "distill" not in json.loads(
        (alone / "log.jsonl").read_text().splitlines()[-1]
    )


def test_distillation_options_are_checked(tmp_path):
    with pytest.raises(ValueError, match="distill_weight must be > 0"):
        T.TrainConfig(distill_from="default", distill_weight=0.0)
    source = T.train(_tiny(tmp_path, "teacher", max_steps=1)) / "checkpoint"
    cfg = _tiny(tmp_path, "student", max_steps=1, k_max=3, distill_from=str(source))
    with pytest.raises(ValueError, match="must have this run's d_max, K range"):
        T.train(cfg)


@pytest.mark.parametrize("scale_type", ["diag", "full"])
def test_init_from_a_spherical_model_to_wider_scales_keeps_its_outputs(tmp_path, scale_type):
    first = T.train(_tiny(tmp_path, "first", max_steps=3, eval_every=100))
    source = load_checkpoint(first / "checkpoint")
    wider_cfg = _tiny(tmp_path, scale_type, max_steps=1, eval_every=100, lr=0.0, min_lr=0.0,
                      init_from=str(first / "checkpoint"), scale_type=scale_type)  # fmt: skip
    wider = load_checkpoint(T.train(wider_cfg) / "checkpoint")
    assert wider.config.scale_type == scale_type
    x = torch.randn(3, 40, source.config.d_max, generator=torch.Generator().manual_seed(0))
    z = x.double()
    for k in source.supported_n_components:
        a, b = source(x, k), wider(x, k)
        torch.testing.assert_close(a.means, b.means)
        # Every coordinate's scale is the spherical one; a full factor is diagonal.
        stds = b.scales.diagonal(dim1=-2, dim2=-1) if scale_type == "full" else b.scales
        torch.testing.assert_close(stds, a.scales.expand_as(stds))
        torch.testing.assert_close(
            model_space_responsibilities(z, 3, a, None), model_space_responsibilities(z, 3, b, None)
        )
    # The estimators read the wider checkpoint, and its estimate is the source's.
    wider_path = str(wider_cfg.out_dir) + "/checkpoint"
    X = np.random.default_rng(5).normal(size=(80, 3)) + np.repeat([[0, 0, 0], [4, 0, 0]], 40, 0)
    fits = [
        TransformerGMM(2, checkpoint=path, max_iter=0, random_state=0).fit(X)
        for path in (str(first / "checkpoint"), wider_path)
    ]
    np.testing.assert_allclose(fits[0].means_, fits[1].means_, rtol=1e-5, atol=1e-6)
    # And back is not a fine-tune: a wider model's scales have no spherical form.
    narrower = _tiny(tmp_path, "back", max_steps=1, init_from=wider_path)
    with pytest.raises(ValueError, match="scale_type"):
        T.train(narrower)


def test_full_covariance_losses_reduce_to_the_diagonal_ones():
    """With diagonal Cholesky factors, every loss is what the same diagonal scales give."""
    batch = sample_batch(np.random.default_rng(3), PRIORS["tiny-real"], 3, 5, 4, 48)
    out = MixtureTransformer(config_from_preset("tiny", scale_type="diag"))(batch.x, 3, batch.mask)
    full = out._replace(scales=torch.diag_embed(out.scales))
    for loss in (hungarian_loss, mixture_nll, m_step_nll):
        torch.testing.assert_close(loss(full, batch), loss(out, batch), rtol=1e-5, atol=1e-6)
    # A correlated factor changes the likelihood, and its gradient reaches the off-diagonal.
    tilted = full.scales.detach().clone()
    tilted[..., 1, 0] = 0.7
    tilted.requires_grad_(True)
    nll = m_step_nll(full._replace(scales=tilted), batch)
    assert not torch.isclose(nll, m_step_nll(full, batch))
    nll.backward()
    assert tilted.grad[..., 1, 0].abs().sum() > 0


def test_init_from_drops_the_sources_k_posterior_head(tmp_path):
    from conftest import TINY_K_CHECKPOINT

    from transformer_gmm.storage import save_checkpoint
    from transformer_gmm.training.k_posterior import with_cluster_count_head

    source = with_cluster_count_head(load_checkpoint(TINY_K_CHECKPOINT))
    assert source.has_k_posterior and source.has_cluster_count
    folder = str(save_checkpoint(source, tmp_path / "source"))
    cfg = _tiny(tmp_path, "no_head", max_steps=1, eval_every=100, lr=0.0, min_lr=0.0,
                init_from=folder)  # fmt: skip
    tuned = load_checkpoint(T.train(cfg) / "checkpoint")
    # The heads read the backbone this run changes: they are left out, the rest carried over.
    assert not tuned.has_k_posterior and tuned.config.k_posterior_seeds == 0
    assert not tuned.has_cluster_count and tuned.config.cluster_count_seeds == 0
    kept = tuned.state_dict()
    for name, weight in source.state_dict().items():
        if name.startswith(("k_unknown", "k_posterior_head", "cluster_count_head")):
            assert name not in kept
        else:
            assert torch.equal(kept[name], weight), name


def test_init_from_a_model_that_read_fewer_directions(tmp_path):
    first = T.train(_tiny(tmp_path, "first", max_steps=3, eval_every=100))
    reads_more_cfg = _tiny(
        tmp_path, "reads_more", max_steps=2, eval_every=100, init_from=str(first / "checkpoint"),
        noise_directions=1,
    )  # fmt: skip
    reads_more = load_checkpoint(T.train(reads_more_cfg) / "checkpoint")
    assert reads_more.reading_config.noise_directions == 1
    assert load_checkpoint(first / "checkpoint").reading_config.noise_directions == 0
    # Its batches hold one direction more where the data has it (the tiny prior's d reaches
    # past K), and the estimators read as many.
    batch = T.get_batch(reads_more_cfg, reads_more.config, step=0, rank=0)
    d_max, K = reads_more.config.d_max, batch.n_components
    assert int(batch.dim_mask.sum(dim=1).max()) == min(d_max, K)
    X = np.random.default_rng(0).normal(size=(60, 6))  # d = 6 > d_max = 4
    gmm = TransformerGMM(2, checkpoint=str(reads_more_cfg.out_dir) + "/checkpoint", max_iter=0)
    assert gmm.fit(X).init_method_ == "transformer"


def test_only_k_trains_that_ks_head_and_embedding_row_alone(tmp_path):
    first = T.train(_tiny(tmp_path, "first", max_steps=3, eval_every=100))
    init = str(first / "checkpoint")
    tuned = T.train(_tiny(tmp_path, "only3", max_steps=4, eval_every=100, init_from=init, only_k=3))
    records = [json.loads(line) for line in (tuned / "log.jsonl").read_text().splitlines()]
    assert [record["K"] for record in records] == [3] * 4
    a = load_checkpoint(first / "checkpoint").state_dict()
    b = load_checkpoint(tuned / "checkpoint").state_dict()
    changed = {name for name, tensor in a.items() if not torch.equal(tensor, b[name])}
    assert changed and all(
        name.startswith("heads.3.") or name == "k_embedding.weight" for name in changed
    )
    row = 3 - T.model_config(T.TrainConfig(**T.PRESETS["tiny"])).k_min
    others = [i for i in range(a["k_embedding.weight"].shape[0]) if i != row]
    assert torch.equal(a["k_embedding.weight"][others], b["k_embedding.weight"][others])
    assert not torch.equal(a["k_embedding.weight"][row], b["k_embedding.weight"][row])
    assert (
        "Only K = 3's head and task embedding trained"
        in (tuned / "checkpoint" / "README.md").read_text()
    )


def test_only_k_needs_a_model_to_fine_tune_and_a_k_it_has(tmp_path):
    with pytest.raises(ValueError, match="name that model with init_from"):
        _tiny(tmp_path, "bare", max_steps=1, only_k=3)
    first = T.train(_tiny(tmp_path, "first", max_steps=1, eval_every=100))
    cfg = _tiny(tmp_path, "k9", max_steps=1, init_from=str(first / "checkpoint"), only_k=9)
    with pytest.raises(ValueError, match=r"only_k=9 is outside the K .* \(2\.\.4\)"):
        T.train(cfg)


def test_train_k_from_trains_the_grown_heads_alone(tmp_path):
    first = T.train(_tiny(tmp_path, "first", max_steps=3, eval_every=100))
    init = str(first / "checkpoint")
    tuned = T.train(_tiny(tmp_path, "grown", max_steps=4, eval_every=100, init_from=init,
                          k_max=6, train_k_from=5))  # fmt: skip
    records = [json.loads(line) for line in (tuned / "log.jsonl").read_text().splitlines()]
    assert {record["K"] for record in records} <= {5, 6}
    source = load_checkpoint(first / "checkpoint")
    grown = MixtureTransformer(dataclasses.replace(source.config, k_max=6))
    load_initial_weights(grown, source)  # where the run started
    a, b = grown.state_dict(), load_checkpoint(tuned / "checkpoint").state_dict()
    changed = {name for name, tensor in a.items() if not torch.equal(tensor, b[name])}
    assert changed and all(
        name.startswith(("heads.5.", "heads.6.")) or name == "k_embedding.weight"
        for name in changed
    )
    assert torch.equal(a["k_embedding.weight"][:3], b["k_embedding.weight"][:3])  # K = 2..4
    assert (
        "Only the heads and task embeddings of K >= 5 trained"
        in (tuned / "checkpoint" / "README.md").read_text()
    )


def test_train_k_from_needs_a_model_to_fine_tune_and_a_k_it_has(tmp_path):
    with pytest.raises(ValueError, match="name that model with init_from"):
        _tiny(tmp_path, "bare", max_steps=1, train_k_from=3)
    with pytest.raises(ValueError, match="not both"):
        _tiny(tmp_path, "both", max_steps=1, init_from="x", train_k_from=3, only_k=3)
    first = T.train(_tiny(tmp_path, "first", max_steps=1, eval_every=100))
    cfg = _tiny(tmp_path, "k9", max_steps=1, init_from=str(first / "checkpoint"), train_k_from=9)
    with pytest.raises(ValueError, match=r"train_k_from=9 is outside the K .* \(2\.\.4\)"):
        T.train(cfg)


def test_batches_depend_on_seed_step_and_rank_only():
    cfg = T.TrainConfig(**T.PRESETS["tiny"])
    mc = T.model_config(cfg)
    a, b = T.get_batch(cfg, mc, 3, 0), T.get_batch(cfg, mc, 3, 0)
    other_rank = T.get_batch(cfg, mc, 3, 1)
    assert torch.equal(a.x, b.x) and a.n_components == other_rank.n_components
    assert a.x.shape != other_rank.x.shape or not torch.equal(a.x, other_rank.x)


def test_focus_prior_draws_that_fraction_of_the_batches():
    # "small" has heads for K = 2..10 and d_max = 8; tgmm-2d draws d = 2 and K <= 5 only,
    # so a focused batch fills two input columns, and a broad one almost never does.
    cfg = T.TrainConfig(model="small", batch_size=4, focus_prior="tgmm-2d", focus_prob=0.3)
    mc = T.model_config(cfg)
    focused = []
    for step in range(200):
        batch = T.get_batch(cfg, mc, step, 0)
        columns = int((batch.x.abs().sum((0, 1)) > 0).sum())
        focused.append(columns == 2 and batch.n_components <= 5)
    assert 0.2 < np.mean(focused) < 0.45
    # Without a focus, K is the first draw of the step's generator, as it always was, so
    # runs begun before the option existed resume onto the same batches.
    plain = T.TrainConfig(model="small", batch_size=4)
    for step in range(20):
        K = int(np.random.default_rng([plain.seed, step]).integers(2, 11))
        assert T.get_batch(plain, mc, step, 0).n_components == K


def test_several_focus_priors_share_the_steps():
    # tgmm-2d fills two columns with K <= 5; "real" draws K up to 10 and d up to 64.
    cfg = T.TrainConfig(model="small", batch_size=4, focus_prior="tgmm-2d,tiny", focus_prob=0.3)
    mc = T.model_config(cfg)
    kinds = []
    for step in range(200):
        batch = T.get_batch(cfg, mc, step, 0)
        columns = int((batch.x.abs().sum((0, 1)) > 0).sum())
        n_points = int(batch.mask.sum(-1).max())
        kinds.append("tiny" if n_points <= 64 else "2d" if columns == 2 else "broad")
    shares = {kind: kinds.count(kind) / len(kinds) for kind in ("2d", "tiny", "broad")}
    assert 0.2 < shares["2d"] < 0.42 and 0.2 < shares["tiny"] < 0.42, shares
    # One focus prior draws the batches it always drew: the step's first draw below
    # focus_prob picks it, then K, then the tasks from the step and rank's generator.
    one = T.TrainConfig(model="small", batch_size=4, focus_prior="tgmm-2d", focus_prob=0.3)
    for step in range(10):
        step_rng = np.random.default_rng([one.seed, step])
        name = "tgmm-2d" if step_rng.random() < 0.3 else one.prior
        low, high = T.k_range(one, mc, name)
        K = int(step_rng.integers(low, high + 1))
        expected = sample_batch(
            np.random.default_rng([one.seed, step, 0]),
            PRIORS[name],
            K,
            4,
            mc.d_max,
            T.reading_config(one).context_size,
            T.reading_config(one).noise_directions,
        )
        assert torch.equal(T.get_batch(one, mc, step, 0).x, expected.x)


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(focus_prob=1.5, focus_prior="tgmm-2d"), "in \\[0, 1\\]"),
        (dict(focus_prob=0.5), "needs"),
        (dict(focus_prob=0.6, focus_prior="tgmm-2d,tgmm"), "in \\[0, 1\\]"),
        (dict(focus_prob=0.3, focus_prior="tgmm-2d,nonsense"), "needs"),
        (dict(m_step_weight=-1.0), "m_step_weight must be >= 0"),
    ],
)
def test_focus_and_loss_options_are_checked(options, message):
    with pytest.raises(ValueError, match=message):
        T.TrainConfig(**options)


def test_command_line_overrides_the_preset():
    cfg = T.parse_args(
        [
            "--preset",
            "tiny",
            "--max-steps",
            "7",
            "--parameter-loss",
            "nll",
            "--compile",
            "--stop-at",
            "3",
        ]
    )
    assert (cfg.max_steps, cfg.parameter_loss, cfg.compile, cfg.stop_at) == (7, "nll", True, 3)
    assert cfg.batch_size == T.PRESETS["tiny"]["batch_size"] and cfg.preset == "tiny"


def test_compile_on_the_cpu_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="compile=True needs a CUDA device"):
        T.train(_tiny(tmp_path, "compiled", max_steps=1, compile=True))


@pytest.mark.slow  # torchrun starts two processes that import torch: about 10 s
def test_data_parallel_on_cpu_with_two_processes(tmp_path):
    """torchrun, gloo backend: both ranks step together and rank 0 writes the checkpoint."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "transformer_gmm.training",
        "--preset",
        "tiny",
        "--max-steps",
        "4",
        "--eval-every",
        "4",
        "--threads",
        "1",
        "--out-dir",
        str(tmp_path / "ddp"),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    state = torch.load(tmp_path / "ddp" / "state.pt", weights_only=True)
    assert state["step"] == 4
    load_checkpoint(tmp_path / "ddp" / "checkpoint")
