"""A conjugate prior on the covariances: each component's covariance is drawn towards a
scale, as if it had seen ``count`` more rows of that spread.

Where a full covariance's d(d + 1) / 2 entries are estimated from few rows, or from pairs
of features that few rows observe together (missing values), the maximum-likelihood
covariance becomes nearly singular, and held-out rows in its thin directions score tens of
nats lower. The prior's mode (a maximum a posteriori M-step) keeps it wide enough:

    covariance_k = (scatter_k + count * scale) / (n_k + count)

the inverse-Wishart prior with ``count`` pseudo-observations of covariance ``scale``
(Fraley & Raftery 2007, "Bayesian regularization for normal mixture estimation and
model-based clustering", whose scale is the data's variance divided by K^(2/d): the
spread one of K components of equal volume would have). Means keep their weighted mean
(a flat prior). EM then climbs the log-likelihood plus :meth:`CovariancePrior.log_density`,
the bound its loop reads.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class CovariancePrior:
    """``count`` pseudo-observations (in the statistics' weight: rows times an average
    row's weight) of diagonal covariance ``scale`` (d,), for every component (once for
    "tied", whose covariance is one)."""

    count: float
    scale: Tensor  # (d,)

    @classmethod
    def of_data(
        cls, x: Tensor, observed: Tensor, row_weight: Tensor, n_components: int, count: float
    ) -> CovariancePrior:
        """The prior of ``count`` (in the rows' weight) for ``n_components`` components of
        the rows ``x`` (n, d), over their ``observed`` (n, d) entries (zero elsewhere),
        weighted by ``row_weight`` (n,): each feature's weighted variance over its observed
        entries (0 where none has weight), divided by ``n_components ** (2 / d)``."""
        weight = observed * row_weight[:, None]  # (n, d)
        # A feature observed only in rows of no weight has no spread to draw towards: 0.
        total = weight.sum(0).clamp_min(torch.finfo(x.dtype).tiny)
        mean = (weight * x).sum(0) / total
        variance = (weight * (x - mean).square()).sum(0) / total  # (d,)
        n_features = x.shape[1]
        return cls(count, variance / n_components ** (2.0 / n_features))

    def pseudo_scatter(self, covariance_type: str) -> Tensor:
        """What the pseudo-observations add to the scatter, in the shape the statistics
        keep it for ``covariance_type``."""
        if covariance_type in ("full", "tied"):
            return self.count * torch.diag(self.scale)
        if covariance_type == "diag":
            return self.count * self.scale
        return self.count * self.scale.mean()  # spherical

    def log_density(self, precisions_cholesky: Tensor, covariance_type: str) -> Tensor:
        """The prior's log-density (B,) of each run's covariances, up to a constant:
        ``-count / 2 * sum_k (log det covariance_k + trace(scale @ precision_k))``."""
        p = precisions_cholesky
        if covariance_type in ("full", "tied"):  # precision = p @ p.T
            log_det = -2.0 * torch.diagonal(p, dim1=-2, dim2=-1).log().sum(-1)
            trace = (self.scale[:, None] * p.square()).sum((-2, -1))
        elif covariance_type == "diag":
            log_det = -2.0 * p.log().sum(-1)
            trace = (self.scale * p.square()).sum(-1)
        else:  # spherical: one precision per component, over d features
            n_features = self.scale.shape[0]
            log_det = -2.0 * n_features * p.log()
            trace = self.scale.sum() * p.square()
        per_component = log_det + trace  # (B, K), or (B,) for tied
        if covariance_type != "tied":
            per_component = per_component.sum(-1)
        return -0.5 * self.count * per_component


def resolve_count(count, covariance_type: str) -> float:
    """``"auto"``: one pseudo-observation for full covariances, none (maximum likelihood)
    for the others, whose entries each come from their own observed values."""
    if count == "auto":
        return 1.0 if covariance_type == "full" else 0.0
    return float(count)
