"""The transformer_gmm checkpoints in the local Hugging Face cache (what ``transformer-gmm
list`` shows). Read from disk only: listing never touches the network."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .format import CONFIG_FILE, MODEL_TYPE, CheckpointError, read_json
from .hub import cache_dir, spec


@dataclass(frozen=True)
class CachedCheckpoint:
    """One revision of a transformer_gmm checkpoint in the Hugging Face cache.

    Attributes
    ----------
    repo_id : str
        The Hub repository.
    commit_hash : str
        The revision's commit.
    refs : tuple of str
        Branches and tags that point at this revision, e.g. ``("main",)``.
    folder : pathlib.Path
        The snapshot folder in the cache.
    size : int
        Bytes on disk.

    Examples
    --------
    >>> from pathlib import Path
    >>> cached = CachedCheckpoint("org/name", "a" * 40, ("v1",), Path("snapshot"), 1024)
    >>> cached.name
    'org/name@v1'
    """

    repo_id: str
    commit_hash: str
    refs: tuple[str, ...]  # branches and tags that point at this revision, e.g. ("main",)
    folder: Path
    size: int  # bytes on disk

    @property
    def name(self) -> str:
        """What to pass as ``checkpoint=`` for this revision.

        Examples
        --------
        >>> from pathlib import Path
        >>> CachedCheckpoint("org/name", "a" * 40, ("main",), Path("snapshot"), 1024).name
        'org/name'
        >>> CachedCheckpoint("org/name", "abc", (), Path("snapshot"), 1024).name
        'org/name@abc'
        """
        if "main" in self.refs:
            return self.repo_id
        return spec(self.repo_id, self.refs[0] if self.refs else self.commit_hash)


def cached_checkpoints(cache: str | os.PathLike | None = None) -> list[CachedCheckpoint]:
    """The transformer_gmm checkpoints in the Hugging Face cache, sorted by name.

    Read from disk only; other models in the cache are skipped.

    Parameters
    ----------
    cache : str or path, optional
        The cache folder; by default :func:`~transformer_gmm.storage.hub.cache_dir`.

    Returns
    -------
    checkpoints : list of CachedCheckpoint

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as empty_cache:
    ...     print(cached_checkpoints(empty_cache))
    []
    """
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.utils import CacheNotFound

    try:
        info = scan_cache_dir(cache if cache is not None else cache_dir())
    except CacheNotFound:
        return []
    found = []
    for repo in info.repos:
        if repo.repo_type != "model":
            continue
        for revision in repo.revisions:
            if _is_ours(revision.snapshot_path / CONFIG_FILE):
                found.append(
                    CachedCheckpoint(
                        repo_id=repo.repo_id,
                        commit_hash=revision.commit_hash,
                        refs=tuple(sorted(revision.refs)),
                        folder=revision.snapshot_path,
                        size=revision.size_on_disk,
                    )
                )
    return sorted(found, key=lambda c: (c.repo_id, c.name))


def _is_ours(config_path: Path) -> bool:
    try:
        config = read_json(config_path)  # any file in the cache is untrusted input
    except CheckpointError:
        return False
    return isinstance(config, dict) and config.get("model_type") == MODEL_TYPE
