"""Devices and dtypes, and the numpy/torch boundary every fit crosses.

The estimators hand numpy arrays in and get numpy arrays back; the modules that fit
(:mod:`~transformer_gmm.engine.fit`, :mod:`~transformer_gmm.engine.fit_by_blocks`,
:mod:`~transformer_gmm.engine.starts`) move them with what is here: the device a fit runs
on, the dtype it computes in, its generator, tensors in and out (a batch of datasets
padded to one tensor), and the error a device that runs out of memory raises. Fitting
runs in float64 on CPU (to agree with scikit-learn) and float32 on CUDA (where float64 is
slow); fitted parameters come back as float64 numpy arrays, so a model fitted on CUDA
predicts and pickles on CPU (the estimators then give them the training data's dtype).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np
import torch

__all__ = [
    "DeviceMemoryError",
    "dtype_for",
    "entry_point",
    "seeded_generator",
    "pad",
    "resolve_device",
    "tensor",
    "to_numpy",
]

_Function = TypeVar("_Function", bound=Callable)


class DeviceMemoryError(MemoryError):
    """The device (a GPU) ran out of memory; the message says what to make smaller.

    Examples
    --------
    >>> from transformer_gmm import DeviceMemoryError
    >>> issubclass(DeviceMemoryError, MemoryError)
    True
    """


def entry_point(function: _Function) -> _Function:
    """An engine function that the estimators call, numpy in and numpy out: it runs in
    ``torch.inference_mode`` (no autograd bookkeeping on any operation: a small fit is
    thousands of small operations, whose dispatch is much of its time on CPU), and a device
    out-of-memory error is re-raised as a DeviceMemoryError that says what to do.

    Nothing it makes may leave it as a tensor: an inference-mode tensor refuses autograd
    and in-place updates outside inference mode.
    """

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        try:
            with torch.inference_mode():
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

    return wrapper  # type: ignore[return-value]


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


def seeded_generator(seed: int, device: str) -> torch.Generator:
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


def shared_tensor(array: np.ndarray, device: str) -> torch.Tensor:
    """``array`` as :func:`tensor` makes it, but sharing numpy's memory where it can (a
    C-contiguous, writable float64 array, for the CPU): for rows the engine only reads,
    such as a stream's batch, which a copy would cost one more pass over."""
    shareable = array.dtype == np.float64 and array.flags.c_contiguous and array.flags.writeable
    if device == "cpu" and shareable:
        return torch.from_numpy(array)
    return tensor(array, device)


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """``tensor`` as a float64 numpy array."""
    return tensor.detach().to("cpu", torch.float64).numpy()


def pad(
    arrays: Sequence[np.ndarray] | np.ndarray | torch.Tensor, device: str, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor | None]:
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
