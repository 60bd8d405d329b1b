"""The numpy/torch boundary that every path shares.

The estimators hand numpy arrays in and get numpy arrays back. The modules that fit
(:mod:`~transformer_gmm.engine.starts`, :mod:`~transformer_gmm.engine.fit`,
:mod:`~transformer_gmm.engine.fit_by_blocks`) cross the boundary with what is here: devices and
dtypes, tensors in and out, the backbone, the input-range check, and the out-of-memory
error. Fitting runs in float64 on CPU (to agree with scikit-learn) and float32 on CUDA
(where float64 is slow); fitted parameters come back as float64 numpy arrays so a model
fitted on CUDA predicts and pickles on CPU (the estimators then give them the training
data's dtype). Scoring a fitted mixture, on CPU, is here too.
"""

from __future__ import annotations

import copy
import functools
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

from ..storage import checkpoints
from . import e_step, m_step, precision

# Rows per chunk when scoring: bounds memory at O(chunk * K * d) whatever n_samples is.
_CHUNK_ROWS = 65536


# --- device memory -------------------------------------------------------------------


class DeviceMemoryError(MemoryError):
    """The device (a GPU) ran out of memory; the message says what to make smaller.

    Examples
    --------
    >>> from transformer_gmm import DeviceMemoryError
    >>> issubclass(DeviceMemoryError, MemoryError)
    True
    """


def explain_out_of_memory(function):
    """Re-raise a device out-of-memory error as a DeviceMemoryError that says what to do."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except RuntimeError as error:  # torch.cuda.OutOfMemoryError is a RuntimeError
            if not isinstance(error, torch.cuda.OutOfMemoryError) and (
                "out of memory" not in str(error)
            ):
                raise
            raise DeviceMemoryError(
                "The device ran out of memory. Ask for less at once: fewer datasets per "
                "fit_many call, a smaller n_init or n_views, fewer samples or features (subsample "
                "X, or reduce it with PCA first), or device='cpu'."
            ) from error

    return wrapper


# --- devices, tensors and the backbone -----------------------------------------------


def resolve_device(device: str) -> str:
    """Turn ``"auto"``, ``"cpu"``, ``"cuda"`` or ``"cuda:N"`` into a usable device name."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(
            f"device={device!r} is not a device name. Use 'auto', 'cpu', 'cuda' or 'cuda:N'."
        ) from error
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"device={device!r} was requested but CUDA is not available in this PyTorch "
            f"build or on this machine. Use device='cpu' or device='auto'."
        )
    if resolved.type not in ("cpu", "cuda"):
        raise ValueError(f"device={device!r} is not supported. Use 'auto', 'cpu' or 'cuda'.")
    return str(resolved)


def dtype_for(device: str) -> torch.dtype:
    """The dtype fits compute in on ``device``."""
    return torch.float64 if device == "cpu" else torch.float32


def generator(seed: int, device: str) -> torch.Generator:
    """A generator on ``device`` seeded with ``seed``: a fit's one source of randomness."""
    return torch.Generator(device=device).manual_seed(seed)


def tensor(
    array: np.ndarray | torch.Tensor, device: str, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """``array`` (or a tensor) on ``device``, in ``dtype`` or else :func:`dtype_for`'s."""
    # torch.tensor copies, so read-only and non-contiguous inputs are fine.
    dtype = dtype_for(device) if dtype is None else dtype
    if isinstance(array, torch.Tensor):  # already on the device (canonical order there)
        return array.to(device=device, dtype=dtype)
    return torch.tensor(np.ascontiguousarray(array), dtype=dtype, device=device)


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """``tensor`` as a float64 numpy array."""
    return tensor.detach().to("cpu", torch.float64).numpy()


@dataclass(frozen=True)
class Backbone:
    """A loaded transformer and what the estimators need to know about it."""

    model: torch.nn.Module
    d_max: int
    context_size: int
    supported_n_components: range

    @property
    def noise_directions(self) -> int:
        """Principal directions the model reads beyond the K - 1 (its config says)."""
        return self.model.config.noise_directions


def load_backbone(checkpoint: str | os.PathLike) -> Backbone:
    """Load (once per process) the checkpoint the user named; errors are CheckpointError."""
    model = checkpoints.load_model(checkpoint)
    config = model.config
    return Backbone(model, config.d_max, config.context_size, model.supported_n_components)


def has_bundled(name: str) -> bool:
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


def pad(arrays, device: str, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Stack arrays of shape (n_i, ...) into (B, max n_i, ...), zero-padded, and the mask
    (B, max n_i) of real rows; the mask is None when no row is padding. A 3-D array is
    already a batch: it is copied to the device once, with no loop over its datasets."""
    if isinstance(arrays, np.ndarray | torch.Tensor):
        return tensor(arrays, device, dtype), None
    lengths = [len(a) for a in arrays]
    if len(set(lengths)) == 1:
        stacked = arrays[0][None] if len(arrays) == 1 else np.stack(arrays)  # one copy less
        return tensor(stacked, device, dtype), None
    padded = np.zeros((len(arrays), max(lengths), *arrays[0].shape[1:]))
    for i, array in enumerate(arrays):
        padded[i, : len(array)] = array
    mask = np.arange(max(lengths))[None] < np.array(lengths)[:, None]
    return tensor(padded, device, dtype), torch.tensor(mask, device=device)


# --- input range ---------------------------------------------------------------------


def check_magnitude(
    x: torch.Tensor, mask: torch.Tensor | None, dtypes: list[np.dtype] | None = None
) -> None:
    """Raise a ValueError for a dataset of ``x`` whose sums would overflow its dtype, before
    torch's eigendecomposition or Cholesky fails with an error that says nothing of the data.

    ``dtypes`` are the datasets' own dtypes (B,), where the fit computes in a wider one: a
    float32 dataset is held to float32's range all the same, as its fitted parameters are
    float32 (an overflow there is an infinite covariance and a ``sample`` of NaN), and as
    its fit on a GPU, or scikit-learn's, computes in float32.
    """
    if mask is None:
        highest, lowest = x.amax(dim=1), x.amin(dim=1)  # (B, d)
        n_rows = torch.full(x.shape[:1], x.shape[1], dtype=x.dtype, device=x.device)
    else:
        padding = ~mask[..., None]
        highest = x.masked_fill(padding, -torch.inf).amax(dim=1)
        lowest = x.masked_fill(padding, torch.inf).amin(dim=1)
        n_rows = mask.sum(dim=1).to(x.dtype)
    _check_range(highest, lowest, n_rows, x.shape[-1], on_cuda=x.is_cuda, dtypes=dtypes)


def _check_range(
    highest: torch.Tensor,
    lowest: torch.Tensor,
    n_rows: torch.Tensor,
    n_features: int,
    on_cuda: bool = False,
    dtypes: list[np.dtype] | None = None,
) -> None:
    """:func:`check_magnitude` from each dataset's largest and smallest values (B, d) and
    its number of rows (B,), in their dtype, and the datasets' own ``dtypes`` (B,) or None
    (theirs)."""
    computed = np.dtype(str(highest.dtype).split(".")[-1])
    # Each dataset's range: that of the narrower of the dtype computed in and its own.
    narrowest = [
        computed if dtype is None or np.finfo(dtype).max >= np.finfo(computed).max else dtype
        for dtype in (dtypes or [None] * highest.shape[0])
    ]
    # A margin for the few sums added together.
    limit = highest.new_tensor([float(np.finfo(dtype).max) / 16 for dtype in narrowest])
    spread = (highest - lowest).amax(dim=-1)  # (B,) the widest range of a feature
    magnitude = torch.maximum(highest.abs(), lowest.abs()).amax(dim=-1)  # (B,)
    # Written so that an overflow to inf, or a nan from inf - inf, fails the test.
    safe = (spread * spread * n_rows * n_features < limit) & (magnitude * n_rows < limit)
    if bool(safe.all()):
        return
    i = int((~safe).nonzero()[0, 0])
    dataset = f"Dataset {i}: " if highest.shape[0] > 1 else ""
    rescale = "Rescale X (divide it by a constant, or use sklearn.preprocessing.StandardScaler)"
    cpu = "fit with device='cpu', which computes in float64"
    if narrowest[i] != computed and on_cuda:  # the data's own dtype is the narrower
        fix = f"{rescale}, or cast it to float64 (X.astype(np.float64)) and {cpu}."
    elif narrowest[i] != computed:
        fix = f"{rescale} or cast it to float64 (X.astype(np.float64)), and fit again."
    else:
        fix = f"{rescale} and fit again{', or ' + cpu if on_cuda else ''}."
    raise ValueError(
        f"{dataset}X holds values too large for {narrowest[i]} arithmetic (a feature spans "
        f"{float(spread[i]):.3g}, the largest absolute value is {float(magnitude[i]):.3g}): "
        f"the covariances and squared distances over its {int(n_rows[i])} samples would "
        f"overflow. {fix}"
    )


def check_range(
    highest: np.ndarray, lowest: np.ndarray, n_rows: int, dtype: np.dtype | None = None
) -> None:
    """:func:`check_magnitude` for data known by the largest and smallest value of each
    feature (d,) and the number of rows (a Dask array) and their ``dtype``; in float64, as
    the blocks compute."""
    _check_range(
        tensor(highest, "cpu")[None],
        tensor(lowest, "cpu")[None],
        torch.tensor([float(n_rows)], dtype=torch.float64),
        highest.shape[-1],
        dtypes=None if dtype is None else [dtype],
    )


# --- scoring -------------------------------------------------------------------------


@explain_out_of_memory
def estimate_weighted_log_prob(
    X: np.ndarray,
    weights: np.ndarray,
    means: np.ndarray,
    precisions_cholesky: np.ndarray,
    covariance_type: str,
) -> np.ndarray:
    """log p(x | k) + log w_k of shape (n, K), on CPU in float64, in bounded-memory chunks."""
    params = m_step.MixtureParams(
        weights=tensor(weights, "cpu")[None],
        means=tensor(means, "cpu")[None],
        covariances=None,  # not needed to score
        precisions_cholesky=tensor(precisions_cholesky, "cpu")[None],
    )
    out = np.empty((X.shape[0], means.shape[0]))
    for start in range(0, X.shape[0], _CHUNK_ROWS):
        chunk = tensor(X[start : start + _CHUNK_ROWS], "cpu")[None]
        out[start : start + _CHUNK_ROWS] = to_numpy(
            e_step.estimate_weighted_log_prob(chunk, params, covariance_type)[0]
        )
    return out
