"""Choosing the number of components: ``n_components="auto"`` (``n_clusters="auto"``) or a
list of candidates, for both estimators.

Two ways to choose:

- ``"posterior"``: the backbone's K-posterior head reads P(K | X) for every candidate in one
  pass (:mod:`transformer_gmm.engine.k_posterior`); the most probable K is fitted once,
  its transformer's starts read by K's head from that same pass.
- ``"bic"``: every candidate is fitted as the estimator would fit it, and the lowest BIC
  wins: the mixture's BIC, or for k-means that of its hard-assignment mixture of spherical
  Gaussians with one shared variance (X-means, Pelleg & Moore 2000). Where the checkpoint
  reads P(K | X), every candidate's heads read the tokens of that one pass, as the
  posterior's choice does; elsewhere each candidate is the fit of an int K, pass and all.

``"auto"``, the default, takes the posterior where the checkpoint reads P(K | X) for every
candidate and BIC elsewhere: the posterior is ahead where components overlap and on the
real datasets, and faster, since it fits one K (``benchmarks/choose_k.py``). With ``"bic"``,
P(K | X) is also reported where the checkpoint reads it.

A clusterer counts clusters, not Gaussian components: where the checkpoint has a
cluster-count head, which reads P(C | X) for C clusters of any shape from the same pass,
the clusterer's posterior is P(C = k | X) P(K = k | X)^(1/2), normalized: the count of
clusters, tempered by that of components. The cluster-count head alone counts curved and
nested clusters best, but loses separated Gaussian clusters and shapes its training never
drew (hollow squares) that the K-posterior head counts; the full product loses moons,
which take many components. The square root keeps most of both (measured on draws apart
from the benchmark's; docs/choosing_k.md). Where the rows show fewer clusters than that
count, standing apart and each one cluster by the clusterer's test (one Gaussian;
``_merge.separated_count``), it takes the rows' count: the heads read a small
separated blob as two. Where they show more, standing twice as far apart and each one
Gaussian of any orientation but at most one (which may hold clusters that touch), it
takes the largest such count too: the heads read elongated clusters sheared alike as
fewer.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from numbers import Integral
from typing import TYPE_CHECKING

import numpy as np

from . import _merge
from ._collapsed import CollapsedComponentWarning, points_needed
from ._fitting import draw_seed
from .engine import model_cache
from .engine.device import resolve_device
from .engine.k_posterior import read_k_unknown
from .storage.checkpoints import is_missing_default

if TYPE_CHECKING:
    from .engine.readout import KUnknownPass
    from .nn import MixtureTransformer

# The candidates' upper end without a checkpoint: the largest K the bundled one covers.
DEFAULT_MAX_COMPONENTS = 10
# A clusterer's posterior is P(C | X) P(K = C | X)^this, normalized (the module's docstring).
COMPONENT_COUNT_POWER = 0.5


@dataclass(frozen=True)
class Choice:
    """The K chosen, and what it was chosen from."""

    n_components: int
    candidates: np.ndarray  # (C,) the K considered, increasing
    criterion: str  # "posterior" or "bic"
    values: np.ndarray  # (C,) the criterion per candidate, lower is better
    # (C,) P(K | X) over the candidates where the model reads it; a clusterer's is the
    # normalized product with P(C | X), clusters of any shape, where the model reads that.
    posterior: np.ndarray | None
    fitted: object | None  # the chosen candidate's fitted estimator, when BIC fitted them all
    # The pass that read the posterior, which the chosen K's fit starts from (posterior only).
    k_unknown_pass: KUnknownPass | None = None
    # (C,) P(K | X) alone, normalized over the candidates, where ``posterior`` is a
    # clusterer's product with P(C | X): the components that describe the density.
    component_posterior: np.ndarray | None = None
    # Where a clusterer's count was read against its rows' groups: the count and, where
    # they stand apart at it, those groups (``_merge.separated_count``).
    separated: _merge.SeparatedCount | None = None

    @property
    def n_density_components(self) -> int:
        """The most probable K under P(K | X) alone (a counted choice only)."""
        return int(self.candidates[np.argmax(self.component_posterior)])


def is_auto(value) -> bool:
    """Whether ``n_components`` asks for a choice rather than one K."""
    return not (isinstance(value, Integral) and not isinstance(value, bool))


def candidates(
    value, max_components, n_samples: int, backbone, k_name: str, points_needed: int = 1
) -> np.ndarray:
    """The K to choose from, increasing; a ValueError that says what to do for bad ones.
    By default ``"auto"`` considers no K whose components cannot each hold
    ``points_needed`` of the samples (a mixture's K collapses there, whatever the data)."""
    max_name = _max_name(k_name)
    if isinstance(value, str):  # "auto": 1 .. max_components
        if max_components is None:
            top = DEFAULT_MAX_COMPONENTS
            if backbone is not None:
                top = backbone.supported_n_components[-1]
            fitting = max(1, n_samples // max(1, points_needed))
            return np.arange(1, min(top, fitting) + 1)
        if max_components > n_samples:
            raise ValueError(
                f"{max_name}={max_components} exceeds n_samples={n_samples}: a fit cannot "
                f"have more components than samples. Lower {max_name} or pass more samples."
            )
        return np.arange(1, max_components + 1)
    ks = np.asarray(value)
    if ks.ndim != 1 or ks.size == 0 or not np.all(np.isfinite(ks.astype(float, copy=False))):
        raise ValueError(
            f"{k_name} must be an int, 'auto', or a non-empty list of candidate ints, "
            f"got {value!r}."
        )
    if not np.all(ks == np.round(ks)) or ks.min() < 1:
        raise ValueError(f"The candidates of {k_name} must be positive ints, got {value!r}.")
    ks = np.unique(ks.astype(int))
    if ks.max() > n_samples:
        raise ValueError(
            f"The candidates of {k_name} go up to {ks.max()}, but there are only "
            f"n_samples={n_samples}: pass more samples or fewer candidates."
        )
    return ks


def named_backbone(checkpoint) -> MixtureTransformer | None:
    """The backbone the estimator names, or None (checkpoint=None, or no default bundled)."""
    if checkpoint is None or is_missing_default(checkpoint):
        return None
    return model_cache.load_backbone(checkpoint)


def counts_clusters(clusterer, n_samples: int) -> bool:
    """Whether :func:`choose` counts ``clusterer``'s clusters of any shape: by the
    posterior, of a checkpoint with a cluster-count head."""
    params = clusterer._fit_params()
    backbone = named_backbone(params["checkpoint"])
    ks = candidates(params["n_clusters"], params["max_clusters"], n_samples, backbone, "n_clusters")
    criterion, _ = _criterion(params, backbone, ks)
    return criterion == "posterior" and backbone.has_cluster_count


def _criterion(params: dict, backbone, ks: np.ndarray) -> tuple[str, bool]:
    """The criterion ``params`` ask for, resolved, and whether the checkpoint reads
    P(K | X) for every candidate ``ks``; a ValueError where the posterior is asked for
    and cannot be read."""
    readable = backbone is not None and backbone.has_k_posterior
    covered = readable and ks.max() <= backbone.supported_n_components.stop - 1
    criterion = params["criterion"]
    if criterion == "auto":  # the posterior where the checkpoint reads it, BIC elsewhere
        criterion = "posterior" if covered else "bic"
    if criterion == "posterior" and not covered:
        why = (
            "reads no P(K | X)"
            if not readable
            else f"reads P(K | X) up to K={backbone.supported_n_components.stop - 1}"
        )
        raise ValueError(
            f"criterion='posterior' needs a checkpoint that reads P(K | X) for every "
            f"candidate, but checkpoint={params['checkpoint']!r} {why}. Use criterion='bic', "
            "or fewer candidates."
        )
    return criterion, covered


def choose(
    estimator,
    X,
    sample_weight,
    random_state,
    k_name: str,
    is_one_cluster: Callable[[np.ndarray, int], bool] | None = None,
) -> Choice:
    """Choose K for ``estimator`` (whose ``k_name`` is "auto" or candidates) on ``X``; a
    counted choice gives way to fewer groups that stand apart where ``is_one_cluster``
    holds for the rows of each, given their number (see the module)."""
    params = estimator._fit_params()
    backbone = named_backbone(params["checkpoint"])
    needed = 1
    if k_name == "n_components":  # each component's covariance needs its points
        needed = points_needed(params["covariance_type"], X.shape[1])
    ks = candidates(
        params[k_name], params[_max_name(k_name)], len(X), backbone, k_name, needed
    )
    criterion, covered = _criterion(params, backbone, ks)
    posterior, k_unknown_pass, component_posterior = None, None, None
    clusters = False
    if covered:
        seed = draw_seed(random_state)
        weights = None if sample_weight is None else [sample_weight]
        device = resolve_device(params["device"])
        n_views = params["n_views"]
        clusters = k_name == "n_clusters" and backbone.has_cluster_count
        p, k_unknown_pass, p_clusters = read_k_unknown(
            backbone, [X], weights, seed=seed, device=device, n_views=n_views,
            clusters=clusters,
        )
        if clusters:  # the count of clusters, tempered by that of components (see above)
            p_components = p[0, ks - 1].astype(np.float64)
            component_posterior = p_components / p_components.sum()
            p = p_clusters * p.astype(np.float64) ** COMPONENT_COUNT_POWER
        posterior = p[0, ks - 1] / p[0, ks - 1].sum()
    if criterion == "bic":
        with warnings.catch_warnings():
            # The chosen candidate's collapse is the estimator's to report, not each one's.
            warnings.simplefilter("ignore", CollapsedComponentWarning)
            fits = [
                _fit_candidate(estimator, params, k_name, K, X, sample_weight, k_unknown_pass)
                for K in ks
            ]
        values = np.array([fitted._weighted_bic(X, sample_weight) for fitted in fits])
        # A candidate with collapsed components wins on the likelihood of a handful of
        # points: it is chosen only where every candidate has one (and then it warns).
        collapsed = np.array([np.any(getattr(f, "collapsed_components_", False)) for f in fits])
        eligible = np.where(collapsed.all(), values, np.where(collapsed, np.inf, values))
        best = int(np.argmin(eligible))
        return Choice(
            int(ks[best]), ks, "bic", values, posterior, fits[best],
            component_posterior=component_posterior,
        )
    with np.errstate(divide="ignore"):
        values = -np.log(posterior)
    K = int(ks[np.argmax(posterior)])
    separated = None
    if clusters and is_one_cluster is not None:
        read = _merge.separated_count(X, K, sample_weight, is_one_cluster, int(ks.max()))
        if read is not None and read.n_clusters in ks:
            K, separated = read.n_clusters, read
    return Choice(
        K, ks, "posterior", values, posterior, None, k_unknown_pass, component_posterior,
        separated,
    )


def _max_name(k_name: str) -> str:
    return "max_components" if k_name == "n_components" else "max_clusters"


def _fit_candidate(estimator, params: dict, k_name: str, K: int, X, sample_weight, k_unknown_pass):
    """The estimator's fit with ``k_name=K``: the same parameters, a fresh estimator, its
    transformer's starts read from ``k_unknown_pass`` (the pass that read P(K | X)) where there is
    one, so that the candidates share one pass."""
    candidate = type(estimator)(**{**params, k_name: int(K)})
    if k_unknown_pass is None:
        return candidate.fit(X, sample_weight=sample_weight)
    candidate._fit_as_candidate(X, sample_weight, int(K), k_unknown_pass)
    return candidate
