"""Many small mixtures at once: one forward pass and one batched EM for all datasets."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Integral
from types import NoneType

import numpy as np
from sklearn.base import clone
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils import check_random_state

from . import _array_api, _fitting
from ._collapsed import (
    CollapsedComponentWarning,
    collapsed_components,
    identical_components,
    remedy,
)
from ._warnings import warn_user
from .engine import fit
from .gmm import TransformerGMM


@dataclass(frozen=True)
class FittedMixtures:
    """Many fitted mixtures as stacked arrays: what ``fit_many(..., output="arrays")``
    returns, without building an estimator per dataset.

    Row ``i`` of each array is what ``fit_many(...)[i]`` would hold in the attribute of
    the same name with a trailing underscore.

    Attributes
    ----------
    weights : ndarray of shape (n_datasets, n_components)
        Like ``means``, ``covariances`` and ``precisions_cholesky``: float32 when every
        dataset is float32, else float64.
    means : ndarray of shape (n_datasets, n_components, n_features)
    covariances : ndarray of shape (n_datasets, ...)
        Each dataset's covariances, shaped by ``covariance_type`` as
        :attr:`TransformerGMM.covariances_`.
    precisions_cholesky : ndarray of the same shape as ``covariances``
    lower_bound : ndarray of shape (n_datasets,)
    n_iter : ndarray of shape (n_datasets,)
    converged : ndarray of shape (n_datasets,)
    init_method : ndarray of shape (n_datasets,)
        ``"transformer"`` or ``"k-means++"``: where each kept estimate started.
    collapsed : ndarray of bool, shape (n_datasets, n_components)
        The collapsed components of each mixture, as
        :attr:`TransformerGMM.collapsed_components_`.
    covariance_type : str
    device : str
        The device the fit ran on.
    """

    weights: np.ndarray
    means: np.ndarray
    covariances: np.ndarray
    precisions_cholesky: np.ndarray
    lower_bound: np.ndarray
    n_iter: np.ndarray
    converged: np.ndarray
    init_method: np.ndarray
    collapsed: np.ndarray
    covariance_type: str
    device: str

    def __len__(self) -> int:
        return self.weights.shape[0]


def fit_many(
    datasets: Sequence | np.ndarray,
    n_components: int,
    *,
    covariance_type: str = "full",
    checkpoint: str | None = "default",
    max_iter: int = 100,
    tol: float = 1e-3,
    reg_covar: float = 1e-6,
    n_init: int | str = "auto",
    n_views: int | str = "auto",
    device: str = "auto",
    random_state=None,
    output: str = "estimators",
) -> list[TransformerGMM] | FittedMixtures:
    """Fit one :class:`TransformerGMM` per dataset, all datasets in one batch.

    The datasets may differ in their number of samples but must share their number of
    features. The transformer's pass and EM run batched on the device, much faster than
    a loop of ``fit`` calls for many small datasets; each result is the one
    ``TransformerGMM(...).fit(X)`` gives, up to rounding and the random draws.

    Read more in the :ref:`User Guide <user-guide-fit-many>`.

    Parameters
    ----------
    datasets : sequence of array-like of shape (n_samples_i, n_features), or ndarray of \
shape (n_datasets, n_samples, n_features)
        The datasets; a 3-D float array is the fastest input.
    n_components : int
        Mixture components per dataset.
    covariance_type, checkpoint, max_iter, tol, reg_covar, n_init, n_views, device, \
random_state
        As in :class:`TransformerGMM`.
    output : {"estimators", "arrays"}, default="estimators"
        ``"estimators"`` returns a fitted :class:`TransformerGMM` per dataset;
        ``"arrays"`` returns the same parameters stacked in one :class:`FittedMixtures`,
        which skips building the estimators.

    Returns
    -------
    estimators : list of TransformerGMM, or FittedMixtures
        One fitted estimator per dataset, in order; or, with ``output="arrays"``, their
        parameters as arrays whose first axis is the dataset.

    See Also
    --------
    TransformerGMM : One mixture, fitted to one dataset.

    Examples
    --------
    >>> import numpy as np
    >>> from transformer_gmm import fit_many
    >>> rng = np.random.default_rng(0)
    >>> datasets = [np.vstack([rng.normal(-4, 1, (n, 2)), rng.normal(4, 1, (n, 2))])
    ...             for n in (30, 50, 80)]
    >>> fits = fit_many(datasets, 2, checkpoint=None, random_state=0)
    >>> [len(gmm.predict(X)) for gmm, X in zip(fits, datasets)]
    [60, 100, 160]
    >>> bool(np.allclose(np.sort(fits[2].means_[:, 0]), [-4, 4], atol=0.5))
    True

    Arrays instead of estimators, for many datasets of one shape:

    >>> batch = rng.normal(size=(500, 64, 2))
    >>> batch[:, :32] += 10.0  # two separated clusters in every dataset
    >>> arrays = fit_many(batch, 2, checkpoint=None, random_state=0, output="arrays")
    >>> len(arrays), arrays.means.shape, arrays.covariances.shape
    (500, (500, 2, 2), (500, 2, 2, 2))
    >>> bool(np.allclose(arrays.weights, 0.5)), np.unique(arrays.init_method).tolist()
    (True, ['k-means++'])
    """
    template = TransformerGMM(
        n_components,
        covariance_type=covariance_type,
        checkpoint=checkpoint,
        max_iter=max_iter,
        tol=tol,
        reg_covar=reg_covar,
        n_init=n_init,
        n_views=n_views,
        device=device,
        random_state=random_state,
    )
    params = template.get_params(deep=False)
    _fitting.validate_params(TransformerGMM, params)
    if not isinstance(n_components, Integral) or isinstance(n_components, bool):
        raise ValueError(
            "fit_many fits one n_components, an int, for every dataset; got "
            f"{n_components!r}. Choose K per dataset with TransformerGMM(n_components='auto')."
        )
    if output not in ("estimators", "arrays"):
        raise ValueError(f"output must be 'estimators' or 'arrays'; got {output!r}.")
    if len(datasets) == 0:
        raise ValueError("fit_many needs at least one dataset; got an empty sequence.")
    # With scikit-learn's array_api_dispatch, torch tensors (or other array-API arrays)
    # come in through the estimators' one door: the first dataset's namespace is the
    # results', every dataset is read as numpy (a CPU tensor as a view), as fit reads X.
    namespace = _array_api.input_namespace(datasets[0])
    if namespace is not None:
        datasets = (
            [_array_api.to_numpy(X) for X in datasets]
            if isinstance(datasets, (list, tuple)) else _array_api.to_numpy(datasets)
        )
    # Arrays need no estimator per dataset: the template validates every dataset.
    estimators = _copies(params, len(datasets)) if output == "estimators" else None
    Xs = _validate(estimators or [template] * len(datasets), datasets, n_components)
    widths = sorted({Xs.shape[2]} if isinstance(Xs, np.ndarray) else {X.shape[1] for X in Xs})
    if len(widths) > 1:
        raise ValueError(
            f"fit_many needs datasets with the same number of features; got {widths}. "
            "Group the datasets by width and call fit_many once per group."
        )
    # The plan reads the template's parameters and the largest dataset's size alone.
    n_samples = max(X.shape[0] for X in Xs)
    plan = _fitting.mixture_plan(
        params, Xs[0], None, check_random_state(random_state), n_samples=n_samples
    )
    fits = fit.fit(plan, Xs)
    n_failed = int(np.count_nonzero(~fits.converged))
    if n_failed and max_iter > 0:
        warn_user(
            f"EM did not converge for {n_failed} of {len(fits.converged)} datasets. Increase "
            "max_iter or tol, or check those datasets for degenerate (collapsed) samples.",
            ConvergenceWarning,
        )
    n_samples = np.array([X.shape[0] for X in Xs], dtype=np.float64)  # (B,)
    collapsed = collapsed_components(
        fits.weights, fits.means, fits.covariances, covariance_type, n_samples, reg_covar
    )  # (B, K)
    n_collapsed = int(collapsed.any(axis=-1).sum())
    if n_collapsed:
        warn_user(
            f"{n_collapsed} of {len(collapsed)} mixtures have collapsed components: each "
            "holds too few points for its covariance or has a variance at the reg_covar "
            "floor (collapsed_components_, or FittedMixtures.collapsed, marks them). "
            f"{remedy(covariance_type)}.",
            CollapsedComponentWarning,
        )
    identical = identical_components(
        fits.means, fits.covariances, fits.precisions_cholesky, covariance_type
    )  # (B, K)
    n_identical = int(identical.any(axis=-1).sum())
    if n_identical:
        warn_user(
            f"{n_identical} of {len(identical)} mixtures have components that repeat others "
            "(the same mean and covariance), so they have fewer distinct components than "
            "asked for: their data vary far less than reg_covar, or hold repeated points. "
            "Rescale those datasets (or lower reg_covar), or fit fewer components.",
            CollapsedComponentWarning,
        )
    if estimators is None:
        dtype = Xs.dtype if isinstance(Xs, np.ndarray) else np.result_type(*{X.dtype for X in Xs})
        # As wide as "transformer" whichever starts ran, as np.where made them.
        init_method = np.asarray(plan.start_names, dtype="<U11")[fits.best_run]
        return _in_namespace(FittedMixtures(
            weights=fits.weights.astype(dtype, copy=False),
            means=fits.means.astype(dtype, copy=False),
            covariances=fits.covariances.astype(dtype, copy=False),
            precisions_cholesky=fits.precisions_cholesky.astype(dtype, copy=False),
            lower_bound=fits.lower_bound,
            n_iter=fits.n_iter,
            converged=fits.converged,
            init_method=init_method,
            collapsed=collapsed,
            covariance_type=covariance_type,
            device=plan.device,
        ), namespace)
    for i, estimator in enumerate(estimators):
        dtype = Xs.dtype if isinstance(Xs, np.ndarray) else Xs[i].dtype
        estimator._store_fit(fits, i, plan, dtype, collapsed=collapsed[i])
        _array_api.attributes_to_input(estimator, namespace)
    return estimators


def _in_namespace(fitted: FittedMixtures, namespace) -> FittedMixtures:
    """``fitted`` with its numeric arrays in the input's namespace and on its device (as
    they are without one); ``init_method`` names stay numpy strings."""
    if namespace is None:
        return fitted
    numeric = {
        field.name: namespace.to_input(getattr(fitted, field.name))
        for field in dataclasses.fields(fitted)
        if isinstance(getattr(fitted, field.name), np.ndarray)
        and getattr(fitted, field.name).dtype.kind in "biuf"
    }
    return dataclasses.replace(fitted, **numeric)


# --- many estimators at once -----------------------------------------------------------
# Per dataset, sklearn's validate_data costs about 0.25 ms and clone about 0.06 ms (0.6 s
# for 10,000 datasets, as much as their whole batched fit on CPU; _copies takes 0.13 s):
# these do that work once. Each estimator is then set as its own fit sets it.


def _copies(params: dict, n_copies: int) -> list[TransformerGMM]:
    """``[clone(TransformerGMM(**params)) for _ in range(n_copies)]``."""
    # Strings, numbers and None are shared, as their deep copies would be; the rest (a
    # RandomState, say) is cloned for each estimator, as clone does.
    shared = {name: v for name, v in params.items() if isinstance(v, (str, int, float, NoneType))}
    cloned = {name: v for name, v in params.items() if name not in shared}
    return [
        TransformerGMM(**shared, **{name: clone(v, safe=False) for name, v in cloned.items()})
        for _ in range(n_copies)
    ]


def _validate(
    estimators: list[TransformerGMM], datasets, n_components: int
) -> np.ndarray | list[np.ndarray]:
    """Each dataset validated as its estimator's ``fit`` validates it: float arrays of one shape
    in one call (returned as one 3-D array), anything else one at a time (returned as a list).
    """
    stacked = _stack_floats(datasets)
    if stacked is not None and stacked.shape[1] >= max(2, n_components):
        rows = stacked.reshape(-1, stacked.shape[2])
        try:
            rows = _without_gaps(_fitting.validate_fit_data(
                estimators[0], rows, n_components, allow_nan=True))
        except (TypeError, ValueError):
            rows = None
        if rows is not None:  # the others learn n_features_in_ from their fit (_store_fit)
            return rows.reshape(stacked.shape)
    return [
        _without_gaps(
            _fitting.validate_fit_data(estimator, X, n_components, allow_nan=True), index
        )
        for index, (estimator, X) in enumerate(zip(estimators, datasets, strict=True))
    ]


def _without_gaps(X: np.ndarray, index: int | None = None) -> np.ndarray:
    """``X``, where it has no missing values (NaN): ``fit_many`` batches complete datasets
    alone, where ``TransformerGMM.fit`` takes gaps."""
    if np.isnan(X).any():
        which = "" if index is None else f" (dataset {index})"
        raise ValueError(
            f"fit_many takes no missing values (NaN), and a dataset has some{which}. Fit "
            "datasets with gaps one at a time with TransformerGMM(...).fit(X), which "
            "fits over the observed entries, or fill them first (sklearn.impute)."
        )
    return X


def _stack_floats(datasets) -> np.ndarray | None:
    """The datasets as one (B, n, d) float array, or None if they are anything else."""
    if isinstance(datasets, np.ndarray):
        return datasets if datasets.ndim == 3 and datasets.dtype.kind == "f" else None
    if not all(type(X) is np.ndarray for X in datasets):
        return None
    kinds = {(X.shape, X.dtype) for X in datasets}
    (shape, dtype), *others = kinds
    if others or len(shape) != 2 or shape[1] == 0 or dtype.kind != "f":
        return None
    return np.stack(datasets)
