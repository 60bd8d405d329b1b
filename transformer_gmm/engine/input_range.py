"""Whether the data fits the dtype a fit computes in: the check of its range of values.

A fit sums squares of the data (covariances, squared distances). Values too large for
the dtype overflow to inf there, and torch's eigendecomposition or Cholesky then fails
with an error that says nothing of the data; this check says instead which dataset is too
large for which dtype, and what to do. The limit is that of the narrower of the dtype the
fit computes in (:func:`~transformer_gmm.engine.device.dtype_for`) and the data's own:
:func:`check_magnitude` checks a padded batch on its device,
:func:`check_range` data known by its per-feature extremes (a Dask array's summary).
"""

from __future__ import annotations

import numpy as np
import torch

from .device import tensor

__all__ = ["check_magnitude", "check_range"]


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
