"""Many small mixtures at once: one forward pass and one batched EM for all datasets."""

from __future__ import annotations

from collections.abc import Sequence

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
    n_init: int = 1,
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
    estimators = [clone(template) for _ in range(len(datasets))]
    Xs = [
        estimator._validate_fit_data(X) for estimator, X in zip(estimators, datasets, strict=True)
    ]
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
