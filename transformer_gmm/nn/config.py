"""The model's hyperparameters (:class:`ModelConfig`), how a fit shows it a dataset
(:class:`ReadingConfig`), their JSON form and a few presets."""

from __future__ import annotations

import dataclasses
import reprlib
from dataclasses import dataclass
from typing import Any

SCALE_TYPES = ("spherical", "diag", "full")


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a :class:`~transformer_gmm.nn.MixtureTransformer`.

    Every field is stored in a checkpoint's ``config.json``; together they fix every
    weight's shape, so a checkpoint is loaded only under the exact config it was saved with.
    How a fit shows the model a dataset (how many rows, which directions) is not the
    model's shape: it is the :class:`ReadingConfig` the checkpoint keeps beside it.

    Parameters
    ----------
    d_max : int, default=8
        Input width: points are standardized and zero-padded (or projected) to ``d_max``.
    k_min, k_max : int, default=2, 10
        A readout head exists for every number of components in ``[k_min, k_max]``.
    n_layer : int, default=4
        Transformer blocks.
    n_head : int, default=4
        Attention heads; must divide ``d_model``.
    d_model : int, default=128
        Token width.
    mlp_ratio : int, default=4
        Hidden width of each block's MLP, as a multiple of ``d_model``.
    scale_type : {"spherical", "diag", "full"}, default="spherical"
        One standard deviation per component, one per coordinate, or a full covariance
        (its lower Cholesky factor) in model space, so that the model's own
        responsibilities can follow elongated, correlated components.
    k_posterior_seeds : int, default=0
        Pooling seeds of the head that reads P(K | X) for K = 1..k_max under a "K unknown"
        task embedding; 0: no such head.
    cluster_count_seeds : int, default=0
        Pooling seeds of the head that reads, from the same tokens, the probability of each
        number of clusters 1..k_max, where a cluster may be any shape (a ring, a curve) and
        so need several Gaussian components; 0: no such head. It needs the "K unknown"
        embedding, so ``k_posterior_seeds`` > 0.
    reads_gaps : int, default=0
        1: the model also reads, for each point, how much of each model-space coordinate
        was missing in the data (filled with its column's mean before standardizing), so
        that it need not take filled values for observed ones; 0: it reads the filled
        points alone.

    Examples
    --------
    >>> from transformer_gmm.nn import ModelConfig
    >>> config = ModelConfig(d_max=2, k_max=5, n_layer=2, d_model=32)
    >>> config.k_min, config.k_max, config.n_head
    (2, 5, 4)
    >>> try:
    ...     ModelConfig(d_model=30, n_head=4)
    ... except ValueError as error:
    ...     print(error)
    d_model must be divisible by n_head, got d_model=30, n_head=4.
    """

    d_max: int = 8  # input width: points are standardized and zero-padded (or projected) to d_max
    k_min: int = 2  # a readout head exists for every K in [k_min, k_max]
    k_max: int = 10
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 128
    mlp_ratio: int = 4
    scale_type: str = "spherical"  # one std per component ("spherical"), per coordinate
    # ("diag"), or a lower Cholesky factor of each component's covariance ("full")
    k_posterior_seeds: int = 0  # pooling seeds of the P(K | X) head; 0: no such head
    cluster_count_seeds: int = 0  # pooling seeds of the number-of-clusters head; 0: none
    reads_gaps: int = 0  # 1: each point's share of each coordinate that was missing is read

    def __post_init__(self) -> None:
        _check_values(self)
        if self.k_min > self.k_max:
            raise ValueError(
                f"k_min and k_max must satisfy 1 <= k_min <= k_max, "
                f"got k_min={self.k_min}, k_max={self.k_max}."
            )
        if self.cluster_count_seeds and not self.k_posterior_seeds:
            raise ValueError(
                "cluster_count_seeds > 0 needs k_posterior_seeds > 0: the number of clusters "
                f"is read under the \"K unknown\" embedding, got "
                f"cluster_count_seeds={self.cluster_count_seeds}, k_posterior_seeds=0."
            )
        if self.d_model % self.n_head != 0:
            raise ValueError(
                f"d_model must be divisible by n_head, got d_model={self.d_model}, "
                f"n_head={self.n_head}."
            )

    def to_dict(self) -> dict[str, Any]:
        """The fields as a plain, JSON-ready dict; :meth:`from_dict` reads it back."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        """Strict inverse of :meth:`to_dict`: every field must be present and no other.

        A config written by a newer or foreign model must not be half-understood, and a
        missing field must not silently take a default that disagrees with the weights.
        The exception is a field added later whose default is what every checkpoint
        written before it did (``k_posterior_seeds``, ``cluster_count_seeds``, ``reads_gaps``:
        0).

        Examples
        --------
        >>> from transformer_gmm.nn import ModelConfig, config_from_preset
        >>> config = config_from_preset("tiny")
        >>> ModelConfig.from_dict(config.to_dict()) == config
        True
        >>> try:
        ...     ModelConfig.from_dict({**config.to_dict(), "dropout": 0.1})
        ... except ValueError as error:
        ...     print(str(error)[:40])
        Unknown ModelConfig field(s) ['dropout']
        """
        return _from_dict(cls, d)


@dataclass(frozen=True)
class ReadingConfig:
    """How a fit shows a :class:`~transformer_gmm.nn.MixtureTransformer` a dataset: no
    weight depends on it, but the model was trained reading data this way, so a checkpoint
    keeps it beside its :class:`ModelConfig` (in the same ``config.json``) and the loaded
    model carries it as ``model.reading_config``, as a language model carries the settings its
    generation reads. The fit (``engine/readout.py``) and the training read it; the
    forward pass does not.

    Parameters
    ----------
    context_size : int, default=256
        The most points one forward pass reads; ``fit`` subsamples larger datasets.
    noise_directions : int, default=0
        Principal directions the model reads beyond the K - 1 that can hold the means,
        when the data has them: they hold only noise, so they show how wide the
        components are.
    summary_cells : int, default=0
        Where a dataset has more rows than this, the model reads it as this many weighted
        cells instead of rows (0: never), up to ``engine.summary.SUMMARY_ROWS`` rows:
        Lloyd's cells of the rows in model space, each read as its centre with its count
        as its weight, which the model reads exactly as that many copies
        (:meth:`MixtureTransformer.forward`). Fewer tokens than rows cost a
        shorter forward pass, and the cells summarize every row rather than a draw.
        Training reads rows (the same model reads both).
    summary_iterations : int, default=8
        Lloyd's iterations of those cells at most, from as many drawn rows: the cells need
        only tile the data, and each iteration costs a few dozen small operations.

    Examples
    --------
    >>> from transformer_gmm.nn import ReadingConfig
    >>> ReadingConfig(context_size=128).noise_directions
    0
    """

    context_size: int = 256  # most points one forward pass reads; fit subsamples larger datasets
    noise_directions: int = 0  # principal directions read beyond the K - 1 the means span
    summary_cells: int = 0  # read a dataset of more rows as this many weighted cells; 0: rows
    summary_iterations: int = 8  # Lloyd's iterations of those cells at most

    def __post_init__(self) -> None:
        _check_values(self)

    def to_dict(self) -> dict[str, Any]:
        """The fields as a plain, JSON-ready dict; :meth:`from_dict` reads it back."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ReadingConfig:
        """Strict inverse of :meth:`to_dict`, as :meth:`ModelConfig.from_dict`
        (``noise_directions``, added later, is 0 where absent)."""
        return _from_dict(cls, d)


def split_checkpoint_config(d: dict[str, Any]) -> tuple[ModelConfig, ReadingConfig]:
    """A checkpoint's ``config.json`` fields (both configs' in one dict) as its
    :class:`ModelConfig` and :class:`ReadingConfig`: strict, as their ``from_dict``.

    Examples
    --------
    >>> from transformer_gmm.nn import ModelConfig, ReadingConfig
    >>> both = {**ModelConfig().to_dict(), **ReadingConfig().to_dict()}
    >>> split_checkpoint_config(both) == (ModelConfig(), ReadingConfig())
    True
    """
    if not isinstance(d, dict):
        raise ValueError(f"A checkpoint's config is a dict, got {type(d).__name__}.")
    model_names = _names(ModelConfig)
    reading_names = _names(ReadingConfig)
    unknown = sorted(set(d) - set(model_names) - set(reading_names))
    if unknown:
        raise ValueError(
            f"Unknown config field(s) {shown(unknown)}; the known fields are "
            f"{model_names + reading_names}."
        )
    model = {name: value for name, value in d.items() if name in model_names}
    reading = {name: value for name, value in d.items() if name in reading_names}
    return ModelConfig.from_dict(model), ReadingConfig.from_dict(reading)


def _names(cls) -> list[str]:
    return [field.name for field in dataclasses.fields(cls)]


def _from_dict(cls, d: dict[str, Any]):
    if not isinstance(d, dict):
        raise ValueError(f"A {cls.__name__} is read from a dict, got {type(d).__name__}.")
    fields = {**{k: v for k, v in _ADDED_LATER.items() if k in _names(cls)}, **d}
    _check_names(fields, cls, require_all=True)
    return cls(**fields)


def _check_values(config) -> None:
    """Each field of ``config`` (a ModelConfig or a ReadingConfig) of its type and within
    its bounds."""
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if field.name == "scale_type":
            if not isinstance(value, str) or value not in SCALE_TYPES:
                raise ValueError(f"scale_type must be one of {SCALE_TYPES}, got {shown(value)}.")
        # bool is an int subclass; a JSON 128.0 is not an int: both are rejected.
        elif not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"{field.name} must be an int, got {shown(value)}.")
        elif value < _SMALLEST.get(field.name, 1):
            smallest = _SMALLEST.get(field.name)
            kind = "a positive int" if smallest is None else f">= {smallest}"
            raise ValueError(f"{field.name} must be {kind}, got {shown(value)}.")
        elif value > LARGEST[field.name]:
            raise ValueError(
                f"{field.name} must be at most {LARGEST[field.name]}, got {shown(value)}."
            )


# Fields added after the first checkpoints, with the value that reproduces what those
# checkpoints' models were trained to read.
_ADDED_LATER: dict[str, Any] = {
    "noise_directions": 0, "k_posterior_seeds": 0, "cluster_count_seeds": 0, "reads_gaps": 0,
    "summary_cells": 0, "summary_iterations": 8,
}
# The int fields that may be 0; every other must be positive.
_SMALLEST = {
    "noise_directions": 0, "k_posterior_seeds": 0, "cluster_count_seeds": 0, "reads_gaps": 0,
    "summary_cells": 0, "summary_iterations": 0,
}
# The largest value of each int field. Far beyond any model that fits in memory, they keep
# a config (a checkpoint's config.json is untrusted input) from asking for a million layers
# or heads, or for sizes whose products overflow, before any weight is read.
LARGEST: dict[str, int] = {
    "d_max": 4096,
    "k_min": 1024,
    "k_max": 1024,
    "context_size": 1 << 20,
    "n_layer": 256,
    "n_head": 1024,
    "d_model": 16384,
    "mlp_ratio": 64,
    "noise_directions": 4096,
    "k_posterior_seeds": 1024,
    "cluster_count_seeds": 1024,
    "reads_gaps": 1,
    "summary_cells": 1 << 20,
    "summary_iterations": 1 << 10,
}

_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxstring, _SHOWN.maxother, _SHOWN.maxlong = 2, 60, 60, 40


def shown(value: Any) -> str:
    """``repr(value)`` cut short: a value from a file may be a huge string, an int of
    thousands of digits or a list nested a thousand deep, and a message shows only its
    start.

    Examples
    --------
    >>> shown(10**400)
    '100000000000000000...0000000000000000000'
    >>> shown([[[[1]]]])
    '[[[...]]]'
    """
    return _SHOWN.repr(value)


def _check_names(d: dict[str, Any], cls, *, require_all: bool) -> None:
    names = _names(cls)
    unknown = sorted(set(d) - set(names))
    if unknown:
        raise ValueError(
            f"Unknown {cls.__name__} field(s) {shown(unknown)}; the known fields are {names}."
        )
    missing = [name for name in names if name not in d]
    if require_all and missing:
        raise ValueError(f"Missing {cls.__name__} field(s) {missing}.")


PRESETS: dict[str, dict[str, Any]] = {  # ModelConfig fields, and a ReadingConfig's context_size
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
    """The preset ``name``'s model ("tiny", "small" or "base") with some fields replaced.

    Parameters
    ----------
    name : {"tiny", "small", "base"}
        The preset, one of the keys of ``PRESETS``.
    **overrides
        ModelConfig fields to replace.

    Returns
    -------
    config : ModelConfig

    Examples
    --------
    >>> from transformer_gmm.nn import config_from_preset
    >>> config = config_from_preset("tiny", scale_type="diag")
    >>> config.d_model, config.n_layer, config.scale_type
    (16, 1, 'diag')
    """
    return _from_preset(ModelConfig, name, overrides)


def reading_from_preset(name: str, **overrides: Any) -> ReadingConfig:
    """The preset ``name``'s :class:`ReadingConfig` with some fields replaced.

    Examples
    --------
    >>> from transformer_gmm.nn import reading_from_preset
    >>> reading_from_preset("tiny", noise_directions=1)
    ReadingConfig(context_size=64, noise_directions=1, summary_cells=0, summary_iterations=8)
    """
    return _from_preset(ReadingConfig, name, overrides)


def _from_preset(cls, name: str, overrides: dict[str, Any]):
    if name not in PRESETS:
        raise ValueError(f"Unknown preset {name!r}; the presets are {sorted(PRESETS)}.")
    _check_names(overrides, cls, require_all=False)
    names = _names(cls)
    preset = {field: value for field, value in PRESETS[name].items() if field in names}
    return cls(**{**preset, **overrides})
