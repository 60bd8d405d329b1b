"""The torch engine: everything that fits, batched over datasets, on CPU or CUDA.

The estimators (``TransformerGMM``, ``TransformerClusterer``, ``fit_many``) validate
numpy arrays and hand them to :mod:`~transformer_gmm.engine.fit`; what comes back is numpy
again. In between, every step works on a padded batch of B datasets with no loop over
them in Python. The modules, from the estimators' side down:

:mod:`~transformer_gmm.engine.plan`
    What a fit does, decided once from the estimator's parameters: a ``MixturePlan``
    (EM) or a ``KMeansPlan`` (Lloyd), which the fits below run.

:mod:`~transformer_gmm.engine.fit`
    Fitting data in memory: builds every start, runs EM or Lloyd from all of them in one
    batch (on a subsample first for many rows), and keeps one run per dataset.

:mod:`~transformer_gmm.engine.fit_by_blocks`
    The same fits for a Dask array (which ``transformer_gmm._dask`` drives): starts on a
    sample, then EM or Lloyd by blocks.

:mod:`~transformer_gmm.engine.blocks`
    Statistics over blocks of rows, a bounded slice at a time in float64, and EM and Lloyd
    from a start over them: a Dask array's chunks, and rows in memory above
    ``fit.REFIT_BY_BLOCKS_ROWS``.

:mod:`~transformer_gmm.engine.starts`
    Where EM and Lloyd start: the transformer's starts, k-means++'s, and the estimator's
    own initial parameters.

:mod:`~transformer_gmm.engine.runs`
    Several runs per dataset in one batch: their layout, and which one is kept.

:mod:`~transformer_gmm.engine.row_order`
    The canonical order of a dataset's rows (a fixed hash of their values), so that no
    fit depends on the order the rows came in. Numpy only.

:mod:`~transformer_gmm.engine.device`
    The numpy/torch boundary: devices and dtypes, a fit's generator, tensors in and out
    (datasets padded into one batch), and the error a device out of memory raises.

:mod:`~transformer_gmm.engine.input_range`
    Whether the data's values fit the dtype a fit computes in, checked before it sums
    their squares.

:mod:`~transformer_gmm.engine.model_cache`
    The loaded transformer (the backbone) of a checkpoint, and its copies on devices.

:mod:`~transformer_gmm.engine.standardize`
    The map to the model's input space (centring, principal directions, one scale), and
    the rows the backbone reads.

:mod:`~transformer_gmm.engine.precision`
    The precision of the backbone's matrix products on CPU: float32, or bfloat16 where
    the user allowed it (``torch.set_float32_matmul_precision("medium")``).

:mod:`~transformer_gmm.engine.readout`
    The backbone's forward pass over a batch and its readout: weights and means in the
    user's space by one M-step on the transformer's responsibilities.

:mod:`~transformer_gmm.engine.em`
    EM as scikit-learn's ``GaussianMixture`` runs it: the loop of every fit
    (``run_em``), the rows it reads in memory, and the re-seeding of components that
    empty on the way.

:mod:`~transformer_gmm.engine.e_step`
    EM's E-step: weighted log-probabilities, responsibilities, the lower bound; and the
    scores of a fitted mixture (``predict``, ``score_samples``) on CPU.

:mod:`~transformer_gmm.engine.m_step`
    EM's M-step, the ``MixtureParams`` it estimates, and scikit-learn's k-means
    initialisations of a mixture.

:mod:`~transformer_gmm.engine.gaussian`
    Gaussian log-densities and the conversions between covariances and precisions, for
    the four covariance types.

:mod:`~transformer_gmm.engine.kmeans`
    k-means++ seeding and Lloyd's algorithm, as scikit-learn's ``KMeans``: the loop of
    every fit (``run_lloyd``) and the rows it reads in memory.

:mod:`~transformer_gmm.engine.sufficient_stats`
    The statistics EM and Lloyd need of some rows, which add up over blocks, and the
    rows the two loops read through them alone.

:mod:`~transformer_gmm.engine.missing`, :mod:`~transformer_gmm.engine.kpod`
    Data with missing entries: the observed entries' expected statistics (EM), and
    k-POD (Lloyd on rows filled from their centres).

:mod:`~transformer_gmm.engine.online`
    A stream's steps: stepwise EM and mini-batch k-means, one batch at a time.

:mod:`~transformer_gmm.engine.batching`
    The batch convention every kernel shares: checks, padding, per-row weights, and the
    shrinking batch with which the loops drop the problems that have converged.

The submodules load on first access (``transformer_gmm.engine.em``), so importing the
package loads no torch.
"""

from __future__ import annotations

import importlib

_SUBMODULES = {
    "batching",
    "blocks",
    "collapse",
    "device",
    "e_step",
    "em",
    "fit",
    "fit_by_blocks",
    "gaussian",
    "input_range",
    "k_posterior",
    "kmeans",
    "kpod",
    "m_step",
    "missing",
    "model_cache",
    "online",
    "plan",
    "precision",
    "readout",
    "row_order",
    "runs",
    "standardize",
    "starts",
    "sufficient_stats",
}


def __getattr__(name: str) -> object:
    """Import a submodule the first time it is used as an attribute."""
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
