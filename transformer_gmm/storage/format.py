"""The checkpoint format: a folder of three files, read and written.

- ``config.json``: the :class:`~transformer_gmm.nn.ModelConfig` fields and the
  :class:`~transformer_gmm.nn.ReadingConfig` fields in one object, plus ``model_type`` and
  ``format_version``;
- ``model.safetensors``: the weights (read with safetensors only: never pickle);
- ``README.md``: the model card.

Finding a checkpoint by name, folder or Hub id, and loading it once per process, is
:mod:`transformer_gmm.storage.checkpoints`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from ..nn import MixtureTransformer, ModelConfig, ReadingConfig
from ..nn.config import shown, split_checkpoint_config
from ..nn.model import scale_width

MODEL_TYPE = "transformer_gmm.MixtureTransformer"
FORMAT_VERSION = 1
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
CARD_FILE = "README.md"
CHECKPOINT_FILES = (CONFIG_FILE, WEIGHTS_FILE, CARD_FILE)
# A config.json is a few hundred bytes; a larger one is not read into memory.
MAX_CONFIG_BYTES = 1 << 16
# The safetensors dtypes of floating point weights (the header's names for them).
_FLOAT_DTYPES = frozenset({"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"})
Header = dict[str, tuple[str, tuple[int, ...]]]  # a weights file's tensors: (dtype, shape)


class CheckpointError(ValueError):
    """A checkpoint could not be found, downloaded or loaded.

    Examples
    --------
    >>> from transformer_gmm import CheckpointError
    >>> from transformer_gmm.storage import load_checkpoint
    >>> try:
    ...     load_checkpoint("./no-such-folder")
    ... except CheckpointError as error:
    ...     print(str(error)[:44])
    Checkpoint './no-such-folder' was not found.
    >>> issubclass(CheckpointError, ValueError)
    True
    """


# --- saving ----------------------------------------------------------------------------


def save_checkpoint(
    model: MixtureTransformer, folder: str | os.PathLike, *, model_card: str | None = None
) -> Path:
    """Write ``model`` to ``folder`` (created if needed) as config, weights and model card.

    The folder loads back through ``checkpoint=<folder>`` and is ready to upload to the
    Hugging Face Hub as it is. ``model_card`` defaults to :func:`default_model_card`.

    Parameters
    ----------
    model : MixtureTransformer
        The model to save.
    folder : str or path
        Where to write the three files.
    model_card : str, optional
        The ``README.md`` text.

    Returns
    -------
    folder : pathlib.Path

    Examples
    --------
    >>> import tempfile
    >>> from transformer_gmm.nn import MixtureTransformer, config_from_preset
    >>> model = MixtureTransformer(config_from_preset("tiny"))
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     folder = save_checkpoint(model, tmp + "/my-model")
    ...     print(sorted(path.name for path in folder.iterdir()))
    ...     print(read_checkpoint(folder).config == model.config)
    ['README.md', 'config.json', 'model.safetensors']
    True
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = {"model_type": MODEL_TYPE, "format_version": FORMAT_VERSION}
    config.update(model.config.to_dict())
    config.update(model.reading_config.to_dict())
    tensors = {
        name: tensor.detach().to("cpu", torch.float32).contiguous()
        for name, tensor in model.state_dict().items()
    }
    # Write each file beside its target, then rename: a crash never leaves half a file
    # under the real name, and a reader sees the old file or the new one.
    _replace(folder / WEIGHTS_FILE, lambda p: save_file(tensors, p, metadata={"format": "pt"}))
    _replace(folder / CONFIG_FILE, lambda p: Path(p).write_text(json.dumps(config, indent=2)))
    card = (
        model_card if model_card is not None
        else default_model_card(model.config, reading_config=model.reading_config)
    )
    _replace(folder / CARD_FILE, lambda p: Path(p).write_text(card, encoding="utf-8"))
    return folder


def _replace(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".tmp")
    write(str(tmp))
    os.replace(tmp, path)


def default_model_card(
    config: ModelConfig, *, note: str = "", reading_config: ReadingConfig | None = None
) -> str:
    """A model card (``README.md``) that describes ``config`` and ``reading_config`` (by default
    ``ReadingConfig()``); ``note`` follows the title.

    It opens with the Hub's metadata block, so the Hub lists the checkpoint under the
    ``transformer_gmm`` library.

    Parameters
    ----------
    config : ModelConfig
        The config the card describes.
    note : str, default=""
        A paragraph placed after the title.

    Returns
    -------
    card : str
        Markdown text.

    Examples
    --------
    >>> from transformer_gmm.nn import config_from_preset
    >>> card = default_model_card(config_from_preset("tiny"), note="Trained for tests.")
    >>> card.splitlines()[1]
    'library_name: transformer_gmm'
    >>> "Trained for tests." in card
    True
    """
    reading = ReadingConfig() if reading_config is None else reading_config
    fields = {**config.to_dict(), **reading.to_dict()}
    rows = "\n".join(f"| `{key}` | `{value}` |" for key, value in fields.items())
    k = f"{config.k_min}..{config.k_max}"
    return (
        "---\nlibrary_name: transformer_gmm\ntags: [gaussian-mixture, clustering]\n---\n\n"
        "# transformer_gmm checkpoint\n\n"
        + (note.strip() + "\n\n" if note.strip() else "")
        + f"A `MixtureTransformer` with readout heads for {k} components, reading up to "
        f"{reading.context_size} points of dimension up to {config.d_max}.\n\n"
        "| field | value |\n| --- | --- |\n" + rows + "\n\n"
        "```python\nfrom transformer_gmm import TransformerGMM\n\n"
        'gmm = TransformerGMM(n_components=3, checkpoint="<this folder or Hub id>").fit(X)\n```\n'
    )


# --- loading ---------------------------------------------------------------------------


def read_checkpoint(folder: str | os.PathLike) -> MixtureTransformer:
    """Read the checkpoint in ``folder``: in eval mode, on CPU, in float32.

    Strict, for a checkpoint is untrusted input: before anything is built, the config is
    validated (each field's type and bounds) and every size it gives is compared with the
    tensor shapes in the weights file's header; then the weights must match the model's
    shapes exactly, be of a floating point dtype, and be finite. Every failure is a
    :class:`CheckpointError` that names the field or the tensor.

    Parameters
    ----------
    folder : str or path
        A checkpoint folder (for a bundled name or a Hub id, see
        :func:`transformer_gmm.storage.load_checkpoint`).

    Returns
    -------
    model : MixtureTransformer
        A new model, private to the caller.

    Examples
    --------
    >>> import tempfile
    >>> from transformer_gmm.nn import MixtureTransformer, config_from_preset
    >>> model = MixtureTransformer(config_from_preset("tiny"))
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     loaded = read_checkpoint(save_checkpoint(model, tmp))
    >>> loaded.config == model.config, loaded.training
    (True, False)
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"Checkpoint folder {str(folder)!r} does not exist.")
    config, reading = _read_configs(folder / CONFIG_FILE)
    weights = folder / WEIGHTS_FILE
    header = _read_header(weights)
    # Every size the config gives must match the weights file before anything is built: a
    # config that lies (a million layers, say) is refused before the model it describes
    # would use time and memory to build. The model is then built on the meta device,
    # where nothing is allocated and the expected names and shapes come for free.
    _check_sizes(weights, config, header)
    with torch.device("meta"):
        model = MixtureTransformer(config, reading)
    _check_weights(weights, header, model.state_dict())
    state = _read_weights(weights)
    _check_finite(weights, state)
    # Copies, in memory of their own: a tensor read from the file is a view at its byte
    # offset there, and float32 kernels round differently with its alignment, so that two
    # files holding the same tensors in another order (one with a head more, say) gave
    # fits that differ in the last bits. The allocator aligns every copy alike.
    state = {name: tensor.to(torch.float32, copy=True) for name, tensor in state.items()}
    # load_state_dict(assign=True) adopts the loaded tensors as the parameters.
    model.load_state_dict(state, strict=True, assign=True)
    return model.eval()


def read_config(folder: str | os.PathLike) -> ModelConfig:
    """The validated config of the checkpoint in ``folder``, without reading its weights.

    Raises :class:`CheckpointError` naming the field of a config written by a newer or a
    foreign model.

    Parameters
    ----------
    folder : str or path
        A checkpoint folder.

    Returns
    -------
    config : ModelConfig

    Examples
    --------
    >>> import tempfile
    >>> from transformer_gmm.nn import MixtureTransformer, config_from_preset
    >>> model = MixtureTransformer(config_from_preset("tiny"))
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     config = read_config(save_checkpoint(model, tmp))
    >>> config.k_min, config.k_max, config.d_max
    (2, 4, 4)
    """
    return _read_configs(Path(folder) / CONFIG_FILE)[0]


def read_reading_config(folder: str | os.PathLike) -> ReadingConfig:
    """How a fit shows the model of the checkpoint in ``folder`` a dataset (its
    :class:`~transformer_gmm.nn.ReadingConfig`), without reading its weights; errors as
    :func:`read_config`'s.

    Examples
    --------
    >>> import tempfile
    >>> from transformer_gmm.nn import MixtureTransformer, config_from_preset
    >>> from transformer_gmm.nn import reading_from_preset
    >>> model = MixtureTransformer(config_from_preset("tiny"), reading_from_preset("tiny"))
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     reading = read_reading_config(save_checkpoint(model, tmp))
    >>> reading.context_size
    64
    """
    return _read_configs(Path(folder) / CONFIG_FILE)[1]


def _read_configs(path: Path) -> tuple[ModelConfig, ReadingConfig]:
    if not path.is_file():
        raise CheckpointError(
            f"{path} is missing: a checkpoint folder holds {CONFIG_FILE}, {WEIGHTS_FILE} and "
            f"{CARD_FILE}. Save one with transformer_gmm.storage.save_checkpoint."
        )
    d = read_json(path)
    if not isinstance(d, dict):
        raise CheckpointError(f"{path} must hold a JSON object, got {type(d).__name__}.")
    d = dict(d)
    model_type = d.pop("model_type", None)
    if not isinstance(model_type, str) or model_type != MODEL_TYPE:
        raise CheckpointError(
            f"{path}: field 'model_type' is {shown(model_type)}, expected {MODEL_TYPE!r}. "
            "This is not a transformer_gmm checkpoint."
        )
    version = d.pop("format_version", None)
    if type(version) is not int or version != FORMAT_VERSION:  # not True, not 1.0
        raise CheckpointError(
            f"{path}: field 'format_version' is {shown(version)}, but this version of "
            f"transformer_gmm reads format_version {FORMAT_VERSION}. A newer checkpoint needs "
            "a newer transformer_gmm: upgrade it (pip install -U transformer-gmm)."
        )
    try:
        return split_checkpoint_config(d)
    except (TypeError, ValueError, OverflowError, RecursionError) as error:
        raise CheckpointError(f"{path}: {error}") from error


def read_json(path: Path) -> object:
    """The JSON in ``path``, which is untrusted: too large (over ``MAX_CONFIG_BYTES``), too
    deeply nested or with an int too long to convert, it is a :class:`CheckpointError`,
    never a crash.

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     path = Path(tmp) / "config.json"
    ...     _ = path.write_text("[" * 10_000 + "]" * 10_000)
    ...     try:
    ...         read_json(path)
    ...     except CheckpointError as error:
    ...         print("nested too deeply" in str(error))
    True
    """
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)  # never more, whatever the file's size
    except OSError as error:
        raise CheckpointError(f"{path} is not readable ({error}).") from error
    if len(data) > MAX_CONFIG_BYTES:
        raise CheckpointError(
            f"{path} is larger than {MAX_CONFIG_BYTES} bytes, where a config is a few "
            f"hundred. This is not a transformer_gmm checkpoint's {CONFIG_FILE}."
        )
    try:
        return json.loads(data.decode("utf-8"))
    except RecursionError as error:
        raise CheckpointError(
            f"{path} is not readable JSON (nested too deeply). This is not a transformer_gmm "
            f"checkpoint's {CONFIG_FILE}."
        ) from error
    except ValueError as error:  # UnicodeDecodeError, JSONDecodeError, an int too long
        raise CheckpointError(f"{path} is not readable JSON ({shown(str(error))}).") from error


def _read_header(path: Path) -> Header:
    """The name, dtype and shape of each tensor in ``path``, from its header alone: no
    tensor is read."""
    if not path.is_file():
        raise CheckpointError(
            f"{path} is missing: the checkpoint has no weights. Download or copy the whole "
            "checkpoint folder again."
        )
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            header = {}
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                tensor = f.get_slice(name)
                header[name] = (tensor.get_dtype(), tuple(tensor.get_shape()))
            return header
    except (SafetensorError, OSError, ValueError) as error:
        raise _corrupted(path, error) from error


def _read_weights(path: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(path), device="cpu")
    except (SafetensorError, OSError, ValueError) as error:
        raise _corrupted(path, error) from error


def _corrupted(path: Path, error: Exception) -> CheckpointError:
    return CheckpointError(
        f"{path} is truncated or corrupted ({shown(str(error))}). Download or copy the "
        "checkpoint folder again."
    )


def _check_sizes(path: Path, config: ModelConfig, header: Header) -> None:
    """Raise a CheckpointError naming the first config field the weights contradict.

    The tensors compared here fix every size that building the model depends on (how many
    blocks and heads, how wide), so a model is built only when it fits the file;
    :func:`_check_weights` then compares every tensor with the model's.
    """
    first = next(_size_problems(config, header), None)
    if first is not None:
        fields, problem = first
        values = ", ".join(f"{name}={getattr(config, name)!r}" for name in fields)
        raise CheckpointError(
            f"{path} does not match {CONFIG_FILE}: {values} {problem}. The config and the "
            "weights must come from the same save_checkpoint call."
        )


def _size_problems(config: ModelConfig, header: Header) -> Iterator[tuple[tuple[str, ...], str]]:
    """(the fields, what is wrong) for each size of ``config`` the weights contradict."""
    c, d = config, config.d_model
    counts = [
        (("n_layer",), "blocks", range(c.n_layer)),
        (("k_min", "k_max"), "heads", range(c.k_min, c.k_max + 1)),
    ]
    for fields, prefix, implied in counts:
        held = _indices(header, prefix)
        if held != set(implied):
            yield fields, _count_problem(header, prefix, implied, held)
    scales = 1 + c.d_max + scale_width(c)
    anchors = [
        (("d_model", "d_max"), "readin.weight", (d, c.d_max)),
        (("mlp_ratio",), "blocks.0.mlp.fc.weight", (c.mlp_ratio * d, d)),
        (("scale_type",), f"heads.{c.k_min}.out.weight", (scales, d)),
        (("k_posterior_seeds",), "k_posterior_head.seeds", (c.k_posterior_seeds, d)),
        (("cluster_count_seeds",), "cluster_count_head.seeds", (c.cluster_count_seeds, d)),
    ]
    # The heads a config may leave out (0 seeds): then the weights must hold none.
    optional = {
        "k_posterior_head.seeds": "K-posterior", "cluster_count_head.seeds": "cluster-count"
    }
    for fields, name, shape in anchors:
        held_shape = header[name][1] if name in header else None
        if name in optional and shape[0] == 0:
            if held_shape is not None:
                yield fields, f"implies no {optional[name]} head, but the weights hold {name}"
        elif held_shape != shape:
            held = "no such tensor" if held_shape is None else f"shape {held_shape}"
            yield fields, f"implies {name} of shape {shape}, but the weights hold {held}"


def _count_problem(header: Header, prefix: str, implied: range, held: set[int]) -> str:
    """What differs between the blocks (or heads) the config implies and those held."""
    extra = held - set(implied)
    unexpected = sorted(name for name in header if _index(name, prefix) in extra)
    missing = [f"{prefix}.{i}.*" for i in implied if i not in held][:3]
    listed = "".join(
        f": {kind} tensors {shown(names)}"
        for kind, names in (("unexpected", unexpected), ("missing", missing))
        if names
    )
    return (
        f"implies {prefix} {_span(set(implied))}, but the weights hold {prefix} "
        f"{_span(held)}{listed}"
    )


def _indices(header: Header, prefix: str) -> set[int]:
    """The ``i`` of the tensors named ``{prefix}.{i}.*`` (the blocks, the heads)."""
    return {i for i in (_index(name, prefix) for name in header) if i is not None}


def _index(name: str, prefix: str) -> int | None:
    """``i`` for a tensor named ``{prefix}.{i}.*``, else None."""
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == prefix and parts[1].isdigit() and len(parts[1]) < 9:
        return int(parts[1])
    return None


def _span(indices: set[int]) -> str:
    if not indices:
        return "none"
    if len(indices) == max(indices) - min(indices) + 1:
        return f"{min(indices)}..{max(indices)}"
    return shown(sorted(indices))


def _check_weights(path: Path, header: Header, expected: dict[str, torch.Tensor]) -> None:
    """Raise a CheckpointError listing every missing, unexpected and misshapen tensor."""
    problems = []
    missing = sorted(set(expected) - set(header))
    unexpected = sorted(set(header) - set(expected))
    if missing:
        problems.append(f"missing tensors {shown(missing)}")
    if unexpected:
        problems.append(f"unexpected tensors {shown(unexpected)}")
    for name in sorted(set(header) & set(expected)):
        (dtype, got), want = header[name], tuple(expected[name].shape)
        if got != want:
            problems.append(f"{name} has shape {got}, expected {want}")
        elif dtype not in _FLOAT_DTYPES:
            problems.append(f"{name} has dtype {dtype}, expected a floating point dtype")
    if problems:
        raise CheckpointError(
            f"{path} does not match the model described by {CONFIG_FILE}: "
            + "; ".join(problems[:10])
            + (f"; and {len(problems) - 10} more" if len(problems) > 10 else "")
            + ". The config and the weights must come from the same save_checkpoint call."
        )


def _all_finite(tensor: torch.Tensor) -> bool:
    """Whether every value of ``tensor`` is finite. A NaN or an infinity makes the sum
    NaN or infinite, so a finite sum settles it in one pass (torch's isfinite is several
    times slower); a sum that overflows is checked value by value."""
    return bool(torch.isfinite(tensor.sum())) or bool(torch.isfinite(tensor).all())


def _check_finite(path: Path, state: dict[str, torch.Tensor]) -> None:
    """Refuse weights that hold NaN or infinity: every estimate made from them would be
    NaN, and the failure would seem to come from the data."""
    bad = [name for name, tensor in sorted(state.items()) if not _all_finite(tensor)]
    if bad:
        raise CheckpointError(
            f"{path} holds weights that are not finite (NaN or infinity) in {shown(bad)}. The "
            "checkpoint is broken: retrain or download it again, or pass checkpoint=None to "
            "fit with EM from k-means++."
        )
