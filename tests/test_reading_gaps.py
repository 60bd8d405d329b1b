"""A checkpoint that reads where the data's missing entries were (``reads_gaps``): the
model's channel, the training tasks with gaps, and the fit that hands them over."""

import dataclasses
import warnings

import numpy as np
import pytest
import torch
from conftest import make_blobs, make_tiny_checkpoint

from transformer_gmm import TransformerGMM
from transformer_gmm.engine.standardize import fit_standardization
from transformer_gmm.nn import MixtureTransformer, ModelConfig, config_from_preset
from transformer_gmm.storage import load_checkpoint, load_model, save_checkpoint
from transformer_gmm.training import PRIORS, collate, sample_task
from transformer_gmm.training.tasks import draw_observed
from transformer_gmm.training.train import parse_args, train
from transformer_gmm.training.weights import load_initial_weights


@pytest.fixture(scope="module")
def gaps_checkpoints(tmp_path_factory):
    """A tiny model that reads gaps (random weights, its gap weights too), the same with its
    gap weights at zero, and the same weights in a model without the channel."""
    root = tmp_path_factory.mktemp("gaps")
    reading = make_tiny_checkpoint(root / "reads", reads_gaps=1)
    model = load_checkpoint(reading)  # a private copy: the shared one is not to be changed
    with torch.no_grad():
        model.readin_gaps.weight.zero_()
    zeroed = save_checkpoint(model, root / "zeroed")
    plain = MixtureTransformer(
        dataclasses.replace(model.config, reads_gaps=0), model.reading_config
    )
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if "gaps" not in k})
    return str(reading), str(zeroed), str(save_checkpoint(plain, root / "plain"))


def with_gaps(X, rate=0.3, seed=1):
    rng = np.random.default_rng(seed)
    X = X.copy()
    X[rng.random(X.shape) < rate] = np.nan
    X[np.isnan(X).all(axis=1), 0] = 0.0  # every row keeps an observed entry
    return X


def fitted_start(X, checkpoint, weights=None, **params):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # max_iter=0 stops before convergence
        return TransformerGMM(
            3, checkpoint=checkpoint, max_iter=0, random_state=0, **params
        ).fit(X, sample_weight=weights)


BLOBS = make_blobs(40, [[0, 0, 0], [5, 0, 0], [0, 5, 5]], seed=3)


def test_the_shares_are_the_squared_loadings_of_the_filled_features():
    x = torch.randn(1, 30, 5, dtype=torch.float64) * torch.tensor([3.0, 2.0, 1.0, 1.0, 0.5])
    standardization = fit_standardization(x, None, d_max=4, n_components=3)  # 2 kept, padded
    missing = torch.zeros(1, 30, 5, dtype=torch.bool)
    missing[0, 0, [0, 3]] = True
    missing[0, 1] = True
    shares = standardization.transform_gaps(missing)
    basis = standardization.basis[0]  # (5, 2)
    expected = (basis[[0, 3]] ** 2).sum(0).float()
    assert torch.allclose(shares[0, 0, :2], expected)
    assert torch.allclose(shares[0, 1, :2], torch.ones(2))  # every entry filled
    assert (shares[0, 2:] == 0).all() and (shares[..., 2:] == 0).all()  # complete; padding


def test_a_model_reads_gaps_only_when_its_config_says_so():
    config = config_from_preset("tiny", reads_gaps=1)
    assert ModelConfig.from_dict({**config.to_dict()}).reads_gaps == 1
    old = {k: v for k, v in config.to_dict().items() if k != "reads_gaps"}
    assert ModelConfig.from_dict(old).reads_gaps == 0  # checkpoints written before it
    with pytest.raises(ValueError, match="reads_gaps must be at most 1"):
        config_from_preset("tiny", reads_gaps=2)
    x = torch.randn(2, 20, 4)
    plain = MixtureTransformer(config_from_preset("tiny"))
    with pytest.raises(ValueError, match="does not read gaps"):
        plain(x, 2, gaps=torch.zeros_like(x))
    reading = MixtureTransformer(config)
    with pytest.raises(ValueError, match="gaps must have the shape of x"):
        reading(x, 2, gaps=torch.zeros(2, 20, 3))


def test_a_new_channel_starts_at_zero_and_computes_what_its_source_did():
    torch.manual_seed(0)
    source = MixtureTransformer(config_from_preset("tiny"))
    model = MixtureTransformer(config_from_preset("tiny", reads_gaps=1))
    load_initial_weights(model, source)
    x, gaps = torch.randn(2, 20, 4), torch.rand(2, 20, 4)
    assert torch.equal(model(x, 3, gaps=gaps).means, source(x, 3).means)
    with torch.no_grad():
        model.readin_gaps.weight.normal_()
    assert not torch.equal(model(x, 3, gaps=gaps).means, source(x, 3).means)
    assert torch.equal(model(x, 3).means, source(x, 3).means)  # no gaps: the points alone


def test_training_tasks_fill_their_gaps_with_the_observed_column_means():
    rng = np.random.default_rng(0)
    tasks = [sample_task(rng, PRIORS["tiny-missing"], 3, 5, 40, d_max=4) for _ in range(20)]
    for task in tasks:
        observed = task.observed
        assert observed is not None and not observed.all() and np.isfinite(task.X).all()
        assert observed.any(axis=1).all() and observed.any(axis=0).all()
        # Each filled entry holds its column's observed mean, as the fit fills it.
        means = np.nanmean(np.where(observed, task.X, np.nan), axis=0)
        filled = np.broadcast_to(means, task.X.shape)[~observed]
        np.testing.assert_allclose(task.X[~observed], filled)
    assert draw_observed(np.random.default_rng(0), np.zeros((50, 3)), 0.5).shape == (50, 3)
    batch = collate(tasks[:2], d_max=4)
    assert batch.gaps.shape == batch.x.shape
    assert (batch.gaps[~batch.mask] == 0).all() and batch.gaps.max() <= 1.0
    assert batch.gaps[batch.mask].max() > 0
    complete = [sample_task(rng, PRIORS["tiny"], 3, 5, 40, d_max=4) for _ in range(2)]
    batch = collate(complete, d_max=4)
    assert batch.gaps is None
    assert torch.equal(batch.gaps_read_by(config_from_preset("tiny", reads_gaps=1)),
                       torch.zeros_like(batch.x))
    assert batch.gaps_read_by(config_from_preset("tiny")) is None


def test_the_fit_hands_the_gaps_to_a_checkpoint_that_reads_them(gaps_checkpoints):
    reading, zeroed, plain = gaps_checkpoints
    X = with_gaps(BLOBS)
    read = fitted_start(X, reading)
    # Gap weights at zero: the start of the same weights without the channel, to the bit.
    assert np.array_equal(fitted_start(X, zeroed).means_, fitted_start(X, plain).means_)
    assert not np.allclose(read.means_, fitted_start(X, zeroed).means_)
    # Complete data have no gaps to read: the same fit with or without gap weights.
    assert np.array_equal(fitted_start(BLOBS, reading).means_,
                          fitted_start(BLOBS, zeroed).means_)


def test_the_gaps_follow_the_rows_whatever_their_order(gaps_checkpoints):
    reading = gaps_checkpoints[0]
    X = with_gaps(BLOBS)
    order = np.random.default_rng(5).permutation(len(X))
    for params in ({}, {"n_init": 2}):
        first = fitted_start(X, reading, **params)
        again = fitted_start(X[order], reading, **params)
        np.testing.assert_allclose(again.means_, first.means_, rtol=1e-12, atol=1e-12)


def test_weighted_rows_are_read_without_their_gaps(gaps_checkpoints):
    reading, zeroed, _ = gaps_checkpoints
    X = with_gaps(BLOBS)
    weights = np.random.default_rng(2).uniform(0.5, 2.0, len(X))
    np.testing.assert_array_equal(
        fitted_start(X, reading, weights=weights).means_,
        fitted_start(X, zeroed, weights=weights).means_,
    )


def test_a_training_run_learns_to_read_gaps(tmp_path):
    cfg = parse_args(["--preset", "tiny", "--prior", "tiny-missing", "--reads-gaps", "1",
                      "--max-steps", "2", "--out-dir", str(tmp_path)])
    out_dir = train(cfg)
    model = load_model(out_dir / "checkpoint")
    assert model.config.reads_gaps == 1
    assert model.readin_gaps.weight.abs().sum() > 0  # the channel was trained
    fitted = TransformerGMM(3, checkpoint=str(out_dir / "checkpoint"), random_state=0)
    assert np.isfinite(fitted.fit(with_gaps(BLOBS)).lower_bound_)
