"""Gaussian mixtures and clustering with a pretrained set transformer.

``TransformerGMM`` stands beside :class:`sklearn.mixture.GaussianMixture` and
``TransformerClusterer`` beside :class:`sklearn.cluster.KMeans`.
"""

from ._base import FallbackWarning
from .batch import fit_many
from .checkpoints import CheckpointError
from .cluster import TransformerClusterer
from .gmm import TransformerGMM

__version__ = "0.1.0"

__all__ = [
    "CheckpointError",
    "FallbackWarning",
    "TransformerClusterer",
    "TransformerGMM",
    "__version__",
    "fit_many",
]
