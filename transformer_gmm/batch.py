"""Many small mixtures at once: one forward pass and one batched EM for all datasets."""

from __future__ import annotations

from collections.abc import Sequence
from types import NoneType

import numpy as np
from sklearn.base import clone
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils import check_random_state

from . import _backend
from ._base import draw_seed, warn_user
from .gmm import TransformerGMM


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
    device: str = "auto",
    random_state=None,
) -> list[TransformerGMM]:
    """Fit one :class:`TransformerGMM` per dataset, all datasets in one batch.

    The datasets may have different numbers of samples (they are padded and masked) but
    must share their number of features. The transformer reads all of them in one
    forward pass and EM polishes all of them together, which is much faster than a loop
    of ``fit`` calls when there are many small datasets, on CPU and more so on a GPU.
    Each returned estimator is the same as ``TransformerGMM(...).fit(X)`` would give,
    up to floating-point rounding and the random draws (one generator serves the batch).

    Parameters
    ----------
    datasets : sequence of array-like of shape (n_samples_i, n_features), or ndarray of \
shape (n_datasets, n_samples, n_features)
        The datasets.
    n_components : int
        Mixture components per dataset.
    covariance_type, checkpoint, max_iter, tol, reg_covar, n_init, device, random_state
        As in :class:`TransformerGMM`.

    Returns
    -------
    estimators : list of TransformerGMM
        Fitted estimators, one per dataset, in order.

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
    """
    template = TransformerGMM(
        n_components,
        covariance_type=covariance_type,
        checkpoint=checkpoint,
        max_iter=max_iter,
        tol=tol,
        reg_covar=reg_covar,
        n_init=n_init,
        device=device,
        random_state=random_state,
    )
    template._validate_params()
    if len(datasets) == 0:
        raise ValueError("fit_many needs at least one dataset; got an empty sequence.")
    estimators = _copies(template, len(datasets))
    Xs = _validate(estimators, datasets)
    widths = sorted({X.shape[1] for X in Xs})
    if len(widths) > 1:
        raise ValueError(
            f"fit_many needs datasets with the same number of features; got {widths}. "
            "Group the datasets by width and call fit_many once per group."
        )
    random_state = check_random_state(random_state)
    device = _backend.resolve_device(device)
    backbone = template._load_backbone()
    transformer_inits = None
    if backbone is not None:
        transformer_inits = template._transformer_inits(Xs, backbone, device, random_state)
    fits = _backend.fit_mixtures(
        Xs,
        **template._em_options(device),
        seed=draw_seed(random_state),
        n_kmeans_inits=template._n_kmeans_inits(backbone is not None),
        transformer_inits=transformer_inits,
    )
    for estimator, fit in zip(estimators, fits, strict=True):
        estimator._store_fit(fit, device, used_transformer=backbone is not None)
    n_failed = sum(not fit.converged for fit in fits)
    if n_failed and max_iter > 0:
        warn_user(
            f"EM did not converge for {n_failed} of {len(fits)} datasets. Increase max_iter "
            "or tol, or check those datasets for degenerate (collapsed) samples.",
            ConvergenceWarning,
        )
    return estimators


# --- many estimators at once -----------------------------------------------------------
# Per dataset, sklearn's clone and validate_data each cost about 0.25 ms: 5 s for 10,000
# datasets, more than their whole batched k-means and EM. These do that work once.


def _copies(template: TransformerGMM, n_copies: int) -> list[TransformerGMM]:
    """``[clone(template) for _ in range(n_copies)]``, reading the parameters only once."""
    params = template.get_params(deep=False)
    # Strings, numbers and None are shared, as their deep copies would be; the rest (a
    # RandomState, say) is cloned for each estimator, as clone does.
    shared = {name: v for name, v in params.items() if isinstance(v, (str, int, float, NoneType))}
    cloned = {name: v for name, v in params.items() if name not in shared}
    return [
        type(template)(**shared, **{name: clone(v, safe=False) for name, v in cloned.items()})
        for _ in range(n_copies)
    ]


def _validate(estimators: list[TransformerGMM], datasets) -> list[np.ndarray]:
    """Each dataset validated as its estimator's ``fit`` validates it.

    Float arrays of one shape and dtype (a 3-D array, or a list of equal 2-D arrays) are
    validated in one call, on their rows stacked together; the per-dataset check left
    (enough samples) holds for all of them when it holds for one. Anything else, or a
    batch that fails, goes one dataset at a time, which raises the usual errors.
    """
    stacked = _stack_floats(datasets)
    if stacked is not None and stacked.shape[1] >= max(2, estimators[0].n_components):
        first = estimators[0]
        try:
            rows = first._validate_fit_data(stacked.reshape(-1, stacked.shape[2]))
        except (TypeError, ValueError):
            rows = None
        if rows is not None:
            fitted = {name: value for name, value in vars(first).items() if name.endswith("_")}
            for estimator in estimators[1:]:
                estimator.__dict__.update(fitted)  # what validation set: n_features_in_
            return list(rows.reshape(stacked.shape))
    return [
        estimator._validate_fit_data(X) for estimator, X in zip(estimators, datasets, strict=True)
    ]


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
