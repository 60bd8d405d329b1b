"""k-means on data with missing entries (NaN): k-POD (Chi, Chi and Baraniuk, 2016).

k-POD minimises the inertia over the observed entries alone,
``sum_i sum_{j observed in i} (x_ij - c_{l(i), j})^2``, by majorisation-minimisation:
each iteration fills every missing entry with its row's centre's coordinate, and one
Lloyd step (:func:`~transformer_gmm.engine.kmeans.lloyd`, the same as on complete data)
runs on the filled rows. The filled rows' inertia majorises the observed one and touches
it at the current centres, so the observed inertia never increases. The missing entries
are never imputed in the result: they only carry the current centres through a step.

Why k-POD rather than Lloyd with distances and means over the observed coordinates (the
other common variant, which minimises the same inertia): from the same starts, on iris and
wine with 30 and 50 % of the entries missing completely at random (three seeds), the other
variant's inertia was 0.04 to 1.3 % lower and the ARI of the two within 0.03 of each other
either way (k-POD's 0.0035 higher on average): nothing clearly better, and k-POD reuses
Lloyd as it is.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from .kmeans import lloyd, run_lloyd

__all__ = [
    "KPODResult",
    "centred_observed_squared_distances",
    "fit_kpod",
    "observed_squared_distances",
]


def observed_squared_distances(x: Tensor, observed: Tensor, centers: Tensor) -> Tensor:
    """Squared distances (n, K) over each row's observed coordinates alone (unscaled):
    ``sum_{j observed} (x_j - c_kj)^2``. ``x`` (n, d) is zero where ``observed`` (n, d)
    is False; ``centers`` is (K, d)."""
    weights = observed.to(x.dtype)
    # Expanded as Lloyd's assignment is: one matmul per term, no (n, K, d) temporary.
    squared = (
        x.square().sum(1, keepdim=True)
        - 2.0 * x @ centers.T
        + weights @ centers.square().T
    )
    return squared.clamp_min_(0.0)  # rounding can leave tiny negatives


def centred_observed_squared_distances(x: Tensor, observed: Tensor, centers: Tensor) -> Tensor:
    """:func:`observed_squared_distances` of rows ``x`` (n, d, NaN or anything where not
    ``observed``) to ``centers`` (K, d), both less the centres' mean: the expanded squares
    then keep the digits an offset of the data would take (the differences, and so the
    distances, do not depend on it)."""
    offset = centers.mean(0)
    return observed_squared_distances(
        torch.where(observed, x - offset, 0.0), observed, centers - offset
    )


class _FilledRows:
    """The rows k-POD's Lloyd loop reads (:func:`~transformer_gmm.engine.kmeans.run_lloyd`,
    every fit's): each step fills the missing entries from the current labels' centres and
    takes one Lloyd step (:func:`~transformer_gmm.engine.kmeans.lloyd`) on the filled rows.
    The labels alone are no test of convergence here (the centres go on moving towards
    their clusters' observed means after the labels have settled): the shift decides."""

    def __init__(self, x: Tensor, observed: Tensor, labels: Tensor, weights: Tensor | None):
        self.x, self.observed, self.labels, self.weights = x, observed, labels, weights

    def step(self, centers: Tensor, active: Tensor) -> tuple[Tensor, Tensor]:
        filled = torch.where(self.observed, self.x, centers[0][self.labels])
        step = lloyd(filled[None], centers, max_iter=1, tol=0.0, sample_weight=self.weights,
                     with_inertia=False)
        self.labels = step.labels[0]
        return step.centers, torch.zeros_like(active)

    def take(self, keep: Tensor) -> _FilledRows:
        return self  # one run


@dataclass(frozen=True)
class KPODResult:
    """k-POD's clustering, as numpy arrays in float64."""

    centers: np.ndarray  # (K, d)
    labels: np.ndarray  # (n,) the nearest centre over each row's observed coordinates
    inertia: float  # the (weighted) inertia over the observed entries
    n_iter: int
    converged: bool


def fit_kpod(
    X: np.ndarray,
    centers: np.ndarray,
    *,
    max_iter: int,
    tol: float,
    sample_weight: np.ndarray | None = None,
    device: str = "cpu",
) -> KPODResult:
    """k-POD on ``X`` (n, d), NaN for missing entries, from ``centers`` (K, d), in float64
    on ``device``.

    Each iteration fills the missing entries from the current labels' centres and takes
    one Lloyd step on the filled rows, in every fit's Lloyd loop. It stops when the
    squared shift of the centres, summed over them, is at most ``tol`` times the mean over
    features of the observed entries' variance (Lloyd's rule; the labels alone are no test
    here, as the centres go on moving towards their clusters' observed means after the
    labels have settled), or after ``max_iter`` iterations. The labels returned are the
    nearest centres over each row's observed coordinates, as ``predict`` gives them.
    """
    dtype = torch.float64
    x = torch.as_tensor(X, dtype=dtype, device=device)
    observed = ~torch.isnan(x)
    x_zeroed = torch.where(observed, x, 0.0)
    c = torch.as_tensor(centers, dtype=dtype, device=device)
    weights = (
        None if sample_weight is None
        else torch.as_tensor(sample_weight, dtype=dtype, device=device)[None]
    )
    threshold = tol * float(np.nanvar(X.astype(np.float64), axis=0).mean())
    rows = _FilledRows(x, observed, observed_squared_distances(x_zeroed, observed, c).argmin(1),
                       weights)
    threshold_t = torch.tensor([threshold], dtype=dtype, device=device)
    centers, n_iter, stopped = run_lloyd(rows, c[None], threshold_t, max_iter)
    c, n_iter, converged = centers[0], int(n_iter[0]), bool(stopped[0])
    squared = observed_squared_distances(x_zeroed, observed, c)
    labels = squared.argmin(1)
    nearest = squared.gather(1, labels[:, None])[:, 0]
    inertia = nearest.sum() if weights is None else (nearest * weights[0]).sum()
    return KPODResult(
        centers=c.cpu().numpy(),
        labels=labels.cpu().numpy().astype(np.int32),
        inertia=float(inertia),
        n_iter=n_iter,
        converged=converged,
    )
