"""The loaded transformers: a checkpoint's model, loaded once, and its copies on devices.

A fit's transformer start reads the data with the model a checkpoint holds (the
"backbone", a :class:`~transformer_gmm.nn.MixtureTransformer`: its ``config`` says how
many features it reads, ``d_max``, its ``reading_config`` how many rows, ``context_size``, and
``supported_n_components`` which K it has a head for).
:mod:`transformer_gmm.storage.checkpoints` loads it once per process and shares it; this
module keeps its copies on the other devices (and a bfloat16 copy on CPU,
:mod:`~transformer_gmm.engine.precision`), so that fits after the first load and copy
nothing, and forgets them all on request (:func:`clear_model_cache`).
"""

from __future__ import annotations

import copy
import os
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING

import torch

from ..storage import checkpoints
from . import precision

if TYPE_CHECKING:
    from ..nn import MixtureTransformer

__all__ = ["clear_model_cache", "has_bundled", "load_backbone", "model_on"]


def load_backbone(checkpoint: str | os.PathLike) -> MixtureTransformer:
    """The model of the checkpoint the user named, loaded once per process and shared
    (never change it: :func:`model_on` gives its copy on a device); errors are
    CheckpointError."""
    return checkpoints.load_model(checkpoint)


def has_bundled(name: str) -> bool:
    """Whether a checkpoint of this name comes with the package."""
    return name in checkpoints.bundled_checkpoints()


# The loaded models are shared (checkpoints caches them on CPU): never move one in place,
# keep a copy on each other device instead (and, where bfloat16 products are allowed, a
# bfloat16 copy on CPU), by (model, device), least recently used first.
# As many as the CPU cache keeps models: a copy holds device memory, and a process that
# tries many checkpoints keeps at most four of them there.
_DEVICE_CACHE_SIZE = 4
_MODELS_ON_DEVICES: OrderedDict[tuple[torch.nn.Module, str], torch.nn.Module] = OrderedDict()
_MODELS_ON_DEVICES_LOCK = threading.Lock()


def model_on(model: torch.nn.Module, device: str) -> torch.nn.Module:
    """``model`` itself on CPU; on another device, its copy there (made once while used).
    On a CPU where the user allowed bfloat16 matrix products, its copy that multiplies in
    bfloat16 (:mod:`~transformer_gmm.engine.precision`)."""
    bfloat16 = precision.bfloat16_matmuls(device)
    if device == "cpu" and not bfloat16:
        return model
    key = (model, "cpu:bfloat16" if bfloat16 else device)
    with _MODELS_ON_DEVICES_LOCK:  # one copy per model and device even when threads ask
        if key not in _MODELS_ON_DEVICES:
            _MODELS_ON_DEVICES[key] = (
                precision.bfloat16_copy(model) if bfloat16 else copy.deepcopy(model).to(device)
            )
            while len(_MODELS_ON_DEVICES) > _DEVICE_CACHE_SIZE:
                _MODELS_ON_DEVICES.popitem(last=False)
        _MODELS_ON_DEVICES.move_to_end(key)
        return _MODELS_ON_DEVICES[key]


def clear_model_cache() -> None:
    """Forget the loaded transformers and their copies on GPUs; later fits load them again.

    A process keeps the four most recently used checkpoints' models (and their copies on
    each device) so that fits after the first do not load them again; this frees that
    memory.

    Examples
    --------
    >>> import transformer_gmm
    >>> transformer_gmm.clear_model_cache()
    """
    checkpoints.clear_cache()
    with _MODELS_ON_DEVICES_LOCK:
        _MODELS_ON_DEVICES.clear()
