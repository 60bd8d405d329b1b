"""The transformer behind the estimators: its config and its model."""

from .config import PRESETS, ModelConfig, config_from_preset
from .model import MixtureOutput, MixtureTransformer

__all__ = ["PRESETS", "MixtureOutput", "MixtureTransformer", "ModelConfig", "config_from_preset"]
