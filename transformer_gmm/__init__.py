"""Gaussian mixtures and clustering with a pretrained set transformer.

``TransformerGMM`` stands beside :class:`sklearn.mixture.GaussianMixture` and
``TransformerClusterer`` beside :class:`sklearn.cluster.KMeans`.

The public names are imported on first use (PEP 562), so ``import transformer_gmm`` and
the ``transformer-gmm`` command start without loading PyTorch; the classes keep their
module paths (``transformer_gmm.gmm.TransformerGMM``), so pickles load as before.

Examples
--------
>>> import transformer_gmm
>>> transformer_gmm.__version__
'0.1.0'
>>> from transformer_gmm import TransformerGMM
>>> TransformerGMM.__module__
'transformer_gmm.gmm'
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # type checkers and IDEs see the names; the runtime imports them lazily
    from ._collapsed import CollapsedComponentWarning
    from ._warnings import FallbackWarning
    from .batch import FittedMixtures, fit_many
    from .cluster import TransformerClusterer
    from .engine.device import DeviceMemoryError
    from .engine.model_cache import clear_model_cache
    from .gmm import TransformerGMM
    from .storage.format import CheckpointError

__version__ = "0.1.0"

# Each public name and the module that defines it, imported on first access.
_LAZY_NAMES = {
    "CheckpointError": ".storage.format",
    "CollapsedComponentWarning": "._collapsed",
    "DeviceMemoryError": ".engine.device",
    "FallbackWarning": "._warnings",
    "FittedMixtures": ".batch",
    "TransformerClusterer": ".cluster",
    "TransformerGMM": ".gmm",
    "clear_model_cache": ".engine.model_cache",
    "fit_many": ".batch",
}
# Submodules reachable as attributes after `import transformer_gmm` (as in
# `transformer_gmm.engine.em.fit_em`), imported on first access.
_LAZY_SUBMODULES = {"batch", "cluster", "engine", "gmm", "nn", "storage"}

__all__ = [
    "CheckpointError",
    "CollapsedComponentWarning",
    "DeviceMemoryError",
    "FallbackWarning",
    "FittedMixtures",
    "TransformerClusterer",
    "TransformerGMM",
    "__version__",
    "clear_model_cache",
    "fit_many",
]


def __getattr__(name: str) -> object:
    """Import a public name's module the first time the name is used."""
    if name in _LAZY_NAMES:
        value = getattr(importlib.import_module(_LAZY_NAMES[name], __name__), name)
        globals()[name] = value  # later lookups find it without calling this function
        return value
    if name in _LAZY_SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return list(__all__)
