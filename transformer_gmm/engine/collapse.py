"""Collapsed components, told from a mixture's parameters alone, batched in torch.

A component collapses when it holds too few points for its covariance: the covariance is
then singular but for ``reg_covar``, and the component's likelihood on its handful of
points grows without bound as ``reg_covar`` shrinks. Such optima win on likelihood and
lose on everything else (new data, agreement with classes). The fits use this to prefer
a run without them (:func:`transformer_gmm.engine.runs.choose`); the estimators, to mark
and warn (``transformer_gmm._collapsed``).
"""

from __future__ import annotations

import torch
from torch import Tensor

# A variance within this factor of reg_covar is at the floor ...
FLOOR_FACTOR = 10.0
# ... where the data vary far more: for data whose variances are themselves near reg_covar,
# every component sits there and none has collapsed onto a handful of points.
RELATIVE_FLOOR = 1e-4


def points_needed(covariance_type: str, n_features: int) -> int:
    """The fewest points whose covariance of ``covariance_type`` is not singular: d + 1 for
    a full covariance, 2 for a variance; a tied covariance is shared, so none per
    component."""
    return {"full": n_features + 1, "diag": 2, "spherical": 2, "tied": 0}[covariance_type]


def collapsed(
    weights: Tensor,
    means: Tensor,
    covariances: Tensor,
    covariance_type: str,
    n_samples: float | Tensor,
    reg_covar: float,
) -> Tensor:
    """Which components collapsed: bool of ``weights``' shape (..., K).

    True where a component holds fewer points than :func:`points_needed`, or where its
    smallest variance is within ``FLOOR_FACTOR`` of ``reg_covar`` and below
    ``RELATIVE_FLOOR`` times the mixture's mean variance per feature (the data's, as the
    fitted mixture describes it: no pass over the data). ``covariances`` are shaped as
    ``GaussianMixture.covariances_`` with the leading axes of ``weights``; ``n_samples``
    (float or (...)) is the points, or the total weight, each mixture was fitted on.
    """
    weights, means, covariances = (t.to(torch.float64) for t in (weights, means, covariances))
    n_features = means.shape[-1]
    if covariance_type == "full":
        variances = covariances.diagonal(dim1=-2, dim2=-1)  # (..., K, d)
    elif covariance_type == "tied":
        variances = covariances.diagonal(dim1=-2, dim2=-1)[..., None, :]
    else:
        variances = covariances if covariance_type == "diag" else covariances[..., None]
    # The mixture's variance per feature: within components plus between their means.
    center = torch.einsum("...k,...kd->...d", weights, means)
    spread = variances + (means - center[..., None, :]) ** 2  # (..., K, d)
    data_variance = torch.einsum("...k,...kd->...", weights, spread) / n_features  # (...)
    floor = torch.clamp(RELATIVE_FLOOR * data_variance, max=FLOOR_FACTOR * reg_covar)  # (...)
    if covariance_type == "full":
        at_floor = _reaches(covariances, floor[..., None])  # (..., K)
    elif covariance_type == "tied":  # one covariance for all: each component shares it
        at_floor = _reaches(covariances, floor)[..., None].expand_as(weights)
    else:
        at_floor = variances.amin(dim=-1) <= floor[..., None]
    n_samples = torch.as_tensor(n_samples, dtype=torch.float64, device=weights.device)
    points = weights * n_samples[..., None]
    return at_floor | (points < points_needed(covariance_type, n_features))


def _reaches(matrices: Tensor, floor: Tensor) -> Tensor:
    """Whether each symmetric matrix (..., d, d) has an eigenvalue at or below its
    ``floor`` (...): the matrix less ``floor`` times the identity is then not positive
    definite, which one Cholesky factorization tells, several times cheaper than the
    eigenvalues (fit_many checks every component of every dataset)."""
    d = matrices.shape[-1]
    batch = matrices.shape[:-2]
    flat, floors = matrices.reshape(-1, d, d), floor.expand(batch).reshape(-1)
    if flat.numel() * flat.element_size() <= _CHUNK_BYTES:  # all at once
        eye = torch.eye(d, dtype=matrices.dtype, device=matrices.device)
        shifted = flat - floors[:, None, None] * eye
        return (torch.linalg.cholesky_ex(shifted).info > 0).reshape(batch)
    # Many or wide (2,000 features: 32 MB a matrix): one at a time, in two buffers made
    # once (column-major, as LAPACK writes), the floor taken off the diagonal in place.
    shifted = flat.new_empty((d, d)).mT
    factor = flat.new_empty((d, d)).mT
    info = torch.empty((), dtype=torch.int32, device=flat.device)
    reaches = []
    for matrix, matrix_floor in zip(flat, floors, strict=True):
        shifted.copy_(matrix).diagonal().sub_(matrix_floor)
        torch.linalg.cholesky_ex(shifted, out=(factor, info))
        reaches.append(info > 0)
    return torch.stack(reaches).reshape(batch)


# Matrices of more bytes than this in all _reaches factorizes one at a time; fewer, all
# at once.
_CHUNK_BYTES = 1 << 24
