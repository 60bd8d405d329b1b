"""The one boundary between numpy and torch.

The estimators hand numpy arrays in and get numpy arrays back; every tensor is made and
dropped here. Fitting runs on the resolved device in float64 on CPU (to agree with
scikit-learn) and float32 on CUDA (where float64 is slow); fitted parameters come back
as float64 numpy arrays so a model fitted on CUDA predicts and pickles on CPU (the
estimators then give them the training data's dtype).
"""

from __future__ import annotations

import copy
import functools
import os
import weakref
from dataclasses import dataclass

import numpy as np
import torch

from . import checkpoints, em, readout, runs
from .standardize import subsample_rows, take_rows

# Rows per chunk when scoring: bounds memory at O(chunk * K * d) whatever n_samples is.
_CHUNK_ROWS = 65536

# Above this many rows, a fit chooses among its starts on a subsample of this many rows,
# then runs EM on all rows from the best start only (see fit_mixtures). The lower bounds
# of different local optima differ by far more than a subsample of this size blurs.
_SELECTION_ROWS = 8192


# --- device memory -------------------------------------------------------------------


class DeviceMemoryError(MemoryError):
    """The device (a GPU) ran out of memory; the message says what to make smaller.

    Examples
    --------
    >>> from transformer_gmm import DeviceMemoryError
    >>> issubclass(DeviceMemoryError, MemoryError)
    True
    """


def _explain_out_of_memory(function):
    """Re-raise a device out-of-memory error as a DeviceMemoryError that says what to do."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except RuntimeError as error:  # torch.cuda.OutOfMemoryError is a RuntimeError
            if not isinstance(error, torch.cuda.OutOfMemoryError) and (
                "out of memory" not in str(error)
            ):
                raise
            raise DeviceMemoryError(
                "The device ran out of memory. Ask for less at once: fewer datasets per "
                "fit_many call, a smaller n_init or n_views, fewer samples or features (subsample "
                "X, or reduce it with PCA first), or device='cpu'."
            ) from error

    return wrapper


# --- devices, seeds and the backbone -------------------------------------------------


def resolve_device(device: str) -> str:
    """Turn ``"auto"``, ``"cpu"``, ``"cuda"`` or ``"cuda:N"`` into a usable device name."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(
            f"device={device!r} is not a device name. Use 'auto', 'cpu', 'cuda' or 'cuda:N'."
        ) from error
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"device={device!r} was requested but CUDA is not available in this PyTorch "
            f"build or on this machine. Use device='cpu' or device='auto'."
        )
    if resolved.type not in ("cpu", "cuda"):
        raise ValueError(f"device={device!r} is not supported. Use 'auto', 'cpu' or 'cuda'.")
    return str(resolved)


def _dtype(device: str) -> torch.dtype:
    return torch.float64 if device == "cpu" else torch.float32


def _generator(seed: int, device: str) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def _tensor(array: np.ndarray, device: str, dtype: torch.dtype | None = None) -> torch.Tensor:
    # torch.tensor copies, so read-only and non-contiguous inputs are fine.
    dtype = _dtype(device) if dtype is None else dtype
    return torch.tensor(np.ascontiguousarray(array), dtype=dtype, device=device)


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().to("cpu", torch.float64).numpy()


@dataclass(frozen=True)
class Backbone:
    """A loaded transformer and what the estimators need to know about it."""

    model: torch.nn.Module
    d_max: int
    context_size: int
    supported_n_components: range

    @property
    def noise_directions(self) -> int:
        """Principal directions the model reads beyond the K - 1 (its config says)."""
        return self.model.config.noise_directions


def load_backbone(checkpoint: str | os.PathLike) -> Backbone:
    """Load (once per process) the checkpoint the user named; errors are CheckpointError."""
    model = checkpoints.load_model(checkpoint)
    config = model.config
    return Backbone(model, config.d_max, config.context_size, model.supported_n_components)


def has_bundled(name: str) -> bool:
    return name in checkpoints.bundled_checkpoints()


# The loaded models are shared (checkpoints caches them on CPU): never move one in place,
# keep one copy per other device instead.
_MODELS_ON_DEVICES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _model_on(model: torch.nn.Module, device: str) -> torch.nn.Module:
    if device == "cpu":
        return model
    copies = _MODELS_ON_DEVICES.setdefault(model, {})
    if device not in copies:
        copies[device] = copy.deepcopy(model).to(device)
    return copies[device]


@dataclass(frozen=True)
class TransformerEstimate:
    """The backbone's raw answer for one dataset, in model space (to inspect and test it;
    fitting reads the backbone through :mod:`transformer_gmm.readout`)."""

    weights: np.ndarray  # (K,)
    means: np.ndarray  # (K, d_max)
    scales: np.ndarray  # (K, 1) or (K, d_max), standard deviations
    point_probs: np.ndarray  # (n, K), the per-point head's cluster probabilities


def _pad(arrays, device: str, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Stack arrays of shape (n_i, ...) into (B, max n_i, ...), zero-padded, and the mask
    (B, max n_i) of real rows; the mask is None when no row is padding. A 3-D array is
    already a batch: it is copied to the device once, with no loop over its datasets."""
    if isinstance(arrays, np.ndarray):
        return _tensor(arrays, device, dtype), None
    lengths = [len(a) for a in arrays]
    if len(set(lengths)) == 1:
        stacked = arrays[0][None] if len(arrays) == 1 else np.stack(arrays)  # one copy less
        return _tensor(stacked, device, dtype), None
    padded = np.zeros((len(arrays), max(lengths), *arrays[0].shape[1:]))
    for i, array in enumerate(arrays):
        padded[i, : len(array)] = array
    mask = np.arange(max(lengths))[None] < np.array(lengths)[:, None]
    return _tensor(padded, device, dtype), torch.tensor(mask, device=device)


@_explain_out_of_memory
def transformer_estimates(
    backbone: Backbone, Zs: list[np.ndarray], n_components: int, device: str
) -> list[TransformerEstimate]:
    """One forward pass over B standardized datasets, each of shape (n_i, d_max)."""
    model = _model_on(backbone.model, device)
    x, mask = _pad(Zs, device, torch.float32)  # (B, N, d_max), (B, N) or None
    out = readout.forward(model, x, n_components, mask)
    point_probs = _numpy(out.point_logits.softmax(dim=-1))  # (B, N, K)
    weights, means, scales = (_numpy(t) for t in (out.weights, out.means, out.scales))
    return [
        TransformerEstimate(weights[i], means[i], scales[i], point_probs[i, : len(Z)])
        for i, Z in enumerate(Zs)
    ]


# --- input range ---------------------------------------------------------------------


def _check_magnitude(x: torch.Tensor, mask: torch.Tensor | None) -> None:
    """Raise a ValueError for a dataset of ``x`` (B, N, d) whose values would overflow
    ``x``'s dtype in the fit's sums, before any of them is taken.

    Covariances, squared distances and the k-means inertia sum up to ``n * d`` squared
    differences, each at most the square of a feature's range; means sum ``n`` values.
    Past the largest float those sums are inf, and torch's eigendecomposition and Cholesky
    factorisation then fail with errors that say nothing about the data.
    """
    if mask is None:
        highest, lowest = x.amax(dim=1), x.amin(dim=1)  # (B, d)
        n_rows = torch.full(x.shape[:1], x.shape[1], dtype=x.dtype, device=x.device)
    else:
        padding = ~mask[..., None]
        highest = x.masked_fill(padding, -torch.inf).amax(dim=1)
        lowest = x.masked_fill(padding, torch.inf).amin(dim=1)
        n_rows = mask.sum(dim=1).to(x.dtype)
    spread = (highest - lowest).amax(dim=-1)  # (B,) the widest range of a feature
    magnitude = torch.maximum(highest.abs(), lowest.abs()).amax(dim=-1)  # (B,)
    limit = torch.finfo(x.dtype).max / 16  # a margin for the few sums added together
    # Written so that an overflow to inf, or a nan from inf - inf, fails the test.
    safe = (spread * spread * n_rows * x.shape[-1] < limit) & (magnitude * n_rows < limit)
    if bool(safe.all()):
        return
    i = int((~safe).nonzero()[0, 0])
    dataset = f"Dataset {i}: " if x.shape[0] > 1 else ""
    on_cuda = ", or fit with device='cpu', which computes in float64" if x.is_cuda else ""
    raise ValueError(
        f"{dataset}X holds values too large for {str(x.dtype).split('.')[-1]} arithmetic "
        f"(a feature spans {float(spread[i]):.3g}, the largest absolute value is "
        f"{float(magnitude[i]):.3g}): the covariances and squared distances over its "
        f"{int(n_rows[i])} samples would overflow. Rescale X (divide it by a constant, or "
        f"use sklearn.preprocessing.StandardScaler) and fit again{on_cuda}."
    )


# --- Gaussian mixtures ---------------------------------------------------------------


@dataclass(frozen=True)
class MixtureFits:
    """The best of each dataset's EM runs, as numpy arrays in the user's space."""

    weights: np.ndarray  # (B, K)
    means: np.ndarray  # (B, K, d)
    covariances: np.ndarray  # (B, ...), by covariance type
    precisions_cholesky: np.ndarray  # (B, ...)
    lower_bound: np.ndarray  # (B,) float
    n_iter: np.ndarray  # (B,) int
    converged: np.ndarray  # (B,) bool
    best_run: np.ndarray  # (B,) int, index of the kept run, in the order of the starts


def _selection_rows(
    x: torch.Tensor, mask: torch.Tensor | None, n_runs: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Where the starts are built and compared: every row, or, for several starts on
    datasets of more than ``_SELECTION_ROWS`` rows, a uniform subsample of that many.

    Returns those rows (B, S, d), which of them are real (or None), and their index
    (B, S), None when every row is kept.
    """
    if n_runs == 1 or x.shape[1] <= _SELECTION_ROWS:
        return x, mask, None
    index, sub_mask = subsample_rows(tuple(x.shape[:2]), mask, _SELECTION_ROWS, generator)
    return take_rows(x, index), sub_mask, index


@_explain_out_of_memory
def fit_mixtures(
    Xs: list[np.ndarray] | np.ndarray,
    *,
    n_components: int,
    covariance_type: str,
    reg_covar: float,
    max_iter: int,
    tol: float,
    device: str,
    seed: int,
    n_kmeans_inits: int,
    backbone: Backbone | None = None,
    n_transformer_inits: int = 0,
) -> MixtureFits:
    """EM on B datasets (padded into one batch) from every initialisation at once; keep
    each dataset's best run (see :func:`transformer_gmm.runs.choose`).

    Each dataset's runs are, in order: the first ``n_transformer_inits`` of the starts
    of ``backbone``'s transformer (see :func:`transformer_gmm.readout.mixture_inits`:
    per view of the data, from its mixture, then from its per-point head; covariances
    from one M-step on their responsibilities), then
    ``n_kmeans_inits`` starts from k-means++ and Lloyd (scikit-learn's default
    initialisation).

    Datasets of more than ``_SELECTION_ROWS`` rows choose among several starts on a
    uniform subsample of that many rows: every start is built and run by EM there, and
    only each dataset's best goes on to EM over all rows. So a large fit costs about one
    EM run whatever ``n_init`` is, with its memory. ``n_iter`` then counts both stages.

    One generator, seeded with ``seed``, draws that subsample (only where it is taken),
    the rows the backbone reads (only where they are more than its context), then the
    k-means++ seeds.
    """
    dtype = _dtype(device)
    x, mask = _pad(Xs, device, dtype)  # (B, N, d), (B, N) or None
    _check_magnitude(x, mask)
    n_datasets = x.shape[0]
    generator = _generator(seed, device)
    n_runs = n_transformer_inits + n_kmeans_inits
    x_all, mask_all = x, mask
    x, mask, index = _selection_rows(x, mask, n_runs, generator)  # (B, S, d)
    run_params = []  # each (B, R_i, ...) parameters
    if n_transformer_inits > 0:
        model = _model_on(backbone.model, device)
        starts = readout.mixture_inits(
            model, x, mask, n_components, generator, n_starts=n_transformer_inits
        )
        for init in starts:
            params = em.estimate_gaussian_parameters(
                init.x,
                init.resp,
                covariance_type=covariance_type,
                reg_covar=reg_covar,
                means=init.means,
                mask=init.mask,
            )
            params.weights = init.weights
            run_params.append(runs.unflatten(params, n_datasets))
    if n_kmeans_inits > 0:
        params = em.initialize_kmeans(
            runs.repeat(x, n_kmeans_inits),
            n_components,
            covariance_type=covariance_type,
            reg_covar=reg_covar,
            generator=generator,
            mask=None if mask is None else runs.repeat(mask, n_kmeans_inits),
        )
        run_params.append(runs.unflatten(params, n_datasets))
    params = runs.flatten(runs.concatenate(run_params))  # (B * R, ...), dataset-major
    result = em.fit_em(
        runs.repeat(x, n_runs),
        params,
        covariance_type=covariance_type,
        reg_covar=reg_covar,
        max_iter=max_iter,
        tol=tol,
        mask=None if mask is None else runs.repeat(mask, n_runs),
    )
    n_rows = x.shape[1] if mask is None else mask.sum(dim=1)  # rows each bound is over
    best = runs.choose(
        result.lower_bound.view(n_datasets, n_runs), n_transformer_inits, n_rows
    )  # (B,)
    kept = best + n_runs * torch.arange(n_datasets, device=best.device)  # rows of the batch
    if index is not None:  # the chosen starts, now on every row
        chosen = em.MixtureParams(*(getattr(result.params, f)[kept] for f in runs.FIELDS))
        n_iter = result.n_iter[kept]
        result = em.fit_em(
            x_all,
            chosen,
            covariance_type=covariance_type,
            reg_covar=reg_covar,
            max_iter=max_iter,
            tol=tol,
            mask=mask_all,
        )
        result.n_iter.add_(n_iter)
        kept = torch.arange(n_datasets, device=best.device)
    # One transfer per field for the whole batch: no per-dataset indexing of tensors.
    fields = [result.params.weights, result.params.means, result.params.covariances]
    fields += [result.params.precisions_cholesky, result.lower_bound]
    return MixtureFits(
        *(_numpy(t[kept]) for t in fields),
        n_iter=result.n_iter[kept].cpu().numpy(),
        converged=result.converged[kept].cpu().numpy(),
        best_run=best.cpu().numpy(),
    )


@_explain_out_of_memory
def estimate_weighted_log_prob(
    X: np.ndarray,
    weights: np.ndarray,
    means: np.ndarray,
    precisions_cholesky: np.ndarray,
    covariance_type: str,
) -> np.ndarray:
    """log p(x | k) + log w_k of shape (n, K), on CPU in float64, in bounded-memory chunks."""
    params = em.MixtureParams(
        weights=_tensor(weights, "cpu")[None],
        means=_tensor(means, "cpu")[None],
        covariances=None,  # not needed to score
        precisions_cholesky=_tensor(precisions_cholesky, "cpu")[None],
    )
    out = np.empty((X.shape[0], means.shape[0]))
    for start in range(0, X.shape[0], _CHUNK_ROWS):
        chunk = _tensor(X[start : start + _CHUNK_ROWS], "cpu")[None]
        out[start : start + _CHUNK_ROWS] = _numpy(
            em.estimate_weighted_log_prob(chunk, params, covariance_type)[0]
        )
    return out


# --- k-means -------------------------------------------------------------------------


@dataclass(frozen=True)
class KMeansFit:
    """The best of the Lloyd runs, in the user's space."""

    centers: np.ndarray
    labels: np.ndarray
    inertia: float
    n_iter: int
    best_run: int


@_explain_out_of_memory
def fit_kmeans(
    X: np.ndarray,
    *,
    n_clusters: int,
    max_iter: int,
    tol: float,
    device: str,
    seed: int,
    n_kmeans_inits: int,
    backbone: Backbone | None = None,
    n_transformer_inits: int = 0,
) -> KMeansFit:
    """Lloyd from the first ``n_transformer_inits`` of the centres of
    ``backbone``'s transformer (see :func:`transformer_gmm.readout.cluster_centers`)
    and from ``n_kmeans_inits`` k-means++ seedings, all in one batch; keep the lowest
    inertia. As in :func:`fit_mixtures`, a dataset of more than ``_SELECTION_ROWS`` rows
    compares its starts on a subsample of that many and runs Lloyd on all rows from the
    best only. One generator, seeded with ``seed``, draws that subsample (where it is
    taken), the rows the backbone reads, then the k-means++ seeds."""
    x = _tensor(X, device)[None]  # (1, n, d)
    _check_magnitude(x, None)
    generator = _generator(seed, device)
    x_all = x
    x, _, index = _selection_rows(x, None, n_transformer_inits + n_kmeans_inits, generator)
    subsampled = index is not None
    starts = []
    if n_transformer_inits > 0:
        model = _model_on(backbone.model, device)
        starts += readout.cluster_centers(
            model, x, None, n_clusters, generator, n_starts=n_transformer_inits
        )
    if n_kmeans_inits > 0:
        starts.append(
            em.kmeans_plusplus(x.expand(n_kmeans_inits, -1, -1), n_clusters, generator=generator)
        )
    centers = torch.cat(starts)
    centers, labels, inertia, n_iter = em.lloyd(
        x.expand(centers.shape[0], -1, -1), centers, max_iter=max_iter, tol=tol
    )
    best = int(torch.argmin(inertia))
    if subsampled:  # the chosen start, now on every row
        first_stage = n_iter[best]
        centers, labels, inertia, n_iter = em.lloyd(
            x_all, centers[best : best + 1], max_iter=max_iter, tol=tol
        )
        n_iter = n_iter + first_stage
    kept = 0 if subsampled else best
    return KMeansFit(
        centers=_numpy(centers[kept]),
        labels=labels[kept].cpu().numpy().astype(np.int32),
        inertia=float(inertia[kept]),
        n_iter=int(n_iter[kept]),
        best_run=best,
    )
