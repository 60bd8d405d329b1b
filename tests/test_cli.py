"""The transformer-gmm command line: list, info, download, export (Hub on 127.0.0.1)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import warnings
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
from conftest import make_tiny_checkpoint
from test_hub import isolate_hf, serve, set_offline

from transformer_gmm import FallbackWarning, TransformerGMM
from transformer_gmm.cli import main
from transformer_gmm.nn import MixtureTransformer, config_from_preset
from transformer_gmm.storage import checkpoints, hub, load_checkpoint, save_checkpoint


@pytest.fixture(autouse=True)
def hf_cache(tmp_path, monkeypatch) -> Path:
    return isolate_hf(tmp_path, monkeypatch)


@pytest.fixture
def fake_hub(monkeypatch):
    yield from serve(monkeypatch)


@pytest.fixture
def published(fake_hub, tmp_path) -> str:
    return fake_hub.publish("org/name", make_tiny_checkpoint(tmp_path / "published"))


@pytest.fixture
def bundled(tmp_path, monkeypatch) -> Path:
    """An empty bundled-checkpoints folder standing in for transformer_gmm/pretrained."""
    root = tmp_path / "pretrained"
    root.mkdir()
    monkeypatch.setattr(checkpoints, "_bundled_root", lambda: root)
    return root


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def fits_with(folder: Path, three_blobs) -> TransformerGMM:
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)  # the transformer must have run
        gmm = TransformerGMM(3, checkpoint=str(folder), n_init=1, random_state=0).fit(three_blobs)
    assert gmm.init_method_ == "transformer"
    return gmm


# --- list ------------------------------------------------------------------------------------


def test_list_empty_states(capsys, bundled, hf_cache):
    code, out, _ = run(capsys, "list")
    assert code == 0
    assert "No checkpoint is bundled" in out and "transformer-gmm info default" in out
    assert "No transformer_gmm checkpoint in the Hugging Face cache" in out
    assert "transformer-gmm download org/name" in out
    assert "CHECKPOINT" not in out  # no empty table


def test_list_shows_bundled_and_cached(capsys, bundled, published, hf_cache):
    save_checkpoint(MixtureTransformer(config_from_preset("tiny", k_max=5)), bundled / "default")
    assert main(["download", "org/name"]) == 0
    capsys.readouterr()
    (hf_cache / "models--someone--bert").mkdir()  # another library's model: not listed
    code, out, _ = run(capsys, "list")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["CHECKPOINT", "K", "D_MAX", "SIZE", "SOURCE"]
    default = lines[1].split()
    assert default[:3] == ["default", "2..5", "4"] and default[-1] == "bundled"
    cached = lines[2].split()
    assert cached[:3] == ["org/name", "2..4", "4"] and cached[4] == "kB"
    assert f"Hub cache, revision {published[:12]}" in lines[2]
    assert "No checkpoint is bundled" not in out and "someone" not in out


# --- info ------------------------------------------------------------------------------------


def test_info_default_when_none_is_bundled(capsys, bundled):
    code, out, _ = run(capsys, "info", "default")
    assert code == 0
    assert "No default checkpoint is bundled" in out
    assert "fall\nback to EM" in out or "fall back to EM" in out.replace("\n", " ")
    assert "transformer-gmm download org/name" in out and "--preset small" in out


def test_info_default_prints_its_model_card(capsys, bundled):
    model = MixtureTransformer(config_from_preset("tiny"))
    save_checkpoint(model, bundled / "default", model_card="# The default\n\nTrained on X.")
    code, out, _ = run(capsys, "info", "default")
    assert code == 0
    assert "Source:      bundled with transformer_gmm" in out
    assert "K = 2..4" in out and "Trained on X." in out


def test_info_is_short_and_full_gives_the_whole_card(capsys, bundled):
    model = MixtureTransformer(config_from_preset("tiny"))
    card = "# The default\n\nTrained on X. Then on Y. Then on Z.\n\n"
    card += "## Runs\n\nmany lines\n" * 50
    save_checkpoint(model, bundled / "default", model_card=card)
    code, out, _ = run(capsys, "info", "default")
    assert code == 0 and "Trained on X. Then on Y." in out and "Then on Z." not in out
    assert "many lines" not in out and "`transformer-gmm info default --full`" in out
    assert len(out.splitlines()) < 20
    code, out, _ = run(capsys, "info", "default", "--full")
    assert code == 0 and out.count("many lines") == 50 and "Then on Z." in out


def test_info_folder(capsys, tmp_path):
    folder = make_tiny_checkpoint(tmp_path / "mine")
    code, out, _ = run(capsys, "info", str(folder))
    assert code == 0
    assert "local folder" in out and "K = 2..4" in out and "up to 4 features" in out
    n_parameters = sum(p.numel() for p in load_checkpoint(folder).parameters())
    assert f"Parameters:  {n_parameters:,}" in out
    assert "Random weights, for tests only." in out


def test_info_on_a_folder_without_weights_says_it_cannot_be_used(capsys, tmp_path):
    """A Hub checkpoint gets its weights at first use; a local folder never will."""
    from transformer_gmm.storage.format import CheckpointError

    folder = make_tiny_checkpoint(tmp_path / "mine")
    (folder / "model.safetensors").unlink()
    code, out, err = run(capsys, "info", str(folder))
    assert code == 1
    assert "no weights (model.safetensors is missing)" in out
    assert "not downloaded" not in out
    assert "cannot be used" in err and "CheckpointError" in err
    with pytest.raises(CheckpointError):  # what info says fit does
        TransformerGMM(2, checkpoint=str(folder)).fit(torch.randn(30, 2).numpy())


def test_info_hub_id_fetches_only_config_and_card(capsys, published, fake_hub):
    code, out, _ = run(capsys, "info", "org/name")
    assert code == 0
    assert "Hugging Face Hub, org/name" in out and "weights not downloaded yet" in out
    assert not any(path.endswith("model.safetensors") for _, path in fake_hub.requests)
    code, out, _ = run(capsys, "list")
    assert "org/name" in out and "(weights not downloaded yet)" in out


def test_info_unknown_checkpoint(capsys):
    code, out, err = run(capsys, "info", "no-such-thing")
    assert code == 1 and out == ""
    assert err.startswith("error: Checkpoint 'no-such-thing' was not found")


# --- download ---------------------------------------------------------------------------------


def test_download_to_the_cache_then_offline(capsys, published, hf_cache, monkeypatch):
    code, out, _ = run(capsys, "download", "org/name")
    assert code == 0
    assert f"Downloaded org/name to the Hugging Face cache: {hf_cache}" in out
    assert "checkpoint='org/name'" in out
    monkeypatch.setattr(checkpoints, "_CACHE", OrderedDict())
    monkeypatch.setattr(hub, "_RESOLVED", {})
    set_offline(monkeypatch, True)
    assert checkpoints.load_model("org/name").config.k_max == 4


def test_download_to_a_folder(capsys, published, tmp_path, three_blobs):
    target = tmp_path / "copied"
    code, out, _ = run(capsys, "download", f"org/name@{published}", "--to", str(target))
    assert code == 0 and f"checkpoint={str(target)!r}" in out
    fits_with(target, three_blobs)


def test_download_offline_without_cache(capsys, fake_hub, monkeypatch):
    set_offline(monkeypatch, True)
    code, _, err = run(capsys, "download", "org/name")
    assert code == 1 and "HF_HUB_OFFLINE is set" in err
    assert fake_hub.requests == []


def test_download_rejects_a_non_hub_id(capsys):
    code, _, err = run(capsys, "download", "./folder")
    assert code == 1 and "not a Hub id" in err


# --- export -----------------------------------------------------------------------------------


def test_export_a_preset_loads_back(capsys, tmp_path, three_blobs):
    target = tmp_path / "my-model"
    code, out, _ = run(
        capsys, "export", "--preset", "tiny", "--set", "k_max=5", "--seed", "3", "--to", str(target)
    )
    assert code == 0
    assert "untrained model from preset 'tiny'" in out and "hf upload" in out
    config = json.loads((target / "config.json").read_text())
    assert config["k_max"] == 5 and config["model_type"] == "transformer_gmm.MixtureTransformer"
    card = (target / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: transformer_gmm") and "**Untrained**" in card
    fits_with(target, three_blobs)
    # The same preset and seed give the same weights.
    assert (
        main(
            [
                "export",
                "--preset",
                "tiny",
                "--set",
                "k_max=5",
                "--seed",
                "3",
                "--to",
                str(tmp_path / "b"),
            ]
        )
        == 0
    )
    a, b = load_checkpoint(target), load_checkpoint(tmp_path / "b")
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))


def test_export_a_checkpoint_keeps_weights_and_card(capsys, tmp_path, three_blobs):
    source = make_tiny_checkpoint(tmp_path / "source", seed=4)
    target = tmp_path / "exported"
    code, out, _ = run(capsys, "export", str(source), "--to", str(target))
    assert code == 0 and f"checkpoint={str(target)!r}" in out
    assert (target / "README.md").read_text() == "Random weights, for tests only."
    a, b = load_checkpoint(source), load_checkpoint(target)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
    fits_with(target, three_blobs)


def test_export_a_hub_checkpoint_with_a_new_card(capsys, published, tmp_path):
    card = tmp_path / "card.md"
    card.write_text("# Mine")
    assert main(["export", "org/name", "--to", str(tmp_path / "out"), "--card", str(card)]) == 0
    assert (tmp_path / "out" / "README.md").read_text() == "# Mine"
    assert load_checkpoint(tmp_path / "out").config.k_max == 4


@pytest.mark.parametrize(
    "argv, message",
    [
        (["export", "--to", "x"], "exactly one source"),
        (["export", "src", "--preset", "tiny", "--to", "x"], "exactly one source"),
        (["export", "--preset", "huge", "--to", "x"], "Unknown preset 'huge'"),
        (["export", "--preset", "tiny", "--set", "depth=3", "--to", "x"], "depth"),
    ],
)
def test_export_usage_errors(capsys, tmp_path, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, *argv)
    assert code == 1 and message in err
    assert not (tmp_path / "x").exists()


def test_export_refuses_a_non_empty_folder(capsys, tmp_path):
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    code, _, err = run(capsys, "export", "--preset", "tiny", "--to", str(tmp_path / "busy"))
    assert code == 1 and "--force" in err
    assert main(["export", "--preset", "tiny", "--to", str(tmp_path / "busy"), "--force"]) == 0
    assert (tmp_path / "busy" / "notes.txt").read_text() == "mine"


# --- the installed command --------------------------------------------------------------------


def test_help_and_usage_errors_return_codes(capsys):
    assert main(["--help"]) == 0
    assert "download" in capsys.readouterr().out
    assert main(["frobnicate"]) == 2
    assert main([]) == 2


def test_console_script_runs():
    script = shutil.which("transformer-gmm", path=str(Path(sys.executable).parent))
    command = [script] if script else [sys.executable, "-m", "transformer_gmm"]
    result = subprocess.run(command + ["--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "usage: transformer-gmm" in result.stdout
    for name in ("list", "info", "download", "export"):
        assert name in result.stdout
