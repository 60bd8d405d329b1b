"""What an estimator's door (:class:`~transformer_gmm._base.TransformerMixtureBase`'s
``_fit`` and ``_read_rows``) hands on: validated rows, the namespace their results go back
to, and whether they are a Dask array's chunks. The door decides that once; the methods
past it read :attr:`Rows.chunked` or call :meth:`Rows.apply`, and ask nothing again."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from . import _dask
from ._array_api import Namespace


class Rows(NamedTuple):
    X: Any  # numpy (dense, or CSR where the estimator takes it), or a Dask array
    namespace: Namespace | None  # where results go back; None: numpy, or dispatch off
    chunked: bool  # a Dask array: computations run on its chunks, lazily

    def apply(self, function, *args, n_columns: int | None = None, dtype=np.float64):
        """``function(X, *args)``; on a Dask array, the same on each chunk, lazily (a Dask
        array of shape (n,) or (n, n_columns))."""
        if self.chunked:
            return _dask.map_rows(function, self.X, *args, n_columns=n_columns, dtype=dtype)
        return function(self.X, *args)
