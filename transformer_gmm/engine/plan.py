"""What a fit does, decided once: the estimator's parameters as one frozen :class:`FitPlan`.

Each estimator turns its parameters (and its random starts, drawn first) into a plan;
:func:`transformer_gmm.engine.fit.fit` and, for a Dask array,
:mod:`transformer_gmm.engine.fit_by_blocks` run it, for mixtures and for k-means alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from ..nn import MixtureTransformer
    from .readout import Reading
    from .starts import GivenStarts


@dataclass(frozen=True)
class FitPlan:
    """One fit's settings, for every dataset: ``covariance_type`` (None for k-means), how many
    transformer and k-means++ starts, ``given`` starts, ``start_names``, ``seed``, ``trace``.
    """

    n_components: int
    max_iter: int
    tol: float
    device: str
    seed: int
    covariance_type: str | None = None  # None: k-means
    reg_covar: float = 0.0
    backbone: MixtureTransformer | None = None
    n_transformer_inits: int = 0
    n_kmeans_inits: int = 0
    given: GivenStarts | np.ndarray | None = None
    start_names: tuple[str, ...] = ()
    trace: bool = False
    # The backbone's pass under the "K unknown" embedding (K chosen among candidates), which
    # the transformer's starts read K's head on, instead of a pass of their own.
    reading: Reading | None = None

    @property
    def is_mixture(self) -> bool:
        return self.covariance_type is not None

    @property
    def n_given(self) -> int:
        """The runs that start from ``given``."""
        if self.given is None:
            return 0
        return self.given.n_runs if self.is_mixture else len(self.given)

    @property
    def n_runs(self) -> int:
        """The runs of each dataset."""
        return self.n_transformer_inits + self.n_kmeans_inits + self.n_given

    def init_method(self, best_run: int) -> str:
        """The name of run ``best_run``'s start."""
        return self.start_names[best_run]
