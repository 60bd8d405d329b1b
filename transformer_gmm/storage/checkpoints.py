"""Checkpoints by name: bundled, in a local folder, or on the Hugging Face Hub.

``checkpoint=`` accepts a bundled name, a local folder or a Hugging Face Hub id
(``"org/name"`` or ``"org/name@revision"``). :func:`load_checkpoint` returns a private
copy of one; :func:`load_model` the shared, frozen copy the estimators use, kept in a
small per-process cache. The folder format is :mod:`transformer_gmm.storage.format`; the
Hub is :mod:`transformer_gmm.storage.hub`.
"""

from __future__ import annotations

import os
import re
import threading
from collections import OrderedDict
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from . import hub
from .format import (
    CARD_FILE,
    CONFIG_FILE,
    WEIGHTS_FILE,
    CheckpointError,
    read_checkpoint,
    save_checkpoint,
)

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

    from ..nn import MixtureTransformer

# "org/name" or "org/name@revision"; the first character of each part must be
# alphanumeric, so "./x", "/x" and "~/x" are never taken for Hub ids.
_HUB_ID = re.compile(
    r"^(?P<repo_id>[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)(?:@(?P<revision>[\w./-]+))?$"
)


# --- finding checkpoints ---------------------------------------------------------------


def _bundled_root() -> Traversable:
    """Where bundled checkpoints live; a function so tests can point it elsewhere."""
    return resources.files("transformer_gmm.pretrained")


def bundled_checkpoints() -> dict[str, Path]:
    """The checkpoints shipped with the package, by name: every folder with a config.json.

    Returns
    -------
    checkpoints : dict of str to pathlib.Path
        Folder of each bundled checkpoint, sorted by name; empty when none is bundled.

    Examples
    --------
    >>> checkpoints = bundled_checkpoints()
    >>> isinstance(checkpoints, dict)
    True
    """
    global _bundled
    root = _bundled_root()
    try:  # the folder and its mtime, where it is one on disk (not inside a zip)
        key = (str(root), os.stat(str(root)).st_mtime_ns)
    except OSError:
        key = None
    if key is None or _bundled is None or _bundled[0] != key:
        found = {}
        for entry in root.iterdir():
            if entry.is_dir() and entry.joinpath(CONFIG_FILE).is_file():
                # A regular package on disk, so the Traversable is a filesystem path.
                found[entry.name] = Path(str(entry))
        _bundled = (key, dict(sorted(found.items())))
    return dict(_bundled[1])


# The last listing of the bundled checkpoints, by their folder and its mtime (a checkpoint
# added or removed changes it): every fit looks its checkpoint up, and listing the folder
# took 40 us of the 140 us that lookup took.
_bundled: tuple[tuple[str, int] | None, dict[str, Path]] | None = None


# The checkpoint the estimators name by default.
DEFAULT_CHECKPOINT = "default"


def is_missing_default(checkpoint) -> bool:
    """The default checkpoint was asked for, but this version bundles none."""
    return checkpoint == DEFAULT_CHECKPOINT and DEFAULT_CHECKPOINT not in bundled_checkpoints()


def resolve_checkpoint(checkpoint: str | os.PathLike) -> Path:
    """The local folder of ``checkpoint``, downloading it first if it is a Hub id.

    Tried in order: a bundled name, an existing local folder, a Hugging Face Hub id
    ``"org/name"`` or ``"org/name@revision"``.

    Parameters
    ----------
    checkpoint : str or path
        A bundled name, a local folder, or a Hub id.

    Returns
    -------
    folder : pathlib.Path
        The folder that holds the checkpoint's files.

    Raises
    ------
    CheckpointError
        When ``checkpoint`` is a file, or none of the above.

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     print(resolve_checkpoint(tmp) == Path(tmp))
    True
    """
    bundled = bundled_checkpoints()
    if isinstance(checkpoint, str) and checkpoint in bundled:
        return bundled[checkpoint]
    path = Path(checkpoint).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise CheckpointError(
            f"Checkpoint {str(checkpoint)!r} is a file; pass the folder that holds "
            f"{CONFIG_FILE} and {WEIGHTS_FILE}."
        )
    hub_id = parse_hub_id(checkpoint)
    if hub_id is not None:
        return hub.resolve(*hub_id)
    names = ", ".join(repr(name) for name in bundled) or "none in this version"
    raise CheckpointError(
        f"Checkpoint {str(checkpoint)!r} was not found. checkpoint= accepts a bundled name "
        f"(bundled: {names}), a path to a local checkpoint folder, or a Hugging Face Hub id "
        "'org/name' or 'org/name@revision'."
    )


def parse_hub_id(checkpoint: str | os.PathLike) -> tuple[str, str | None] | None:
    """``(repo_id, revision)`` when ``checkpoint`` reads as a Hub id, else None.

    Examples
    --------
    >>> parse_hub_id("org/name@v1")
    ('org/name', 'v1')
    >>> parse_hub_id("org/name")
    ('org/name', None)
    >>> parse_hub_id("./folder") is None
    True
    """
    match = _HUB_ID.match(checkpoint) if isinstance(checkpoint, str) else None
    return (match["repo_id"], match["revision"]) if match else None


def export_checkpoint(
    source: str | os.PathLike, folder: str | os.PathLike, *, model_card: str | None = None
) -> Path:
    """Copy checkpoint ``source`` (bundled, local folder or Hub id) into ``folder``.

    The source is loaded strictly and written again with
    :func:`~transformer_gmm.storage.save_checkpoint`, so the folder holds exactly a config,
    float32 weights and a model card (the source's, unless ``model_card`` is given): ready
    to upload, and loadable through ``checkpoint=``.

    Parameters
    ----------
    source : str or path
        The checkpoint to copy, as ``checkpoint=`` accepts it.
    folder : str or path
        Where to write the copy (created if needed); not the source folder itself.
    model_card : str, optional
        The ``README.md`` text of the copy.

    Returns
    -------
    folder : pathlib.Path

    Examples
    --------
    >>> import tempfile
    >>> from transformer_gmm.nn import MixtureTransformer, config_from_preset
    >>> from transformer_gmm.storage import save_checkpoint
    >>> model = MixtureTransformer(config_from_preset("tiny"))
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     source = save_checkpoint(model, tmp + "/source", model_card="# Mine")
    ...     copy = export_checkpoint(source, tmp + "/copy")
    ...     print((copy / "README.md").read_text())
    # Mine
    """
    source_folder = resolve_checkpoint(source)
    if Path(folder).resolve() == source_folder.resolve():
        raise CheckpointError(f"Cannot export checkpoint {str(source)!r} onto itself ({folder}).")
    model = read_checkpoint(source_folder)
    if model_card is None and (source_folder / CARD_FILE).is_file():
        model_card = (source_folder / CARD_FILE).read_text(encoding="utf-8")
    return save_checkpoint(model, folder, model_card=model_card)


# --- loading ---------------------------------------------------------------------------


def load_checkpoint(checkpoint: str | os.PathLike) -> MixtureTransformer:
    """A private copy of ``checkpoint`` (bundled name, folder or Hub id), in eval mode.

    Unlike the shared model of :func:`load_model`, this copy is yours to train (call
    ``.train()``) or change; :func:`~transformer_gmm.storage.save_checkpoint` saves it.

    Parameters
    ----------
    checkpoint : str or path
        A bundled name, a local checkpoint folder, or a Hub id ``"org/name[@revision]"``.

    Returns
    -------
    model : MixtureTransformer
        A new model, on CPU, in float32.

    Examples
    --------
    >>> import tempfile
    >>> import torch
    >>> from transformer_gmm.nn import MixtureTransformer, config_from_preset
    >>> from transformer_gmm.storage import save_checkpoint
    >>> model = MixtureTransformer(config_from_preset("tiny"))
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     copy = load_checkpoint(save_checkpoint(model, tmp))
    >>> copy.config == model.config, copy.training
    (True, False)
    >>> all(torch.equal(a, b) for a, b in zip(copy.parameters(), model.parameters()))
    True
    """
    return _read(resolve_checkpoint(checkpoint), checkpoint)


def _read(folder: Path, checkpoint: str | os.PathLike) -> MixtureTransformer:
    """Read ``folder``, resolved from ``checkpoint``; for a Hub id, say how to fetch it again."""
    try:
        return read_checkpoint(folder)
    except CheckpointError as error:
        hub_id = None if Path(checkpoint).expanduser().is_dir() else parse_hub_id(checkpoint)
        if hub_id is None:
            raise
        raise CheckpointError(f"{error} {hub.redownload_hint(*hub_id)}") from error


# --- the per-process cache -------------------------------------------------------------

# The shared models by their files, least recently used first. A process usually uses one
# or two checkpoints; four lets a few be compared side by side without reloading, while a
# process that tries many (a sweep, a long-lived server) keeps at most four in memory.
_CACHE_SIZE = 4
_CACHE: OrderedDict[tuple[str, ...], tuple[tuple, MixtureTransformer]] = OrderedDict()
_CACHE_LOCK = threading.Lock()


def _model_files(folder: Path) -> tuple[str, ...]:
    """The real paths of the files a model is built from. In the Hub cache they are links
    to content-addressed blobs, so two names for one revision share one model."""
    return tuple(_real_path(str(folder / name)) for name in (CONFIG_FILE, WEIGHTS_FILE))


# Real paths by path and the link's own (mtime, inode): a path's lookup reads every folder
# on the way (54 us for a checkpoint's two files), a link re-pointed or a file replaced
# changes its own.
_REAL_PATHS: dict[tuple[str, int, int], str] = {}
_REAL_PATHS_SIZE = 64


def _real_path(path: str) -> str:
    try:
        stat = os.lstat(path)
    except OSError:
        return os.path.realpath(path)
    key = (path, stat.st_mtime_ns, stat.st_ino)
    real = _REAL_PATHS.get(key)
    if real is None:
        if len(_REAL_PATHS) >= _REAL_PATHS_SIZE:
            _REAL_PATHS.clear()
        real = _REAL_PATHS[key] = os.path.realpath(path)
    return real


def _stamp(files: tuple[str, ...]) -> tuple:
    """(mtime, size) of each file; None for a missing one."""
    stamps = []
    for path in files:
        try:
            stat = os.stat(path)
            stamps.append((stat.st_mtime_ns, stat.st_size))
        except OSError:
            stamps.append(None)
    return tuple(stamps)


def load_model(checkpoint: str | os.PathLike) -> MixtureTransformer:
    """Resolve and load ``checkpoint``, once per process while it is recently used.

    Models are cached by the resolved config and weight files and by their (mtime, size),
    so a rewritten checkpoint is loaded again; a Hub id is looked up on the Hub once per
    process (see :func:`transformer_gmm.storage.hub.resolve`). The cache keeps the four
    most recently used models; :func:`clear_cache` empties it. The returned model is SHARED
    by every caller and frozen (:meth:`~transformer_gmm.nn.MixtureTransformer.freeze`:
    ``requires_grad`` off, eval mode, weights laid out for inference): use it for inference
    only and never modify it; call :func:`load_checkpoint` for a private copy to train or
    change.

    Parameters
    ----------
    checkpoint : str or path
        A bundled name, a local folder, or a Hub id.

    Returns
    -------
    model : MixtureTransformer
        The shared, frozen model.

    Examples
    --------
    >>> import tempfile
    >>> from transformer_gmm.nn import MixtureTransformer, config_from_preset
    >>> from transformer_gmm.storage import save_checkpoint
    >>> model = MixtureTransformer(config_from_preset("tiny"))
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     folder = save_checkpoint(model, tmp)
    ...     first, second = load_model(folder), load_model(folder)
    >>> first is second, next(first.parameters()).requires_grad
    (True, False)
    """
    folder = resolve_checkpoint(checkpoint)
    files = _model_files(folder)
    stamp = _stamp(files)
    with _CACHE_LOCK:  # one load per checkpoint even when threads ask at once
        cached = _CACHE.get(files)
        if cached is not None and cached[0] == stamp:
            _CACHE.move_to_end(files)
            return cached[1]
        model = _read(folder, checkpoint).freeze()
        _CACHE[files] = (stamp, model)  # replaces a stale model of the same files
        _CACHE.move_to_end(files)
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
        return model


def clear_cache() -> None:
    """Forget the shared models :func:`load_model` keeps; the next call loads again.

    :func:`transformer_gmm.clear_model_cache` also drops their copies on other devices.

    Examples
    --------
    >>> clear_cache()
    >>> len(_CACHE)
    0
    """
    with _CACHE_LOCK:
        _CACHE.clear()
