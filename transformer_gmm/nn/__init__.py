"""The transformer behind the estimators: its config and its model."""

from .config import PRESETS, ModelConfig, ReadingConfig, config_from_preset, reading_from_preset
from .model import MixtureOutput, MixtureTransformer

__all__ = [
    "PRESETS",
    "MixtureOutput",
    "MixtureTransformer",
    "ModelConfig",
    "ReadingConfig",
    "config_from_preset",
    "reading_from_preset",
]
