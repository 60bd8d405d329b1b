"""The map to the model's input space, in torch: B datasets at once.

The backbone reads points of width ``d_max`` with zero mean and unit average variance per
coordinate. :func:`fit_standardization` fits that map: centre, principal axes, a sign fix,
the top :func:`n_kept_directions` of them, one global scale, zero padding to ``d_max``.
It runs on a padded batch (B, N, d) with an optional bool ``mask`` (B, N) of real rows, on
the batch's device, with no per-dataset Python. Fitting standardizes its batch of datasets
with it, and the training task sampler each task as a batch of one, so the model sees at
inference exactly the distribution it was trained on. The statistics are computed in
float64 whatever the input's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = [
    "Standardization",
    "fit_standardization",
    "n_kept_directions",
    "subsample_rows",
    "take_rows",
]


def n_kept_directions(
    n_features: int, n_components: int, d_max: int, noise_directions: int = 0
) -> int:
    """How many coordinates the model reads: all of them, or the top principal directions.

    The means of K components span an affine subspace of at most K - 1 dimensions, so
    when the data has more features than that, only the top ``K - 1 + noise_directions``
    principal directions (at most ``d_max``) are kept: every task then looks alike to the
    model, whatever its number of features, and the rest is noise that the EM polish
    handles in full space. A direction beyond the K - 1 holds (almost) only noise, and so
    shows the model how wide the components are, which the K - 1 alone confound with how
    far apart they lie; a checkpoint's config says how many such directions its model
    was trained to read.

    Examples
    --------
    >>> from transformer_gmm.engine.standardize import n_kept_directions
    >>> n_kept_directions(2, 5, 9), n_kept_directions(128, 5, 9), n_kept_directions(8, 2, 9)
    (2, 4, 1)
    >>> n_kept_directions(2, 2, 9, noise_directions=1), n_kept_directions(128, 10, 9, 1)
    (2, 9)
    """
    return min(n_features, d_max, max(n_components - 1, 1) + noise_directions)


@dataclass(frozen=True)
class Standardization:
    """B affine maps ``z = basis.T @ (x - center) / scale``, zero-padded to ``d_max``.

    Attributes
    ----------
    center : Tensor of shape (B, n_features)
        Mean of each dataset, float64.
    scale : Tensor of shape (B,)
        One global scale per dataset: the root mean variance of the kept coordinates.
    basis : Tensor of shape (B, n_features, n_kept)
        Orthonormal columns: the top principal directions (see :func:`n_kept_directions`),
        where the component means live, largest variance first; each column's largest
        loading (the first, on ties) is positive.
    d_max : int
        Width of the model's input.

    Examples
    --------
    >>> import torch
    >>> from transformer_gmm.engine.standardize import fit_standardization
    >>> x = torch.randn(2, 50, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    >>> standardization = fit_standardization(x, None, d_max=4, n_components=3)
    >>> standardization.basis.shape  # K - 1 = 2 principal directions kept of 3
    torch.Size([2, 3, 2])
    >>> z = standardization.transform(x)
    >>> z.shape, z.dtype, bool((z[..., 2:] == 0).all())
    (torch.Size([2, 50, 4]), torch.float32, True)
    """

    center: Tensor
    scale: Tensor
    basis: Tensor
    d_max: int

    @property
    def n_kept(self) -> int:
        return self.basis.shape[-1]

    def transform(self, x: Tensor) -> Tensor:
        """Map points (B, N, n_features) to float32 model inputs (B, N, d_max)."""
        centered = x.to(torch.float64) - self.center[:, None, :]
        kept = centered @ self.basis / self.scale[:, None, None]  # (B, N, n_kept)
        return torch.nn.functional.pad(kept.float(), (0, self.d_max - self.n_kept))

    def inverse_transform_means(self, means: Tensor) -> Tensor:
        """Map model-space means (B, K, d_max) back to float64 (B, K, n_features)."""
        kept = means[..., : self.n_kept].to(torch.float64)
        return self.center[:, None, :] + self.scale[:, None, None] * kept @ self.basis.mT


def fit_standardization(
    x: Tensor, mask: Tensor | None, d_max: int, n_components: int, noise_directions: int = 0
) -> Standardization:
    """Fit, for each dataset of the batch, the map that brings it to model space.

    Parameters
    ----------
    x : Tensor of shape (B, N, n_features)
        The datasets, padded to N rows; padded rows may hold anything.
    mask : bool Tensor of shape (B, N), optional
        True for real rows; None when every row is real.
    d_max : int
        Width of the model's input.
    n_components : int
        K: ``n_kept_directions(n_features, K, d_max, noise_directions)`` principal
        directions are kept.
    noise_directions : int, default=0
        Directions kept beyond the K - 1 that can hold the means (the model's config says
        how many it reads).

    Returns
    -------
    Standardization
        Each dataset's map depends on its real rows only. Translating a dataset by ``b``
        and scaling it by ``a > 0`` changes its ``center`` to ``a * center + b`` and its
        ``scale`` to ``a * scale`` and leaves the transformed points unchanged (up to
        rounding), so the model's estimate is equivariant.

    Examples
    --------
    >>> import torch
    >>> from transformer_gmm.engine.standardize import fit_standardization
    >>> x = torch.tensor([[[0.0, 0.0], [2.0, 0.0], [4.0, 0.0], [9.0, 9.0]]])
    >>> mask = torch.tensor([[True, True, True, False]])  # the last row is padding
    >>> standardization = fit_standardization(x, mask, d_max=3, n_components=3)
    >>> standardization.center.tolist(), standardization.basis[0, :, 0].tolist()
    ([[2.0, 0.0]], [1.0, 0.0])
    """
    x = x.to(torch.float64)
    n_features = x.shape[-1]
    n_kept = n_kept_directions(n_features, n_components, d_max, noise_directions)
    if mask is None:
        counts = x.new_full((x.shape[0], 1), x.shape[1])  # (B, 1)
        center = x.mean(dim=1)  # (B, d)
        centered = x - center[:, None, :]
    else:
        padding = ~mask[..., None]  # (B, N, 1); padded rows may hold NaN: fill, not multiply
        counts = mask.sum(dim=1, keepdim=True).to(torch.float64)  # (B, 1)
        center = x.masked_fill(padding, 0.0).sum(dim=1) / counts  # (B, d)
        centered = (x - center[:, None, :]).masked_fill(padding, 0.0)
    covariance = centered.mT @ centered / counts[..., None]  # (B, d, d)
    # The principal axes even when every feature is kept: the backbone is not rotation
    # equivariant, and a canonical orientation (largest variance first) is one thing less
    # for it to learn. Eigenvectors of the d x d covariance: O(N d^2) time and O(d^2)
    # memory per dataset, whatever N.
    # Ascending eigenvalues: the last n_kept, reversed, are the largest first.
    eigenvalues, eigenvectors = torch.linalg.eigh(covariance)
    variances = eigenvalues.flip(-1)[:, :n_kept].clamp_min(0.0)  # (B, n_kept)
    basis = eigenvectors.flip(-1)[..., :n_kept]  # (B, d, n_kept)
    # Each direction's sign: its largest loading (the first, on ties) is positive.
    largest = basis.abs().argmax(dim=1, keepdim=True)  # (B, 1, n_kept)
    signs = basis.gather(1, largest).sign()
    basis = basis * torch.where(signs == 0, 1.0, signs)
    scale = variances.mean(dim=-1).sqrt()  # (B,)
    # All points coincide: any scale maps them to the origin.
    degenerate = ~torch.isfinite(scale) | (scale <= torch.finfo(torch.float64).tiny)
    scale = torch.where(degenerate, 1.0, scale)
    return Standardization(center=center, scale=scale, basis=basis, d_max=d_max)


def subsample_rows(
    shape: tuple[int, int], mask: Tensor | None, context_size: int, generator: torch.Generator
) -> tuple[Tensor | None, Tensor | None]:
    """The rows the backbone reads: each dataset's real rows, or a uniform subset of
    ``context_size`` of them, drawn without replacement and kept in order.

    Parameters
    ----------
    shape : (int, int)
        (B, N): datasets, and rows of each (padding included).
    mask : bool Tensor of shape (B, N), optional
        Real rows; None when every row is real.
    context_size : int
        The most rows the backbone reads per dataset.
    generator : torch.Generator
        The draw's randomness (on the mask's device); used only when N > context_size.

    Returns
    -------
    index : long Tensor of shape (B, C) or None
        Row indices, C = context_size, ascending; None when N <= context_size (every
        row is read). A dataset with fewer than C real rows reads all of them, then
        padding rows.
    read_mask : bool Tensor of shape (B, C), or None
        Which of the read rows are real; None when all are.

    Examples
    --------
    >>> import torch
    >>> from transformer_gmm.engine.standardize import subsample_rows
    >>> mask = torch.arange(6)[None] < torch.tensor([[6], [3]])  # 6 and 3 real rows
    >>> index, read_mask = subsample_rows((2, 6), mask, 4, torch.Generator().manual_seed(0))
    >>> index.shape, index[1].tolist()[:3], read_mask[1].tolist()
    (torch.Size([2, 4]), [0, 1, 2], [True, True, True, False])
    """
    if shape[1] <= context_size:
        return None, mask
    keys = torch.rand(shape, generator=generator, device=generator.device)  # in [0, 1)
    if mask is not None:
        keys = keys.masked_fill(~mask, 2.0)  # padding is read last, only to fill
    index = keys.topk(context_size, dim=1, largest=False, sorted=False).indices
    index = index.sort(dim=1).values  # (B, C)
    read_mask = None if mask is None else mask.gather(1, index)
    if read_mask is not None and bool(read_mask.all()):
        read_mask = None
    return index, read_mask


def take_rows(t: Tensor, index: Tensor) -> Tensor:
    """Rows ``index`` (B, C) of each dataset of ``t`` (B, N, F): (B, C, F).

    Examples
    --------
    >>> import torch
    >>> from transformer_gmm.engine.standardize import take_rows
    >>> t = torch.arange(12.0).reshape(2, 3, 2)
    >>> take_rows(t, torch.tensor([[2], [0]])).tolist()
    [[[4.0, 5.0]], [[6.0, 7.0]]]
    """
    return t.gather(1, index[..., None].expand(-1, -1, t.shape[-1]))
