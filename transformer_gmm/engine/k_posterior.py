"""P(K | X): how many components each dataset has, read by the backbone in one pass.

The backbone reads each dataset under its "K unknown" task embedding, projected as for its
largest K (every direction up to ``d_max``), and its K-posterior head scores K = 1..k_max.
Rows are read as a fit reads them: in canonical order, a uniform draw of ``context_size``
of them (or one in proportion to ``sample_weight``), and each view of
:func:`~transformer_gmm.engine.readout.reflections`; the views' probabilities are averaged.
Every readout head reads the same tokens, so the fit of the K chosen starts from this pass
(:func:`read_k_unknown`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from . import model_cache, row_order
from .device import dtype_for, entry_point, pad, seeded_generator, to_numpy
from .input_range import check_magnitude
from .readout import KUnknownPass, read_views
from .standardize import weighted_rows

if TYPE_CHECKING:
    from ..nn import MixtureTransformer

__all__ = ["k_posteriors", "read_k_unknown"]


def k_posteriors(
    backbone: MixtureTransformer,
    Xs: list[np.ndarray],
    sample_weight: list[np.ndarray] | None = None,
    *,
    seed: int,
    device: str = "cpu",
    n_views: int = 1,
) -> np.ndarray:
    """P(K = k | X) for k = 1..k_max of each dataset of ``Xs``: (B, k_max), rows summing to 1.

    Examples
    --------
    >>> import numpy as np
    >>> from transformer_gmm.engine import model_cache
    >>> from transformer_gmm.engine.k_posterior import k_posteriors
    >>> backbone = model_cache.load_backbone("default")
    >>> X, _ = two_blobs()  # one dataset (B=1) of 40 points in two blobs
    >>> p = k_posteriors(backbone, [X[0].numpy()], seed=0)
    >>> p.shape, int(p.argmax()) + 1
    ((1, 10), 2)
    """
    return read_k_unknown(backbone, Xs, sample_weight, seed=seed, device=device, n_views=n_views)[0]


@entry_point
def read_k_unknown(
    backbone: MixtureTransformer,
    Xs: list[np.ndarray],
    sample_weight: list[np.ndarray] | None = None,
    *,
    seed: int,
    device: str = "cpu",
    n_views: int = 1,
    clusters: bool = False,
) -> tuple[np.ndarray, KUnknownPass, np.ndarray | None]:
    """:func:`k_posteriors`, the pass they were read from, whose tokens every readout
    head reads as well: a fit of ``Xs`` (in canonical row order, as the fit puts them)
    starts from it with no pass of its own (``FitPlan.k_unknown_pass``); and, where
    ``clusters`` (the backbone must read them), P(C = c | X) for c = 1..k_max clusters of
    any shape, from the same tokens (else None)."""
    model = model_cache.model_on(backbone, device)
    config = model.config
    orders = row_order.canonical_orders(Xs, sample_weight)
    Xs = [np.take(X, order, axis=0) for X, order in zip(Xs, orders, strict=True)]
    x, mask = pad(Xs, device, dtype_for(device))  # (B, N, d), (B, N) or None
    check_magnitude(x, mask)
    generator = seeded_generator(seed, device)
    if sample_weight is not None:
        weights = [np.asarray(w)[order] for w, order in zip(sample_weight, orders, strict=True)]
        w = pad(weights, device, x.dtype)[0]  # (B, N), zero on padding
        x, mask = weighted_rows(x, w, model.reading_config.context_size, generator)
    # Projected as for the largest K: every direction up to d_max. P(K | X) reads rows, not
    # a summary's cells: the head was trained on rows, and cells blur how many clusters
    # there are (docs/benchmarks.md, "Reading cells").
    read = read_views(model, x, mask, config.k_max, generator, n_views, summary=False)
    with torch.inference_mode():
        tokens, tokens_mask = model.k_unknown_tokens(read.views, read.views_mask)
        log_p = model.k_posterior_head(tokens, tokens_mask)  # (V * B, k_max)
        log_c = model.cluster_count_head(tokens, tokens_mask) if clusters else None
    probs = _over_views(log_p, n_views)
    cluster_probs = None if log_c is None else to_numpy(_over_views(log_c, n_views))
    rows = read.rows(x)  # (V * B, C, d)
    k_unknown_pass = KUnknownPass(
        read.standardization, rows, read.rows_mask, read.signs, tokens, tokens_mask
    )
    return to_numpy(probs), k_unknown_pass, cluster_probs


def _over_views(log_p: torch.Tensor, n_views: int) -> torch.Tensor:
    """Probabilities (V * B, k_max), view-major, averaged over the views: (B, k_max)."""
    probs = log_p.exp().view(n_views, -1, log_p.shape[-1]).mean(dim=0)
    return probs / probs.sum(dim=-1, keepdim=True)
