"""EM accelerated by squared extrapolation (SQUAREM; Varadhan & Roland 2008, "Simple and
globally convergent methods for accelerating the convergence of any EM algorithm",
Scandinavian Journal of Statistics 35(2)), for rows whose EM converges slowly.

Where much of the data is missing, EM's rate is the fraction of information missing, and
it takes many passes. Every third pass here starts from an extrapolation of the last
three parameters (theta_0, theta_1, theta_2) instead of theta_2:

    r = theta_1 - theta_0,   v = theta_2 - 2 theta_1 + theta_0,   alpha = min(-|r| / |v|, -1)
    theta' = theta_0 - 2 alpha r + alpha^2 v                       (alpha = -1 gives theta_2)

(their scheme "SqS3"), per run over the weights, means and covariances as one vector. The
pass from theta' is kept where theta' is a mixture (weights positive, covariances positive
definite) and at least as likely as theta_1, the last parameters whose likelihood is
known; elsewhere that run's pass starts from theta_2, as plain EM's would. So the
likelihoods the loop reads never decrease, as in plain EM. A pass kept from theta' counts
as one iteration; a run whose extrapolation is refused takes a second pass in the same
iteration.

:class:`Accelerated` wraps the rows that :func:`~transformer_gmm.engine.em.run_em` reads,
so the loop, its stopping rule and its re-seeding of empty components are every fit's.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .em import select_runs
from .gaussian import try_precision_cholesky
from .m_step import MixtureParams

__all__ = ["Accelerated"]


def _vector(params: MixtureParams) -> Tensor:
    """(B, P) each run's weights, means and covariances, flattened into one row."""
    n_runs = params.means.shape[0]
    parts = (params.weights, params.means, params.covariances)
    return torch.cat([t.reshape(n_runs, -1) for t in parts], dim=1)


def _extrapolated(
    history: list[MixtureParams], covariance_type: str
) -> tuple[MixtureParams, Tensor]:
    """theta' from the three parameters of ``history`` (oldest first), and which runs (B,)
    it is a mixture for."""
    theta_0, theta_1, theta_2 = history
    x0, x1, x2 = _vector(theta_0), _vector(theta_1), _vector(theta_2)
    r, v = x1 - x0, x2 - 2 * x1 + x0
    r_norm, v_norm = r.norm(dim=1), v.norm(dim=1)
    # v = 0: steps of one length along a line, where no extrapolation is read (alpha = -1).
    alpha = torch.where(v_norm > 0, -r_norm / v_norm.clamp_min(torch.finfo(x0.dtype).tiny), -1.0)
    alpha = alpha.clamp(max=-1.0)[:, None]
    x = x0 - 2 * alpha * r + alpha.square() * v

    shapes = [t.shape for t in (theta_2.weights, theta_2.means, theta_2.covariances)]
    sizes = [s[1:].numel() for s in shapes]
    weights, means, covariances = (
        part.reshape(shape) for part, shape in zip(x.split(sizes, dim=1), shapes, strict=True)
    )
    weights = weights / weights.sum(-1, keepdim=True)
    precisions_cholesky, failed = try_precision_cholesky(covariances, covariance_type)
    valid = ~failed & (weights > 0).all(-1) & torch.isfinite(x).all(-1)
    return MixtureParams(weights, means, covariances, precisions_cholesky), valid


class Accelerated:
    """``rows`` (any rows :func:`~transformer_gmm.engine.em.run_em` reads whose ``step``
    returns covariances) with SQUAREM's extrapolation (see the module): the loop calls
    :meth:`step` with the parameters the last step returned; anything else (a re-seed,
    runs taken out) starts the extrapolation's history again."""

    def __init__(self, rows, covariance_type: str):
        self.rows, self.covariance_type = rows, covariance_type
        self._history: list[MixtureParams] = []  # the last parameters, oldest first
        self._returned: MixtureParams | None = None
        self._last_bound: Tensor | None = None  # the loop's last bound: theta_1's

    def __getattr__(self, name):  # counts, lower_bound, dtype, empty_below, ...
        return getattr(self.rows, name)

    def step(self, params: MixtureParams) -> tuple[Tensor, Tensor, MixtureParams, Tensor]:
        if params is not self._returned:
            self._history = [params]
        if len(self._history) < 3:
            bound, counts, new, failed = self.rows.step(params)
            self._history = [*self._history, new]
        else:  # theta_0, theta_1, theta_2: extrapolated; the result starts a new history
            bound, counts, new, failed = self._extrapolated_step(params)
            self._history = [new]
        self._returned, self._last_bound = new, bound
        return bound, counts, new, failed

    def _extrapolated_step(self, params: MixtureParams):
        """The pass from theta' where it is kept, from ``params`` (theta_2) elsewhere."""
        theta, valid = _extrapolated(self._history, self.covariance_type)
        theta = select_runs(valid, theta, params)
        bound, counts, new, failed = self.rows.step(theta)
        kept = valid & (bound >= self._last_bound) & ~failed
        refused = valid & ~kept
        if bool(refused.any()):
            plain = self.rows.step(params)
            bound = torch.where(refused, plain[0], bound)
            counts = torch.where(refused[:, None], plain[1], counts)
            new = select_runs(refused, plain[2], new)
            failed = torch.where(refused, plain[3], failed)
        return bound, counts, new, failed

    def reseed(self, params: MixtureParams, counts: Tensor, empty: Tensor):
        return self.rows.reseed(params, counts, empty)

    def take(self, keep: Tensor) -> Accelerated:
        # The runs taken start their extrapolation's history again.
        return Accelerated(self.rows.take(keep), self.covariance_type)
