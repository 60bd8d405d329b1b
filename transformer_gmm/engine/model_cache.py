"""The loaded transformers: a checkpoint's model, loaded once, and its copies on devices.

A fit's transformer start reads the data with the model a checkpoint holds (the
"backbone", a :class:`~transformer_gmm.nn.MixtureTransformer`: its ``config`` says how
many features it reads, ``d_max``, its ``reading_config`` how many rows, ``context_size``, and
``supported_n_components`` which K it has a head for).
:mod:`transformer_gmm.storage.checkpoints` loads it once per process and shares it; this
module keeps the copies fits read (on CPU, weights laid out for products of few rows, or
in bfloat16, :mod:`~transformer_gmm.engine.precision`; on another device, its copy there),
so that fits after the first load and copy nothing, and forgets them all on request
(:func:`clear_model_cache`).
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


# The loaded models are shared (checkpoints caches them on CPU): never change one in place,
# keep the copy fits read on each device instead (on CPU, float32 or, where bfloat16
# products are allowed, bfloat16), by (model, device), least recently used first.
# As many as the CPU cache keeps models: a copy holds device memory, and a process that
# tries many checkpoints keeps at most four of them there.
_DEVICE_CACHE_SIZE = 4
_MODELS_ON_DEVICES: OrderedDict[tuple[torch.nn.Module, str], torch.nn.Module] = OrderedDict()
_MODELS_ON_DEVICES_LOCK = threading.Lock()


def model_on(model: torch.nn.Module, device: str) -> torch.nn.Module:
    """``model``'s copy on ``device`` (made once while used): on CPU, the copy whose weights
    are laid out for products of few rows, or, where the user allowed bfloat16 matrix
    products, the copy that multiplies in bfloat16 (:mod:`~transformer_gmm.engine.precision`)."""
    bfloat16 = precision.bfloat16_matmuls(device)
    key = (model, "cpu:bfloat16" if bfloat16 else device)
    with _MODELS_ON_DEVICES_LOCK:  # one copy per model and device even when threads ask
        if key not in _MODELS_ON_DEVICES:
            if bfloat16:
                copied = precision.bfloat16_copy(model)
            elif device == "cpu":
                copied = precision.float32_copy(model)
            else:
                copied = copy.deepcopy(model).to(device)
            _MODELS_ON_DEVICES[key] = copied
            while len(_MODELS_ON_DEVICES) > _DEVICE_CACHE_SIZE:
                _MODELS_ON_DEVICES.popitem(last=False)
        _MODELS_ON_DEVICES.move_to_end(key)
        return _MODELS_ON_DEVICES[key]


def clear_model_cache() -> None:
    """Forget the loaded transformers and the copies fits read; later fits load them again.

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
