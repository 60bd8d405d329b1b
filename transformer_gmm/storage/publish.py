"""Publishing checkpoints to the Hugging Face Hub (``push_to_hub``).

Downloading, the cache and offline use are :mod:`transformer_gmm.storage.hub`.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from .checkpoints import export_checkpoint
from .format import CHECKPOINT_FILES, CheckpointError, save_checkpoint
from .time_limits import no_answer, time_limits

if TYPE_CHECKING:
    from ..nn import MixtureTransformer


def push_to_hub(
    source: MixtureTransformer | str | os.PathLike,
    repo_id: str,
    *,
    token: str | None = None,
    private: bool | None = None,
    commit_message: str | None = None,
    model_card: str | None = None,
):
    """Upload a model, or a checkpoint (bundled name, folder or Hub id), to ``repo_id``.

    The repository is created if needed. The checkpoint is written to a temporary folder
    first (config, weights and model card, exactly as
    :func:`~transformer_gmm.storage.save_checkpoint` writes them), so what is uploaded
    loads back through ``checkpoint="<repo_id>"``. Needs a token with write access:
    ``token=``, ``HF_TOKEN``, or ``hf auth login``.

    The requests run under :func:`transformer_gmm.storage.time_limits.time_limits`: a Hub that
    does not answer, or stops answering, ends the push with a :class:`CheckpointError` within
    about twice ``HF_HUB_DOWNLOAD_TIMEOUT`` (10 s by default), where ``huggingface_hub``
    alone would wait forever. (An upload through ``hf_xet`` keeps that library's limits.)

    Returns the ``huggingface_hub`` commit info (its ``commit_url`` links to the commit).

    Parameters
    ----------
    source : MixtureTransformer, str or path
        A model, or a checkpoint as ``checkpoint=`` accepts it.
    repo_id : str
        The Hub repository, ``"org/name"``.
    token : str, optional
        A token with write access; by default the one ``huggingface_hub`` finds.
    private : bool, optional
        Whether to create the repository as private.
    commit_message : str, optional
        The commit message.
    model_card : str, optional
        The ``README.md`` text.

    Returns
    -------
    commit_info : huggingface_hub.CommitInfo

    Raises
    ------
    CheckpointError
        Without a token, or when the Hub cannot be reached or does not answer in time.

    Examples
    --------
    Uploading needs the network and a write token, so this example is not run:

    >>> from transformer_gmm.nn import MixtureTransformer, config_from_preset
    >>> model = MixtureTransformer(config_from_preset("tiny"))
    >>> push_to_hub(model, "me/tiny-gmm", private=True)  # doctest: +SKIP
    >>> push_to_hub("./my-checkpoint", "me/my-gmm")  # doctest: +SKIP
    """
    import huggingface_hub
    from huggingface_hub import constants

    token = token or huggingface_hub.get_token()
    if not token:
        raise CheckpointError(
            f"Pushing to {repo_id!r} needs a Hugging Face token with write access: run "
            "`hf auth login`, set HF_TOKEN, or pass token=."
        )
    with tempfile.TemporaryDirectory(prefix="transformer_gmm_push_") as tmp:
        if isinstance(source, (str, os.PathLike)):
            folder = export_checkpoint(source, Path(tmp) / "checkpoint", model_card=model_card)
        else:
            folder = save_checkpoint(source, Path(tmp) / "checkpoint", model_card=model_card)
        try:
            with time_limits() as headers:
                api = huggingface_hub.HfApi(token=token, headers=headers or None)
                api.create_repo(repo_id, private=private, exist_ok=True)
                return api.upload_folder(
                    repo_id=repo_id,
                    folder_path=str(folder),
                    allow_patterns=list(CHECKPOINT_FILES),
                    commit_message=commit_message or "Upload transformer_gmm checkpoint",
                )
        except Exception as error:
            why = no_answer(error)
            if why is None:  # the Hub's own answer (no access, bad name): its message says it
                raise
            raise CheckpointError(
                f"Pushing to {repo_id!r} failed: the Hub at {constants.ENDPOINT} {why}. Check "
                "the connection (and HF_ENDPOINT, if set) and push again; the repository may "
                "already exist, which is fine."
            ) from error
