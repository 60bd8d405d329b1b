"""Starts that compete in a few principal directions before one runs at full width.

On wide data (``SCREEN_FROM_FEATURES`` features or more; with diagonal covariances, many
values as well) EM at full width from every start is most of a fit's time. There, each
start is made in the span of the data's leading ``screening_dims`` principal directions
(the transformer's responsibilities and k-means++, as at full width, in that space), EM
runs from every start there, and the runs compete as they do at full width
(:func:`transformer_gmm.engine.runs.choose`). The winner's responsibilities give one
full-width M-step, and EM at full width runs from it alone. The means of K clusters span
K - 1 directions, which lead the data's variance where the clusters are apart; the
likelihood there orders the starts' optima as the full one does, at a fraction of the
cost (docs/benchmarks.md, "High-dimensional data").
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from .batching import point_weights
from .standardize import AXES_ROWS, leading_axes

# Screening runs where the data have at least this many features (and more than the
# directions screening reads); narrower data run every start at full width.
SCREEN_FROM_FEATURES = 64
# Diagonal covariances screen only from this many values (rows x features) of the rows the
# starts run on. A diagonal model in the principal directions is not the model in the
# features (it is not rotation invariant), so the projection can rank its starts wrongly;
# below this size every start runs at full width, where they compete on the likelihood
# itself, for less time than the projection and the second run at full width (few rows of
# many features, benchmarks/wide_rows.py: likelier in 27 and less likely in 7 of 39 fits,
# in a median 0.79 of the time; docs/benchmarks.md, "Few rows of many features"). Full,
# tied and spherical models, and Lloyd, are rotation invariant and keep their form in the
# projection (where spherical and Lloyd's runs found the better optima in that table):
# they screen from SCREEN_FROM_FEATURES on.
SCREEN_DIAG_FROM_VALUES = 1 << 18
# Directions read beyond K: the means' K - 1, and some of the spread around them.
EXTRA_DIMS = 10


def screening_dims(n_features: int, n_components: int) -> int:
    """The principal directions the starts compete in."""
    return min(n_features, n_components + EXTRA_DIMS)


def screens(
    n_rows: int, n_features: int, n_components: int, covariance_type: str | None
) -> bool:
    """Whether starts on ``n_rows`` rows of ``n_features`` compete in a projection first:
    EM's with ``covariance_type``, or Lloyd's where None."""
    from_values = SCREEN_DIAG_FROM_VALUES if covariance_type == "diag" else 0
    return (
        n_features >= SCREEN_FROM_FEATURES
        and screening_dims(n_features, n_components) < n_features
        and n_rows * n_features >= from_values
    )


@dataclass(frozen=True)
class Projection:
    """``z = (x - center) @ basis``: B maps onto orthonormal directions (B, d, p), in the
    data's own units (covariances and ``reg_covar`` mean what they mean at full width).
    The rows it was fitted on (``rows``) are projected once (``projected``)."""

    center: Tensor  # (B, d)
    basis: Tensor  # (B, d, p)
    rows: Tensor  # (B, N, d)
    projected: Tensor  # (B, N, p)

    def __call__(self, x: Tensor) -> Tensor:
        """Points or means (B, M, d) in the projection, (B, M, p)."""
        if x is self.rows:
            return self.projected
        return (x - self.center[:, None, :]) @ self.basis


def principal_projection(
    x: Tensor, mask: Tensor | None, sample_weight: Tensor | None, n_dims: int
) -> Projection:
    """The (weighted) mean of each dataset of ``x`` (B, N, d) and its ``n_dims`` leading
    principal directions (:func:`~transformer_gmm.engine.standardize.leading_axes`).

    Examples
    --------
    >>> import torch
    >>> x = torch.randn(1, 500, 3, dtype=torch.float64) * torch.tensor([10.0, 1.0, 0.1])
    >>> projection = principal_projection(x, None, None, 1)
    >>> projection.basis.shape, round(abs(float(projection.basis[0, 0, 0])), 3)
    (torch.Size([1, 3, 1]), 1.0)
    """
    if mask is None and sample_weight is None:
        center = x.mean(dim=1)  # (B, d)
        weights = None
    else:
        weights = point_weights(x, mask, sample_weight)  # (B, N), zero on padding
        center = (weights[..., None] * x).sum(dim=1) / weights.sum(dim=1)[:, None]  # (B, d)
    # The directions from the first AXES_ROWS rows alone (real rows come first; in
    # canonical order they are a uniform draw): the variances along them are not needed.
    scaled = x[:, :AXES_ROWS] - center[:, None, :]  # (B, n, d)
    if weights is not None:
        scaled = scaled * weights[:, :AXES_ROWS, None].sqrt()  # 0 on padding
    counts = x.new_ones((x.shape[0], 1))  # any positive count: only the vectors are read
    vectors = leading_axes(scaled, counts, n_dims).vectors  # ascending
    basis = vectors.flip(-1)[..., :n_dims]  # (B, d, n_dims), leading first
    del scaled
    # x @ basis less the centre's: no second (B, N, d) array of centred rows.
    projected = x @ basis - (center[:, None, :] @ basis)
    return Projection(center, basis, x, projected)
