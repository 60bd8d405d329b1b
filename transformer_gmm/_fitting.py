"""The steps of a fit that the estimators and :func:`~transformer_gmm.fit_many` share, read
from an estimator's public parameters (``get_params(deep=False)``): checking them and the
data, the fit's plan (:class:`~transformer_gmm.engine.plan.MixturePlan` or
:class:`~transformer_gmm.engine.plan.KMeansPlan`) and its run; each estimator sets its
fitted attributes from the result itself (``_store_fit``). No torch here: the backbone is loaded by
:mod:`transformer_gmm.engine.model_cache` and read in :mod:`transformer_gmm.engine.starts`."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

import numpy as np
from scipy import sparse
from sklearn.utils._param_validation import validate_parameter_constraints
from sklearn.utils.validation import validate_data

from . import _initialization
from ._cluster_initialization import given_centers, init_kind, n_runs
from ._warnings import FallbackWarning, warn_user
from .engine import fit, model_cache
from .engine.device import resolve_device
from .engine.plan import GivenStarts, KMeansPlan, MixturePlan
from .storage.checkpoints import is_missing_default

if TYPE_CHECKING:
    from .nn import MixtureTransformer

# What runs without the transformer, as the FallbackWarning names it.
MIXTURE_FALLBACK = "EM with k-means++ initialisation"
KMEANS_FALLBACK = "k-means (Lloyd) with k-means++ seeding"


def validate_params(estimator_class: type, params: dict) -> None:
    """scikit-learn's check of ``params`` against the class's constraints."""
    validate_parameter_constraints(
        estimator_class._parameter_constraints, params, caller_name=estimator_class.__name__
    )


# --- input -----------------------------------------------------------------------------


def too_few_samples_message(n_components: int, n_samples: int) -> str:
    return (
        f"Expected n_samples >= n_components but got n_components = "
        f"{n_components}, n_samples = {n_samples}. Pass more samples or lower "
        "n_components."
    )


def validate_fit_data(
    estimator,
    X,
    n_components: int,
    accept_sparse=False,
    message=too_few_samples_message,
    allow_nan: bool = False,
) -> np.ndarray:
    """``X`` checked as ``estimator``'s fit takes it (which sets its ``n_features_in_``), in
    float64 or float32, dense, with at least two and ``n_components`` rows; NaN let through
    where ``allow_nan`` (inf never)."""
    X = validate_data(
        estimator,
        X,
        accept_sparse=accept_sparse,
        dtype=[np.float64, np.float32],
        ensure_min_samples=2,
        ensure_all_finite="allow-nan" if allow_nan else True,
    )
    if X.shape[0] < n_components:
        raise ValueError(message(n_components, X.shape[0]))
    return densified(X) if sparse.issparse(X) else X


# --- the plan --------------------------------------------------------------------------


# The transformer's readings of a mixture stream's first batch under ``n_views="auto"`` (one
# in ``fit``): that fit starts every later step, its cost is shared by the whole stream, and
# on large tables more readings find likelier optima (docs/benchmarks.md, "Streams"). A
# clusterer's stream reads its first batch once, as ``fit`` does: there four readings led
# to no lower k-means basin, for twice the first call's time.
MIXTURE_STREAM_VIEWS = 4


def resolved_params(params: dict, auto_views: int = 1) -> dict:
    """``params`` (an estimator's ``get_params(deep=False)``) as a fit reads them:
    ``n_views="auto"`` made ``auto_views``, one but for a stream's first batch (an int
    stays as it is, so resolving twice changes nothing)."""
    if params["n_views"] != "auto":
        return params
    return {**params, "n_views": auto_views}


def n_starts(params: dict, uses_transformer: bool, with_kmeans: bool = True) -> tuple[int, int]:
    """How many starts to run: (from the transformer, from k-means++). "auto" runs the
    transformer's ``2 * n_views`` and two k-means++ starts (they fail on different datasets;
    docs/benchmarks.md), one k-means++ start without a transformer; none with ``max_iter=0``
    or without ``with_kmeans`` (see :func:`transformer_starts_suffice`).
    """
    n_init = params["n_init"]
    if not uses_transformer:
        return 0, 1 if n_init == "auto" else n_init
    from_transformer = 2 * params["n_views"]
    if n_init == "auto":
        alone = params["max_iter"] == 0 or not with_kmeans
        return (from_transformer, 0) if alone else (from_transformer, 2)
    n_transformer = min(n_init, from_transformer)
    return n_transformer, n_init - n_transformer


def backbone_or_fallback(checkpoint, n_components: int, fallback: str) -> MixtureTransformer | None:
    """The backbone that covers this request, or None (with a FallbackWarning when the
    user would expect the transformer). A checkpoint the user named that cannot be
    found or loaded raises CheckpointError: that is never silently replaced."""
    if checkpoint is None or n_components == 1:
        # No checkpoint asked for, or nothing to learn: one component's maximum
        # likelihood estimate is the sample mean and covariance.
        return None
    if is_missing_default(checkpoint):
        warn_user(
            "No default checkpoint is bundled with this version of transformer_gmm, so "
            f"the estimator falls back to {fallback}. Pass "
            "checkpoint=<folder or Hub id> to use a trained transformer, or "
            "checkpoint=None to choose this fallback explicitly and silence this warning.",
            FallbackWarning,
        )
        return None
    backbone = model_cache.load_backbone(checkpoint)
    if n_components not in backbone.supported_n_components:
        k = backbone.supported_n_components
        warn_user(
            f"Checkpoint {str(checkpoint)!r} has readout heads for "
            f"{k.start} to {k.stop - 1} components, not {n_components}; falling back to "
            f"{fallback}.",
            FallbackWarning,
        )
        return None
    return backbone


def transformer_starts(
    params: dict, n_components: int, fallback: str, k_unknown_pass=None, with_kmeans=True
) -> dict:
    """The plan's starts when the transformer starts the fit: its backbone (None when
    it falls back), the numbers of the transformer's and of k-means++'s starts (none of
    the latter under ``n_init="auto"`` without ``with_kmeans``), the name of each run's
    start, and ``k_unknown_pass``, the pass under the "K unknown" embedding that read
    P(K | X) (its starts read that pass; None: a pass of their own)."""
    backbone = backbone_or_fallback(params["checkpoint"], n_components, fallback)
    n_transformer, n_kmeans = n_starts(params, backbone is not None, with_kmeans)
    return dict(
        backbone=backbone,
        n_transformer_inits=n_transformer,
        n_kmeans_inits=n_kmeans,
        start_names=("transformer",) * n_transformer + ("k-means++",) * n_kmeans,
        k_unknown_pass=k_unknown_pass if n_transformer > 0 else None,
    )


# The most rows of a full-covariance fit that n_init="auto" starts from the transformer's
# starts alone. On small tables the two k-means++ starts cost a quarter of the fit and
# rarely find a likelier optimum; on draws of 500 to 8,000 rows of the large tables they
# find one in a sixth to a half of the fits, and the fit with them stays within
# GaussianMixture(n_init=3)'s time (docs/benchmarks.md, "The transformer's starts alone on
# small full fits").
STARTS_ALONE_ROWS = 512


def transformer_starts_suffice(params: dict, n_samples: int, n_features: int) -> bool:
    """Whether ``n_init="auto"`` leaves out a mixture fit's k-means++ starts: full
    covariances, on small data (at most ``STARTS_ALONE_ROWS`` rows and fewer than
    ``GATED_FROM_VALUES`` values), where EM is cheap and the fit's fixed cost decides its
    time. Larger data keep them: there they find likelier optima often enough, for a
    small share of the fit's time."""
    return (
        params["covariance_type"] == "full"
        and n_samples <= STARTS_ALONE_ROWS
        and n_samples * n_features < fit.GATED_FROM_VALUES
    )


def gated_kmeans(params: dict, starts: dict) -> bool:
    """Whether a mixture fit runs its k-means++ starts only where the transformer's
    disagree: with ``n_init="auto"``, two or more transformer starts and k-means++ ones.
    An int ``n_init`` runs every start it asks for."""
    return (
        params["n_init"] == "auto"
        and starts["n_transformer_inits"] >= 2
        and starts["n_kmeans_inits"] > 0
    )


Plan = TypeVar("Plan", MixturePlan, KMeansPlan)


def _plan(
    kind: type[Plan], params: dict, n_components: int, device: str, fields: dict, random_state
) -> Plan:
    """A plan of ``kind``: the shared settings and ``fields``; the seed of the fit's
    generator is drawn last."""
    return kind(
        n_components=n_components,
        max_iter=params["max_iter"],
        tol=params["tol"],
        device=device,
        seed=draw_seed(random_state),
        **fields,
    )


def mixture_plan(
    params: dict, X, sample_weight, random_state, warm_start: GivenStarts | None = None,
    k_unknown_pass=None, gaps: np.ndarray | None = None, n_samples: int | None = None,
) -> MixturePlan:
    """The mixture fit of ``X``, decided once: EM settings and starts (the backbone or None,
    the numbers of the transformer's and of k-means's starts, the other starts and the given
    parameters or None, the name of each run's start). ``warm_start``: the fitted
    parameters a warm start goes on from (the estimator's own); ``k_unknown_pass`` the pass that
    read P(K | X) (see :func:`transformer_starts`); ``gaps`` (n, d) where ``X``'s missing
    entries were filled, read by a backbone that reads them; ``n_samples`` the rows of the
    largest dataset the plan fits, where that is not ``X`` (``fit_many``). The random
    starts are drawn from ``random_state`` first, as scikit-learn does, then the seed of
    the fit's generator."""
    params = resolved_params(params)
    device = resolve_device(params["device"])
    K = params["n_components"]
    em = dict(covariance_type=params["covariance_type"], reg_covar=params["reg_covar"])
    if warm_start is not None:
        fields = dict(em, given=warm_start, start_names=("warm_start",))
        return _plan(MixturePlan, params, K, device, fields, random_state)
    given = _initialization.initial_parameters(params, X.shape[1])
    init_params = params["init_params"]
    n_init = 1 if params["n_init"] == "auto" else params["n_init"]
    names = (init_params,) * n_init
    if len(given) == 3:  # nothing left to initialise
        fields = dict(em, given=GivenStarts(**given), start_names=("user",))
    elif init_params == "transformer":
        n_rows = X.shape[0] if n_samples is None else n_samples
        with_kmeans = not transformer_starts_suffice(params, n_rows, X.shape[1])
        starts = transformer_starts(params, K, MIXTURE_FALLBACK, k_unknown_pass, with_kmeans)
        backbone = starts["backbone"]
        fields = dict(
            em, **starts, given=GivenStarts(**given) if given else None,
            kmeans_if_starts_disagree=gated_kmeans(params, starts) and not given,
            gaps=gaps if backbone is not None and backbone.config.reads_gaps else None,
        )
    elif init_params == "kmeans":
        given = GivenStarts(**given) if given else None
        fields = dict(em, n_kmeans_inits=n_init, given=given, start_names=names)
    elif init_params == "k-means++":
        fields = dict(em, given=GivenStarts(n_seedings=n_init, **given), start_names=names)
    else:
        resp = _initialization.random_responsibilities(
            init_params, X, K, n_init, random_state, sample_weight
        )
        fields = dict(em, given=GivenStarts(resp=resp, **given), start_names=names)
    return _plan(MixturePlan, params, K, device, fields, random_state)


def kmeans_plan(
    params: dict, X, sample_weight, random_state, name: str, k_unknown_pass=None
) -> KMeansPlan:
    """The k-means fit of ``X``, decided once: the starts (the backbone or None, the numbers
    of the transformer's and of k-means++'s starts, the estimator ``name``'s own starting
    centres (R, K, d) or None, the name of each run's start) and whether to trace Lloyd
    (``verbose``); ``k_unknown_pass`` as :func:`mixture_plan`'s. Draws the random starts from
    ``random_state`` first, as scikit-learn does, then the seed of the fit's generator."""
    params = resolved_params(params)
    device = resolve_device(params["device"])
    K, init = params["n_clusters"], params["init"]
    kind = init_kind(init)
    trace = bool(params["verbose"])  # a fit by blocks traces nothing
    if kind == "transformer":
        fields = dict(transformer_starts(params, K, KMEANS_FALLBACK, k_unknown_pass), trace=trace)
        return _plan(KMeansPlan, params, K, device, fields, random_state)
    n_init = n_runs(init, params["n_init"], name)
    if kind == "k-means++":
        fields = dict(n_kmeans_inits=n_init, start_names=("k-means++",) * n_init, trace=trace)
    else:
        given = given_centers(init, X, K, n_init, random_state, sample_weight)
        fields = dict(given=given, start_names=(kind,) * len(given), trace=trace)
    return _plan(KMeansPlan, params, K, device, fields, random_state)


def run(plan: MixturePlan | KMeansPlan, X, sample_weight=None):
    """``plan`` run on ``X`` in memory (a Dask array's fit runs
    :func:`transformer_gmm._dask.fit_plan` instead)."""
    return fit.fit(plan, [X], None if sample_weight is None else [sample_weight])


# A fit densifies sparse input (EM and Lloyd run on dense tensors) up to this many
# values, 2 GiB in float64; past it, reducing the dimension first is the better fit.
MAX_DENSIFIED_VALUES = 2**28


def densified(X) -> np.ndarray:
    """A sparse matrix as a dense array, or a ValueError that says what to do when it
    would not fit in memory comfortably."""
    n_values = X.shape[0] * X.shape[1]
    if n_values > MAX_DENSIFIED_VALUES:
        gib = n_values * X.dtype.itemsize / 2**30
        raise ValueError(
            f"Sparse X of shape {X.shape} would take {gib:.1f} GiB once densified, and the "
            "fit runs on dense arrays. Reduce its dimension first, e.g. with "
            "sklearn.decomposition.TruncatedSVD in a Pipeline, or fit on fewer rows."
        )
    return X.toarray()


def draw_seed(random_state: np.random.RandomState) -> int:
    """One integer seed for torch's generator, drawn from the estimator's random state."""
    return int(random_state.randint(np.iinfo(np.int32).max))
