"""The model's hyperparameters: one frozen dataclass, its JSON form and a few presets."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

SCALE_TYPES = ("spherical", "diag")


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a :class:`~transformer_gmm.nn.MixtureTransformer`.

    Every field is stored in a checkpoint's ``config.json``; together they fix every
    weight's shape, so a checkpoint is loaded only under the exact config it was saved with.
    """

    d_max: int = 8  # input width: points are standardized and zero-padded (or projected) to d_max
    k_min: int = 2  # a readout head exists for every K in [k_min, k_max]
    k_max: int = 10
    context_size: int = 256  # most points one forward pass reads; fit subsamples larger datasets
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 128
    mlp_ratio: int = 4
    scale_type: str = "spherical"  # "spherical": one std per component; "diag": one per coordinate

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name == "scale_type":
                if value not in SCALE_TYPES:
                    raise ValueError(f"scale_type must be one of {SCALE_TYPES}, got {value!r}.")
            # bool is an int subclass; a JSON 128.0 is not an int: both are rejected.
            elif not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{field.name} must be a positive int, got {value!r}.")
        if self.k_min > self.k_max:
            raise ValueError(
                f"k_min and k_max must satisfy 1 <= k_min <= k_max, "
                f"got k_min={self.k_min}, k_max={self.k_max}."
            )
        if self.d_model % self.n_head != 0:
            raise ValueError(
                f"d_model must be divisible by n_head, got d_model={self.d_model}, "
                f"n_head={self.n_head}."
            )

    def to_dict(self) -> dict[str, Any]:
        """The fields as a plain, JSON-ready dict."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        """Strict inverse of :meth:`to_dict`: every field must be present and no other.

        A config written by a newer or foreign model must not be half-understood, and a
        missing field must not silently take a default that disagrees with the weights.
        """
        if not isinstance(d, dict):
            raise ValueError(f"A ModelConfig is read from a dict, got {type(d).__name__}.")
        _check_names(d, require_all=True)
        return cls(**d)


def _check_names(d: dict[str, Any], *, require_all: bool) -> None:
    names = [field.name for field in dataclasses.fields(ModelConfig)]
    unknown = sorted(set(d) - set(names))
    if unknown:
        raise ValueError(f"Unknown ModelConfig field(s) {unknown}; the known fields are {names}.")
    missing = [name for name in names if name not in d]
    if require_all and missing:
        raise ValueError(f"Missing ModelConfig field(s) {missing}.")


PRESETS: dict[str, dict[str, Any]] = {
    # For tests: builds and runs in milliseconds, learns nothing useful.
    "tiny": dict(
        d_max=4, k_min=2, k_max=4, context_size=64, n_layer=1, n_head=2, d_model=16, mlp_ratio=4
    ),
    "small": dict(
        d_max=8, k_min=2, k_max=10, context_size=256, n_layer=4, n_head=4, d_model=128, mlp_ratio=4
    ),
    "base": dict(
        d_max=16, k_min=2, k_max=16, context_size=512, n_layer=6, n_head=8, d_model=256, mlp_ratio=4
    ),
}


def config_from_preset(name: str, **overrides: Any) -> ModelConfig:
    """The preset ``name`` ("tiny", "small" or "base") with some fields replaced."""
    if name not in PRESETS:
        raise ValueError(f"Unknown preset {name!r}; the presets are {sorted(PRESETS)}.")
    _check_names(overrides, require_all=False)
    return ModelConfig(**{**PRESETS[name], **overrides})
