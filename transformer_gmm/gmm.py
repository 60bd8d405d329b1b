"""TransformerGMM: a Gaussian mixture initialised by a pretrained transformer."""

from __future__ import annotations

from numbers import Integral, Real

import numpy as np
from sklearn.base import DensityMixin, _fit_context
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils import check_random_state
from sklearn.utils._param_validation import Interval, StrOptions

from . import _backend
from ._base import _TransformerMixtureBase, draw_seed, warn_user
from ._mixture_methods import FittedMixtureMixin, _precisions


class TransformerGMM(FittedMixtureMixin, DensityMixin, _TransformerMixtureBase):
    """Gaussian mixture whose parameters a pretrained transformer estimates in one pass.

    A set transformer reads the whole (standardized) dataset and returns mixture
    weights, means and scales for the requested number of components; EM then polishes
    that estimate on all of ``X`` in the original space. When the checkpoint has no
    readout head for ``n_components`` (or no default checkpoint is bundled), the
    estimator falls back to EM from k-means++ initialisation, as
    :class:`sklearn.mixture.GaussianMixture` does, and says so with a
    :class:`~transformer_gmm.FallbackWarning`.

    Parameters
    ----------
    n_components : int, default=1
        The number of mixture components.
    covariance_type : {"full", "tied", "diag", "spherical"}, default="full"
        The covariance parameterisation, as in :class:`~sklearn.mixture.GaussianMixture`.
    checkpoint : str, path or None, default="default"
        The transformer: a bundled name, a local checkpoint folder, or a Hugging Face
        Hub id ``"org/name"`` (optionally ``"org/name@revision"``). ``None`` skips the
        transformer and uses EM from k-means++ initialisation, without a warning. A
        checkpoint that is named but cannot be found or loaded raises an error.
    max_iter : int, default=100
        EM iterations that polish the transformer's estimate. ``0`` returns the
        transformer's own estimate: weights and means from one M-step on its
        responsibilities, and covariances from the same M-step (with ``n_init="auto"``,
        of its two starts the one with the higher likelihood).
    tol : float, default=1e-3
        EM stops when the gain in the lower bound (mean log-likelihood per sample) is
        below this threshold.
    reg_covar : float, default=1e-6
        Non-negative regularisation added to the diagonal of the covariances.
    n_init : "auto" or int, default="auto"
        Initialisations to run, all as one batch. The transformer gives the first
        ``2 * n_views``, two per view: the responsibilities under its own mixture
        (``n_init=1`` runs the first view's alone), then its per-point cluster
        probabilities; the others come from k-means++. The run with the highest lower
        bound among the transformer's is kept, unless a k-means++ run's log-likelihood
        over the data is higher by more than 5 nats (on a few hundred overlapping
        points, optima closer than that are noise, and the likelier is often the worse
        estimate); among k-means++ starts alone, the highest lower bound, as in
        ``GaussianMixture``.
        ``"auto"`` runs all of the transformer's starts and two k-means++ starts (a poor
        start can trap EM, and the transformer's and k-means++'s fail on different
        datasets); with ``max_iter=0``, the transformer's starts alone; and a single
        k-means++ start when no transformer runs, as ``GaussianMixture`` does.
    n_views : int, default=1
        Readings of the data by the transformer, in one batch: the data, then
        reflections of its principal axes (every axis negated, then the odd ones, then
        the even ones, and so on). A reflected mixture is a mixture, but the transformer
        is not exactly equivariant, so where it is unsure each view gives other starts,
        and the likeliest is kept. Each view costs a forward pass: ``n_views=4``
        multiplies the transformer's share of the time by about four, and on
        ``benchmarks/accuracy.py`` lowers its own estimate's error (``max_iter=0``) at
        d = 2, K = 5 from 0.247 to 0.149 and at d = 8, K = 5 from 0.062 to 0.045. With
        EM, more views mean more optima to choose from by likelihood, which where
        components overlap is not always the better estimate (there four views helped
        at d = 2, K = 5 and hurt at K = 4), so the default reads the data once.
    device : str, default="auto"
        Where to run: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"auto"`` (CUDA when
        available). Fitting uses float64 on CPU and float32 on CUDA.
    random_state : int, RandomState instance or None, default=None
        Seeds the subsample the transformer reads when ``n_samples`` exceeds its context
        size, and the k-means++ initialisations. The same seed gives the same result on
        the same device.

    Attributes
    ----------
    weights_ : ndarray of shape (n_components,)
        The weight of each mixture component. This and the four arrays below have the
        training data's dtype, float32 or float64 (EM computes in float64 on CPU).
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
        Cholesky factors of the precisions, of the same shape (as in scikit-learn).
    converged_ : bool
        Whether EM converged (False when ``max_iter=0``).
    n_iter_ : int
        EM iterations run for the kept initialisation. Above 8,192 samples, where the
        initialisations are compared on a subsample, those there plus those on all of X.
    lower_bound_ : float
        Mean log-likelihood per sample at the last E-step of the kept initialisation.
    init_method_ : {"transformer", "k-means++"}
        Where the kept estimate started: the transformer, or k-means++ (the fallback when
        the transformer does not cover the request, or a restart that won).
    device_ : str
        The device the fit ran on.
    n_features_in_ : int
        Number of features seen during fit.
    feature_names_in_ : ndarray of shape (`n_features_in_`,)
        Names of features seen during fit, when ``X`` has string column names.

    See Also
    --------
    sklearn.mixture.GaussianMixture : EM from k-means initialisation.
    TransformerClusterer : Hard clustering with the same backbone.

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
        **_TransformerMixtureBase._parameter_constraints,
        "n_components": [Interval(Integral, 1, None, closed="left")],
        "covariance_type": [StrOptions({"full", "tied", "diag", "spherical"})],
        "reg_covar": [Interval(Real, 0.0, None, closed="left")],
    }

    def __init__(
        self,
        n_components=1,
        *,
        covariance_type="full",
        checkpoint="default",
        max_iter=100,
        tol=1e-3,
        reg_covar=1e-6,
        n_init="auto",
        n_views=1,
        device="auto",
        random_state=None,
    ):
        self.n_components = n_components
        self.covariance_type = covariance_type
        self.checkpoint = checkpoint
        self.max_iter = max_iter
        self.tol = tol
        self.reg_covar = reg_covar
        self.n_init = n_init
        self.n_views = n_views
        self.device = device
        self.random_state = random_state

    def _n_components(self) -> int:
        return self.n_components

    # --- fitting -----------------------------------------------------------------------

    def fit(self, X, y=None):
        """Estimate the mixture's parameters.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Training data.
        y : Ignored
            Not used, present for API consistency.

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
        self.fit_predict(X, y)
        return self

    @_fit_context(prefer_skip_nested_validation=True)
    def fit_predict(self, X, y=None):
        """Fit the mixture and return the component of each sample.

        Equals ``fit(X).predict(X)``: labels come from a final E-step.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Training data.
        y : Ignored
            Not used, present for API consistency.

        Returns
        -------
        labels : ndarray of shape (n_samples,)
            Component labels.

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
        X = self._validate_fit_data(X)
        random_state = check_random_state(self.random_state)
        device = _backend.resolve_device(self.device)
        backbone = self._load_backbone()
        n_transformer_inits, n_kmeans_inits = self._starts(backbone is not None)
        fits = _backend.fit_mixtures(
            [X],
            **self._em_options(device),
            seed=draw_seed(random_state),
            n_kmeans_inits=n_kmeans_inits,
            backbone=backbone,
            n_transformer_inits=n_transformer_inits,
        )
        self._store_fit(fits, 0, device, n_transformer_inits, X.dtype)
        if not self.converged_ and self.max_iter > 0:
            warn_user(
                "EM did not converge for the kept initialisation. Increase max_iter or tol, "
                "or check the data for degenerate (duplicated or collapsed) samples.",
                ConvergenceWarning,
            )
        return self._estimate_weighted_log_prob(X).argmax(axis=1)

    def _em_options(self, device: str) -> dict:
        return dict(
            n_components=self.n_components,
            covariance_type=self.covariance_type,
            reg_covar=self.reg_covar,
            max_iter=self.max_iter,
            tol=self.tol,
            device=device,
        )

    def _store_fit(
        self,
        fits: _backend.MixtureFits,
        i: int,
        device: str,
        n_transformer_inits: int,
        dtype: np.dtype,
    ) -> None:
        """Take dataset ``i`` of a batch's fits, in the training data's ``dtype`` (as
        GaussianMixture keeps float32); copies, so that no estimator keeps the whole
        batch's arrays alive."""
        precisions_cholesky = fits.precisions_cholesky[i]
        # From the float64 factors: squaring float32 ones would double their rounding.
        precisions = _precisions(precisions_cholesky, self.covariance_type)
        self.weights_ = fits.weights[i].astype(dtype)
        self.means_ = fits.means[i].astype(dtype)
        self.covariances_ = fits.covariances[i].astype(dtype)
        self.precisions_cholesky_ = precisions_cholesky.astype(dtype)
        self.precisions_ = precisions.astype(dtype, copy=False)
        self.converged_ = bool(fits.converged[i])
        self.n_iter_ = int(fits.n_iter[i])
        self.lower_bound_ = float(fits.lower_bound[i])
        transformer_won = fits.best_run[i] < n_transformer_inits  # its starts come first
        self.init_method_ = "transformer" if transformer_won else "k-means++"
        self.device_ = device
