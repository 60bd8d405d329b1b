"""Gaussian densities and conversions between covariances and precisions, batched.

Shapes are scikit-learn's with a leading batch dimension: covariances (and
``precisions_cholesky``, with scikit-learn's meaning) are full (B, K, d, d), tied
(B, d, d), diag (B, K, d), spherical (B, K). The formulas follow
``sklearn/mixture/_gaussian_mixture.py``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from .batching import matmul

__all__ = [
    "COVARIANCE_TYPES",
    "PARAM_SHAPES",
    "compute_precision_cholesky",
    "IllDefinedCovariance",
    "covariances_from_precisions_cholesky",
    "estimate_log_gaussian_prob",
    "lookup",
    "needs_grad",
    "try_precision_cholesky",
]

COVARIANCE_TYPES = ("full", "tied", "diag", "spherical")

# Shape of one dataset's covariances (or precisions_cholesky) for K components in d dims.
PARAM_SHAPES = {
    "full": lambda k, d: (k, d, d),
    "tied": lambda k, d: (d, d),
    "diag": lambda k, d: (k, d),
    "spherical": lambda k, d: (k,),
}


def lookup(table: dict[str, Callable], covariance_type: str) -> Callable:
    """``table``'s entry for ``covariance_type``; a ValueError that names the four types
    for any other."""
    if covariance_type not in table:
        raise ValueError(
            f"covariance_type must be one of {COVARIANCE_TYPES}, got {covariance_type!r}"
        )
    return table[covariance_type]


# --- precisions ------------------------------------------------------------------------

_ERROR_MESSAGE = (
    "Fitting the mixture model failed because some components have ill-defined empirical "
    "covariance (for instance caused by singleton or collapsed samples). Try to decrease "
    "the number of components, increase reg_covar, or scale the input data."
)


class IllDefinedCovariance(ValueError):
    """A covariance that is not positive definite, with scikit-learn's message (and its
    advice for float32 data). A ValueError, as scikit-learn raises; its own class so that
    a float32 fit on a GPU can tell it from other errors and refit in float64."""

    def __init__(self, dtype: torch.dtype) -> None:
        message = _ERROR_MESSAGE
        if dtype == torch.float32:
            message += (
                " The numerical accuracy can also be improved by passing float64 data instead"
                " of float32."
            )
        super().__init__(message)
        self.dtype = dtype


# From this many features, full covariances are factored and inverted one matrix at a
# time: LAPACK works on each matrix alone either way, and a batch of wide matrices holds
# column-major copies of all of them at once (inputs, factors and the identity broadcast
# to the batch) where one at a time holds one.
ONE_MATRIX_AT_A_TIME = 256


# Each returns the factors and where they fail (not positive definite, or not finite),
# of a shape that broadcasts against the covariances.


def _precision_cholesky_matrix(covariances: Tensor) -> tuple[Tensor, Tensor]:
    n_features = covariances.shape[-1]
    if n_features < ONE_MATRIX_AT_A_TIME or covariances.dim() == 2:
        eye = torch.eye(n_features, dtype=covariances.dtype, device=covariances.device)
        lower, info = torch.linalg.cholesky_ex(covariances)  # (..., d, d)
        precisions_chol = torch.linalg.solve_triangular(lower, eye, upper=False).mT
        return precisions_chol, (info != 0)[..., None, None] | ~torch.isfinite(precisions_chol)
    matrices = covariances.reshape(-1, n_features, n_features)
    # Every d x d array here is column-major, as LAPACK writes them: the factor and each
    # inverse are written in place (out=), to the bit what fresh outputs would hold, and
    # no matrix-sized array is made or freed per matrix (on wide data each is 32 MB, and
    # the C allocator keeps freed blocks of that size in its heap).
    solved = matrices.new_empty(matrices.shape).mT  # (M, d, d): each factor's inverse
    eye = torch.eye(n_features, dtype=covariances.dtype, device=covariances.device)
    lower = matrices.new_empty((n_features, n_features)).mT
    info = torch.empty((), dtype=torch.int32, device=matrices.device)
    failures = []
    for i, matrix in enumerate(matrices):
        torch.linalg.cholesky_ex(matrix, out=(lower, info))
        torch.linalg.solve_triangular(lower, eye, upper=False, out=solved[i])
        # Finite where its extremes are (NaN propagates to them): isfinite would make
        # temporaries of the matrix's size.
        extremes = torch.stack([solved[i].amax(), solved[i].amin()])
        failures.append((info != 0) | ~torch.isfinite(extremes).all())
    failed = torch.stack(failures).view(covariances.shape[:-2])
    return solved.reshape(covariances.shape).mT, failed[..., None, None]


def _precision_cholesky_vector(covariances: Tensor) -> tuple[Tensor, Tensor]:
    precisions_chol = 1.0 / covariances.sqrt()
    # Failed where a variance is not positive or is NaN: there 1 / sqrt is NaN or inf, and
    # nowhere else (an infinite variance gives 0). One comparison: isfinite on the factors
    # is several times slower on CPU.
    return precisions_chol, ~(covariances > 0)


_PRECISION_CHOLESKY = {
    "full": _precision_cholesky_matrix,
    "tied": _precision_cholesky_matrix,
    "diag": _precision_cholesky_vector,
    "spherical": _precision_cholesky_vector,
}


def try_precision_cholesky(covariances: Tensor, covariance_type: str) -> tuple[Tensor, Tensor]:
    """precisions_cholesky and a (B,) flag of the datasets whose covariances are not
    positive definite, where :func:`compute_precision_cholesky` would raise: the loops
    decide what a failure means for each dataset."""
    precisions_chol, failed = lookup(_PRECISION_CHOLESKY, covariance_type)(covariances)
    n_dims = len(PARAM_SHAPES[covariance_type](1, 1))  # dims of one dataset
    return precisions_chol, failed.flatten(failed.dim() - n_dims).any(-1)


def compute_precision_cholesky(covariances: Tensor, covariance_type: str) -> Tensor:
    """Cholesky factor of the precisions, as scikit-learn's ``_compute_precision_cholesky``.

    For full/tied, ``inv(cholesky(cov)).T`` (upper triangular, ``precision = P @ P.T``);
    for diag/spherical, ``1 / sqrt(cov)``. Any leading batch shape is accepted.

    Parameters
    ----------
    covariances : Tensor
        Covariances of ``covariance_type``'s shape, with any leading batch shape.
    covariance_type : {"full", "tied", "diag", "spherical"}

    Returns
    -------
    precisions_cholesky : Tensor
        Of the same shape as ``covariances``.

    Raises
    ------
    ValueError
        With scikit-learn's message, if a covariance is not positive definite.

    Examples
    --------
    >>> import torch
    >>> from transformer_gmm.engine.gaussian import compute_precision_cholesky
    >>> covariances = torch.tensor([[[4.0, 0.0], [0.0, 1.0]]], dtype=torch.float64)  # tied
    >>> compute_precision_cholesky(covariances, "tied").tolist()
    [[[0.5, 0.0], [0.0, 1.0]]]
    >>> compute_precision_cholesky(torch.tensor([[4.0, 0.25]]), "spherical").tolist()
    [[0.5, 2.0]]
    """
    precisions_chol, failed = try_precision_cholesky(covariances, covariance_type)
    if bool(failed.any()):
        raise IllDefinedCovariance(covariances.dtype)
    return precisions_chol


def _covariances_matrix(precisions_chol: Tensor) -> Tensor:
    # precision = P P^T, so covariance = P^-T P^-1; P is upper triangular.
    eye = torch.eye(
        precisions_chol.shape[-1], dtype=precisions_chol.dtype, device=precisions_chol.device
    )
    inverse = torch.linalg.solve_triangular(precisions_chol, eye, upper=True)
    return inverse.mT @ inverse


_COVARIANCES_FROM_PRECISIONS_CHOLESKY = {
    "full": _covariances_matrix,
    "tied": _covariances_matrix,
    "diag": lambda p: p.square().reciprocal(),
    "spherical": lambda p: p.square().reciprocal(),
}


def covariances_from_precisions_cholesky(
    precisions_cholesky: Tensor, covariance_type: str
) -> Tensor:
    """Covariances from scikit-learn-style precisions_cholesky; any leading batch shape.

    Parameters
    ----------
    precisions_cholesky : Tensor
        Of ``covariance_type``'s shape, with any leading batch shape.
    covariance_type : {"full", "tied", "diag", "spherical"}

    Returns
    -------
    covariances : Tensor
        Of the same shape.

    Examples
    --------
    >>> import torch
    >>> from transformer_gmm.engine.gaussian import (
    ...     compute_precision_cholesky, covariances_from_precisions_cholesky)
    >>> covariances = torch.tensor([[[[2.0, 0.5], [0.5, 1.0]]]], dtype=torch.float64)  # full
    >>> P = compute_precision_cholesky(covariances, "full")
    >>> torch.allclose(covariances_from_precisions_cholesky(P, "full"), covariances)
    True
    """
    return lookup(_COVARIANCES_FROM_PRECISIONS_CHOLESKY, covariance_type)(precisions_cholesky)


# --- log-probabilities -----------------------------------------------------------------
# Each returns the squared Mahalanobis distances (B, N, K) for X (B|1, N, d), means
# (B, K, d) and precisions_cholesky of the type, following scikit-learn's formulas.


def needs_grad(*tensors: Tensor) -> bool:
    """Whether autograd tracks any of ``tensors``: the in-place fast paths then step aside."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


# Below this many elements of (B, K, N, d), the full-covariance M-step and EM's E-step handle
# every component at once in one (B, K, N, d) or (B, N, K d) buffer: small fits are a few
# dozen tiny ops an iteration, and looping over components multiplies their count by K (3 to
# 5 times the time at N = 300, K = 5 to 10, B = 4 on one CPU thread). Above it, one buffer
# that every component reuses is faster, as fresh large buffers cost page faults.
ALL_COMPONENTS_AT_ONCE = 2**18


def all_components_at_once(X: Tensor, means: Tensor) -> bool:
    """Whether the full-covariance steps take every component at once (small problems)."""
    batch = max(X.shape[0], means.shape[0])
    return batch * means.shape[1] * X.shape[1] * X.shape[2] <= ALL_COMPONENTS_AT_ONCE


def _mahalanobis_full(X: Tensor, means: Tensor, precisions_chol: Tensor) -> Tensor:
    if needs_grad(X, means, precisions_chol):
        columns = []
        for k in range(means.shape[1]):  # per component, as scikit-learn: memory O(B N d)
            prec_chol = precisions_chol[:, k]  # (B, d, d)
            y = X @ prec_chol - means[:, k, None, :] @ prec_chol  # (B, N, d)
            columns.append(y.square().sum(-1))
        return torch.stack(columns, dim=-1)
    # The same, in one (B, N, d) buffer that every component reuses: a fresh tensor per
    # component cost more than its arithmetic (page faults on each large allocation; 2x
    # the time of the whole E-step at N = 500,000, d = 16, K = 5, one CPU thread). A
    # product with a column of ones sums the squares faster than .sum(-1) over a short d.
    batch = max(X.shape[0], means.shape[0])
    y = X.new_empty((batch, X.shape[1], X.shape[2]))  # (B, N, d)
    ones = X.new_ones((X.shape[2], 1))
    # Each column written as it comes: a list of columns joined at the end would hold the
    # (B, N, K) result twice.
    distances = X.new_empty((batch, X.shape[1], means.shape[1]))  # (B, N, K)
    for k in range(means.shape[1]):
        prec_chol = precisions_chol[:, k]  # (B, d, d)
        torch.matmul(X, prec_chol, out=y)
        y.sub_(means[:, k, None, :] @ prec_chol).square_()
        distances[..., k] = (y @ ones)[..., 0]  # (B, N)
    return distances


def _mahalanobis_full_at_once(X: Tensor, means: Tensor, precisions_chol: Tensor) -> Tensor:
    # [P_1 | ... | P_K]: every component's whitened points from one product. Its rounding
    # differs from the loop's in the last bits, so only EM takes it, never scoring, whose
    # results must not depend on how the rows are chunked.
    B, K, d = precisions_chol.shape[:3]
    y = X @ precisions_chol.transpose(1, 2).reshape(B, d, K * d)  # (B, N, K d)
    y.sub_((means[:, :, None, :] @ precisions_chol).view(B, 1, K * d)).square_()
    return (y.view(B, -1, d) @ X.new_ones((d, 1))).view(B, -1, K)  # (B, N, K)


def _mahalanobis_tied(X: Tensor, means: Tensor, precisions_chol: Tensor) -> Tensor:
    X_prec = X @ precisions_chol  # (B, N, d)
    means_prec = means @ precisions_chol  # (B, K, d)
    columns = [(X_prec - means_prec[:, k, None, :]).square().sum(-1) for k in range(means.shape[1])]
    return torch.stack(columns, dim=-1)


def _mahalanobis_diag(
    X: Tensor, means: Tensor, precisions_chol: Tensor, x_squared: Tensor | None = None
) -> Tensor:
    precisions = precisions_chol.square()  # (B, K, d)
    x_squared = X.square() if x_squared is None else x_squared
    # 2 (X @ M), not (2 X) @ M: the same bits (doubling is exact), without an (N, d) product.
    return (
        (means.square() * precisions).sum(-1)[:, None, :]
        - 2.0 * matmul(X, (means * precisions).mT)
        + matmul(x_squared, precisions.mT)
    )


def _mahalanobis_spherical(
    X: Tensor, means: Tensor, precisions_chol: Tensor, x_squared: Tensor | None = None
) -> Tensor:
    precisions = precisions_chol.square()[:, None, :]  # (B, 1, K)
    x_squared = X.square() if x_squared is None else x_squared
    return (
        means.square().sum(-1)[:, None, :] * precisions
        - 2.0 * matmul(X, means.mT) * precisions
        + x_squared.sum(-1, keepdim=True) * precisions
    )


_MAHALANOBIS = {
    "full": _mahalanobis_full,
    "tied": _mahalanobis_tied,
    "diag": _mahalanobis_diag,
    "spherical": _mahalanobis_spherical,
}

# log det of precisions_chol per component, (B, K) or (B, 1) for tied; it equals half the
# log det of the precision, i.e. minus half that of the covariance.
_LOG_DET_CHOLESKY = {
    "full": lambda p, d: torch.diagonal(p, dim1=-2, dim2=-1).log().sum(-1),
    "tied": lambda p, d: torch.diagonal(p, dim1=-2, dim2=-1).log().sum(-1, keepdim=True),
    "diag": lambda p, d: p.log().sum(-1),
    "spherical": lambda p, d: d * p.log(),
}


def estimate_log_gaussian_prob(
    X: Tensor,
    means: Tensor,
    precisions_cholesky: Tensor,
    covariance_type: str,
    *,
    at_once: bool = False,
    x_squared: Tensor | None = None,
) -> Tensor:
    """log N(x_n | mu_k, Sigma_k): (B, N, K), as scikit-learn's ``_estimate_log_gaussian_prob``.

    ``X`` is (B|1, N, d); ``means`` (B, K, d); ``precisions_cholesky`` of the type's shape.

    Parameters
    ----------
    X : Tensor of shape (B, N, d) or (1, N, d)
    means : Tensor of shape (B, K, d)
    precisions_cholesky : Tensor
        full (B, K, d, d), tied (B, d, d), diag (B, K, d) or spherical (B, K).
    covariance_type : {"full", "tied", "diag", "spherical"}
    at_once : bool, default=False
        Full covariances: every component in one product, faster on small problems (EM
        asks for it by :func:`all_components_at_once`); equal to the default up to
        rounding, which then depends on the number of rows.
    x_squared : Tensor of shape (B, N, d) or (1, N, d), optional
        ``X.square()``, where the caller holds it (diag and spherical read it): EM's loop
        squares its rows once, not at every step. The same result to the bit.

    Returns
    -------
    log_prob : Tensor of shape (B, N, K)

    Examples
    --------
    The standard normal in one dimension, at 0 and 1:

    >>> import torch
    >>> from transformer_gmm.engine.gaussian import estimate_log_gaussian_prob
    >>> X = torch.tensor([[[0.0], [1.0]]], dtype=torch.float64)  # (1, 2, 1)
    >>> means = torch.zeros(1, 1, 1, dtype=torch.float64)  # (1, 1, 1)
    >>> precisions_cholesky = torch.ones(1, 1, dtype=torch.float64)  # spherical (1, 1)
    >>> log_prob = estimate_log_gaussian_prob(X, means, precisions_cholesky, "spherical")
    >>> log_prob.shape, log_prob.flatten().round(decimals=4).tolist()
    (torch.Size([1, 2, 1]), [-0.9189, -1.4189])
    """
    n_features = X.shape[-1]
    mahalanobis = lookup(_MAHALANOBIS, covariance_type)
    if at_once and covariance_type == "full" and not needs_grad(X, means, precisions_cholesky):
        mahalanobis = _mahalanobis_full_at_once
    if x_squared is not None and covariance_type in ("diag", "spherical"):
        distances = mahalanobis(X, means, precisions_cholesky, x_squared)
    else:
        distances = mahalanobis(X, means, precisions_cholesky)
    log_det = _LOG_DET_CHOLESKY[covariance_type](precisions_cholesky, n_features)[:, None, :]
    constant = n_features * math.log(2 * math.pi)
    if needs_grad(distances) or distances.shape != log_det.broadcast_to(distances.shape).shape:
        return -0.5 * (constant + distances) + log_det
    # The same arithmetic in place: on many rows, each (B, N, K) temporary is large.
    return distances.add_(constant).mul_(-0.5).add_(log_det)
