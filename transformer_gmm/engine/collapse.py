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
    fitted mixture describes it: no pass over the data), along a direction in which the
    mixture itself varies above that floor. Along a constant feature, or a combination of
    features that is constant (a total of others), every component sits at the floor:
    that is the data's, not a collapse onto a handful of points. ``covariances`` are
    shaped as ``GaussianMixture.covariances_`` with the leading axes of ``weights``;
    ``n_samples`` (float or (...)) is the points, or the total weight, each mixture was
    fitted on.
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
    if covariance_type in ("full", "tied"):
        at_floor = _matrices_at_floor(weights, means, center, covariances, covariance_type, floor)
    elif covariance_type == "diag":
        # Features along which the mixture varies no more than the floor are left out.
        feature_variance = torch.einsum("...k,...kd->...d", weights, spread)  # (..., d)
        varies = (feature_variance > floor[..., None])[..., None, :]  # (..., 1, d)
        smallest = torch.where(varies, variances, torch.inf).amin(dim=-1)  # (..., K)
        at_floor = smallest <= floor[..., None]
    else:  # one variance over every feature: a constant feature alone cannot floor it
        at_floor = variances.amin(dim=-1) <= floor[..., None]
    n_samples = torch.as_tensor(n_samples, dtype=torch.float64, device=weights.device)
    points = weights * n_samples[..., None]
    return at_floor | (points < points_needed(covariance_type, n_features))


def _matrices_at_floor(
    weights: Tensor, means: Tensor, center: Tensor, covariances: Tensor,
    covariance_type: str, floor: Tensor,
) -> Tensor:
    """Whether each component's full (or the shared tied) covariance has an eigenvalue at
    its mixture's ``floor`` (...), bool (..., K), in the directions in which the mixture's
    own covariance (within components plus between their means) is above it."""
    offsets = means - center[..., None, :]  # (..., K, d)
    between = torch.einsum("...k,...ki,...kj->...ij", weights, offsets, offsets)
    if covariance_type == "full":
        total = torch.einsum("...k,...kij->...ij", weights, covariances) + between
        at_floor = _reaches(covariances, floor[..., None])  # (..., K)
    else:
        total = covariances + between
        at_floor = _reaches(covariances, floor)[..., None].expand_as(weights).clone()
    flat = total.shape[:-2].numel()
    data_at_floor = _reaches(total, floor).reshape(flat)  # (B,)
    if not bool(data_at_floor.any()):  # the usual case: the data vary in every direction
        return at_floor
    # Where the data themselves do not vary in some direction, every component sits at the
    # floor there: test each component in the directions they do vary in (a basis of the
    # total's eigenvectors above the floor), one mixture at a time (this is rare).
    at_floor_flat = at_floor.reshape(flat, -1)
    per_mixture = covariances.shape[-3:] if covariance_type == "full" else covariances.shape[-2:]
    covariances_flat = covariances.reshape(flat, *per_mixture)
    totals, floors = total.reshape(flat, *total.shape[-2:]), floor.reshape(flat)
    for b in torch.nonzero(data_at_floor).flatten().tolist():
        values, vectors = torch.linalg.eigh(totals[b])
        basis = vectors[:, values > floors[b]]  # (d, r)
        if basis.shape[1] == 0:  # the data are one point: nothing collapsed onto a few
            at_floor_flat[b] = False
            continue
        projected = basis.mT @ covariances_flat[b] @ basis  # (K, r, r) or (r, r)
        at_floor_flat[b] = _reaches(projected, floors[b])
    return at_floor_flat.reshape(at_floor.shape)


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
