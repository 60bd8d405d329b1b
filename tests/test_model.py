"""The model reads a set: shapes, constraints, permutation and padding invariance, config."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from transformer_gmm.nn import (
    PRESETS,
    MixtureOutput,
    MixtureTransformer,
    ModelConfig,
    ReadingConfig,
    config_from_preset,
)
from transformer_gmm.nn.config import split_checkpoint_config

ATOL = 1e-5


def make_model(scale_type: str = "spherical", seed: int = 0) -> MixtureTransformer:
    torch.manual_seed(seed)
    # Two layers, so attention between points is exercised beyond one block.
    config = config_from_preset("tiny", n_layer=2, scale_type=scale_type)
    return MixtureTransformer(config).eval()


@pytest.fixture(params=["spherical", "diag", "full"])
def model(request) -> MixtureTransformer:
    return make_model(request.param)


def points(batch: int, n: int, d: int = 4, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, n, d, generator=torch.Generator().manual_seed(seed))


def assert_close(a: MixtureOutput, b: MixtureOutput, fields=MixtureOutput._fields) -> None:
    for name in fields:
        torch.testing.assert_close(getattr(a, name), getattr(b, name), atol=ATOL, rtol=0)


@pytest.mark.parametrize("k", [2, 3, 4])
def test_output_shapes_and_constraints(model, k):
    out = model(points(3, 20), k)
    scale_shape = {"spherical": (1,), "diag": (4,), "full": (4, 4)}[model.config.scale_type]
    assert isinstance(out, MixtureOutput)
    assert out.log_weights.shape == out.weights.shape == (3, k)
    assert out.means.shape == (3, k, 4)
    assert out.scales.shape == (3, k, *scale_shape)
    assert out.point_logits.shape == (3, 20, k)
    for tensor in out:
        assert tensor.dtype == torch.float32
        assert torch.isfinite(tensor).all()
    torch.testing.assert_close(out.weights.sum(-1), torch.ones(3))
    torch.testing.assert_close(out.log_weights.exp(), out.weights)
    assert (out.weights > 0).all()
    if model.config.scale_type == "full":  # a Cholesky factor: lower, positive diagonal
        assert torch.equal(out.scales, out.scales.tril())
        assert (out.scales.diagonal(dim1=-2, dim2=-1) > 0).all()
        assert (out.scales.tril(-1) != 0).any()
    else:
        assert (out.scales > 0).all()


def test_untrained_outputs_are_varied():
    out = make_model()(points(2, 30), 4)
    # Distinct seeds give distinct components, and different data different estimates.
    assert torch.cdist(out.means[0], out.means[0]).triu(1).max() > 1e-3
    assert (out.point_logits[0].std(0) > 0).all()
    assert not torch.allclose(out.means[0], out.means[1])


def test_permutation_invariance_and_equivariance(model):
    x = points(2, 25)
    perm = torch.randperm(25, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        out, shuffled = model(x, 3), model(x[:, perm], 3)
    assert_close(out, shuffled, ["log_weights", "weights", "means", "scales"])
    torch.testing.assert_close(shuffled.point_logits, out.point_logits[:, perm], atol=ATOL, rtol=0)


def test_padding_rows_change_nothing(model):
    x = points(1, 15)
    junk = 1e3 * points(1, 10, seed=3)
    junk[0, 0, 0] = float("nan")  # masked rows must not leak, not even a NaN
    padded = torch.cat([x[:, :7], junk, x[:, 7:]], dim=1)  # real points around the junk
    mask = torch.ones(1, 25, dtype=torch.bool)
    mask[0, 7:17] = False
    with torch.no_grad():
        out, out_padded = model(x, 3), model(padded, 3, mask)
    real = mask[0]
    assert_close(out, out_padded._replace(point_logits=out_padded.point_logits[:, real]))


def test_batch_of_datasets_of_different_sizes():
    model = make_model()
    big, small = points(1, 20, seed=4), points(1, 8, seed=5)
    x = torch.cat([big, torch.cat([small, torch.zeros(1, 12, 4)], dim=1)])  # (2, 20, 4)
    mask = torch.ones(2, 20, dtype=torch.bool)
    mask[1, 8:] = False
    with torch.no_grad():
        out = model(x, 2, mask)
        alone = model(small, 2)
    torch.testing.assert_close(out.means[1], alone.means[0], atol=ATOL, rtol=0)
    torch.testing.assert_close(out.point_logits[1, :8], alone.point_logits[0], atol=ATOL, rtol=0)
    torch.testing.assert_close(out.means[0], model(big, 2).means[0], atol=ATOL, rtol=0)


def test_weighted_points_read_as_their_copies(model):
    # A point of weight w is read as w copies of itself: the multiset's estimate, exactly
    # (to float32 rounding), in a batch whose datasets hold different numbers of copies.
    x = points(2, 12)
    weights = torch.randint(0, 4, (2, 12), generator=torch.Generator().manual_seed(6)).float()
    weights[:, 0] = 1.0  # every dataset reads at least one point
    copies = [x[b].repeat_interleave(weights[b].long(), dim=0) for b in range(2)]
    n = max(len(c) for c in copies)
    repeated = torch.zeros(2, n, 4)
    mask = torch.zeros(2, n, dtype=torch.bool)
    for b, c in enumerate(copies):
        repeated[b, : len(c)], mask[b, : len(c)] = c, True
    with torch.no_grad():
        out, out_repeated = model(x, 3, weights=weights), model(repeated, 3, mask)
        scaled = model(x, 3, weights=0.25 * weights)
    pooled = ["log_weights", "weights", "means", "scales"]
    assert_close(out, out_repeated, pooled)
    assert_close(out, scaled)  # only the weights' ratios count
    for b in range(2):  # each point's logits are those of each of its copies
        first = torch.cumsum(weights[b].long(), 0) - weights[b].long()
        read = weights[b] > 0
        torch.testing.assert_close(out.point_logits[b, read],
                                   out_repeated.point_logits[b, first[read]], atol=ATOL, rtol=0)


def test_weighted_points_read_as_their_copies_by_the_count_heads():
    torch.manual_seed(0)
    config = config_from_preset("tiny", k_posterior_seeds=2, cluster_count_seeds=2)
    model = MixtureTransformer(config).eval()
    x, weights = points(1, 10), torch.tensor([[1.0, 2, 0, 3, 1, 1, 2, 1, 1, 1]])
    repeated = x[0].repeat_interleave(weights[0].long(), dim=0)[None]
    with torch.no_grad():
        for read in (model.k_log_posterior, model.cluster_count_log_posterior):
            torch.testing.assert_close(read(x, weights=weights), read(repeated), atol=ATOL, rtol=0)


def test_weights_one_and_a_mask_read_as_the_mask(model):
    x = points(1, 10)
    mask = torch.ones(1, 10, dtype=torch.bool)
    mask[0, 6:] = False
    with torch.no_grad():
        out = model(x, 2, mask, weights=torch.ones(1, 10))
        assert_close(out, model(x, 2, mask))
        assert_close(out, model(x, 2, weights=mask.float()))


def test_fully_masked_dataset_gives_finite_outputs():
    model = make_model()
    mask = torch.zeros(2, 10, dtype=torch.bool)
    mask[0] = True
    out = model(points(2, 10), 3, mask)
    assert all(torch.isfinite(tensor).all() for tensor in out)


def test_gradients_reach_every_parameter_of_the_used_head():
    model = make_model().train()
    out = model(points(2, 12), 3)
    (out.means.sum() + out.scales.sum() + out.log_weights.sum() + out.point_logits.sum()).backward()
    for name, param in model.named_parameters():
        used = not name.startswith("heads.") or name.startswith("heads.3.")
        assert (param.grad is not None) == used, name


@pytest.mark.parametrize("k", [1, 5, 0])
def test_unsupported_n_components_raises(k):
    model = make_model()
    assert not model.has_head(k)
    with pytest.raises(ValueError, match=r"\[2, 4\]"):
        model(points(1, 10), k)


def test_supported_n_components():
    model = make_model()
    assert model.supported_n_components == range(2, 5)
    assert model.has_head(2) and model.has_head(4)
    assert not model.has_head(3.0) and not model.has_head(True)


def test_bad_inputs_raise():
    model = make_model()
    with pytest.raises(ValueError, match="d_max=4"):
        model(torch.randn(1, 10, 3), 2)
    with pytest.raises(ValueError, match="mask"):
        model(torch.randn(1, 10, 4), 2, torch.ones(1, 9, dtype=torch.bool))
    with pytest.raises(ValueError, match="non-negative"):
        model(torch.randn(1, 10, 4), 2, weights=-torch.ones(1, 10))
    with pytest.raises(ValueError, match=r"shape \(1, 10\)"):
        model(torch.randn(1, 10, 4), 2, weights=torch.ones(1, 9))


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_build(name):
    config = config_from_preset(name)
    assert ModelConfig.from_dict(config.to_dict()) == config
    if name != "base":  # base is built by the latency check, not in every test run
        model = MixtureTransformer(config)
        assert set(model.heads) == {str(k) for k in range(config.k_min, config.k_max + 1)}


def test_a_skeleton_draws_nothing_and_a_model_draws_its_weights():
    # On the meta device (what a checkpoint's weights are loaded into) nothing is drawn;
    # elsewhere the weights are nanoGPT's draws, the same for the same seed.
    config = config_from_preset("tiny", k_posterior_seeds=4, cluster_count_seeds=4)
    with torch.device("meta"):
        skeleton = MixtureTransformer(config)
    drawn = []
    for _ in range(2):
        torch.manual_seed(3)
        drawn.append(MixtureTransformer(config))
    shapes = {name: tensor.shape for name, tensor in drawn[0].state_dict().items()}
    assert {name: tensor.shape for name, tensor in skeleton.state_dict().items()} == shapes
    assert all(tensor.is_meta for tensor in skeleton.state_dict().values())
    for name, tensor in drawn[0].state_dict().items():
        torch.testing.assert_close(tensor, drawn[1].state_dict()[name], rtol=0, atol=0)
    assert 0.015 < float(drawn[0].k_embedding.weight.detach().std()) < 0.025
    assert 0.8 < float(drawn[0].heads["2"].seeds.detach().std()) < 1.2  # unit normal slot seeds


def test_config_from_preset_overrides_and_errors():
    assert config_from_preset("small", scale_type="diag").scale_type == "diag"
    with pytest.raises(ValueError, match="huge"):
        config_from_preset("huge")
    with pytest.raises(ValueError, match="n_layers"):
        config_from_preset("tiny", n_layers=3)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(d_model=30, n_head=4), "d_model"),
        (dict(k_min=5, k_max=3), "k_min"),
        (dict(k_min=0), "k_min"),
        (dict(scale_type="tied"), "scale_type"),
        (dict(n_layer=0), "n_layer"),
        (dict(d_max=4.0), "d_max"),
    ],
)
def test_config_validation(kwargs, field):
    with pytest.raises(ValueError, match=field):
        ModelConfig(**kwargs)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(context_size=True), "context_size"),
        (dict(context_size=0), "context_size"),
        (dict(noise_directions=-1), "noise_directions"),
        (dict(noise_directions=1.0), "noise_directions"),
    ],
)
def test_reading_config_validation(kwargs, field):
    with pytest.raises(ValueError, match=field):
        ReadingConfig(**kwargs)


def test_model_config_holds_only_what_fixes_the_weights():
    # How a fit shows the model data is its ReadingConfig, kept beside it: no weight's
    # shape depends on it, and the forward pass does not read it.
    assert not {"context_size", "noise_directions"} & set(ModelConfig.__dataclass_fields__)
    config = config_from_preset("tiny")
    torch.manual_seed(0)
    a = MixtureTransformer(config, ReadingConfig(context_size=8, noise_directions=2))
    torch.manual_seed(0)
    b = MixtureTransformer(config)
    assert a.reading_config != b.reading_config and b.reading_config == ReadingConfig()
    x = torch.randn(1, 20, config.d_max)
    assert torch.equal(a(x, 2).means, b(x, 2).means)


def test_checkpoint_config_splits_strictly():
    both = {**ModelConfig().to_dict(), **ReadingConfig(context_size=9).to_dict()}
    assert split_checkpoint_config(both) == (ModelConfig(), ReadingConfig(context_size=9))
    with pytest.raises(ValueError, match="dropout"):
        split_checkpoint_config({**both, "dropout": 0.1})
    without_context = dict(both)
    del without_context["context_size"]
    with pytest.raises(ValueError, match="context_size"):
        split_checkpoint_config(without_context)
    with pytest.raises(ValueError, match="context_size"):
        ModelConfig.from_dict(both)  # a ModelConfig alone knows no reading fields


def test_config_round_trip_and_strict_from_dict():
    config = ModelConfig(scale_type="diag")
    assert ModelConfig.from_dict(config.to_dict()) == config
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.d_model = 64
    with pytest.raises(ValueError, match="dropout"):
        ModelConfig.from_dict({**config.to_dict(), "dropout": 0.1})
    partial = config.to_dict()
    del partial["n_head"], partial["mlp_ratio"]
    with pytest.raises(ValueError, match=r"n_head.*mlp_ratio"):
        ModelConfig.from_dict(partial)
    with pytest.raises(ValueError, match="dict"):
        ModelConfig.from_dict([1, 2])


def test_configs_written_before_noise_directions_read_as_zero():
    # Checkpoints saved before the field existed read K - 1 directions: so must they now.
    written_before = {**ModelConfig().to_dict(), **ReadingConfig().to_dict()}
    del written_before["noise_directions"]
    assert split_checkpoint_config(written_before)[1].noise_directions == 0
    reads_one_more = ReadingConfig(noise_directions=1)
    assert ReadingConfig.from_dict(reads_one_more.to_dict()) == reads_one_more


def test_freeze_keeps_the_weights_and_lays_them_out_for_inference():
    model, frozen = make_model(), make_model().freeze()
    for (name, before), after in zip(
        model.state_dict().items(), frozen.state_dict().values(), strict=True
    ):
        assert torch.equal(after, before), name  # the same values, every weight
    linears = [m for m in frozen.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(m.weight.stride() == (1, m.weight.shape[0]) for m in linears)
    assert not frozen.training and not any(p.requires_grad for p in frozen.parameters())
    x = torch.randn(2, 40, model.config.d_max)
    with torch.inference_mode():
        for a, b in zip(model(x, 3), frozen(x, 3), strict=True):  # rounding apart
            torch.testing.assert_close(b, a, rtol=ATOL, atol=ATOL)


def test_the_shared_model_is_frozen_and_a_private_copy_is_not(tmp_path):
    from transformer_gmm.storage import load_checkpoint, load_model, save_checkpoint

    folder = save_checkpoint(make_model(), tmp_path / "ckpt")
    shared, private = load_model(folder), load_checkpoint(folder)
    assert shared.readin.weight.stride() == (1, shared.config.d_model)
    assert private.readin.weight.is_contiguous() and private.readin.weight.requires_grad
    # Saved from the frozen layout, the weights read back the same.
    again = load_checkpoint(save_checkpoint(shared, tmp_path / "again"))
    for name, tensor in again.state_dict().items():
        assert torch.equal(tensor, private.state_dict()[name]), name
