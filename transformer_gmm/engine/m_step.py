"""Mixture parameters and the M-step that estimates them, batched, as scikit-learn.

The M-step follows ``_estimate_gaussian_parameters`` in
``sklearn/mixture/_gaussian_mixture.py``, vectorised over a batch of B datasets;
:func:`initialize_kmeans` is scikit-learn's default start (k-means labels, then one
M-step). Shapes and the ``mask`` convention are those of :mod:`transformer_gmm.engine.em`,
whose loop runs these steps, and of :mod:`transformer_gmm.engine.sufficient_stats`, which
shares the covariance estimators.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .batching import check_batch, compact, point_weights, zero_padding
from .gaussian import all_components_at_once, compute_precision_cholesky, lookup, needs_grad
from .kmeans import kmeans_plusplus, kmeans_plusplus_indices, lloyd

__all__ = [
    "COVARIANCE_ESTIMATORS",
    "MixtureParams",
    "estimate_gaussian_parameters",
    "estimate_parameters_unchecked",
    "initialize_kmeans",
    "initialize_kmeans_plusplus",
    "pool_covariances",
]


@dataclass
class MixtureParams:
    """Parameters of B Gaussian mixtures with K components in d dimensions.

    Attributes
    ----------
    weights : Tensor of shape (B, K)
    means : Tensor of shape (B, K, d)
    covariances : Tensor or None
        full (B, K, d, d), tied (B, d, d), diag (B, K, d) or spherical (B, K).
    precisions_cholesky : Tensor
        Of the same shape as the covariances, with scikit-learn's meaning.

    Examples
    --------
    >>> import torch
    >>> from transformer_gmm.engine.gaussian import compute_precision_cholesky
    >>> from transformer_gmm.engine.m_step import MixtureParams
    >>> covariances = torch.ones(1, 2, dtype=torch.float64)  # spherical, B=1, K=2
    >>> params = MixtureParams(
    ...     weights=torch.tensor([[0.5, 0.5]], dtype=torch.float64),
    ...     means=torch.tensor([[[-1.0], [1.0]]], dtype=torch.float64),
    ...     covariances=covariances,
    ...     precisions_cholesky=compute_precision_cholesky(covariances, "spherical"))
    >>> params.means.shape
    torch.Size([1, 2, 1])
    """

    weights: Tensor  # (B, K)
    means: Tensor  # (B, K, d)
    covariances: Tensor | None  # full (B,K,d,d) | tied (B,d,d) | diag (B,K,d) | spherical (B,K)
    precisions_cholesky: Tensor  # same shape as covariances


# --- M-step ----------------------------------------------------------------------------
# Each estimator takes resp (B, N, K) and X (B|1, N, d) with padding already zeroed, nk
# (B, K), and means (B, K, d), which need not be the resp-weighted means (the transformer
# supplies its own), so the formulas stay exact for any means; with the weighted means
# they reduce to scikit-learn's.


def _covariances_full(resp: Tensor, X: Tensor, nk: Tensor, means: Tensor, reg: float) -> Tensor:
    if needs_grad(resp, X, means):
        eye = torch.eye(X.shape[-1], dtype=X.dtype, device=X.device)
        # One component at a time, as scikit-learn does: memory O(B N d), not O(B N K d).
        covariances = []
        for k in range(means.shape[1]):
            diff = X - means[:, k, None, :]  # (B, N, d)
            covariances.append((resp[..., k, None] * diff).mT @ diff / nk[:, k, None, None])
        return torch.stack(covariances, dim=1) + reg * eye  # (B, K, d, d)
    # sum_n r_nk (x_n - mu_k)(x_n - mu_k)^T = W^T W with W = sqrt(r_nk) (x_n - mu_k).
    if all_components_at_once(X, means):  # small: every W in one buffer (see gaussian.py)
        root = resp.sqrt().mT  # (B, K, N)
        w = (X[:, None] - means[:, :, None, :]).mul_(root[..., None])  # (B, K, N, d)
        # In place: on wide data each covariance is d^2, and a sum would copy them all.
        return _add_to_diagonal((w.mT @ w).div_(nk[..., None, None]), reg)
    # Large: one (B, N, d) buffer that every component reuses; allocating a fresh one per
    # component cost more than the arithmetic (page faults; 2.3x the time at N = 500,000,
    # d = 16, K = 5, one CPU thread). Each component's square roots are taken as it comes,
    # and its covariance written in place: (B, K, N) roots, and a list of covariances
    # stacked then shifted by reg, held two or three times what they need (wide data:
    # each covariance is d^2).
    n_batch, n_components = resp.shape[0], means.shape[1]
    w = X.new_empty((n_batch, X.shape[1], X.shape[2]))  # (B, N, d)
    covariances = X.new_empty((n_batch, n_components, X.shape[2], X.shape[2]))
    for k in range(n_components):
        torch.sub(X, means[:, k, None, :], out=w).mul_(resp[..., k, None].sqrt())
        covariances[:, k] = w.mT @ w
        covariances[:, k].div_(nk[:, k, None, None])
    return _add_to_diagonal(covariances, reg)  # (B, K, d, d)


def _add_to_diagonal(matrices: Tensor, reg: float) -> Tensor:
    """``matrices + reg * I``, in place on the diagonal: no d x d identity and no product of
    it (each 32 MB on wide data, which the C allocator would keep in its heap). The same
    values (an off-diagonal -0.0 aside, which adding 0.0 made +0.0)."""
    matrices.diagonal(dim1=-2, dim2=-1).add_(reg)
    return matrices


def _covariances_tied(resp: Tensor, X: Tensor, nk: Tensor, means: Tensor, reg: float) -> Tensor:
    # sum_k sum_n r_nk (x_n - mu_k)(x_n - mu_k)^T / sum(nk), expanded to cost O(N d^2).
    sums = resp.mT @ X  # (B, K, d)
    second_moment = (resp.sum(-1, keepdim=True) * X).mT @ X  # (B, d, d)
    cross = sums.mT @ means  # (B, d, d)
    means_term = (nk[..., None] * means).mT @ means  # (B, d, d)
    covariance = (second_moment - cross - cross.mT + means_term) / nk.sum(-1)[:, None, None]
    return covariance + reg * torch.eye(X.shape[-1], dtype=X.dtype, device=X.device)


def _covariances_diag(
    resp: Tensor,
    X: Tensor,
    nk: Tensor,
    means: Tensor,
    reg: float,
    x_squared: Tensor | None = None,
    avg_X: Tensor | None = None,
) -> Tensor:
    # x_squared is X.square() and avg_X the weighted means, where the caller holds them.
    avg_X2 = resp.mT @ (X.square() if x_squared is None else x_squared) / nk[..., None]
    if avg_X is None:
        avg_X = resp.mT @ X / nk[..., None]  # (B, K, d)
    return avg_X2 - 2.0 * means * avg_X + means.square() + reg  # (B, K, d)


COVARIANCE_ESTIMATORS = {
    "full": _covariances_full,
    "tied": _covariances_tied,
    "diag": _covariances_diag,
    "spherical": lambda *args: _covariances_diag(*args).mean(-1),  # (B, K)
}


def estimate_parameters_unchecked(
    X: Tensor,
    resp: Tensor,
    covariance_type: str,
    reg_covar: float,
    means: Tensor | None,
    x_squared: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """scikit-learn's ``_estimate_gaussian_parameters``: (nk, means, covariances), on
    inputs already checked, with padding zeroed in ``X`` and in ``resp`` and the sample
    weights multiplied into ``resp``: the M-step inside the EM loop. ``x_squared`` is
    ``X.square()`` where the loop holds it (diag and spherical read it)."""
    # The 10 eps keep empty components from dividing by zero, exactly as scikit-learn.
    nk = resp.sum(1) + 10 * torch.finfo(resp.dtype).eps  # (B, K)
    weighted_means = None
    if means is None:
        means = weighted_means = resp.mT @ X / nk[..., None]  # (B, K, d)
    if covariance_type in ("diag", "spherical"):
        # The weighted means once, not again inside: the same product, the same bits.
        covariances = _covariances_diag(resp, X, nk, means, reg_covar, x_squared, weighted_means)
        if covariance_type == "spherical":
            covariances = covariances.mean(-1)  # (B, K)
    else:
        estimator = lookup(COVARIANCE_ESTIMATORS, covariance_type)
        covariances = estimator(resp, X, nk, means, reg_covar)
    return nk, means.expand(nk.shape[0], -1, -1), covariances


def pool_covariances(
    covariances: Tensor, counts: Tensor, empty: Tensor, covariance_type: str
) -> Tensor:
    """Covariances with each ``empty`` (B, K) component's replaced by the others' average,
    weighted by ``counts`` (B, K); tied covariances are returned as they are.
    """
    if covariance_type == "tied":
        return covariances
    share = torch.where(empty, 0.0, counts)
    share = share / share.sum(-1, keepdim=True)  # (B, K), zero on the empty components
    trailing = [1] * (covariances.dim() - 2)  # the dimensions of one covariance
    pooled = (share.view(*share.shape, *trailing) * covariances).sum(1, keepdim=True)
    return torch.where(empty.view(*empty.shape, *trailing), pooled, covariances)


def estimate_gaussian_parameters(
    X: Tensor,
    resp: Tensor,
    *,
    covariance_type: str,
    reg_covar: float,
    means: Tensor | None = None,
    mask: Tensor | None = None,
    sample_weight: Tensor | None = None,
) -> MixtureParams:
    """The M-step, as scikit-learn's ``_estimate_gaussian_parameters``.

    Parameters
    ----------
    X : Tensor of shape (B, N, d) or (1, N, d)
    resp : Tensor of shape (B, N, K)
        Responsibilities (rows of real points normally sum to 1).
    covariance_type : {"full", "tied", "diag", "spherical"}
    reg_covar : float
        Added to the diagonal of the covariances.
    means : Tensor of shape (B, K, d), optional
        Means to use (in the covariances too) instead of the weighted means.
    mask : bool Tensor of shape (B, N) or (1, N), optional
    sample_weight : Tensor of shape (B, N) or (1, N), optional
        Non-negative weights of the points, zero on padding; they multiply ``resp``.

    Returns
    -------
    MixtureParams
        weights ``nk / n_real_points`` (as scikit-learn's initialisation; the sum of the
        weights of the points, when weighted), means,
        covariances and precisions_cholesky. ValueError if a covariance is not positive
        definite.

    Examples
    --------
    >>> import torch
    >>> from transformer_gmm.engine import m_step
    >>> X, resp = two_blobs()  # (1, 40, 2) points in two blobs, one-hot (1, 40, 2) labels
    >>> params = m_step.estimate_gaussian_parameters(
    ...     X, resp, covariance_type="diag", reg_covar=1e-6)
    >>> params.weights.round(decimals=3).tolist()
    [[0.5, 0.5]]
    >>> torch.allclose(params.means[0, 0], X[0, :20].mean(0))  # weighted means
    True
    >>> params.covariances.shape  # diag: (B, K, d)
    torch.Size([1, 2, 2])
    """
    given = [t for t in (means, sample_weight) if t is not None]
    n_batch = check_batch(X, resp, *given, mask=mask)
    if resp.dim() != 3 or resp.shape[1] != X.shape[1]:
        raise ValueError(f"resp must have shape (B, {X.shape[1]}, K), got {resp.shape}")
    if means is not None and means.shape[1:] != (resp.shape[2], X.shape[2]):
        raise ValueError(f"means must have shape (B, K, d), got {means.shape}")
    X, mask, resp = compact(X), compact(mask), resp.expand(n_batch, -1, -1)
    n_real = point_weights(X, mask, sample_weight).sum(-1, keepdim=True)  # (B|1, 1)
    X = zero_padding(X, mask)
    if mask is not None:
        resp = resp.masked_fill(~mask[..., None], 0.0)
    if sample_weight is not None:
        resp = resp * compact(sample_weight)[..., None]
    nk, means, covariances = estimate_parameters_unchecked(
        X, resp, covariance_type, reg_covar, means
    )
    return MixtureParams(
        nk / n_real, means, covariances, compute_precision_cholesky(covariances, covariance_type)
    )


# --- initialisation --------------------------------------------------------------------


def initialize_kmeans(
    X: Tensor,
    n_components: int,
    *,
    covariance_type: str,
    reg_covar: float,
    generator: torch.Generator,
    mask: Tensor | None = None,
    n_init_lloyd_iter: int = 300,
    sample_weight: Tensor | None = None,
) -> MixtureParams:
    """scikit-learn's default GaussianMixture initialisation, once per dataset of the batch.

    k-means++ seeds, Lloyd to convergence (tol 1e-4), one-hot responsibilities from the
    labels, one M-step. ``X`` is (B, N, d): pass ``X.expand(B, N, d)`` for B restarts.

    Parameters
    ----------
    X : Tensor of shape (B, N, d)
    n_components : int
        Number of components K.
    covariance_type : {"full", "tied", "diag", "spherical"}
    reg_covar : float
        Added to the diagonal of the covariances.
    generator : torch.Generator
        The only source of randomness (on X's device).
    mask : bool Tensor of shape (B, N) or (1, N), optional
        True for real points.
    n_init_lloyd_iter : int, default=300
        Maximum Lloyd iterations.
    sample_weight : Tensor of shape (B, N) or (1, N), optional
        Non-negative weights of the points, zero on padding: weighted k-means++, Lloyd
        and M-step, as scikit-learn's ``KMeans.fit(sample_weight=...)``.

    Returns
    -------
    MixtureParams
        Batch B; weights are ``nk / n_real_points``.

    Examples
    --------
    >>> import torch
    >>> from transformer_gmm.engine import m_step
    >>> X, _ = two_blobs()  # one dataset (B=1) of 40 points in two blobs
    >>> generator = torch.Generator().manual_seed(0)
    >>> params = m_step.initialize_kmeans(X.expand(3, -1, -1), 2, covariance_type="spherical",
    ...                               reg_covar=1e-6, generator=generator)  # 3 restarts
    >>> params.weights.shape, params.means.shape, params.covariances.shape
    (torch.Size([3, 2]), torch.Size([3, 2, 2]), torch.Size([3, 2]))
    """
    weighted = {} if sample_weight is None else {"sample_weight": sample_weight}
    seeds = kmeans_plusplus(X, n_components, generator=generator, mask=mask, **weighted)
    labels = lloyd(
        X, seeds, max_iter=n_init_lloyd_iter, tol=1e-4, mask=mask, with_inertia=False, **weighted
    ).labels
    # Padded points have label -1: give them a column, then masking zeroes their row.
    resp = torch.nn.functional.one_hot(labels.clamp_min(0), n_components).to(X.dtype)
    return estimate_gaussian_parameters(
        X, resp, covariance_type=covariance_type, reg_covar=reg_covar, mask=mask, **weighted
    )


def initialize_kmeans_plusplus(
    X: Tensor,
    n_components: int,
    *,
    covariance_type: str,
    reg_covar: float,
    generator: torch.Generator,
    mask: Tensor | None = None,
    sample_weight: Tensor | None = None,
) -> MixtureParams:
    """scikit-learn's ``init_params="k-means++"``, once per dataset of the batch.

    k-means++ seeds alone: each component's responsibilities are one at its seed and zero
    elsewhere, then one M-step, so the means start at the seeds and the covariances at
    ``reg_covar``. Arguments as :func:`initialize_kmeans`.

    Examples
    --------
    >>> import torch
    >>> from transformer_gmm.engine import m_step
    >>> X = torch.tensor([[[0.0], [1.0], [10.0], [11.0]]], dtype=torch.float64)
    >>> params = m_step.initialize_kmeans_plusplus(X, 2, covariance_type="spherical",
    ...     reg_covar=1e-6, generator=torch.Generator().manual_seed(0))
    >>> params.means.flatten().round(decimals=6).tolist()  # two of the points
    [1.0, 11.0]
    >>> params.covariances.round(decimals=9).tolist()
    [[1e-06, 1e-06]]
    """
    seeds = kmeans_plusplus_indices(  # (B, K)
        X, n_components, generator=generator, mask=mask, sample_weight=sample_weight
    )
    resp = X.new_zeros(seeds.shape[0], X.shape[1], n_components)
    resp.scatter_(1, seeds[:, None, :], 1.0)  # resp[b, seeds[b, k], k] = 1
    return estimate_gaussian_parameters(
        X,
        resp,
        covariance_type=covariance_type,
        reg_covar=reg_covar,
        mask=mask,
        sample_weight=sample_weight,
    )
