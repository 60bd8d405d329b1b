"""Checkpoints that lie: a ``config.json`` with extreme, mistyped or deeply nested values,
or weights that are not finite. A checkpoint from the Hub is untrusted input: each must be
refused with a :class:`CheckpointError` that names the field, quickly and with little
memory, before any model is built.
"""

from __future__ import annotations

import json
import random
import shutil
import threading
import time
import tracemalloc
from pathlib import Path

import pytest
import torch
from conftest import make_tiny_checkpoint
from safetensors.torch import load_file, save_file

from transformer_gmm import CheckpointError, TransformerGMM
from transformer_gmm.cli import main
from transformer_gmm.nn import MixtureTransformer
from transformer_gmm.storage import format as format_module
from transformer_gmm.storage.format import read_checkpoint, read_config

SECONDS = 5.0  # a refusal takes milliseconds; this is for a loaded machine
MEGABYTES = 64  # Python memory a refusal may use at its peak (a small model loads in ~1)


@pytest.fixture(autouse=True, scope="module")
def _warm_up() -> None:
    # The first model a process builds, even on the meta device, imports part of torch
    # (seconds, and memory): done once here, so that the bounds measure the loader alone.
    from conftest import TINY_CHECKPOINT

    read_checkpoint(TINY_CHECKPOINT)


@pytest.fixture
def folder(tmp_path) -> Path:
    return make_tiny_checkpoint(tmp_path / "tiny")


def config_of(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


def write_config(folder: Path, config: dict | str) -> None:
    text = config if isinstance(config, str) else json.dumps(config)
    (folder / "config.json").write_text(text)


def bounded(call, seconds: float = SECONDS, megabytes: float = MEGABYTES):
    """Call in a thread, tracing Python memory; fail if it takes longer than ``seconds`` or
    peaks above ``megabytes``. Returns what it returned or raised."""
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["result"] = call()
        except BaseException as error:  # noqa: BLE001 - whatever it is, the test reports it
            outcome["error"] = error

    tracemalloc.start()
    try:
        start = time.monotonic()
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        thread.join(timeout=seconds)
        elapsed = time.monotonic() - start
        peak = tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()
    assert not thread.is_alive(), f"still loading after {seconds:g} s"
    assert peak < megabytes, f"peaked at {peak:.0f} MiB in {elapsed:.1f} s"
    return outcome.get("result"), outcome.get("error")


def refused(folder: Path, field: str) -> CheckpointError:
    """Load ``folder``; it must fail with a CheckpointError naming ``field``, in bounds."""
    result, error = bounded(lambda: read_checkpoint(folder))
    assert result is None, "a hostile checkpoint was loaded"
    assert isinstance(error, CheckpointError), repr(error)
    assert field in str(error), str(error)
    assert len(str(error)) < 2000  # the value is shown, not dumped
    return error


# --- sizes that cannot match the weights ---------------------------------------------------


@pytest.mark.parametrize(
    "field, value",
    [
        ("k_max", 100_000),
        ("n_layer", 100_000),
        ("d_model", 2**40),
        ("d_max", 2**40),
        ("mlp_ratio", 2**40),
        ("n_head", 2**40),
        ("context_size", 2**40),
        ("k_posterior_seeds", 100_000),
        ("noise_directions", 2**40),
        ("k_min", 100_000),
    ],
)
def test_a_huge_size_is_refused_before_anything_is_built(folder, field, value):
    config = config_of(folder)
    config[field] = value
    if field == "k_min":
        config["k_max"] = value
    write_config(folder, config)
    refused(folder, field)


@pytest.mark.parametrize("field", ["k_max", "n_layer", "d_model", "d_max"])
@pytest.mark.parametrize(
    "value",
    # Beyond any machine (torch overflowed on these), then of the wrong type.
    [2**63, 2**64, 10**400, -(2**63), "4", 4.0, 1e400, True, None, [4], {"k": 4}, float("nan")],
)
def test_an_int_beyond_any_machine_or_of_the_wrong_type_is_named(folder, field, value):
    config = config_of(folder)
    config[field] = value
    write_config(folder, config)  # json.dumps writes nan and inf as NaN and Infinity
    refused(folder, field)


@pytest.mark.parametrize(
    "field, value", [("k_max", 500), ("n_layer", 200), ("d_model", 32), ("k_posterior_seeds", 2)]
)
def test_a_plausible_size_that_the_weights_do_not_have(folder, monkeypatch, field, value):
    # Within the bounds, but not what the weights file holds: refused from its header,
    # before a model is built or a tensor read.
    config = config_of(folder)
    config[field] = value
    write_config(folder, config)
    monkeypatch.setattr(format_module, "load_file", never_read)
    monkeypatch.setattr(format_module, "MixtureTransformer", never_built)
    error = refused(folder, field)
    assert "model.safetensors" in str(error)


def never_built(*args, **kwargs):
    raise AssertionError("a model was built before the sizes were checked")


def test_an_int_too_long_to_parse(folder):
    text = (folder / "config.json").read_text().replace('"k_max": 4', '"k_max": ' + "9" * 5000)
    write_config(folder, text)
    refused(folder, "config.json")


@pytest.mark.parametrize("field", ["scale_type", "model_type"])
def test_a_huge_string_is_shown_short(folder, field):
    config = config_of(folder)
    config[field] = "x" * 50_000
    write_config(folder, config)
    refused(folder, field)


# --- nesting ---------------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [100_000, 10_000, 950])
def test_deep_nesting_is_a_checkpoint_error(folder, depth):
    # 100,000 deep is larger than any config; 10,000 is not, and nests too deeply to parse.
    write_config(folder, "[" * depth + "]" * depth)
    refused(folder, "config.json")


@pytest.mark.parametrize("depth", [100_000, 10_000, 950, 400])
def test_a_deeply_nested_value_is_named(folder, depth):
    text = (folder / "config.json").read_text()
    write_config(folder, text.replace('"k_max": 4', '"k_max": ' + "[" * depth + "]" * depth))
    refused(folder, "k_max" if depth < 900 else "config.json")


def test_a_huge_config_file_is_not_read(folder):
    config = config_of(folder)
    config["padding"] = " " * (8 << 20)
    write_config(folder, config)
    _, error = bounded(lambda: read_checkpoint(folder), megabytes=4)  # never read whole
    assert isinstance(error, CheckpointError) and "larger than" in str(error), repr(error)


def test_read_config_refuses_the_same(folder):
    write_config(folder, "[" * 100_000 + "]" * 100_000)
    _, error = bounded(lambda: read_config(folder))
    assert isinstance(error, CheckpointError)


def test_the_cli_lists_a_cache_with_a_hostile_config(tmp_path, capsys):
    # `transformer-gmm list` reads every cached config.json: a hostile one is skipped.
    snapshot = tmp_path / "hub" / "models--org--bad" / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    (tmp_path / "hub" / "models--org--bad" / "refs").mkdir()
    (tmp_path / "hub" / "models--org--bad" / "refs" / "main").write_text("a" * 40)
    assert main(["list", "--cache-dir", str(tmp_path / "hub")]) == 0
    assert "org/bad" not in capsys.readouterr().out


# --- weights ---------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_weights_are_refused_at_load(folder, bad):
    state = load_file(str(folder / "model.safetensors"))
    state["heads.3.out.weight"][0, 0] = bad
    save_file(state, str(folder / "model.safetensors"))
    error = refused(folder, "heads.3.out.weight")
    assert "not finite" in str(error)


def test_fit_with_non_finite_weights_blames_the_checkpoint(folder, three_blobs):
    state = load_file(str(folder / "model.safetensors"))
    state = {name: torch.full_like(tensor, float("nan")) for name, tensor in state.items()}
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError, match="not finite"):
        TransformerGMM(3, checkpoint=str(folder)).fit(three_blobs)


def test_weights_of_an_integer_dtype_are_refused_before_loading(folder, monkeypatch):
    state = load_file(str(folder / "model.safetensors"))
    state["readin.weight"] = state["readin.weight"].to(torch.int32)
    save_file(state, str(folder / "model.safetensors"))
    monkeypatch.setattr(format_module, "load_file", never_read)
    refused(folder, "readin.weight")


def never_read(*args, **kwargs):
    raise AssertionError("a tensor was read before the header was checked")


# --- fuzzing ---------------------------------------------------------------------------------

FIELDS = [
    "d_max",
    "k_min",
    "k_max",
    "context_size",
    "n_layer",
    "n_head",
    "d_model",
    "mlp_ratio",
    "scale_type",
    "noise_directions",
    "k_posterior_seeds",
    "model_type",
    "format_version",
]


def random_value(rng: random.Random):
    """A value from anywhere: plausible, extreme, mistyped or deeply nested."""
    kind = rng.randrange(12)
    if kind == 0:
        return rng.randint(-3, 20)  # plausible, mostly wrong for these weights
    if kind == 1:
        return rng.choice([0, 1, 2, 4, 16, 64, 128, 2**31 - 1, 2**31, 2**53, 2**63 - 1])
    if kind == 2:
        return rng.choice([2**63, 2**64, -(2**63), 10**18, 10**400, -(10**400)])
    if kind == 3:
        return rng.randint(-(2**70), 2**70)
    if kind == 4:
        return rng.choice([0.0, 4.0, -1.5, 1e308, float("nan"), float("inf"), -float("inf")])
    if kind == 5:
        return rng.choice(["", "4", "spherical", "full", "x" * rng.randint(1, 100_000)])
    if kind == 6:
        return rng.choice([True, False, None])
    if kind == 7:
        return [rng.randint(0, 9) for _ in range(rng.randint(0, 5))]
    if kind == 8:
        return {"nested": rng.randint(0, 9)}
    if kind == 9:
        return "NEST" + str(rng.choice([10, 500, 990, 5_000, 20_000, 100_000]))  # see below
    if kind == 10:
        return rng.randint(100, 100_000)  # a size that asks for many layers or heads
    return rng.choice(["transformer_gmm.MixtureTransformer", 1])


def fuzzed_config(rng: random.Random, base: dict) -> str:
    """The text of a config.json: ``base`` with a few fields changed, dropped or added,
    sometimes cut short."""
    config = dict(base)
    for _ in range(rng.randint(1, 3)):
        action = rng.random()
        if action < 0.8:
            config[rng.choice(FIELDS)] = random_value(rng)
        elif action < 0.9:
            config.pop(rng.choice(FIELDS), None)
        else:
            config[rng.choice(["extra", "x" * 1000, ""])] = random_value(rng)
    text = json.dumps(config)
    for depth in (10, 500, 990, 5_000, 20_000, 100_000):
        text = text.replace(f'"NEST{depth}"', "[" * depth + "]" * depth)
    if rng.random() < 0.05:
        text = text[: rng.randrange(len(text))]
    return text


def test_fuzzed_configs_are_loaded_or_refused_within_bounds(folder, tmp_path):
    rng = random.Random(20240611)
    base = config_of(folder)
    weights = folder / "model.safetensors"
    case = tmp_path / "case"
    case.mkdir()
    shutil.copy(weights, case / "model.safetensors")
    outcomes = {"loaded": 0, "refused": 0}
    for i in range(300):
        text = fuzzed_config(rng, base)
        write_config(case, text)
        model, error = bounded(lambda: read_checkpoint(case), seconds=SECONDS)
        if error is None:
            assert isinstance(model, MixtureTransformer)
            outcomes["loaded"] += 1
        else:
            assert isinstance(error, CheckpointError), f"case {i}: {text[:200]!r}: {error!r}"
            assert len(str(error)) < 2000, f"case {i}: a message of {len(str(error))} chars"
            outcomes["refused"] += 1
    assert outcomes["refused"] > 250  # almost every change breaks the config
    assert outcomes["loaded"] >= 1  # the unchanged and harmless ones load


def test_fit_reports_a_hostile_config_as_a_checkpoint_error(folder, three_blobs):
    config = config_of(folder)
    config["n_layer"] = 10**400
    write_config(folder, config)
    with pytest.raises(CheckpointError, match="n_layer"):
        TransformerGMM(3, checkpoint=str(folder)).fit(three_blobs)
