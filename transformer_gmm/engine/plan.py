"""What a fit does, decided once: the estimator's parameters as a frozen plan.

Each estimator turns its parameters (and its random starts, drawn first) into a plan of
its algorithm: :class:`MixturePlan` for EM (TransformerGMM, ``fit_many``), :class:`KMeansPlan`
for Lloyd (TransformerClusterer). Both share :class:`FitPlan`'s fields: the number of
components, the stopping rule, the device, the seed and the starts.
:func:`transformer_gmm.engine.fit.fit` and, for a Dask array,
:mod:`transformer_gmm.engine.fit_by_blocks` run either; the plan's type says which algorithm.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from ..nn import MixtureTransformer
    from .readout import KUnknownPass


@dataclass(frozen=True)
class GivenStarts:
    """What the estimator fixed about a mixture fit's starts, for one dataset: ``n_seedings``
    k-means++ seedings, responsibilities ``resp`` (R, N, K), and any ``weights``, ``means``,
    ``precisions_cholesky`` that replace every start's (``*_init`` or a warm start).
    """

    n_seedings: int = 0
    resp: np.ndarray | None = None
    weights: np.ndarray | None = None
    means: np.ndarray | None = None
    precisions_cholesky: np.ndarray | None = None
    lower_bound: float = -math.inf

    @property
    def complete(self) -> bool:
        return all(p is not None for p in (self.weights, self.means, self.precisions_cholesky))

    @property
    def n_runs(self) -> int:
        n_runs = self.n_seedings + (0 if self.resp is None else len(self.resp))
        return 1 if n_runs == 0 and self.complete else n_runs


@dataclass(frozen=True, kw_only=True)
class FitPlan:
    """What every fit's plan holds, for every dataset: ``n_components`` (the clusters of
    k-means), the stopping rule, the ``device``, the ``seed`` of the fit's generator, how
    many transformer and k-means++ starts, and the name of each run's start.
    """

    n_components: int
    max_iter: int
    tol: float
    device: str
    seed: int
    backbone: MixtureTransformer | None = None
    n_transformer_inits: int = 0
    n_kmeans_inits: int = 0
    start_names: tuple[str, ...] = ()
    # The backbone's pass under the "K unknown" embedding (K chosen among candidates), which
    # the transformer's starts read K's head on, instead of a pass of their own.
    k_unknown_pass: KUnknownPass | None = None

    def __post_init__(self) -> None:
        if type(self) is FitPlan:  # its type is what says which algorithm runs
            raise TypeError("a plan is a MixturePlan or a KMeansPlan, not a FitPlan")

    @property
    def n_given(self) -> int:
        """The runs that start from the estimator's own starts (``given``)."""
        raise NotImplementedError

    @property
    def n_runs(self) -> int:
        """The runs of each dataset."""
        return self.n_transformer_inits + self.n_kmeans_inits + self.n_given

    def init_method(self, best_run: int) -> str:
        """The name of run ``best_run``'s start."""
        return self.start_names[best_run]


@dataclass(frozen=True, kw_only=True)
class MixturePlan(FitPlan):
    """An EM fit: :class:`FitPlan`'s fields, the ``covariance_type``, ``reg_covar``,
    ``given``, what the estimator fixed about the starts (its own starts, ``*_init``
    parameters or a warm start), and ``kmeans_if_starts_disagree``: run the k-means++
    starts of a dataset only where EM from the transformer's starts ended on different
    optima (``n_init="auto"``; see :func:`transformer_gmm.engine.fit.fit`); and ``gaps``,
    for one dataset whose missing entries were filled, where they were (n, d), for a
    backbone that reads them."""

    covariance_type: str
    reg_covar: float = 0.0
    given: GivenStarts | None = None
    kmeans_if_starts_disagree: bool = False
    gaps: np.ndarray | None = None  # (n, d) True where the one dataset's entry was filled

    @property
    def n_given(self) -> int:
        return 0 if self.given is None else self.given.n_runs


@dataclass(frozen=True, kw_only=True)
class KMeansPlan(FitPlan):
    """A Lloyd fit: :class:`FitPlan`'s fields, ``given``, the estimator's own starting
    centres (R, K, d) (an array ``init`` or its random draws), and whether to ``trace``
    each Lloyd iteration (``verbose``)."""

    given: np.ndarray | None = None
    trace: bool = False

    @property
    def n_given(self) -> int:
        return 0 if self.given is None else len(self.given)
