"""The one door between the array namespaces users pass and the estimators' numpy/torch
work: with scikit-learn's ``array_api_dispatch`` on, a non-numpy array (a torch tensor,
an ``array-api-strict`` array, ...) is recognised once where data come in, brought to
numpy once (for a torch tensor on CPU, a view of its memory, no copy), and the results
go back once to the input's namespace and device. Without dispatch, or for numpy input,
nothing here changes anything: the estimators take the path they always took."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import sparse
from sklearn import get_config
from sklearn.externals import array_api_compat
from sklearn.utils._array_api import (
    _convert_to_numpy,
    _is_numpy_namespace,
    check_same_namespace,
    get_namespace_and_device,
    move_to,
)

# Constructor parameters that may be arrays of the input's namespace.
MIXTURE_INIT_PARAMETERS = ("weights_init", "means_init", "precisions_init")


@dataclass(frozen=True)
class Namespace:
    """A non-numpy array namespace and device that results are returned in."""

    xp: Any
    device: Any

    def to_input(self, array):
        """``array`` (numpy, or None) in this namespace, on this device."""
        if array is None:
            return None
        return move_to(np.asarray(array), xp=self.xp, device=self.device)


def input_namespace(X) -> Namespace | None:
    """The namespace and device of ``X`` where scikit-learn's ``array_api_dispatch`` is on
    and ``X`` is not numpy (None: the numpy path, as without dispatch). As in
    scikit-learn, everything follows ``X``: ``sample_weight`` and the other arrays are
    read whatever their namespace."""
    if not get_config()["array_api_dispatch"]:
        return None
    # Sparse input keeps its own path (a Dask array never comes here: the estimators'
    # doors take it first).
    if sparse.issparse(X):
        return None
    xp, is_array_api, device = get_namespace_and_device(X)
    if not is_array_api or _is_numpy_namespace(xp):
        return None
    return Namespace(xp, device)


def to_numpy(array):
    """``array`` as a numpy array (None, numpy arrays, lists and scalars as they are); a
    torch tensor on CPU becomes a view of its memory, one elsewhere is copied to the host.
    Does not depend on ``array_api_dispatch``: fitted attributes of any namespace are read
    through it."""
    if array is None or isinstance(array, (np.ndarray, list, tuple, int, float, str)):
        return array
    if sparse.issparse(array):
        return array
    module = type(array).__module__.split(".")[0]
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(array, torch.Tensor):
        return array.detach().cpu().numpy()
    if module == "array_api_strict" and hasattr(array, "__array_namespace__"):
        import array_api_strict

        return _convert_to_numpy(array, array_api_strict)
    return array  # pandas and other array-likes: validation converts them as before


def _fitted(estimator) -> dict:
    """``estimator``'s attributes other than its constructor parameters."""
    params = estimator.get_params(deep=False)
    return {name: value for name, value in vars(estimator).items() if name not in params}


def attributes_to_numpy(estimator) -> None:
    """Set ``estimator``'s fitted arrays of another namespace back to numpy, so that the
    numpy code that goes on from them (a warm start) reads what it always read; numpy
    ones are left as they are, the same objects."""
    for name, value in _fitted(estimator).items():
        converted = to_numpy(value)
        if converted is not value:
            setattr(estimator, name, converted)


def attributes_to_input(estimator, namespace: Namespace | None) -> None:
    """Set ``estimator``'s fitted numeric arrays in the training data's namespace and
    device, as scikit-learn's estimators return them (names of features stay numpy)."""
    if namespace is None:
        return
    for name, value in _fitted(estimator).items():
        if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
            setattr(estimator, name, namespace.to_input(value))


def check_fitted_namespace(X, estimator, attribute: str, method: str) -> None:
    """scikit-learn's error, which says how to move the estimator, where ``X`` (dispatch
    on) is not of the namespace and device ``estimator`` was fitted on."""
    if not sparse.issparse(X):
        check_same_namespace(X, estimator, attribute=attribute, method=method)


def attribute_namespace(array) -> Namespace | None:
    """The namespace and device of a fitted attribute (None for numpy): what
    ``sample`` returns its draws in."""
    if array is None or isinstance(array, np.ndarray):
        return None
    # Read from the array itself: dispatch may have been turned off since the fit.
    return Namespace(array_api_compat.array_namespace(array), array_api_compat.device(array))


def returned(values, namespace: Namespace | None):
    """``values`` (numpy) in ``namespace`` (None: as they are)."""
    if namespace is None or not isinstance(values, np.ndarray):
        return values
    return namespace.to_input(values)


def check_numpy_stream(name: str, X) -> None:
    """``partial_fit`` keeps its running state in numpy: with dispatch on, a batch of
    another namespace raises, saying what to pass instead."""
    namespace = input_namespace(X)
    if namespace is not None:
        raise NotImplementedError(
            f"{name}.partial_fit takes numpy arrays only when array_api_dispatch is on, "
            f"not arrays of {namespace.xp.__name__}. Pass numpy batches (for a torch "
            "tensor, X.cpu().numpy()), or use fit, which takes them."
        )
