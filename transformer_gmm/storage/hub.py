"""Checkpoints from the Hugging Face Hub: download, cache, offline use, integrity.

Everything goes through ``huggingface_hub``, so its settings apply unchanged: ``HF_HOME``
and ``HF_HUB_CACHE`` choose the cache, ``HF_ENDPOINT`` the server (a mirror or a private
Hub), ``HF_TOKEN`` or ``hf auth login`` the token, and ``HF_HUB_OFFLINE=1`` forbids every
request. ``huggingface_hub`` reads these variables when it is imported; ``HF_HUB_OFFLINE``
is also honoured when it is set later, as a notebook might.

No request waits long. ``HF_HUB_ETAG_TIMEOUT`` (10 s by default) bounds the wait for the
Hub's first answer: a Hub that does not answer in time is treated as unreachable, so the
cached copy is used, or a :class:`~transformer_gmm.CheckpointError` says how to get the
files. After that, :func:`~transformer_gmm.storage.time_limits.time_limits` bounds every
wait, a stalled download included, by
``HF_HUB_DOWNLOAD_TIMEOUT`` (10 s by default), and gives up on a request that stays silent
twice in a row, where ``huggingface_hub`` alone would retry it five times or wait forever.
Timeouts bound each silence, not a whole request, so one overall deadline
(:func:`~transformer_gmm.storage.time_limits.deadline`: ``TRANSFORMER_GMM_HUB_DEADLINE``,
23 s by default) bounds everything a download asks of the Hub, against a server that
answers one byte at a time too. With a cached copy, the wait ends there and the copy serves,
with a warning that says so.

A Hub checkpoint is resolved once per process: the first :func:`resolve` downloads (or
finds in the cache) and verifies the files, later calls reuse that folder with no request.
Publishing is :mod:`transformer_gmm.storage.publish`.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from collections.abc import Callable
from pathlib import Path

from .._warnings import warn_user
from .format import CARD_FILE, CHECKPOINT_FILES, WEIGHTS_FILE, CheckpointError
from .time_limits import DeadlinePassed, before_deadline, deadline, no_answer, request_timeout

_SHA256 = re.compile(r"^[0-9a-f]{64}$")  # the Hub's ETag of an LFS file: its sha256
_GIT_SHA1 = re.compile(r"^[0-9a-f]{40}$")  # the ETag of a file kept in git: its blob sha1


def spec(repo_id: str, revision: str | None = None) -> str:
    """``"org/name"`` or ``"org/name@revision"``, the form ``checkpoint=`` accepts.

    Examples
    --------
    >>> spec("org/name"), spec("org/name", "v1")
    ('org/name', 'org/name@v1')
    """
    return repo_id + (f"@{revision}" if revision else "")


def is_offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` forbids requests (read now, not only at import).

    Examples
    --------
    >>> import os
    >>> from unittest import mock
    >>> with mock.patch.dict(os.environ, {"HF_HUB_OFFLINE": "1"}):
    ...     print(is_offline())
    True
    """
    from huggingface_hub import constants

    flag = os.environ.get("HF_HUB_OFFLINE", "")
    return bool(constants.HF_HUB_OFFLINE) or flag.upper() in {"1", "ON", "YES", "TRUE"}


class _NoAnswer(Exception):
    """The Hub could not be reached, did not answer in time, or failed on its side."""

    def __init__(
        self, cause: Exception, endpoint: str, timeout: float, why: str | None = None
    ) -> None:
        super().__init__(str(cause))
        self.cause, self.endpoint, self.timeout, self.why = cause, endpoint, timeout, why


def cache_dir() -> Path:
    """The Hugging Face cache this process uses (``HF_HUB_CACHE``, else ``HF_HOME``/hub).

    Examples
    --------
    >>> from pathlib import Path
    >>> isinstance(cache_dir(), Path)
    True
    """
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


# --- downloading -------------------------------------------------------------------------


def download(
    repo_id: str,
    revision: str | None = None,
    *,
    local_dir: str | os.PathLike | None = None,
    force_download: bool = False,
    token: str | bool | None = None,
    files: tuple[str, ...] = CHECKPOINT_FILES,
) -> Path:
    """Download a checkpoint's ``files`` from the Hub and return their folder.

    Into the Hugging Face cache by default (a file already there is not downloaded
    again, and a commit hash that is cached needs no request at all), or into
    ``local_dir``. The downloaded files are checked against the hashes the Hub advertised.
    Offline (``HF_HUB_OFFLINE=1``) only the cache is read; so it is, with a warning, when
    the Hub does not answer within :func:`request_timeout` seconds or the download does not
    finish within :func:`~transformer_gmm.storage.time_limits.deadline` seconds. Every
    failure is a :class:`~transformer_gmm.CheckpointError` that says what to do.

    Parameters
    ----------
    repo_id : str
        The Hub repository, ``"org/name"``.
    revision : str, optional
        A branch, tag or commit hash; by default the main branch.
    local_dir : str or path, optional
        Download into this folder instead of the cache.
    force_download : bool, default=False
        Download again even if the files are cached.
    token : str or bool, optional
        The token for private or gated repositories; by default the one
        ``huggingface_hub`` finds.
    files : tuple of str
        The files to fetch; by default the config, the weights and the model card.

    Returns
    -------
    folder : pathlib.Path
        The folder that holds the files.

    Examples
    --------
    Offline, a checkpoint that is not cached fails with advice (no request is made):

    >>> import os
    >>> from unittest import mock
    >>> from transformer_gmm import CheckpointError
    >>> with mock.patch.dict(os.environ, {"HF_HUB_OFFLINE": "1"}):
    ...     try:
    ...         download("someone/not-cached")
    ...     except CheckpointError as error:
    ...         print(str(error)[:62])
    Hub checkpoint 'someone/not-cached' is not in the Hugging Face

    Online it returns the folder (not run here: it needs the network):

    >>> folder = download("org/name", "v1", local_dir="./name")  # doctest: +SKIP
    """
    # Imported here: huggingface_hub is slow to import and only Hub checkpoints need it.
    import huggingface_hub

    from .. import __version__

    def snapshot(local_files_only: bool, headers: dict[str, str] | None = None) -> Path:
        # headers only when given: huggingface_hub before 0.26 took no headers= here.
        extra = {"headers": headers} if headers else {}
        return Path(
            huggingface_hub.snapshot_download(
                repo_id,
                revision=revision,
                allow_patterns=list(files),
                local_dir=local_dir,
                force_download=force_download,
                token=token,
                local_files_only=local_files_only,
                etag_timeout=request_timeout(),
                library_name="transformer_gmm",
                library_version=__version__,
                **extra,
            )
        )

    offline = is_offline()
    try:
        if offline:
            folder = snapshot(True)
        else:
            folder = _fetch(snapshot, repo_id, revision, files, token, force_download)
    except Exception as error:  # network, auth, missing repo, offline mode: explained below
        raise CheckpointError(_download_error(repo_id, revision, error, offline)) from error
    missing = _missing(folder, files)
    if missing:
        raise CheckpointError(
            f"Hub checkpoint {spec(repo_id, revision)!r} has no {' or '.join(missing)} (in "
            f"{folder}): the repository is not a transformer_gmm checkpoint, or only part of "
            f"it is cached. {_how_to_get(repo_id, revision)}"
        )
    for name in files:
        verify_file(folder / name, redownload=_redownload(repo_id, revision))
    return folder


def _fetch(
    snapshot: Callable[..., Path],
    repo_id: str,
    revision: str | None,
    files: tuple[str, ...],
    token: str | bool | None,
    force_download: bool,
) -> Path:
    """``snapshot(local_files_only, headers)`` online, never waiting on the Hub longer than
    :func:`~transformer_gmm.storage.time_limits.deadline` in all; without an answer in
    time, the cached copy serves, with a warning.
    """
    from huggingface_hub import constants

    if not force_download and _GIT_SHA1.match(revision or ""):
        # A commit never changes: once it is cached, no request is needed.
        try:
            folder = snapshot(True)
        except Exception:  # not cached, or only in part
            folder = None
        if folder is not None and not _missing(folder, files):
            return folder
    seconds = deadline()
    try:
        return before_deadline(
            lambda headers: _ask_hub(snapshot, repo_id, revision, token, headers), seconds
        )
    except (_NoAnswer, DeadlinePassed) as error:
        if isinstance(error, DeadlinePassed):
            error = _NoAnswer(error, constants.ENDPOINT, seconds, str(error))
        if force_download:  # a forced download must not settle for the cache
            raise error.cause from None
        try:
            folder = snapshot(True)
        except Exception:
            folder = None
        if folder is None or _missing(folder, files):
            raise error from error.cause
        _warn_cached(repo_id, revision, folder, error.why or _why_no_answer(error))
        return folder


def _ask_hub(
    snapshot: Callable[..., Path],
    repo_id: str,
    revision: str | None,
    token: str | bool | None,
    headers: dict[str, str],
) -> Path:
    """Ask the Hub for the revision, then download what the cache lacks; a failure to get
    an answer is a :class:`_NoAnswer`, the Hub's own answers are raised as they are.

    ``snapshot_download``'s first request has no timeout, so one timed request asks first.
    """
    import huggingface_hub
    from huggingface_hub import constants

    from .. import __version__

    timeout = request_timeout()
    api = huggingface_hub.HfApi(
        token=token,
        library_name="transformer_gmm",
        library_version=__version__,
        headers=headers or None,
    )
    try:
        api.model_info(repo_id, revision=revision or constants.DEFAULT_REVISION, timeout=timeout)
    except Exception as error:
        if _hub_answered(error):
            # The Hub's own answer (no such repository or revision, no access) says what
            # is wrong.
            raise
        raise _NoAnswer(error, constants.ENDPOINT, timeout) from error
    try:
        return snapshot(False, headers)
    except Exception as error:
        if no_answer(error) is None:
            raise
        # Unfinished files never count: huggingface_hub writes each one to a temporary
        # name and deletes it when the transfer fails.
        raise _NoAnswer(error, constants.ENDPOINT, timeout, no_answer(error)) from error


def _warn_cached(repo_id: str, revision: str | None, folder: Path, why: str) -> None:
    """Say that the cached copy serves, because the Hub gave no answer."""
    warn_user(
        f"Using the cached copy of Hub checkpoint {spec(repo_id, revision)!r} ({folder}): "
        f"the Hub at {_endpoint()} {why}, so whether it has a newer revision is unknown. "
        "Set HF_HUB_OFFLINE=1 to use the cache without asking the Hub.",
        UserWarning,
    )


def _endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


def _hub_answered(error: Exception) -> bool:
    """Whether ``error`` is the Hub's own answer (a 4xx status), not a failure to get one
    (no connection, no answer in time, or a server error)."""
    from huggingface_hub.utils import HfHubHTTPError

    status = getattr(getattr(error, "response", None), "status_code", None)
    return isinstance(error, HfHubHTTPError) and status is not None and status < 500


def _missing(folder: Path, files: tuple[str, ...]) -> list[str]:
    """The files of ``files`` that ``folder`` lacks; a checkpoint may have no model card."""
    return [name for name in files if name != CARD_FILE and not (folder / name).is_file()]


def _download_error(repo_id: str, revision: str | None, error: Exception, offline: bool) -> str:
    from huggingface_hub.utils import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    name = repr(spec(repo_id, revision))
    cause = f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})"
    if isinstance(error, GatedRepoError):
        return (
            f"Hub checkpoint {name} is gated {cause}. Accept its conditions on its Hub page, "
            "then log in with `hf auth login` or set HF_TOKEN."
        )
    if isinstance(error, RepositoryNotFoundError):
        return (
            f"Hub checkpoint {name} was not found {cause}: check the name, or, if the "
            "repository is private, log in with `hf auth login` or set HF_TOKEN."
        )
    if isinstance(error, RevisionNotFoundError):
        return (
            f"Hub checkpoint {repo_id!r} has no revision {revision!r} {cause}. Pass a branch, "
            "a tag or a full 40-character commit hash after '@'."
        )
    if isinstance(error, _NoAnswer):
        why = error.why or _why_no_answer(error)
        return (
            f"Hub checkpoint {name} is not in the Hugging Face cache ({cache_dir()}) and the "
            f"Hub at {error.endpoint} {why}. Check the connection and try again"
            f"{_SLOW_CONNECTION if isinstance(error.cause, DeadlinePassed) else ''}. "
            f"{_how_to_get(repo_id, revision)}"
        )
    if isinstance(error, DeadlinePassed):  # a forced download
        return (
            f"Could not download Hub checkpoint {name}: the Hub at {_endpoint()} {error}. "
            f"Check the connection and try again{_SLOW_CONNECTION}."
        )
    if offline or isinstance(error, LocalEntryNotFoundError):
        # Offline, huggingface_hub's own message (about local_files_only) would mislead.
        why = "HF_HUB_OFFLINE is set" if offline else f"the Hub could not be reached {cause}"
        return (
            f"Hub checkpoint {name} is not in the Hugging Face cache ({cache_dir()}) and {why}. "
            f"{_how_to_get(repo_id, revision)}"
        )
    return (
        f"Could not download Hub checkpoint {name} {cause}. Check the connection and try "
        f"again. Without internet access: {_how_to_get(repo_id, revision)}"
    )


_SLOW_CONNECTION = (
    " (on a slow connection, allow more time: TRANSFORMER_GMM_HUB_DEADLINE=120, in seconds)"
)


def _why_no_answer(error: _NoAnswer) -> str:
    """Why the Hub's first request got no answer, for a message."""
    reason, detail = type(error.cause).__name__, str(error.cause)
    if "timeout" in reason.lower() or "timed out" in detail.lower():
        return f"did not answer within {error.timeout:g} s (HF_HUB_ETAG_TIMEOUT)"
    return f"could not be reached ({reason}: {detail.splitlines()[0] if detail else ''})"


def _how_to_get(repo_id: str, revision: str | None) -> str:
    name = spec(repo_id, revision)
    return (
        f"On a machine with internet access run `transformer-gmm download {name}` and copy "
        f"its cache folder ({cache_dir() / ('models--' + repo_id.replace('/', '--'))}) into "
        f"the cache here, or run `transformer-gmm download {name} --to <folder>` (or `hf "
        f"download {repo_id}{' --revision ' + revision if revision else ''} --local-dir "
        "<folder>`), copy the folder here and pass checkpoint='<folder>'."
    )


def _redownload(repo_id: str, revision: str | None) -> str:
    return f"Run `transformer-gmm download {spec(repo_id, revision)} --force` to fetch it again."


# --- integrity ---------------------------------------------------------------------------


def verify_file(path: Path, *, redownload: str = "") -> None:
    """Check a downloaded file against the hash the Hub advertised for it, when known.

    The Hub's ETag of a file is its sha256 (files in LFS, such as the weights) or its git
    blob sha1 (small files in git). ``huggingface_hub`` names each cached blob by that
    ETag and writes it into the metadata of a ``local_dir`` download, so a truncated or
    altered file is caught here, before any tensor is read. Files with no known hash
    (copied by hand, or a cache without symlinks) are left to the strict loader.

    Parameters
    ----------
    path : pathlib.Path
        A downloaded file.
    redownload : str, default=""
        Advice appended to the error message.

    Raises
    ------
    CheckpointError
        When the file's hash differs from the advertised one.

    Examples
    --------
    A ``local_dir`` download whose metadata advertises another sha256:

    >>> import hashlib, tempfile
    >>> from pathlib import Path
    >>> from transformer_gmm import CheckpointError
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     path = Path(tmp) / "config.json"
    ...     _ = path.write_text("{}")
    ...     metadata = Path(tmp, ".cache", "huggingface", "download", "config.json.metadata")
    ...     metadata.parent.mkdir(parents=True)
    ...     sha = hashlib.sha256(b"something else").hexdigest()
    ...     _ = metadata.write_text("0" * 40 + "\\n" + sha + "\\n")
    ...     try:
    ...         verify_file(path)
    ...     except CheckpointError as error:
    ...         print("corrupted" in str(error))
    True
    """
    etag = _expected_etag(path)
    if etag is None or not path.is_file():
        return
    if _SHA256.match(etag):
        actual = _file_hash(path, hashlib.sha256())
    elif _GIT_SHA1.match(etag):
        actual = _file_hash(path, hashlib.sha1(f"blob {path.stat().st_size}\0".encode()))
    else:
        return
    if actual != etag:
        raise CheckpointError(
            f"{path} is corrupted: its hash is {actual}, but the Hub advertised {etag} (a "
            f"truncated download, or a changed file). {redownload}".rstrip()
        )


def _expected_etag(path: Path) -> str | None:
    if path.is_symlink():  # the cache: snapshots/<commit>/<file> -> ../../blobs/<etag>
        return Path(os.path.realpath(path)).name
    # A local_dir download: line 1 of .cache/huggingface/download/<file>.metadata is the
    # commit hash, line 2 the ETag (huggingface_hub/_local_folder.py documents the layout).
    metadata = path.parent / ".cache" / "huggingface" / "download" / f"{path.name}.metadata"
    try:
        lines = metadata.read_text().splitlines()
    except OSError:
        return None
    return lines[1].strip() if len(lines) > 1 else None


def _file_hash(path: Path, hasher) -> str:
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            hasher.update(chunk)
    return hasher.hexdigest()


# --- resolving once per process ----------------------------------------------------------

_RESOLVED: dict[tuple, Path] = {}
_RESOLVED_LOCK = threading.Lock()


def resolve(repo_id: str, revision: str | None = None) -> Path:
    """The local folder of Hub checkpoint ``repo_id`` at ``revision``, once per process.

    The first call downloads (or finds in the cache) and verifies the files; later calls
    return the same folder with no request, so a branch such as ``main`` is looked up
    once per process, not at every ``fit``.

    Parameters
    ----------
    repo_id : str
        The Hub repository, ``"org/name"``.
    revision : str, optional
        A branch, tag or commit hash; by default the main branch.

    Returns
    -------
    folder : pathlib.Path

    Examples
    --------
    Offline, a checkpoint that is not cached fails (no request is made):

    >>> import os
    >>> from unittest import mock
    >>> from transformer_gmm import CheckpointError
    >>> with mock.patch.dict(os.environ, {"HF_HUB_OFFLINE": "1"}):
    ...     try:
    ...         resolve("someone/not-cached", "v1")
    ...     except CheckpointError as error:
    ...         print(type(error).__name__)
    CheckpointError
    """
    from huggingface_hub import constants

    # The endpoint and the cache are part of the key: another server or cache is another
    # checkpoint, even under the same name.
    key = (constants.ENDPOINT, constants.HF_HUB_CACHE, repo_id, revision)
    with _RESOLVED_LOCK:  # one download per checkpoint even when threads ask at once
        folder = _RESOLVED.get(key)
        if folder is None or not (folder / WEIGHTS_FILE).is_file():
            folder = download(repo_id, revision)
            _RESOLVED[key] = folder
        return folder


def redownload_hint(repo_id: str, revision: str | None) -> str:
    """What to tell a user whose Hub checkpoint failed to load from the cache.

    Examples
    --------
    >>> hint = redownload_hint("org/name", "v1")
    >>> hint.startswith("The files came from the Hugging Face Hub cache.")
    True
    >>> "transformer-gmm download org/name@v1 --force" in hint
    True
    """
    return f"The files came from the Hugging Face Hub cache. {_redownload(repo_id, revision)}"
