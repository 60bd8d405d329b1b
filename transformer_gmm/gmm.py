"""TransformerGMM: a Gaussian mixture initialised by a pretrained transformer."""

from __future__ import annotations

import warnings
from numbers import Integral, Real

import numpy as np
from sklearn.base import DensityMixin, _fit_context
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils import check_random_state
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import _num_samples as _num_rows
from sklearn.utils.validation import check_is_fitted

from . import (
    _array_api,
    _choose_k,
    _fitting,
    _initialization,
    _merge,
    _streaming,
    _verbose,
)
from ._base import TransformerMixtureBase
from ._collapsed import identical_components, warn_collapsed, warn_identical
from ._mixture_methods import FittedMixtureMixin
from .engine import missing, online
from .engine.covariance_prior import resolve_count
from .engine.plan import GivenStarts, MixturePlan


class TransformerGMM(FittedMixtureMixin, DensityMixin, TransformerMixtureBase):
    """Gaussian mixture whose parameters a pretrained transformer estimates in one pass.

    A set transformer reads the whole (standardized) dataset and returns mixture
    weights, means and scales for the requested number of components; EM then polishes
    that estimate on all of ``X``. Where the checkpoint has no readout head for
    ``n_components`` (or no default checkpoint is bundled), EM starts from k-means++, as
    in :class:`sklearn.mixture.GaussianMixture`, with a
    :class:`~transformer_gmm.FallbackWarning`.

    Read more in the :ref:`User Guide <user-guide-fit>`; every parameter of
    ``GaussianMixture`` is taken, with the differences listed in
    :ref:`Coming from scikit-learn <coming-from-sklearn>`.

    Parameters
    ----------
    n_components : int, "auto" or array-like of int, default=1
        The number of mixture components. ``"auto"`` chooses it among ``1`` to
        ``max_components``, and a list (or range) among its values, by ``criterion``
        (see :ref:`Choosing the number of components <choosing-k>`).
    max_components : int, default=None
        The largest K that ``n_components="auto"`` considers; by default the largest the
        checkpoint covers (10 without one), at most ``n_samples``, and at most the K whose
        components can each hold the points their covariance needs (``n_features + 1``
        for ``"full"``, 2 for a variance): more would collapse. Ignored otherwise.
    criterion : {"auto", "bic", "posterior"}, default="auto"
        How K is chosen when ``n_components`` is not an int: ``"posterior"``, the most
        probable K under the checkpoint's learned P(K | X), from one forward pass;
        ``"bic"``, the lowest BIC over every candidate's fit; ``"auto"``, the posterior
        where the checkpoint reads it for every candidate, else BIC.
    covariance_type : {"full", "tied", "diag", "spherical"}, default="full"
        The covariance parameterisation, as in :class:`~sklearn.mixture.GaussianMixture`.
    checkpoint : str, path or None, default="default"
        The transformer: a bundled name, a local checkpoint folder, or a Hugging Face
        Hub id ``"org/name"`` (optionally ``"org/name@revision"``). ``None`` uses EM from
        k-means++ without a warning; a named checkpoint that cannot be loaded raises.
    max_iter : int, default=100
        The number of EM iterations. ``0`` returns the transformer's own estimate (one
        M-step on its responsibilities).
    tol : float, default=1e-3
        EM stops when the gain in the lower bound (mean log-likelihood per sample) is
        below this threshold.
    reg_covar : float, default=1e-6
        Non-negative regularisation added to the diagonal of the covariances.
    missing_covariance_prior : float or "auto", default="auto"
        With missing values (NaN) in ``X``: how many pseudo-rows draw each component's
        covariance towards the observed entries' variances divided by
        ``n_components ** (2 / n_features)`` (a conjugate prior; EM then finds its mode,
        and ``lower_bound_`` includes its log-density per sample). Full covariances
        estimated from the pairs of features that few rows observe together are nearly
        singular, and score held-out rows far too low; one pseudo-row keeps them wide
        enough. ``"auto"`` is 1 for ``"full"`` and 0, maximum likelihood, for the other
        types, whose entries come from their own observed values. Not used without NaN
        (see the User Guide, :ref:`Missing values <user-guide-missing-values>`).
    n_init : "auto" or int, default="auto"
        The number of initialisations, run as one batch. With the transformer, the
        first ``2 * n_views`` are its starts and the rest k-means++ starts; ``"auto"``
        runs all of the transformer's and two k-means++ (the transformer's alone with
        ``max_iter=0`` and with full covariances on data of at most 512 rows and fewer
        than 131,072 values, one k-means++ without a transformer; where EM is costly, the
        k-means++ starts only if the transformer's end on different optima). With another
        ``init_params``, ``"auto"`` is 1. Which run is kept: see the User Guide. With NaN
        in ``X``, ``"auto"`` starts EM on the observed entries from the transformer's
        reading alone, and an int runs its starts on the mean-imputed rows first (User
        Guide, Missing values).
    init_params : {"transformer", "kmeans", "k-means++", "random", \
"random_from_data"}, default="transformer"
        How EM starts: from the transformer (and the k-means++ restarts ``n_init``
        asks for), or as ``GaussianMixture``'s other starts do.
    weights_init : array-like of shape (n_components,), default=None
        Initial weights, which replace every start's.
    means_init : array-like of shape (n_components, n_features), default=None
        Initial means, which replace every start's.
    precisions_init : array-like, default=None
        Initial precisions (inverse covariances), of the shape of ``precisions_``. Given
        all three, EM starts from them alone.
    n_views : "auto" or int, default="auto"
        Readings of the data by the transformer, in one batch: each view reads another
        draw of rows (where ``X`` exceeds the transformer's context) and reflects the
        principal axes, costs a forward pass and gives two more starts. ``"auto"`` reads
        one view in :meth:`fit` and four in the first call of :meth:`partial_fit`, whose
        cost the whole stream shares.
    device : str, default="auto"
        ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"auto"`` (CUDA when available). The fit
        runs in float64 on CPU and float32 on CUDA.
    random_state : int, RandomState instance or None, default=None
        Seeds the rows the transformer reads when ``n_samples`` exceeds its context,
        and the other random starts. The same seed gives the same fit on one device.
    warm_start : bool, default=False
        If True, each ``fit`` after the first goes on from the previous fit's
        parameters and ``lower_bound_``; ``n_init`` and ``init_params`` are ignored.
    verbose : int, default=0
        1 prints each initialisation and every ``verbose_interval``-th iteration, 2 also
        the time lapses and the changes of the lower bound, when EM has ended.
    verbose_interval : int, default=10
        Iterations between two printed ones.
    learning_decay : float, default=0.7
        How fast :meth:`partial_fit` forgets: batch ``t`` weighs
        ``(t + learning_offset) ** -learning_decay`` in the running average of the
        sufficient statistics (see :ref:`partial_fit <user-guide-partial-fit>`). Not
        used by :meth:`fit`.
    learning_offset : float, default=10.0
        Non-negative; larger values weigh the first batches longer in
        :meth:`partial_fit`. Not used by :meth:`fit`.

    Attributes
    ----------
    weights_ : ndarray of shape (n_components,)
        The weight of each mixture component. This and the four arrays below have the
        training data's dtype.
    means_ : ndarray of shape (n_components, n_features)
        The mean of each component.
    covariances_ : ndarray
        The covariance of each component; its shape depends on ``covariance_type``::

            (n_components,)                        if "spherical",
            (n_features, n_features)               if "tied",
            (n_components, n_features)             if "diag",
            (n_components, n_features, n_features) if "full"
    precisions_ : ndarray
        The inverses of the covariances, of the same shape.
    precisions_cholesky_ : ndarray
        Cholesky factors of the precisions, of the same shape.
    converged_ : bool
        Whether EM converged (False when ``max_iter=0``).
    collapsed_components_ : ndarray of bool, shape (n_components,)
        Components that collapsed onto too few points or onto the ``reg_covar`` floor;
        a fit that returns one warns (see :ref:`Collapsed components
        <user-guide-collapsed>`).
    n_iter_ : int
        EM iterations of the kept initialisation (above 8,192 samples, those on the
        subsample the starts are compared on, plus those on all of ``X``).
    lower_bound_ : float
        Mean (weighted) log-likelihood per sample at the last E-step of the kept
        initialisation; with ``NaN`` in ``X``, of the observed entries, plus the
        covariance prior's log-density per sample where ``missing_covariance_prior``
        takes one.
    lower_bounds_ : ndarray of shape (n_iterations,)
        The lower bound at each EM iteration of the kept initialisation.
    init_method_ : str
        Where the kept estimate started: ``"transformer"``, ``"k-means++"``, another
        ``init_params``, ``"user"`` (the three ``*_init`` arrays) or ``"warm_start"``.
    device_ : str
        The device the fit ran on.
    n_components_ : int
        The number of components fitted: ``n_components``, or the K chosen.
    candidates_ : ndarray of shape (n_candidates,)
        The K that were considered, when ``n_components`` is not an int.
    criterion_ : ndarray of shape (n_candidates,)
        The value of ``selection_criterion_`` for each candidate (lower is better): the
        BIC, or ``-log P(K | X)``.
    selection_criterion_ : {"posterior", "bic"}
        How K was chosen.
    k_posterior_ : ndarray of shape (n_candidates,)
        P(K | X) of each candidate under the checkpoint, when it reads one.
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
    sklearn.mixture.GaussianMixture : EM from k-means initialisation.
    TransformerClusterer : Hard clustering with the same backbone.
    fit_many : Fit one mixture per dataset, many datasets in one batch.

    Examples
    --------
    >>> import numpy as np
    >>> from transformer_gmm import TransformerGMM
    >>> rng = np.random.default_rng(0)
    >>> X = np.vstack([rng.normal(-5, 1, (100, 2)), rng.normal(5, 1, (100, 2))])
    >>> gmm = TransformerGMM(n_components=2, checkpoint=None, random_state=0).fit(X)
    >>> np.round(np.sort(gmm.means_[:, 0]))
    array([-5.,  5.])
    >>> gmm.weights_.round(2)
    array([0.5, 0.5])
    >>> labels = gmm.predict([[-5.0, -5.0], [5.0, 5.0]])
    >>> bool(labels[0] != labels[1])
    True
    """

    _parameter_constraints: dict = {
        **TransformerMixtureBase._parameter_constraints,
        "n_components": [
            Interval(Integral, 1, None, closed="left"),
            StrOptions({"auto"}),
            "array-like",
        ],
        "max_components": [Interval(Integral, 1, None, closed="left"), None],
        "criterion": [StrOptions({"auto", "bic", "posterior"})],
        "covariance_type": [StrOptions({"full", "tied", "diag", "spherical"})],
        "reg_covar": [Interval(Real, 0.0, None, closed="left")],
        "missing_covariance_prior": [
            Interval(Real, 0.0, None, closed="left"), StrOptions({"auto"})
        ],
        "init_params": [
            StrOptions({"transformer", "kmeans", "k-means++", "random", "random_from_data"})
        ],
        "weights_init": ["array-like", None],
        "means_init": ["array-like", None],
        "precisions_init": ["array-like", None],
        "warm_start": ["boolean"],
        "verbose": ["verbose"],
        "verbose_interval": [Interval(Integral, 1, None, closed="left")],
        "learning_decay": [Interval(Real, 0.0, 1.0, closed="both")],
        "learning_offset": [Interval(Real, 0.0, None, closed="left")],
    }

    # NaN marks a missing entry in fit and the methods that score rows (see _missing).
    _allow_nan = True
    _streamed_attribute = "means_"
    _stream_views = _fitting.MIXTURE_STREAM_VIEWS
    _k_name = "n_components"
    _in_memory_message = (
        "sample_weight, warm_start, weights_init, means_init, precisions_init, "
        "init_params other than 'transformer' and n_components other than an int "
        "need X in memory; fit on a numpy array (X.compute()) to use them."
    )

    def __init__(
        self,
        n_components=1,
        *,
        max_components=None,
        criterion="auto",
        covariance_type="full",
        checkpoint="default",
        max_iter=100,
        tol=1e-3,
        reg_covar=1e-6,
        missing_covariance_prior="auto",
        n_init="auto",
        init_params="transformer",
        weights_init=None,
        means_init=None,
        precisions_init=None,
        n_views="auto",
        device="auto",
        random_state=None,
        warm_start=False,
        verbose=0,
        verbose_interval=10,
        learning_decay=0.7,
        learning_offset=10.0,
    ):
        self.n_components = n_components
        self.max_components = max_components
        self.criterion = criterion
        self.covariance_type = covariance_type
        self.checkpoint = checkpoint
        self.max_iter = max_iter
        self.tol = tol
        self.reg_covar = reg_covar
        self.missing_covariance_prior = missing_covariance_prior
        self.n_init = n_init
        self.init_params = init_params
        self.weights_init = weights_init
        self.means_init = means_init
        self.precisions_init = precisions_init
        self.n_views = n_views
        self.device = device
        self.random_state = random_state
        self.warm_start = warm_start
        self.verbose = verbose
        self.verbose_interval = verbose_interval
        self.learning_decay = learning_decay
        self.learning_offset = learning_offset

    # --- fitting -----------------------------------------------------------------------

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y=None, sample_weight=None):
        """Estimate the mixture's parameters.

        If ``warm_start`` is True and the estimator is fitted, EM goes on from the
        previous fit's parameters (``n_init`` and ``init_params`` are then ignored).

        Parameters
        ----------
        X : array-like or dask array of shape (n_samples, n_features)
            Training data. A ``dask.array.Array`` chunked by rows is fitted where its
            chunks live, without gathering it (see :ref:`Fitting on a Dask array
            <dask-fit>`). In memory, NaN marks a missing entry: EM then fits the
            observed entries alone, and ``lower_bound_`` is their mean log-likelihood
            (see :ref:`Missing values <user-guide-missing-values>`).
        y : Ignored
            Not used, present for API consistency.
        sample_weight : array-like of shape (n_samples,), default=None
            Non-negative weights of the samples, as frequencies: a sample of weight 2
            counts as the same sample twice (the fit equals the one on repeated rows from
            the same start). The transformer reads samples drawn in proportion to their
            weights, the k-means++ starts and EM are weighted, and ``lower_bound_`` is the
            weighted mean log-likelihood. Equal weights give the unweighted fit, and weights
            scaled by one constant the same fit.

        Returns
        -------
        self : TransformerGMM
            The fitted estimator.

        Examples
        --------
        >>> import numpy as np
        >>> from transformer_gmm import TransformerGMM
        >>> rng = np.random.default_rng(0)
        >>> X = np.vstack([rng.normal(-5, 1, (50, 2)), rng.normal(5, 1, (50, 2))])
        >>> gmm = TransformerGMM(n_components=2, checkpoint=None, random_state=0).fit(X)
        >>> gmm.n_iter_ > 0, gmm.converged_, gmm.init_method_
        (True, True, 'k-means++')
        """
        self._fit(X, sample_weight)
        return self

    @_fit_context(prefer_skip_nested_validation=True)
    def fit_predict(self, X, y=None, sample_weight=None):
        """Fit the mixture and return the component of each sample.

        Equals ``fit(X).predict(X)``: labels come from a final E-step.

        Parameters
        ----------
        X : array-like or dask array of shape (n_samples, n_features)
            Training data; a dask array is fitted as :meth:`fit` says.
        y : Ignored
            Not used, present for API consistency.
        sample_weight : array-like of shape (n_samples,), default=None
            Weights of the samples, as :meth:`fit` takes them.

        Returns
        -------
        labels : ndarray or dask array of shape (n_samples,)
            Component labels; for a dask array ``X``, a lazy dask array.

        Examples
        --------
        >>> import numpy as np
        >>> from transformer_gmm import TransformerGMM
        >>> rng = np.random.default_rng(0)
        >>> X = np.vstack([rng.normal(-5, 1, (50, 2)), rng.normal(5, 1, (50, 2))])
        >>> labels = TransformerGMM(n_components=2, checkpoint=None, random_state=0).fit_predict(X)
        >>> np.bincount(labels)
        array([50, 50])
        """
        rows = self._fit(X, sample_weight)
        labels = self._estimate_weighted_log_prob(rows).argmax(axis=1)
        return _array_api.returned(labels, rows.namespace)

    def merge_components(self, X, n_clusters=None, sample_weight=None):
        """The cluster of each component: components merged into clusters.

        ``n_components_`` describes the density; a curved or elongated cluster takes
        several of them. Without ``n_clusters``, the pair of components whose merge lowers
        the entropy of the soft assignment of ``X`` most is merged, again and again
        (Baudry, Raftery, Celeux, Lo & Gottardo 2010), while each merge removes at least
        0.1 nats per point of the pair it merges. With ``n_clusters``, components merge
        down to that many, those whose rows touch (nearest neighbours of each other, within
        three typical spacings of the rows) first, by the same entropy. The fitted mixture
        is left unchanged: one fit answers both how many components describe the density
        and how many clusters they form.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            The samples whose soft assignment is merged, usually the training data.
        n_clusters : int, default=None
            Cut the hierarchy at this number of clusters (1 to ``n_components_``);
            ``None`` chooses it.
        sample_weight : array-like of shape (n_samples,), default=None
            Weights of the samples in the entropy.

        Returns
        -------
        component_to_cluster : ndarray of shape (n_components_,)
            The cluster of each component, numbered from 0 by their smallest component;
            ``component_to_cluster[gmm.predict(X)]`` labels the rows by cluster.

        Examples
        --------
        >>> import numpy as np
        >>> from transformer_gmm import TransformerGMM
        >>> rng = np.random.default_rng(0)
        >>> X = np.vstack([rng.normal(m, 1, (100, 2)) for m in (-12, -10, 10, 12)])
        >>> gmm = TransformerGMM(n_components=4, checkpoint=None, random_state=0).fit(X)
        >>> mapping = gmm.merge_components(X)
        >>> int(mapping.max()) + 1
        2
        >>> np.bincount(mapping[gmm.predict(X)]).tolist()
        [200, 200]
        """
        check_is_fitted(self)
        if n_clusters is not None and not (
            isinstance(n_clusters, Integral) and 1 <= n_clusters <= len(self.weights_)
        ):
            raise ValueError(
                f"n_clusters must be an int from 1 to n_components_={len(self.weights_)}, "
                f"got {n_clusters!r}; pass None to choose it."
            )
        if sample_weight is not None:
            sample_weight = _initialization.checked_sample_weight(
                np.asarray(sample_weight, dtype=float), _num_rows(X), 0
            )
        return _merge.merge_mixture(self, X, sample_weight, n_clusters)

    @_fit_context(prefer_skip_nested_validation=True)
    def partial_fit(self, X, y=None, sample_weight=None):
        """Update the mixture with one batch of samples: online (stepwise) EM.

        The first call (on an estimator that :meth:`partial_fit` has not fitted) fits the
        batch as :meth:`fit` does (with four views of it under ``n_views="auto"``); each
        later call is one step of stepwise EM (Cappé and Moulines, 2009), whose running
        average of the sufficient statistics forgets as ``learning_decay`` and
        ``learning_offset`` say. ``lower_bound_`` is then the latest batch's mean
        log-likelihood. Batches may have missing entries (NaN): a step then reads the
        statistics expected given each row's observed entries, as :meth:`fit`'s EM for
        missing values does (whose ``missing_covariance_prior`` is the first batch's fit's
        alone: later steps are maximum likelihood).

        Read more in the :ref:`User Guide <user-guide-partial-fit>`.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            A batch of training data; NaN marks a missing entry (every row needs an
            observed one). The first needs at least two and ``n_components`` rows; later
            ones at least one, with the first's features.
        y : Ignored
            Not used, present for API consistency.
        sample_weight : array-like of shape (n_samples,), default=None
            Non-negative weights of the batch's samples, as frequencies (as :meth:`fit`
            takes them).

        Returns
        -------
        self : TransformerGMM
            The updated estimator.

        Examples
        --------
        >>> import numpy as np
        >>> from transformer_gmm import TransformerGMM
        >>> rng = np.random.default_rng(0)
        >>> gmm = TransformerGMM(n_components=2, checkpoint=None, random_state=0)
        >>> for _ in range(20):
        ...     batch = np.vstack([rng.normal(-5, 1, (50, 2)), rng.normal(5, 1, (50, 2))])
        ...     gmm = gmm.partial_fit(batch)
        >>> gmm.n_steps_, gmm.n_samples_seen_
        (20, 2000)
        >>> np.round(np.sort(gmm.means_[:, 0]))
        array([-5.,  5.])
        >>> gmm.weights_.round(1)
        array([0.5, 0.5])
        """
        self._check_batch(X)
        _array_api.check_numpy_stream(type(self).__name__, X)
        return self._partial_fit(X, sample_weight)

    def _partial_fit(self, X, sample_weight):
        """:meth:`partial_fit` on a numpy batch."""
        if not self._is_streaming():
            X = self._fit_first_batch(X, sample_weight).X
            self._start_stream(X.shape[0])
            return self
        X, sample_weight, gaps = _streaming.validate_batch(self, X, sample_weight)
        self._count_batch(X.shape[0])
        rho = online.step_size(self.n_steps_ - 1, self.learning_decay, self.learning_offset)
        parameters = (self.weights_, self.means_, self.covariances_, self.precisions_cholesky_)
        fitted, log_likelihood = online.mixture_step(
            X,
            sample_weight,
            parameters,
            rho,
            covariance_type=self.covariance_type,
            reg_covar=self.reg_covar,
            device=self.device_,
            gaps=gaps,
        )
        self._set_parameters(*fitted, self.means_.dtype)  # the first batch's dtype, kept
        self.lower_bound_ = log_likelihood
        self.n_iter_ += 1
        self.lower_bounds_ = np.append(getattr(self, "lower_bounds_", []), log_likelihood)
        self._mark_collapsed(X, sample_weight)
        self._mark_stream()
        return self

    def _fit_k_missing(self, X, start_rows, sample_weight, n_components, k_unknown_pass) -> None:
        """Fit ``n_components`` to ``X`` with NaN: EM for data missing at random, on the
        observed entries alone, whose estimate is kept, from a start read on the imputed
        ``start_rows`` (the transformer's from ``k_unknown_pass`` where it chose K).

        With ``n_init="auto"`` the start is the plan's at ``max_iter=0``: the transformer's
        reading (one k-means++ start without a transformer), chosen by its bound, with no
        EM on the imputed rows, whose optimum is not the observed entries' (measured faster
        and at least as likely: docs/benchmarks.md, "Missing values"). An int ``n_init``
        asks for restarts: its starts compete by EM on the imputed rows, as a fit without
        NaN runs them, and the best goes on."""
        with warnings.catch_warnings():
            # Whether EM converged on the imputed rows does not matter: they only start the
            # EM below, whose convergence is reported.
            warnings.simplefilter("ignore", ConvergenceWarning)
            max_iter = 0 if self.n_init == "auto" else None
            self._fit_k(
                start_rows, sample_weight, n_components, k_unknown_pass, max_iter=max_iter,
                gaps=np.isnan(X),
            )
        result = missing.fit_em_missing(
            X,
            self.weights_.astype(np.float64),
            self.means_.astype(np.float64),
            self.covariances_.astype(np.float64),
            covariance_type=self.covariance_type,
            reg_covar=self.reg_covar,
            max_iter=self.max_iter,
            tol=self.tol,
            sample_weight=sample_weight,
            device=self.device_,
            prior_count=resolve_count(self.missing_covariance_prior, self.covariance_type),
        )
        self._store_missing_fit(result, X, sample_weight)
        if self.verbose:
            print("EM on the observed entries (X has NaN):")
            _verbose.report(
                np.asarray([result.lower_bounds]),
                result.iteration_times,
                best_run=0,
                best_converged=result.converged,
                tol=self.tol,
                initial_lower_bound=-np.inf,
                max_iter=self.max_iter,
                verbose=self.verbose,
                verbose_interval=self.verbose_interval,
            )

    def _fitted_k(self) -> int:
        return len(self.weights_)

    def _after_fit(self, X) -> None:
        warn_collapsed(self.collapsed_components_, self.covariance_type, X.shape[1])
        identical = identical_components(
            self.means_, self.covariances_, self.precisions_cholesky_, self.covariance_type
        )
        warn_identical(identical, self.covariances_, self.reg_covar)

    def _fit_k(
        self, X, sample_weight, n_components: int, k_unknown_pass=None, run=_fitting.run,
        max_iter: int | None = None, gaps=None,
    ) -> None:
        """Fit ``n_components`` to the validated ``X``; the transformer's starts read from
        ``k_unknown_pass``, the pass that read P(K | X), where there is one; ``run`` runs the
        plan (in memory, or on a Dask array's chunks); ``max_iter`` replaces the parameter's
        (None: the parameter's); ``gaps`` marks the entries of ``X`` that were missing and
        filled, for a checkpoint that reads them."""
        if sample_weight is not None:
            _initialization.check_sample_weight(sample_weight, X, n_components)
        random_state = check_random_state(self.random_state)
        plan = self._plan(
            X, sample_weight, random_state, n_components, k_unknown_pass, max_iter, gaps
        )
        fits = run(plan, X, sample_weight)
        self._store_fit(fits, 0, plan, X.dtype)
        self._mark_collapsed(X, sample_weight)
        if self.verbose and fits.lower_bounds is not None:
            _verbose.report(
                fits.lower_bounds[0],
                fits.iteration_times,
                best_run=int(fits.best_run[0]),
                best_converged=self.converged_,
                tol=self.tol,
                initial_lower_bound=-np.inf if plan.given is None else plan.given.lower_bound,
                max_iter=plan.max_iter,
                verbose=self.verbose,
                verbose_interval=self.verbose_interval,
            )
        self._warn_if_not_converged()

    def _choose(self, X, sample_weight, has_missing: bool) -> tuple:
        """The K to fit (a warm start keeps the previous one), and the pass that chose it
        or None; K is None when the choice by BIC has already fitted it, whose fitted
        attributes are then this estimator's."""
        if self.warm_start and hasattr(self, "converged_"):
            return len(self.weights_), None
        given = (self.weights_init, self.means_init, self.precisions_init)
        if any(p is not None for p in given):
            raise ValueError(
                "weights_init, means_init and precisions_init fix the number of components; "
                f"pass n_components as an int to use them, not {self.n_components!r}."
            )
        random_state = check_random_state(self.random_state)
        choice = _choose_k.choose(self, X, sample_weight, random_state, "n_components")
        if choice.fitted is not None:
            self._take_fitted(choice.fitted)
        self._store_choice(choice)
        if choice.fitted is not None:
            return None, None
        return choice.n_components, choice.k_unknown_pass

    def _plan(
        self,
        X,
        sample_weight,
        random_state: np.random.RandomState,
        n_components=None,
        k_unknown_pass=None,
        max_iter: int | None = None,
        gaps=None,
    ) -> MixturePlan:
        """The fit of ``X`` with ``n_components`` and ``max_iter`` (by default the
        parameters'), decided once by :func:`~transformer_gmm._fitting.mixture_plan`, its
        starts read from ``k_unknown_pass`` where K was chosen among candidates, and
        reading ``gaps`` where the checkpoint does."""
        warm = self.warm_start and hasattr(self, "converged_")
        params = self._fit_params()
        for name in _array_api.MIXTURE_INIT_PARAMETERS:  # arrays of the input's namespace
            params[name] = _array_api.to_numpy(params[name])
        if n_components is not None:
            params["n_components"] = n_components
        if max_iter is not None:
            params["max_iter"] = max_iter
        warm_start = self._warm_start_parameters(X.shape[1]) if warm else None
        return _fitting.mixture_plan(
            params, X, sample_weight, random_state, warm_start, k_unknown_pass, gaps
        )

    def _warm_start_parameters(self, n_features: int) -> GivenStarts:
        """The fitted parameters ``warm_start`` goes on from, for a fit of ``n_features``."""
        shape = (len(self.weights_), n_features)
        if self.means_.shape != shape:
            raise ValueError(
                f"warm_start=True continues the previous fit, whose means have shape "
                f"{self.means_.shape}, but this fit asks for {shape} (n_components, "
                "n_features). Set warm_start=False, or fit a new estimator."
            )
        return GivenStarts(
            weights=self.weights_.astype(np.float64),
            means=self.means_.astype(np.float64),
            precisions_cholesky=self.precisions_cholesky_.astype(np.float64),
            lower_bound=self.lower_bound_,
        )

    def _needs_X_in_memory(self, auto: bool, sample_weight) -> bool:
        """Whether this fit needs ``X`` in memory: K to choose, a warm start, the
        ``*_init`` arrays, another ``init_params`` or ``sample_weight``."""
        given = (self.weights_init, self.means_init, self.precisions_init, sample_weight)
        warm = self.warm_start and hasattr(self, "converged_")
        return (
            auto or warm or self.init_params != "transformer" or any(p is not None for p in given)
        )
