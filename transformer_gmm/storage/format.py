"""The checkpoint format: a folder of three files, read and written.

- ``config.json``: the :class:`~transformer_gmm.nn.ModelConfig` fields, plus ``model_type``
  and ``format_version``;
- ``model.safetensors``: the weights (read with safetensors only: never pickle);
- ``README.md``: the model card.

Finding a checkpoint by name, folder or Hub id, and loading it once per process, is
:mod:`transformer_gmm.storage.checkpoints`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from ..nn import MixtureTransformer, ModelConfig

MODEL_TYPE = "transformer_gmm.MixtureTransformer"
FORMAT_VERSION = 1
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
CARD_FILE = "README.md"
CHECKPOINT_FILES = (CONFIG_FILE, WEIGHTS_FILE, CARD_FILE)


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
    tensors = {
        name: tensor.detach().to("cpu", torch.float32).contiguous()
        for name, tensor in model.state_dict().items()
    }
    # Write each file beside its target, then rename: a crash never leaves half a file
    # under the real name, and a reader sees the old file or the new one.
    _replace(folder / WEIGHTS_FILE, lambda p: save_file(tensors, p, metadata={"format": "pt"}))
    _replace(folder / CONFIG_FILE, lambda p: Path(p).write_text(json.dumps(config, indent=2)))
    card = model_card if model_card is not None else default_model_card(model.config)
    _replace(folder / CARD_FILE, lambda p: Path(p).write_text(card, encoding="utf-8"))
    return folder


def _replace(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".tmp")
    write(str(tmp))
    os.replace(tmp, path)


def default_model_card(config: ModelConfig, *, note: str = "") -> str:
    """A model card (``README.md``) that describes ``config``; ``note`` follows the title.

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
    rows = "\n".join(f"| `{key}` | `{value}` |" for key, value in config.to_dict().items())
    k = f"{config.k_min}..{config.k_max}"
    return (
        "---\nlibrary_name: transformer_gmm\ntags: [gaussian-mixture, clustering]\n---\n\n"
        "# transformer_gmm checkpoint\n\n"
        + (note.strip() + "\n\n" if note.strip() else "")
        + f"A `MixtureTransformer` with readout heads for {k} components, reading up to "
        f"{config.context_size} points of dimension up to {config.d_max}.\n\n"
        "| field | value |\n| --- | --- |\n" + rows + "\n\n"
        "```python\nfrom transformer_gmm import TransformerGMM\n\n"
        'gmm = TransformerGMM(n_components=3, checkpoint="<this folder or Hub id>").fit(X)\n```\n'
    )


# --- loading ---------------------------------------------------------------------------


def read_checkpoint(folder: str | os.PathLike) -> MixtureTransformer:
    """Read the checkpoint in ``folder``: in eval mode, on CPU, in float32.

    Strict: the config is validated before any tensor is built, and the weights must match
    its shapes exactly. Every failure is a :class:`CheckpointError`.

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
    config = _read_config(folder / CONFIG_FILE)
    state = _read_weights(folder / WEIGHTS_FILE)
    # On the meta device nothing is allocated: the expected names and shapes come for free,
    # and load_state_dict(assign=True) then adopts the loaded tensors as the parameters.
    with torch.device("meta"):
        model = MixtureTransformer(config)
    _check_weights(folder / WEIGHTS_FILE, state, model.state_dict())
    state = {name: tensor.to(torch.float32) for name, tensor in state.items()}
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
    return _read_config(Path(folder) / CONFIG_FILE)


def _read_config(path: Path) -> ModelConfig:
    if not path.is_file():
        raise CheckpointError(
            f"{path} is missing: a checkpoint folder holds {CONFIG_FILE}, {WEIGHTS_FILE} and "
            f"{CARD_FILE}. Save one with transformer_gmm.storage.save_checkpoint."
        )
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{path} is not readable JSON ({error}).") from error
    if not isinstance(d, dict):
        raise CheckpointError(f"{path} must hold a JSON object, got {type(d).__name__}.")
    d = dict(d)
    model_type = d.pop("model_type", None)
    if model_type != MODEL_TYPE:
        raise CheckpointError(
            f"{path}: field 'model_type' is {model_type!r}, expected {MODEL_TYPE!r}. "
            "This is not a transformer_gmm checkpoint."
        )
    version = d.pop("format_version", None)
    if version != FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: field 'format_version' is {version!r}, but this version of "
            f"transformer_gmm reads format_version {FORMAT_VERSION}. A newer checkpoint needs "
            "a newer transformer_gmm: upgrade it (pip install -U transformer-gmm)."
        )
    try:
        return ModelConfig.from_dict(d)
    except (TypeError, ValueError) as error:
        raise CheckpointError(f"{path}: {error}") from error


def _read_weights(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise CheckpointError(
            f"{path} is missing: the checkpoint has no weights. Download or copy the whole "
            "checkpoint folder again."
        )
    try:
        return load_file(str(path), device="cpu")
    except (SafetensorError, OSError) as error:
        raise CheckpointError(
            f"{path} is truncated or corrupted ({error}). Download or copy the checkpoint "
            "folder again."
        ) from error


def _check_weights(
    path: Path, state: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]
) -> None:
    """Raise a CheckpointError listing every missing, unexpected and misshapen tensor."""
    problems = []
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing:
        problems.append(f"missing tensors {missing}")
    if unexpected:
        problems.append(f"unexpected tensors {unexpected}")
    for name in sorted(set(state) & set(expected)):
        got, want = state[name], expected[name]
        if got.shape != want.shape:
            problems.append(f"{name} has shape {tuple(got.shape)}, expected {tuple(want.shape)}")
        elif not got.is_floating_point():
            problems.append(f"{name} has dtype {got.dtype}, expected a floating point dtype")
    if problems:
        raise CheckpointError(
            f"{path} does not match the model described by {CONFIG_FILE}: "
            + "; ".join(problems)
            + ". The config and the weights must come from the same save_checkpoint call."
        )
