"""What a fitted Gaussian mixture computes from its parameters alone: densities, labels,
probabilities, samples and information criteria.

:class:`~transformer_gmm.TransformerGMM` takes these methods from
:class:`FittedMixtureMixin`; fitting them is :mod:`transformer_gmm.gmm`'s work.
"""

from __future__ import annotations

from numbers import Integral

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted

from . import _array_api, _initialization
from ._blas import one_blas_thread
from ._collapsed import collapsed_components
from ._warnings import warn_user
from .engine import e_step, missing
from .engine.device import to_numpy

# Free parameters of the covariances, by type (for bic and aic).
_N_COVARIANCE_PARAMETERS = {
    "full": lambda k, d: k * d * (d + 1) / 2,
    "tied": lambda k, d: d * (d + 1) / 2,
    "diag": lambda k, d: k * d,
    "spherical": lambda k, d: k,
}


@one_blas_thread
def precisions_from_cholesky(precisions_cholesky: np.ndarray, covariance_type: str) -> np.ndarray:
    """The precisions (``precisions_``, by covariance type) that ``precisions_cholesky``
    factors, as scikit-learn computes them."""
    if covariance_type == "full":
        return precisions_cholesky @ np.swapaxes(precisions_cholesky, -1, -2)
    if covariance_type == "tied":
        return precisions_cholesky @ precisions_cholesky.T
    return precisions_cholesky**2


# What the methods compute from validated rows and the parameters, module-level so that a
# Dask graph carries these functions and the parameters, not the estimator.


def _weighted_log_prob(X: np.ndarray, *parameters) -> np.ndarray:
    """log p(x | k) + log w_k, (n, K); of a row with missing entries (NaN), the marginal
    density of its observed features. Rows without NaN are scored as they always were."""
    is_missing = np.isnan(X)
    if not is_missing.any():
        return e_step.weighted_log_prob_of_fitted(X, *parameters)
    missing.check_rows(X)
    return missing.weighted_log_prob(X, *parameters)


def _score_samples(X: np.ndarray, *parameters) -> np.ndarray:
    # In X's dtype, as GaussianMixture's (its computations are in float64 here).
    log_prob = e_step.log_norm_of_fitted(_weighted_log_prob(X, *parameters))
    return log_prob.astype(X.dtype, copy=False)


def _predict(X: np.ndarray, *parameters) -> np.ndarray:
    return _weighted_log_prob(X, *parameters).argmax(axis=1)


def _predict_proba(X: np.ndarray, *parameters) -> np.ndarray:
    resp = e_step.responsibilities_of_fitted(_weighted_log_prob(X, *parameters))
    return resp.astype(X.dtype, copy=False)


class FittedMixtureMixin:
    """Methods of a fitted mixture: they read ``weights_``, ``means_``, ``covariances_``,
    ``precisions_cholesky_``, ``covariance_type`` and ``random_state``,
    and take rows through the estimator's door, ``_read_rows``."""

    def _set_parameters(
        self, weights, means, covariances, precisions_cholesky, dtype, copy: bool = False
    ) -> None:
        """The mixture's parameters from float64 arrays, kept in ``dtype``; ``precisions_``
        from the float64 factors (squaring float32 ones would double their rounding)."""
        precisions = precisions_from_cholesky(precisions_cholesky, self.covariance_type)
        self.weights_ = weights.astype(dtype, copy=copy)
        self.means_ = means.astype(dtype, copy=copy)
        self.covariances_ = covariances.astype(dtype, copy=copy)
        self.precisions_cholesky_ = precisions_cholesky.astype(dtype, copy=copy)
        self.precisions_ = precisions.astype(dtype, copy=False)

    def _store_missing_fit(self, result, X, sample_weight) -> None:
        """Keep ``result``, EM's estimate on ``X`` with NaN (an engine ``MissingEMResult``)."""
        self._set_parameters(
            *(to_numpy(t) for t in (result.weights, result.means, result.covariances,
                                    result.precisions_cholesky)),
            X.dtype,
        )
        self.converged_ = result.converged
        self.n_iter_ = result.n_iter
        self.lower_bound_ = result.lower_bound
        self.lower_bounds_ = np.asarray(result.lower_bounds)
        self._mark_collapsed(X, sample_weight)
        self._warn_if_not_converged()

    def _store_fit(self, fits, i: int, plan, dtype, collapsed=None) -> None:
        """Set the fitted attributes from dataset ``i`` of ``fits`` (an engine
        ``MixtureFits``) of ``plan``, in the training data's ``dtype`` (as GaussianMixture
        keeps float32); copies where the fits are of several datasets, so that no estimator
        keeps the whole batch's arrays alive (of one, the arrays are its own: a copy of
        wide full covariances would double them). ``collapsed``: its
        ``collapsed_components_`` where the caller marked them (else :meth:`_mark_collapsed`
        does)."""
        self._set_parameters(
            fits.weights[i], fits.means[i], fits.covariances[i], fits.precisions_cholesky[i],
            dtype, copy=len(fits.weights) > 1,
        )
        self.converged_ = bool(fits.converged[i])
        self.n_iter_ = int(fits.n_iter[i])
        self.lower_bound_ = float(fits.lower_bound[i])
        self.__dict__.pop("lower_bounds_", None)  # unknown when EM ran on a Dask array
        if fits.lower_bounds is not None:
            bounds = fits.lower_bounds[i, fits.best_run[i]]
            self.lower_bounds_ = bounds[~np.isnan(bounds)]
        self.init_method_ = plan.init_method(fits.best_run[i])
        self.device_ = plan.device
        self.n_components_ = plan.n_components
        self.n_features_in_ = self.means_.shape[1]  # as validation sets it
        if collapsed is not None:
            self.collapsed_components_ = collapsed

    def _mark_collapsed(self, X, sample_weight) -> None:
        """``collapsed_components_`` of the mixture just fitted on ``X`` (with
        ``sample_weight``, a component's points are counted by their weights)."""
        n_samples = X.shape[0] if sample_weight is None else float(np.sum(sample_weight))
        self.collapsed_components_ = collapsed_components(
            self.weights_,
            self.means_,
            self.covariances_,
            self.covariance_type,
            n_samples,
            self.reg_covar,
        )

    def _warn_if_not_converged(self) -> None:
        """scikit-learn's warning where EM ran and the kept run did not converge."""
        if not self.converged_ and self.max_iter > 0:
            warn_user(
                "Best performing initialization did not converge. Try different init "
                "parameters, or increase max_iter, tol, or check for degenerate data.",
                ConvergenceWarning,
            )

    def _parameters(self) -> tuple:
        """The parameters as numpy arrays (a fit on another namespace keeps them there)."""
        arrays = (self.weights_, self.means_, self.precisions_cholesky_)
        return (*map(_array_api.to_numpy, arrays), self.covariance_type)

    def _estimate_weighted_log_prob(self, rows):
        return rows.apply(
            _weighted_log_prob, *self._parameters(), n_columns=self.weights_.shape[0]
        )

    def score_samples(self, X):
        """Log-likelihood of each sample under the fitted mixture.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Samples.

        Returns
        -------
        log_prob : ndarray of shape (n_samples,)
            ``log p(x)`` for each sample, in ``X``'s dtype (float32 or float64). A
            sample's weight does not change its log-likelihood, so there is no
            ``sample_weight`` here; :meth:`score` takes one.

        Examples
        --------
        >>> import numpy as np
        >>> from transformer_gmm import TransformerGMM
        >>> rng = np.random.default_rng(0)
        >>> X = np.vstack([rng.normal(-5, 1, (50, 2)), rng.normal(5, 1, (50, 2))])
        >>> gmm = TransformerGMM(n_components=2, checkpoint=None, random_state=0).fit(X)
        >>> gmm.score_samples([[-5.0, -5.0], [0.0, 0.0]]).shape
        (2,)
        >>> bool(gmm.score_samples([[-5.0, -5.0]])[0] > gmm.score_samples([[0.0, 0.0]])[0])
        True
        """
        rows = self._read_rows(X, "score_samples", "means_")
        scores = rows.apply(_score_samples, *self._parameters(), dtype=rows.X.dtype)
        return _array_api.returned(scores, rows.namespace)

    def score(self, X, y=None, sample_weight=None):
        """Mean log-likelihood per sample (higher is better).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Samples.
        y : Ignored
            Not used, present for API consistency.
        sample_weight : array-like of shape (n_samples,), default=None
            Non-negative weights of the samples; the mean is then weighted.

        Returns
        -------
        log_likelihood : float
            Mean of :meth:`score_samples`, weighted by ``sample_weight``.

        Examples
        --------
        >>> import numpy as np
        >>> from transformer_gmm import TransformerGMM
        >>> rng = np.random.default_rng(0)
        >>> X = np.vstack([rng.normal(-5, 1, (50, 2)), rng.normal(5, 1, (50, 2))])
        >>> gmm = TransformerGMM(n_components=2, checkpoint=None, random_state=0).fit(X)
        >>> round(gmm.score(X), 1)
        -3.4
        >>> round(gmm.score(X, sample_weight=np.r_[np.ones(50), np.zeros(50)]), 1)  # first 50
        -3.4
        """
        rows = self._read_rows(X, "score", "means_")  # a float whatever the namespace
        log_prob = rows.apply(_score_samples, *self._parameters(), dtype=rows.X.dtype)
        if sample_weight is None:
            return float(log_prob.mean())
        sample_weight = _initialization.checked_sample_weight(
            _array_api.to_numpy(sample_weight), log_prob.shape[0]
        )
        return float((log_prob * sample_weight).sum() / sample_weight.sum())

    def predict(self, X):
        """The most probable component of each sample.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Samples.

        Returns
        -------
        labels : ndarray of shape (n_samples,)
            Component labels: the argmax of :meth:`predict_proba`'s rows.
        """
        rows = self._read_rows(X, "predict", "means_")
        labels = rows.apply(_predict, *self._parameters(), dtype=np.intp)
        return _array_api.returned(labels, rows.namespace)

    def predict_proba(self, X):
        """Posterior probability of each component for each sample.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Samples.

        Returns
        -------
        resp : ndarray of shape (n_samples, n_components)
            Responsibilities; each row sums to 1.

        Examples
        --------
        >>> import numpy as np
        >>> from transformer_gmm import TransformerGMM
        >>> rng = np.random.default_rng(0)
        >>> X = np.vstack([rng.normal(-5, 1, (50, 2)), rng.normal(5, 1, (50, 2))])
        >>> gmm = TransformerGMM(n_components=2, checkpoint=None, random_state=0).fit(X)
        >>> proba = gmm.predict_proba([[-5.0, -5.0], [0.3, 0.2], [5.0, 5.0]])
        >>> proba.round(2)  # the point between the two components is not quite sure
        array([[1.  , 0.  ],
               [0.08, 0.92],
               [0.  , 1.  ]])
        >>> gmm.predict([[0.3, 0.2]])
        array([1])
        """
        rows = self._read_rows(X, "predict_proba", "means_")
        proba = rows.apply(
            _predict_proba, *self._parameters(), n_columns=self.weights_.shape[0],
            dtype=rows.X.dtype,
        )
        return _array_api.returned(proba, rows.namespace)

    def sample(self, n_samples=1):
        """Draw samples from the fitted mixture.

        Parameters
        ----------
        n_samples : int, default=1
            Number of samples to draw.

        Returns
        -------
        X : ndarray of shape (n_samples, n_features)
            Samples, grouped by component.
        y : ndarray of shape (n_samples,)
            The component each sample came from.

        Examples
        --------
        >>> import numpy as np
        >>> from transformer_gmm import TransformerGMM
        >>> rng = np.random.default_rng(0)
        >>> X = np.vstack([rng.normal(-5, 1, (50, 2)), rng.normal(5, 1, (50, 2))])
        >>> gmm = TransformerGMM(n_components=2, checkpoint=None, random_state=0).fit(X)
        >>> X_new, y_new = gmm.sample(6)
        >>> X_new.shape, y_new.shape
        ((6, 2), (6,))
        """
        check_is_fitted(self)
        if not isinstance(n_samples, Integral) or n_samples < 1:
            raise ValueError(
                f"Invalid value for 'n_samples': {n_samples!r}. It must be a positive integer."
            )
        rng = check_random_state(self.random_state)
        # In float64 even for a float32 fit: multinomial rejects weights whose rounding
        # sums past 1, and multivariate_normal's check that a float32 covariance is
        # positive semi-definite fails on rounding alone.
        # Drawn with numpy's generator, as GaussianMixture's are, then returned in the
        # fitted parameters' namespace and on their device.
        namespace = _array_api.attribute_namespace(self.means_)
        weights = _array_api.to_numpy(self.weights_).astype(np.float64)
        means = _array_api.to_numpy(self.means_).astype(np.float64)
        covariances = _array_api.to_numpy(self.covariances_).astype(np.float64)
        counts = rng.multinomial(n_samples, weights / weights.sum())
        if self.covariance_type == "full":
            draws = [
                rng.multivariate_normal(mean, cov, int(count))
                for mean, cov, count in zip(means, covariances, counts, strict=True)
            ]
        elif self.covariance_type == "tied":
            draws = [
                rng.multivariate_normal(mean, covariances, int(count))
                for mean, count in zip(means, counts, strict=True)
            ]
        else:
            draws = [
                mean + rng.standard_normal((count, mean.shape[0])) * np.sqrt(cov)
                for mean, cov, count in zip(means, covariances, counts, strict=True)
            ]
        labels = np.concatenate([np.full(count, k, dtype=int) for k, count in enumerate(counts)])
        return _array_api.returned(np.vstack(draws), namespace), _array_api.returned(
            labels, namespace
        )

    def _n_parameters(self) -> int:
        n_features = self.means_.shape[1]
        n_components = self.weights_.shape[0]  # the fitted K, also when it was chosen
        covariance = _N_COVARIANCE_PARAMETERS[self.covariance_type](n_components, n_features)
        return int(covariance + n_components * n_features + n_components - 1)

    def _weighted_bic(self, X, sample_weight) -> float:
        """BIC on ``X`` weighing its rows as frequencies (the choice of K's criterion)."""
        w = np.ones(len(X)) if sample_weight is None else np.asarray(sample_weight, float)
        log_likelihood = float(w @ self.score_samples(X))
        return -2.0 * log_likelihood + self._n_parameters() * np.log(w.sum())

    def bic(self, X):
        """Bayesian information criterion on ``X`` (lower is better).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Samples.

        Returns
        -------
        bic : float

        Examples
        --------
        Choose the number of components (:meth:`aic` is used the same way):

        >>> import numpy as np
        >>> from transformer_gmm import TransformerGMM
        >>> rng = np.random.default_rng(0)
        >>> X = np.vstack([rng.normal(-5, 1, (50, 2)), rng.normal(5, 1, (50, 2))])
        >>> fits = {k: TransformerGMM(k, checkpoint=None, random_state=0).fit(X) for k in (1, 2, 3)}
        >>> min(fits, key=lambda k: fits[k].bic(X)), min(fits, key=lambda k: fits[k].aic(X))
        (2, 2)
        """
        n_samples = np.shape(X)[0]
        return -2 * self.score(X) * n_samples + self._n_parameters() * np.log(n_samples)

    def aic(self, X):
        """Akaike information criterion on ``X`` (lower is better).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Samples.

        Returns
        -------
        aic : float
            It penalises each parameter by 2 where :meth:`bic` does by ``log(n_samples)``;
            :meth:`bic`'s example compares the two.
        """
        return -2 * self.score(X) * np.shape(X)[0] + 2 * self._n_parameters()
