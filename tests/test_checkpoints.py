"""Checkpoint folders: round trip, strict loading, resolving names, the per-process caches."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import transformer_gmm
from transformer_gmm.engine import model_cache
from transformer_gmm.nn import MixtureTransformer, config_from_preset
from transformer_gmm.storage import checkpoints
from transformer_gmm.storage.checkpoints import (
    bundled_checkpoints,
    load_checkpoint,
    load_model,
    resolve_checkpoint,
)
from transformer_gmm.storage.format import CheckpointError, read_checkpoint, save_checkpoint


def tiny_model(seed: int = 0, **overrides) -> MixtureTransformer:
    torch.manual_seed(seed)
    return MixtureTransformer(config_from_preset("tiny", **overrides)).eval()


@pytest.fixture
def folder(tmp_path) -> Path:
    return save_checkpoint(tiny_model(), tmp_path / "ckpt")


def edit_config(folder: Path, **changes) -> None:
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def test_round_trip_gives_identical_outputs(tmp_path):
    model = tiny_model(scale_type="diag")
    folder = save_checkpoint(model, tmp_path / "a" / "b", model_card="Hello card.")
    assert sorted(p.name for p in folder.iterdir()) == [
        "README.md",
        "config.json",
        "model.safetensors",
    ]
    assert (folder / "README.md").read_text() == "Hello card."
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "transformer_gmm.MixtureTransformer"
    assert config["format_version"] == 1
    loaded = load_checkpoint(folder)
    assert loaded.config == model.config
    assert not loaded.training
    for param in loaded.parameters():
        assert param.device.type == "cpu" and param.dtype == torch.float32
    x = torch.randn(2, 30, 4)
    with torch.no_grad():
        for k in (2, 3, 4):
            for a, b in zip(model(x, k), loaded(x, k), strict=True):
                assert torch.equal(a, b)


def test_default_model_card_lists_the_config(folder):
    card = (folder / "README.md").read_text()
    assert "d_model" in card and "k_max" in card


def test_config_mismatching_the_weights(folder):
    edit_config(folder, d_model=32, n_head=2)
    with pytest.raises(CheckpointError, match=r"model\.safetensors.*shape"):
        load_checkpoint(folder)


def test_config_with_fewer_heads_than_the_weights(folder):
    edit_config(folder, k_max=3)
    with pytest.raises(CheckpointError, match=r"unexpected tensors \['heads\.4\."):
        load_checkpoint(folder)


def test_the_cluster_count_head_is_where_the_config_says(tmp_path):
    model = tiny_model(k_posterior_seeds=2, cluster_count_seeds=3)
    with_head = save_checkpoint(model, tmp_path / "with")
    loaded = load_checkpoint(with_head)
    x = torch.randn(2, 30, 4)
    with torch.no_grad():
        assert torch.equal(
            loaded.cluster_count_log_posterior(x), model.cluster_count_log_posterior(x)
        )
    edit_config(with_head, cluster_count_seeds=0)  # weights with a head the config denies
    with pytest.raises(CheckpointError, match="implies no cluster-count head"):
        load_checkpoint(with_head)
    without = save_checkpoint(tiny_model(k_posterior_seeds=2), tmp_path / "without")
    edit_config(without, cluster_count_seeds=3)  # a head the weights lack
    with pytest.raises(CheckpointError, match=r"cluster_count_head\.seeds.*no such tensor"):
        load_checkpoint(without)


def test_a_loaded_model_owns_aligned_weights_whatever_the_files_layout(tmp_path):
    """A tensor read from a file is a view at its byte offset, and float32 kernels round by
    alignment: the same tensors laid out differently (here behind a head more) must give
    the same bits, so every weight is copied into memory of its own."""
    from transformer_gmm.training.k_posterior import with_cluster_count_head

    model = tiny_model(k_posterior_seeds=2)
    plain = load_checkpoint(save_checkpoint(model, tmp_path / "plain"))
    more = load_checkpoint(save_checkpoint(with_cluster_count_head(model), tmp_path / "more"))
    for loaded in (plain, more):
        assert all(t.data_ptr() % 64 == 0 for t in loaded.state_dict().values())
    x = torch.randn(3, 50, 4, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for a, b in zip(plain(x, 3), more(x, 3), strict=True):
            assert torch.equal(a, b)
        assert torch.equal(plain.k_log_posterior(x), more.k_log_posterior(x))


def test_missing_weight_file(folder):
    (folder / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="model.safetensors is missing"):
        load_checkpoint(folder)


def test_missing_config_file(folder):
    (folder / "config.json").unlink()
    with pytest.raises(CheckpointError, match="config.json is missing"):
        load_checkpoint(folder)


def test_missing_folder(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        read_checkpoint(tmp_path / "nowhere")
    with pytest.raises(CheckpointError, match="was not found"):
        load_checkpoint(tmp_path / "nowhere")


def test_truncated_weight_file(folder):
    path = folder / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"model\.safetensors is truncated or corrupted"):
        load_checkpoint(folder)


def test_garbage_config_file(folder):
    (folder / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="config.json"):
        load_checkpoint(folder)


def test_unknown_config_field_is_rejected_before_reading_weights(folder):
    edit_config(folder, attention_window=32)
    (folder / "model.safetensors").write_bytes(b"never read")
    with pytest.raises(CheckpointError, match="attention_window"):
        load_checkpoint(folder)


def test_missing_config_field(folder):
    config = json.loads((folder / "config.json").read_text())
    del config["scale_type"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="scale_type"):
        load_checkpoint(folder)


def test_invalid_config_value(folder):
    edit_config(folder, n_head=3)
    with pytest.raises(CheckpointError, match="n_head"):
        load_checkpoint(folder)


@pytest.mark.parametrize(
    "field, value", [("model_type", "bert"), ("model_type", None), ("format_version", 2)]
)
def test_wrong_model_type_or_format_version(folder, field, value):
    edit_config(folder, **{field: value})
    with pytest.raises(CheckpointError, match=field):
        load_checkpoint(folder)


def test_extra_and_missing_tensors_are_listed(folder):
    path = folder / "model.safetensors"
    tensors = load_file(path)
    tensors["extra.weight"] = torch.zeros(3)
    del tensors["readin.bias"]
    save_file(tensors, path)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(folder)
    assert "extra.weight" in str(info.value) and "readin.bias" in str(info.value)


def test_half_precision_weights_load_as_float32(folder):
    path = folder / "model.safetensors"
    save_file({k: v.half() for k, v in load_file(path).items()}, path)
    model = load_checkpoint(folder)
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_resolve_local_folder(folder):
    assert resolve_checkpoint(folder) == folder
    assert resolve_checkpoint(str(folder)) == folder


def test_resolve_unknown_name_lists_accepted_forms():
    with pytest.raises(CheckpointError) as info:
        resolve_checkpoint("no-such-checkpoint")
    message = str(info.value)
    assert "bundled" in message and "local checkpoint folder" in message and "org/name" in message


def test_resolve_a_file_is_an_error(folder):
    with pytest.raises(CheckpointError, match="is a file"):
        resolve_checkpoint(folder / "config.json")


@pytest.fixture
def fake_hub(monkeypatch, folder):
    huggingface_hub = pytest.importorskip("huggingface_hub")
    calls = []

    def snapshot_download(repo_id, *, revision=None, allow_patterns=None, **kwargs):
        calls.append((repo_id, revision, sorted(allow_patterns)))
        if repo_id == "org/missing":
            raise OSError("404 Repository Not Found")
        return str(folder)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    return calls


def test_resolve_hub_id_with_revision(fake_hub, folder, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # so "org/name" is not also a local folder
    files = ["README.md", "config.json", "model.safetensors"]
    assert resolve_checkpoint("org/name@abc123") == folder
    assert resolve_checkpoint("org/name") == folder
    assert fake_hub == [("org/name", "abc123", files), ("org/name", None, files)]


def test_hub_errors_become_checkpoint_errors(fake_hub, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckpointError, match=r"org/missing.*hf download.*--local-dir"):
        resolve_checkpoint("org/missing")


def test_local_folder_wins_over_hub_id(fake_hub, folder, monkeypatch):
    monkeypatch.chdir(folder.parent.parent)
    name = f"{folder.parent.name}/{folder.name}"  # relative path shaped like "org/name"
    assert resolve_checkpoint(name) == Path(name)
    assert fake_hub == []


def test_load_model_caches_and_reloads_a_changed_checkpoint(folder):
    first = load_model(folder)
    assert load_model(str(folder)) is first
    assert not first.training
    assert not any(p.requires_grad for p in first.parameters())
    save_checkpoint(tiny_model(seed=1), folder)
    # Same size and, on a coarse clock, maybe the same mtime: move it to be sure.
    stat = (folder / "model.safetensors").stat()
    os.utime(folder / "model.safetensors", ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    second = load_model(folder)
    assert second is not first
    assert not torch.equal(second.readin.weight, first.readin.weight)
    assert load_model(folder) is second


def test_bundled_checkpoints_is_a_dict():
    bundled = bundled_checkpoints()
    assert isinstance(bundled, dict)
    assert all((path / "config.json").is_file() for path in bundled.values())


def test_bundled_checkpoints_found_and_resolved(monkeypatch, tmp_path):
    save_checkpoint(tiny_model(), tmp_path / "demo")
    (tmp_path / "not_a_checkpoint").mkdir()
    (tmp_path / "notes.md").write_text("not a folder")
    monkeypatch.setattr(checkpoints, "_bundled_root", lambda: tmp_path)
    assert bundled_checkpoints() == {"demo": tmp_path / "demo"}
    assert resolve_checkpoint("demo") == tmp_path / "demo"
    assert load_model("demo").config == config_from_preset("tiny")
    with pytest.raises(CheckpointError, match="'demo'"):
        resolve_checkpoint("nothing")


def test_bundled_listing_follows_checkpoints_added_and_removed(monkeypatch, tmp_path):
    monkeypatch.setattr(checkpoints, "_bundled_root", lambda: tmp_path)
    assert bundled_checkpoints() == {}
    save_checkpoint(tiny_model(), tmp_path / "demo")  # a new folder changes the root's mtime
    assert bundled_checkpoints() == {"demo": tmp_path / "demo"}
    listing = bundled_checkpoints()
    listing.clear()  # the caller's copy: the listing kept is not changed
    assert bundled_checkpoints() == {"demo": tmp_path / "demo"}
    for file in (tmp_path / "demo").iterdir():
        file.unlink()
    (tmp_path / "demo").rmdir()
    assert bundled_checkpoints() == {}


def test_a_link_pointed_elsewhere_loads_the_model_it_points_to(tmp_path):
    first = save_checkpoint(tiny_model(0), tmp_path / "first")
    second = save_checkpoint(tiny_model(1), tmp_path / "second")
    link = tmp_path / "current"
    link.symlink_to(first, target_is_directory=True)
    assert load_model(link) is load_model(first)
    link.unlink()
    link.symlink_to(second, target_is_directory=True)
    assert load_model(link) is load_model(second) and load_model(second) is not load_model(first)


def test_load_model_keeps_the_most_recently_used_models(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoints, "_CACHE", type(checkpoints._CACHE)())
    size = checkpoints._CACHE_SIZE
    folders = [save_checkpoint(tiny_model(seed), tmp_path / str(seed)) for seed in range(size + 2)]
    models = [load_model(folder) for folder in folders[:size]]
    assert load_model(folders[0]) is models[0]  # used again: now the most recent
    load_model(folders[size])  # one more than the cache holds: the oldest goes
    assert len(checkpoints._CACHE) == size
    assert load_model(folders[0]) is models[0]
    reloaded = load_model(folders[1])
    assert reloaded is not models[1]
    assert torch.equal(reloaded.readin.weight, models[1].readin.weight)
    assert load_model(folders[2]) is not models[2]  # evicted by the reload of folders[1]


def test_copies_on_other_devices_are_bounded_and_cleared(tmp_path, monkeypatch):
    monkeypatch.setattr(model_cache, "_MODELS_ON_DEVICES", type(model_cache._MODELS_ON_DEVICES)())
    monkeypatch.setattr(checkpoints, "_CACHE", type(checkpoints._CACHE)())
    size = model_cache._DEVICE_CACHE_SIZE
    models = [tiny_model(seed) for seed in range(size + 1)]
    # The "meta" device holds no data, so this runs without a GPU.
    copies = [model_cache.model_on(model, "meta") for model in models[:size]]
    assert copies[0].readin.weight.is_meta and model_cache.model_on(models[0], "cpu") is models[0]
    assert model_cache.model_on(models[0], "meta") is copies[0]
    model_cache.model_on(models[size], "meta")
    assert len(model_cache._MODELS_ON_DEVICES) == size
    assert model_cache.model_on(models[0], "meta") is copies[0]
    assert model_cache.model_on(models[1], "meta") is not copies[1]  # the oldest went
    load_model(save_checkpoint(models[0], tmp_path / "ckpt"))
    transformer_gmm.clear_model_cache()
    assert len(checkpoints._CACHE) == 0 and len(model_cache._MODELS_ON_DEVICES) == 0
