"""TransformerClusterer: k-means clustering whose labels a pretrained transformer proposes."""

from __future__ import annotations

import functools
import warnings
from numbers import Integral

import numpy as np
from scipy.sparse import issparse
from sklearn.base import (
    ClassNamePrefixFeaturesOutMixin,
    ClusterMixin,
    TransformerMixin,
    _fit_context,
)
from sklearn.exceptions import ConvergenceWarning
from sklearn.metrics.pairwise import euclidean_distances
from sklearn.utils import check_random_state, gen_batches
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.extmath import row_norms

from . import (
    _array_api,
    _choose_k,
    _fitting,
    _initialization,
    _merge,
    _missing,
    _mixture_methods,
    _streaming,
)
from ._base import TransformerMixtureBase
from ._cluster_initialization import init_kind
from ._rows import Rows
from ._verbose import kmeans_report
from ._warnings import warn_user
from .engine import fit as engine_fit
from .engine import online, row_order
from .engine.plan import KMeansPlan


def _too_few_samples_message(n_clusters: int, n_samples: int) -> str:
    return (  # KMeans's words, then what to do
        f"n_samples={n_samples} should be >= n_clusters={n_clusters}. Pass more "
        "samples or lower n_clusters."
    )


def _distances(X, points: np.ndarray) -> np.ndarray:
    """Euclidean distances (n, m) from the rows of ``X`` to ``points`` (m, d), both less
    the points' mean. ``euclidean_distances`` expands ``||x||^2 - 2 x.p + ||p||^2``, which
    loses the digits an offset takes (rows 1e9 from the origin lose unit distances
    altogether) where the differences do not; distances do not depend on the offset.
    Sparse rows are read as they are: less an offset, they would be dense."""
    if issparse(X):
        return euclidean_distances(X, points)
    offset = points.mean(axis=0)
    X, points = X - offset, points - offset
    if X.dtype == np.float32 and points.dtype == np.float32:
        return euclidean_distances(X, points)  # float64 products of float32 chunks
    # euclidean_distances' own float64 arithmetic, to the bit, without validating the rows
    # again (the estimator's door has): most of a call's time on small inputs.
    X, points = X.astype(np.float64, copy=False), points.astype(np.float64, copy=False)
    distances = -2 * (X @ points.T)
    distances += row_norms(X, squared=True)[:, None]
    distances += row_norms(points, squared=True)[None, :]
    np.maximum(distances, 0, out=distances)
    return np.sqrt(distances, out=distances)


def _nearest_center(X: np.ndarray, centers: np.ndarray) -> np.ndarray:
    """The nearest of ``centers`` to each row, as ``predict`` gives it."""
    return _distances(X, centers).argmin(axis=1).astype(np.int32)


def _nearest_row_group(X: np.ndarray, rows: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """The group of the nearest of ``rows`` to each row of ``X`` (ties: the first)."""
    # Blocks of X against every row, a few MiB each; not pairwise_distances_argmin, whose
    # thread pool costs tens of milliseconds a call on small data.
    nearest = np.empty(len(X), dtype=np.int64)
    for block in gen_batches(len(X), max(1, 2**19 // max(len(rows), 1))):
        nearest[block] = _distances(X[block], rows).argmin(axis=1)
    return groups[nearest].astype(np.int32)


def is_one_gaussian(rows: np.ndarray, n_groups: int = 1) -> bool:
    """Whether one diagonal Gaussian describes ``rows`` at least as well as two, by BIC:
    the clusterer's test of a group of rows that stands apart, one of ``n_groups`` tested
    together (``_merge``). One Gaussian's fit is the rows' mean and variances; two are
    fitted by EM from one seeded k-means++ start, so the rows alone decide. Two must win by
    more than ``2 log(n_groups)`` (a Bayes factor above ``n_groups``), so that a count of
    many groups is refused by chance no more often than a count of one. Diagonal
    covariances, one start and the margin were chosen on draws apart from the benchmark's
    (docs/choosing_k.md)."""
    n, d = rows.shape
    params = _two_diagonal_params()
    variances = rows.var(axis=0) + params["reg_covar"]
    log_likelihood = -0.5 * n * float(np.sum(np.log(2 * np.pi * variances) + 1))
    one = -2 * log_likelihood + 2 * d * np.log(n)  # d means, d variances
    # The engine's fit, as TransformerGMM(**params).fit(rows) runs it (the same draws and
    # parameters): on a group's few rows, the estimator's validation and scoring would
    # cost a fifth of the test.
    plan = _fitting.mixture_plan(params, rows, None, check_random_state(params["random_state"]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # two components may collapse or converge slowly
        two = engine_fit.fit(plan, [rows])
    parameters = (two.weights[0], two.means[0], two.precisions_cholesky[0], "diag")
    score = float(_mixture_methods._score_samples(rows, *parameters).mean())
    n_parameters = 4 * d + 1  # two means and two variances a feature, one free weight
    two_bic = -2 * score * n + n_parameters * np.log(n)  # TransformerGMM.bic's arithmetic
    return bool(one <= two_bic + 2 * np.log(n_groups))


@functools.cache
def _two_diagonal_params() -> dict:
    """The parameters of :func:`is_one_gaussian`'s two-component fit."""
    from .gmm import TransformerGMM

    return TransformerGMM(
        2, covariance_type="diag", checkpoint=None, n_init=1, random_state=0
    ).get_params()


class TransformerClusterer(
    ClassNamePrefixFeaturesOutMixin, TransformerMixin, ClusterMixin, TransformerMixtureBase
):
    """K-means clustering started from the labels a pretrained transformer assigns.

    The transformer's per-point head labels every point in one forward pass; the cluster
    centres are the means of those labels, and Lloyd's algorithm then refines them on
    all of ``X``. Where the checkpoint has no head for ``n_clusters`` (or no default
    checkpoint is bundled), k-means++ seeds Lloyd instead, as in
    :class:`sklearn.cluster.KMeans`, with a :class:`~transformer_gmm.FallbackWarning`.

    Read more in the :ref:`User Guide <user-guide-fit>`; every parameter of ``KMeans``
    is taken, with the differences listed in :ref:`Coming from scikit-learn
    <coming-from-kmeans>`.

    Parameters
    ----------
    n_clusters : int, "auto" or array-like of int, default=8
        The number of clusters. ``"auto"`` chooses it among ``1`` to ``max_clusters``, and
        a list (or range) among its values, by ``criterion`` (see :ref:`Choosing the
        number of components <choosing-k>`).
    max_clusters : int, default=None
        The largest K that ``n_clusters="auto"`` considers; by default the largest the
        checkpoint covers (10 without one), at most ``n_samples``. Ignored otherwise.
    criterion : {"auto", "bic", "posterior"}, default="auto"
        How K is chosen when ``n_clusters`` is not an int: ``"posterior"``, the most
        probable K under the checkpoint's learned P(K | X), from one forward pass (where
        the checkpoint also counts clusters of any shape, as the bundled one does, the
        most probable count under P(C | X) P(K | X)^(1/2): a ring or two moons are
        clusters, not the many components a mixture needs for them; a count that the
        rows show to be too many, falling into fewer groups that stand apart and are
        each one Gaussian, gives way to that number of groups, and one they show to be too
        few, falling into more groups far apart that are all but at most one one
        Gaussian of any orientation, to the largest such number; where the rows fall into
        as many groups as the count that stand apart, no row's near neighbour in another,
        ``labels_`` are those groups and :meth:`predict` gives each row the group of its
        nearest fitted row, so that two moons or nested rings are labelled as a person
        sees them); ``"bic"``, the lowest BIC of every candidate's clustering (X-means);
        ``"auto"``, the posterior where the checkpoint reads it for every candidate, else
        BIC.
    merge : bool, default=False
        With ``n_clusters`` not an int, label the clusters by a merged mixture rather
        than by k-means: the components of a mixture that ``TransformerGMM`` fits are
        merged, and ``labels_`` and :meth:`predict` follow the merged mixture, so that a
        curved or elongated cluster can be one cluster (see :ref:`Merged clusters
        <merged-clusters>`). Where the checkpoint counts clusters, they are merged down to
        the count ``merge=False`` finds, components whose rows touch first; elsewhere by
        the entropy criterion; the mixture runs from one start (the transformer's, or
        k-means++ without one) unless ``n_init`` is an int. Where the rows themselves
        fall into that many groups that stand apart, those groups label them, as without
        ``merge`` (see ``criterion``): a component that spans two nested rings then
        splits. Ignored with an int ``n_clusters``.
    init : {"transformer", "k-means++", "random"}, callable or array-like, \
default="transformer"
        Where Lloyd starts: ``"transformer"``, the transformer's clusterings, then
        k-means++ (see ``n_init``). The others skip the transformer and are
        :class:`~sklearn.cluster.KMeans`'s: k-means++ seeding, ``n_clusters`` rows drawn in
        proportion to ``sample_weight``, an array of shape (n_clusters, n_features), or a
        callable ``init(X, n_clusters, random_state=random_state)`` that returns one.
    n_init : "auto" or int, default="auto"
        The number of initialisations, run as one batch; the lowest inertia is kept.
        With the transformer, the first ``2 * n_views`` are its starts and the rest
        k-means++ starts; ``"auto"`` runs all of the transformer's and two k-means++
        (the transformer's alone with ``max_iter=0``, one k-means++ without a
        transformer). With another ``init``, ``"auto"`` is ``KMeans``'s: 1 for
        ``"k-means++"`` or an array, 10 for ``"random"`` or a callable.
    max_iter : int, default=300
        The number of Lloyd iterations; ``0`` keeps the starting centres.
    tol : float, default=1e-4
        Lloyd stops when the squared shift of the centres falls below ``tol`` times the
        mean variance of the features, or when no label changes.
    verbose : int, default=0
        Print scikit-learn's report of each initialisation's Lloyd iterations (after
        the batch has run).
    random_state : int, RandomState instance or None, default=None
        Seeds the random starts, the rows the transformer reads when ``n_samples``
        exceeds its context, and the k-means++ seedings.
    copy_x : bool, default=True
        Accepted for ``KMeans``'s signature: ``X`` is never modified.
    algorithm : {"lloyd", "elkan"}, default="lloyd"
        Accepted for ``KMeans``'s signature: both run the same batched Lloyd iterations.
    checkpoint : str, path or None, default="default"
        The transformer: a bundled name, a local checkpoint folder, or a Hugging Face
        Hub id. ``None`` uses k-means++ without a warning; a named checkpoint that
        cannot be loaded raises. Used by ``init="transformer"`` only.
    n_views : "auto" or int, default="auto"
        Readings of the data by the transformer, in one batch; each costs a forward pass
        and gives two more starts (see :class:`TransformerGMM`). ``"auto"`` reads one view,
        in :meth:`fit` and in the first call of :meth:`partial_fit` alike.
    device : str, default="auto"
        ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"auto"`` (CUDA when available).

    Attributes
    ----------
    cluster_centers_ : ndarray of shape (n_clusters, n_features)
        Cluster centres, of the dtype of the training data.
    labels_ : ndarray of shape (n_samples,)
        The nearest centre of each training sample; after a fit on a dask array, a lazy
        dask array (see :ref:`Fitting on a Dask array <dask-fit>`). With ``n_clusters``
        not an int, where the rows fall into groups that stand apart (see
        ``criterion``), or with ``merge=True``, each sample's cluster, whose mean is its
        centre.
    inertia_ : float
        Sum of squared distances of the training samples to the centre of their label,
        weighted by ``sample_weight``.
    n_iter_ : int
        Lloyd iterations of the kept initialisation (above 8,192 samples, those on the
        subsample the starts are compared on, plus those on all of ``X``).
    init_method_ : {"transformer", "k-means++", "random", "array", "callable"}
        Where the kept clustering started.
    device_ : str
        The device the fit ran on.
    n_clusters_ : int
        The number of clusters fitted: ``n_clusters``, or the K chosen.
    candidates_ : ndarray of shape (n_candidates,)
        The K that were considered, when ``n_clusters`` is not an int.
    criterion_ : ndarray of shape (n_candidates,)
        The value of ``selection_criterion_`` for each candidate (lower is better): the
        BIC, or ``-log P(K | X)``.
    selection_criterion_ : {"posterior", "bic"}
        How K was chosen.
    k_posterior_ : ndarray of shape (n_candidates,)
        P(K | X) of each candidate under the checkpoint, when it reads one; where it counts
        clusters too, P(C | X) P(K | X)^(1/2), normalized (the posterior it chooses by;
        ``n_clusters_`` is below its mode where the rows show fewer clusters, see
        ``criterion``).
    mixture_ : TransformerGMM
        With ``merge=True`` and ``n_clusters`` not an int: the fitted mixture whose
        components were merged.
    component_to_cluster_ : ndarray of shape (n_components,)
        With ``merge=True``: the cluster of each of ``mixture_``'s components (the labels,
        unless the clusters stand apart row by row; see ``merge``).
    n_features_in_ : int
        Number of features seen during fit.
    feature_names_in_ : ndarray of shape (`n_features_in_`,)
        Names of features seen during fit, when ``X`` has string column names.
    n_steps_ : int
        Batches :meth:`partial_fit` has read since the stream started (the first
        included); set by :meth:`partial_fit` only.
    n_samples_seen_ : int
        Rows :meth:`partial_fit` has read since the stream started.

    See Also
    --------
    sklearn.cluster.KMeans : Lloyd from k-means++ seeding.
    TransformerGMM : Soft clustering (a Gaussian mixture) with the same backbone.

    Examples
    --------
    >>> import numpy as np
    >>> from transformer_gmm import TransformerClusterer
    >>> rng = np.random.default_rng(0)
    >>> X = np.vstack([rng.normal(-5, 1, (50, 2)), rng.normal(5, 1, (50, 2))])
    >>> km = TransformerClusterer(n_clusters=2, checkpoint=None, random_state=0).fit(X)
    >>> np.bincount(km.labels_).tolist()
    [50, 50]
    >>> bool(km.predict([[-5.0, -5.0]])[0] == km.labels_[0])
    True

    Two clusters, each drawn as two overlapping Gaussians, counted as two with ``merge``:

    >>> X = np.vstack([rng.normal(m, 1, (100, 2)) for m in (-12, -10, 10, 12)])
    >>> km = TransformerClusterer(
    ...     n_clusters=[4], merge=True, checkpoint=None, random_state=0
    ... ).fit(X)
    >>> km.mixture_.n_components_, km.n_clusters_
    (4, 2)
    """

    _parameter_constraints: dict = {
        **TransformerMixtureBase._parameter_constraints,
        "n_clusters": [
            Interval(Integral, 1, None, closed="left"),
            StrOptions({"auto"}),
            "array-like",
        ],
        "max_clusters": [Interval(Integral, 1, None, closed="left"), None],
        "criterion": [StrOptions({"auto", "bic", "posterior"})],
        "merge": ["boolean"],
        "init": [StrOptions({"transformer", "k-means++", "random"}), callable, "array-like"],
        "verbose": ["verbose"],
        "copy_x": ["boolean"],
        "algorithm": [StrOptions({"lloyd", "elkan"})],
    }
    _accept_sparse = "csr"
    # NaN marks a missing entry in fit and the methods that read rows (see _missing).
    _allow_nan = True
    _streamed_attribute = "cluster_centers_"
    _k_name = "n_clusters"
    _in_memory_message = (
        "sample_weight, init other than 'transformer' or 'k-means++', and n_clusters "
        "other than an int need X in memory; fit on a numpy array (X.compute()) to use them."
    )
    _too_few_samples = staticmethod(_too_few_samples_message)

    def __init__(
        self,
        n_clusters=8,
        *,
        max_clusters=None,
        criterion="auto",
        merge=False,
        init="transformer",
        n_init="auto",
        max_iter=300,
        tol=1e-4,
        verbose=0,
        random_state=None,
        copy_x=True,
        algorithm="lloyd",
        checkpoint="default",
        n_views="auto",
        device="auto",
    ):
        self.n_clusters = n_clusters
        self.max_clusters = max_clusters
        self.criterion = criterion
        self.merge = merge
        self.init = init
        self.n_init = n_init
        self.max_iter = max_iter
        self.tol = tol
        self.verbose = verbose
        self.random_state = random_state
        self.copy_x = copy_x
        self.algorithm = algorithm
        self.checkpoint = checkpoint
        self.n_views = n_views
        self.device = device

    @property
    def _n_features_out(self) -> int:
        return self.cluster_centers_.shape[0]

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y=None, sample_weight=None):
        """Cluster ``X``.

        Parameters
        ----------
        X : array-like, sparse matrix or dask array of shape (n_samples, n_features)
            Training data; a sparse matrix is densified for the fit. A
            ``dask.array.Array`` chunked by rows is clustered where its chunks live, without
            gathering it, and ``labels_`` is then lazy (see :ref:`Fitting on a Dask array
            <dask-fit>`). In memory, NaN marks a missing entry: k-POD then minimises the
            inertia over the observed entries (see :ref:`Missing values
            <user-guide-missing-values>`).
        y : Ignored
            Not used, present for API consistency.
        sample_weight : array-like of shape (n_samples,), default=None
            Non-negative weights of the samples, as in :class:`~sklearn.cluster.KMeans`:
            centres are weighted means and the inertia a weighted sum; the transformer
            reads rows drawn in proportion to their weights, and k-means++ and "random"
            draw in proportion to them. Integer weights fit as repeated rows.

        Returns
        -------
        self : TransformerClusterer
            The fitted estimator.

        Examples
        --------
        >>> import numpy as np
        >>> from transformer_gmm import TransformerClusterer
        >>> rng = np.random.default_rng(0)
        >>> X = np.vstack([rng.normal(-5, 1, (50, 2)), rng.normal(5, 1, (50, 2))])
        >>> km = TransformerClusterer(n_clusters=2, checkpoint=None, random_state=0).fit(X)
        >>> km.cluster_centers_.shape, km.init_method_
        ((2, 2), 'k-means++')
        >>> np.sort(km.cluster_centers_[:, 0]).round().tolist()
        [-5.0, 5.0]
        """
        self._fit(X, sample_weight)
        return self

    def _needs_X_in_memory(self, auto: bool, sample_weight) -> bool:
        """Whether this fit needs ``X`` in memory: K to choose, ``sample_weight``, or an
        ``init`` other than the transformer or k-means++."""
        return (
            auto
            or sample_weight is not None
            or init_kind(self.init) not in ("transformer", "k-means++")
        )

    def _forget_previous_fit(self) -> None:
        for name in ("mixture_", "component_to_cluster_", "_separated"):  # of a merged fit
            self.__dict__.pop(name, None)

    def _choose(self, X, sample_weight, has_missing: bool) -> tuple:
        """The K to fit and the pass that chose it or None; K is None when the choice has
        already fitted it (by BIC, whose fitted attributes are then this estimator's, or
        ``merge=True``)."""
        if init_kind(self.init) == "array":
            raise ValueError(
                "An array init fixes the number of clusters; pass n_clusters as an int "
                f"to use it, not {self.n_clusters!r}."
            )
        if self.merge:
            if has_missing:
                raise ValueError(
                    "merge=True does not take missing values (NaN) yet: impute X first "
                    "(sklearn.impute.SimpleImputer), or fit with merge=False, which reads them."
                )
            self._fit_merged(X, sample_weight)
            return None, None
        choice = _choose_k.choose(
            self, X, sample_weight, check_random_state(self.random_state), "n_clusters",
            is_one_gaussian,
        )
        self._store_choice(choice)
        if choice.fitted is not None:  # BIC fitted every candidate: keep the chosen one
            self._take_fitted(choice.fitted)
            return None, None
        if choice.separated is not None and not has_missing:
            # The rows fall into that many groups that stand apart: they label the fit
            # (:meth:`_fit_k`), as they do a merged one.
            self._separated = choice.separated.partition
        return choice.n_components, choice.k_unknown_pass

    def _fit_k_missing(self, X, start_rows, sample_weight, n_clusters, k_unknown_pass) -> None:
        """Cluster ``X`` with NaN: the usual fit (the transformer's or k-means++ starts,
        and Lloyd) on the imputed ``start_rows`` starts k-POD, which minimises the inertia
        over the observed entries; its centres, labels and inertia are kept."""
        self._fit_k(start_rows, sample_weight, n_clusters, k_unknown_pass)
        result, labels = _missing.kpod_in_canonical_order(
            X, self.cluster_centers_, sample_weight, max_iter=self.max_iter, tol=self.tol,
            device=self.device_,
        )
        self.cluster_centers_ = result.centers.astype(X.dtype, copy=False)
        self.labels_, self.inertia_, self.n_iter_ = labels, result.inertia, result.n_iter

    def _fitted_k(self) -> int:
        return self.n_clusters_

    @_fit_context(prefer_skip_nested_validation=True)
    def partial_fit(self, X, y=None, sample_weight=None):
        """Update the clustering with one batch of samples: mini-batch k-means.

        The first call (on an estimator that :meth:`partial_fit` has not fitted) clusters
        the batch as :meth:`fit` does; each later call is a step of
        :class:`~sklearn.cluster.MiniBatchKMeans`: each centre moves to the mean of all
        the samples it has taken. ``labels_`` and ``inertia_`` are then the latest
        batch's, and the nearest centre labels a row, in them and in :meth:`predict`
        alike: the first batch's clusters that stood apart or were merged from a mixture
        (``merge=True``: ``mixture_`` and ``component_to_cluster_``, then dropped) label
        that batch alone. A batch's missing entries (NaN) take their row's nearest centre's
        coordinates for the step, as k-POD fills them in :meth:`fit`, and its labels and
        inertia are over the observed entries.

        Read more in the :ref:`User Guide <user-guide-partial-fit>`.

        Parameters
        ----------
        X : array-like or sparse matrix of shape (n_samples, n_features)
            A batch of training data (densified if sparse); NaN marks a missing entry
            (every row needs an observed one). The first needs at least ``n_clusters``
            rows; later ones at least one, with the first's features.
        y : Ignored
            Not used, present for API consistency.
        sample_weight : array-like of shape (n_samples,), default=None
            Non-negative weights of the batch's samples, as :meth:`fit` takes them: a
            sample of weight 2 counts as two.

        Returns
        -------
        self : TransformerClusterer
            The updated estimator.

        Examples
        --------
        >>> import numpy as np
        >>> from transformer_gmm import TransformerClusterer
        >>> rng = np.random.default_rng(0)
        >>> km = TransformerClusterer(n_clusters=2, checkpoint=None, random_state=0)
        >>> for _ in range(20):
        ...     batch = np.vstack([rng.normal(-5, 1, (50, 2)), rng.normal(5, 1, (50, 2))])
        ...     km = km.partial_fit(batch)
        >>> km.n_steps_, len(km.labels_)
        (20, 100)
        >>> np.sort(km.cluster_centers_[:, 0]).round().tolist()
        [-5.0, 5.0]
        """
        self._check_batch(X)
        _array_api.check_numpy_stream(type(self).__name__, X)
        return self._partial_fit(X, sample_weight)

    def _partial_fit(self, X, sample_weight):
        """:meth:`partial_fit` on a numpy batch."""
        if not self._is_streaming():
            self._fit_first_batch(X, sample_weight)
            if sample_weight is not None:
                sample_weight = _initialization.checked_sample_weight(
                    sample_weight, len(self.labels_), 0
                )
            # The per-centre counts of the first batch, which the steps go on from.
            counts = np.bincount(
                self.labels_, weights=sample_weight, minlength=len(self.cluster_centers_)
            )
            self._counts = counts.astype(np.float64)
            self._start_stream(len(self.labels_))
            return self
        X, sample_weight, gaps = _streaming.validate_batch(
            self, X, sample_weight, accept_sparse=self._accept_sparse
        )
        self._count_batch(X.shape[0])
        # The first batch's groups, or its merged mixture, labelled its rows; the stream's
        # centres move on, and label the later batches and predict, as MiniBatchKMeans's.
        self._forget_previous_fit()
        centers, self._counts, self.labels_, self.inertia_ = online.kmeans_step(
            X, sample_weight, self.cluster_centers_, self._counts, device=self.device_,
            gaps=gaps,
        )
        self.cluster_centers_ = centers.astype(self.cluster_centers_.dtype, copy=False)
        self._mark_stream()
        return self

    def _fit_k(self, X, sample_weight, n_clusters: int, k_unknown_pass=None, run=_fitting.run):
        """Fit ``n_clusters`` to the validated ``X``; the transformer's starts read from
        ``k_unknown_pass``, the pass that read P(K | X), where there is one; ``run`` runs the
        plan (in memory, or on a Dask array's chunks)."""
        if sample_weight is not None:
            _initialization.check_sample_weight(sample_weight, X, n_clusters)
        random_state = check_random_state(self.random_state)
        if self.algorithm == "elkan" and n_clusters == 1:
            # KMeans's words; both algorithms run Lloyd's iterations here.
            warn_user(
                "algorithm='elkan' doesn't make sense for a single cluster. Using 'lloyd' instead.",
                RuntimeWarning,
            )
        plan = self._plan(X, sample_weight, random_state, n_clusters, k_unknown_pass)
        self._n_init = plan.n_runs
        self._store_fit(run(plan, X, sample_weight), X, plan)
        if getattr(self, "_separated", None) is not None:  # "auto": clusters apart, by row
            labels = _nearest_row_group(X, *self._separated)
            self._set_clusters(X, labels, n_clusters, sample_weight)
        return self

    def _store_fit(self, fitted, X, plan: KMeansPlan) -> None:
        """Set the fitted attributes from ``fitted`` (an engine ``KMeansFit``) of ``plan``
        on ``X``."""
        # Computed in float64 on CPU; returned in X's dtype, as KMeans does.
        self.cluster_centers_ = fitted.centers.astype(X.dtype, copy=False)
        # A fit on a dask array labels its rows lazily, as predict does.
        self.labels_ = self.predict(X) if fitted.labels is None else fitted.labels
        self.inertia_ = fitted.inertia
        self.n_iter_ = fitted.n_iter
        self.init_method_ = plan.init_method(fitted.best_run)
        self.device_ = plan.device
        self.n_clusters_ = plan.n_components
        if fitted.trace is not None:
            threshold = plan.tol * float(np.var(X, axis=0).mean())
            kmeans_report(fitted.trace, threshold=threshold)
        n_distinct, n_clusters = fitted.n_distinct, plan.n_components
        if n_distinct < n_clusters:
            # KMeans's warning, word for word, so that filters written for it apply.
            warn_user(
                f"Number of distinct clusters ({n_distinct}) found smaller than n_clusters "
                f"({n_clusters}). Possibly due to duplicate points in X.",
                ConvergenceWarning,
            )

    def _weighted_bic(self, X, sample_weight) -> float:
        """BIC on ``X`` (rows weighed as frequencies) of the hard-assignment mixture of
        spherical Gaussians with one shared variance that k-means fits: the choice of K's
        criterion."""
        w = np.ones(len(X)) if sample_weight is None else np.asarray(sample_weight, float)
        n = w.sum()
        K, d = self.cluster_centers_.shape
        counts = np.bincount(self.labels_, weights=w, minlength=K)
        variance = max(self.inertia_ / (n * d), np.finfo(float).tiny)
        occupied = counts[counts > 0]
        log_likelihood = (
            float(occupied @ np.log(occupied / n))
            - 0.5 * n * d * np.log(2 * np.pi * variance)
            - 0.5 * n * d
        )
        n_parameters = (K - 1) + K * d + 1
        return -2.0 * log_likelihood + n_parameters * np.log(n)

    def _plan(
        self,
        X,
        sample_weight,
        random_state: np.random.RandomState,
        n_clusters=None,
        k_unknown_pass=None,
    ) -> KMeansPlan:
        """The fit of ``X`` with ``n_clusters`` (by default the parameter's), decided once
        by :func:`~transformer_gmm._fitting.kmeans_plan`, its starts read from ``k_unknown_pass``
        where K was chosen among candidates."""
        params = self._fit_params()
        params["init"] = _array_api.to_numpy(params["init"])  # an array of X's namespace
        if n_clusters is not None:
            params["n_clusters"] = n_clusters
        name = type(self).__name__
        return _fitting.kmeans_plan(params, X, sample_weight, random_state, name, k_unknown_pass)

    def fit_predict(self, X, y=None, sample_weight=None):
        """Cluster ``X`` and return ``labels_``.

        Parameters
        ----------
        X : array-like or dask array of shape (n_samples, n_features)
            Training data; a dask array is clustered as :meth:`fit` says.
        y : Ignored
            Not used, present for API consistency.
        sample_weight : array-like of shape (n_samples,), default=None
            Weights of the samples, as in :meth:`fit`.

        Returns
        -------
        labels : ndarray or dask array of shape (n_samples,)
            Cluster labels; for a dask array ``X``, a lazy dask array.

        Examples
        --------
        >>> import numpy as np
        >>> from transformer_gmm import TransformerClusterer
        >>> rng = np.random.default_rng(0)
        >>> X = np.vstack([rng.normal(-5, 1, (50, 2)), rng.normal(5, 1, (50, 2))])
        >>> km = TransformerClusterer(n_clusters=2, checkpoint=None, random_state=0)
        >>> labels = km.fit_predict(X)
        >>> np.bincount(labels).tolist()
        [50, 50]
        """
        return self.fit(X, sample_weight=sample_weight).labels_

    def fit_transform(self, X, y=None, sample_weight=None):
        """Cluster ``X`` and return its distances to the cluster centres.

        Parameters
        ----------
        X : array-like or sparse matrix of shape (n_samples, n_features)
            Training data.
        y : Ignored
            Not used, present for API consistency.
        sample_weight : array-like of shape (n_samples,), default=None
            Weights of the samples, as in :meth:`fit`.

        Returns
        -------
        distances : ndarray of shape (n_samples, n_clusters)
            Euclidean distances to each centre.

        Examples
        --------
        >>> import numpy as np
        >>> from transformer_gmm import TransformerClusterer
        >>> X = np.array([[0.0, 0.0], [0.0, 1.0], [9.0, 9.0], [9.0, 10.0]])
        >>> km = TransformerClusterer(n_clusters=2, checkpoint=None, random_state=0)
        >>> km.fit_transform(X).shape
        (4, 2)
        """
        return self.fit(X, sample_weight=sample_weight).transform(X)

    def _fit_merged(self, X, sample_weight) -> None:
        """``merge=True``: a mixture fitted by ``TransformerGMM``, its components merged into
        clusters (:mod:`~transformer_gmm._merge`). Where the checkpoint counts clusters
        (the posterior, a cluster-count head), the count C is the one ``merge=False``
        takes, the mixture has as many components as P(K | X) finds most probable (the
        largest candidate where that is below C, or C where those collapse), all read
        from one pass, and its components are merged down to C, touching ones first;
        elsewhere the mixture is ``TransformerGMM(n_components=n_clusters)``'s and the
        merges stop by the entropy rule. Where the rows fall into C groups that stand
        apart (:func:`~transformer_gmm._merge.separated_partition`), those groups label
        them, and no larger mixture is fitted to tile them. ``labels_`` are the clusters,
        ``cluster_centers_`` their weighted means and ``inertia_`` the weighted squared
        distances to the centre of each label."""
        from .gmm import TransformerGMM

        mixture_params = dict(
            # The transformer's first start alone, unless asked: measured level with all
            # four starts' merged labels, at 0.7 to 0.9 of the time (docs/choosing_k.md).
            n_init=1 if self.n_init == "auto" else self.n_init,
            max_iter=self.max_iter,
            random_state=self.random_state,
            checkpoint=self.checkpoint,
            n_views=self._fit_params()["n_views"],  # a stream's first batch's too
            device=self.device,
        )
        if _choose_k.counts_clusters(self, len(X)):
            choice = _choose_k.choose(
                self, X, sample_weight, check_random_state(self.random_state), "n_clusters",
                is_one_gaussian,
            )
            n_clusters = choice.n_components
            if choice.separated is not None:  # read with the count
                separated = choice.separated.partition
            else:
                separated = _merge.separated_partition(X, n_clusters, sample_weight)
            sizes = [max(n_clusters, choice.n_density_components)]
            if separated is None and choice.n_density_components < n_clusters:
                # Fewer components than clusters: clusters no Gaussian each describes
                # (nested rings read as one), which the most components tile finely
                # enough for their touching pieces to be merged back, unless so many
                # collapse (few rows in many dimensions), when C components serve.
                sizes.insert(0, int(choice.candidates[-1]))
            for n_components in sizes:
                mixture = TransformerGMM(n_components=n_components, **mixture_params)
                mixture._fit_as_candidate(
                    X, sample_weight, n_components, choice.k_unknown_pass
                )
                if not np.any(mixture.collapsed_components_):
                    break
            mapping = _merge.merge_mixture(mixture, X, sample_weight, n_clusters)
            self._store_choice(choice)
        else:
            mixture = TransformerGMM(
                n_components=self.n_clusters,
                max_components=self.max_clusters,
                criterion=self.criterion,
                **mixture_params,
            ).fit(X, sample_weight=sample_weight)
            mapping = _merge.merge_mixture(mixture, X, sample_weight)
            n_clusters = int(mapping.max()) + 1
            separated = _merge.separated_partition(X, n_clusters, sample_weight)
            self._store_choice(None)
            for name in ("candidates_", "criterion_", "selection_criterion_", "k_posterior_"):
                if hasattr(mixture, name):
                    setattr(self, name, getattr(mixture, name))
        n_clusters = int(mapping.max()) + 1
        # Clusters that stand apart row by row: their rows' groups, not the components'.
        self._separated = separated
        if separated is not None:
            labels = _nearest_row_group(X, *self._separated)
        else:
            labels = mapping[np.asarray(mixture.predict(X))].astype(np.int32)
        self.mixture_ = mixture
        self.component_to_cluster_ = mapping
        self._set_clusters(X, labels, n_clusters, sample_weight)
        self.n_iter_ = mixture.n_iter_
        self.init_method_ = mixture.init_method_
        self.device_ = mixture.device_
        self.n_clusters_ = n_clusters
        self._n_init = getattr(mixture, "_n_init", 1)

    def _set_clusters(self, X, labels: np.ndarray, n_clusters: int, sample_weight) -> None:
        """``labels_``, and ``cluster_centers_`` and ``inertia_`` as their (weighted) means and
        squared distances, summed in canonical row order, as every fit reads its rows: the
        same centres and inertia, to the bit, whatever the rows' own order."""
        w = np.ones(len(X)) if sample_weight is None else np.asarray(sample_weight, dtype=float)
        order = row_order.canonical_order(X, sample_weight)
        rows, rows_labels, rows_w = X[order], labels[order], w[order]
        mass = np.bincount(rows_labels, weights=rows_w, minlength=n_clusters)
        sums = np.stack(
            [np.bincount(rows_labels, weights=rows_w * rows[:, j], minlength=n_clusters)
             for j in range(X.shape[1])],
            axis=1,
        )
        centers = sums / np.maximum(mass, np.finfo(float).tiny)[:, None]
        self.cluster_centers_ = centers.astype(X.dtype, copy=False)
        self.labels_ = labels
        self.inertia_ = float(rows_w @ ((rows - centers[rows_labels]) ** 2).sum(axis=1))

    def predict(self, X):
        """The nearest cluster centre of each sample (where the fit labelled clusters that
        stand apart by their rows, or merged a mixture's components, see ``labels_``:
        the group of its nearest fitted row, or its merged component's cluster).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Samples; NaN marks a missing entry, and a row with gaps goes to the centre
            nearest over its observed coordinates.

        Returns
        -------
        labels : ndarray of shape (n_samples,)
            Cluster labels.

        Examples
        --------
        >>> import numpy as np
        >>> from transformer_gmm import TransformerClusterer
        >>> rng = np.random.default_rng(0)
        >>> X = np.vstack([rng.normal(-5, 1, (50, 2)), rng.normal(5, 1, (50, 2))])
        >>> km = TransformerClusterer(n_clusters=2, checkpoint=None, random_state=0).fit(X)
        >>> labels = km.predict([[-5.0, -5.0], [-4.0, -6.0], [5.0, 5.0]])
        >>> bool(labels[0] == labels[1]), bool(labels[0] != labels[2])
        (True, True)
        """
        rows = self._read_rows(X, "predict", "cluster_centers_")
        if rows.chunked:  # one task a chunk, with nothing but the centres in it
            return rows.apply(_nearest_center, self.cluster_centers_, dtype=np.int32)
        if getattr(self, "_separated", None) is not None:  # merged, row by row
            labels = _nearest_row_group(rows.X, *self._separated)
            return _array_api.returned(labels, rows.namespace)
        if hasattr(self, "component_to_cluster_"):  # merged: the mixture's component's cluster
            components = self.mixture_.predict(rows.X)
            labels = self.component_to_cluster_[np.asarray(components)].astype(np.int32)
            return _array_api.returned(labels, rows.namespace)
        labels = self._distances(rows).argmin(axis=1).astype(np.int32)
        return _array_api.returned(labels, rows.namespace)

    def transform(self, X):
        """Distances from each sample to each cluster centre.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Samples.

        Returns
        -------
        distances : ndarray of shape (n_samples, n_clusters)
            Euclidean distances; of a row with missing entries (NaN), over its observed
            coordinates alone, not rescaled (so the squared distance to the nearest centre
            is the row's share of the inertia over the observed entries).

        Examples
        --------
        >>> import numpy as np
        >>> from transformer_gmm import TransformerClusterer
        >>> rng = np.random.default_rng(0)
        >>> X = np.vstack([rng.normal(-5, 1, (50, 2)), rng.normal(5, 1, (50, 2))])
        >>> km = TransformerClusterer(n_clusters=2, checkpoint=None, random_state=0).fit(X)
        >>> distances = km.transform([[-5.0, -5.0], [5.0, 5.0]])
        >>> distances.shape
        (2, 2)
        >>> bool((distances.argmin(axis=1) == km.predict([[-5.0, -5.0], [5.0, 5.0]])).all())
        True
        """
        rows = self._read_rows(X, "transform", "cluster_centers_")
        return _array_api.returned(self._distances(rows), rows.namespace)

    def _distances(self, rows: Rows):
        """Distances from ``rows`` (read by :meth:`_read_rows`) to the centres, in numpy
        (lazily for a Dask array); a row with NaN, over its observed coordinates."""
        centers = _array_api.to_numpy(self.cluster_centers_)
        if not rows.chunked and _missing.has_missing(rows.X):
            return _missing.observed_distances(rows.X, centers)
        return rows.apply(_distances, centers, n_columns=centers.shape[0])

    def score(self, X, y=None, sample_weight=None):
        """Minus the inertia of ``X`` with respect to the fitted centres (higher is better).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Samples.
        y : Ignored
            Not used, present for API consistency.
        sample_weight : array-like of shape (n_samples,), default=None
            Weights of the samples; ``None`` weighs each by one.

        Returns
        -------
        score : float
            ``-sum(w * min_k ||x - c_k||^2)``, the norm over each row's observed
            coordinates where it has missing entries (NaN).

        Examples
        --------
        >>> import numpy as np
        >>> from transformer_gmm import TransformerClusterer
        >>> rng = np.random.default_rng(0)
        >>> X = np.vstack([rng.normal(-5, 1, (50, 2)), rng.normal(5, 1, (50, 2))])
        >>> km = TransformerClusterer(n_clusters=2, checkpoint=None, random_state=0).fit(X)
        >>> bool(np.isclose(km.score(X), -km.inertia_))
        True
        """
        rows = self._read_rows(X, "score", "cluster_centers_")  # a float whatever the namespace
        squared = self._distances(rows).min(axis=1) ** 2
        if sample_weight is None:
            return -float(squared.sum())
        sample_weight = _initialization.checked_sample_weight(
            _array_api.to_numpy(sample_weight), squared.shape[0], 0
        )
        return -float((squared * sample_weight).sum())
