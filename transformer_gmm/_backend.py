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
import math
import os
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from . import checkpoints, em, readout, runs, sufficient_stats
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
    _check_range(highest, lowest, n_rows, x.shape[-1], on_cuda=x.is_cuda)


def _check_range(
    highest: torch.Tensor,
    lowest: torch.Tensor,
    n_rows: torch.Tensor,
    n_features: int,
    on_cuda: bool = False,
) -> None:
    """:func:`_check_magnitude` from each dataset's largest and smallest values (B, d) and
    its number of rows (B,), in their dtype."""
    spread = (highest - lowest).amax(dim=-1)  # (B,) the widest range of a feature
    magnitude = torch.maximum(highest.abs(), lowest.abs()).amax(dim=-1)  # (B,)
    limit = torch.finfo(highest.dtype).max / 16  # a margin for the few sums added together
    # Written so that an overflow to inf, or a nan from inf - inf, fails the test.
    safe = (spread * spread * n_rows * n_features < limit) & (magnitude * n_rows < limit)
    if bool(safe.all()):
        return
    i = int((~safe).nonzero()[0, 0])
    dataset = f"Dataset {i}: " if highest.shape[0] > 1 else ""
    on_cuda = ", or fit with device='cpu', which computes in float64" if on_cuda else ""
    raise ValueError(
        f"{dataset}X holds values too large for {str(highest.dtype).split('.')[-1]} arithmetic "
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
    # (B, R, T) each run's lower bound at each EM iteration, NaN once it stopped; above
    # _SELECTION_ROWS rows, the kept run's iterations on every row follow its own.
    lower_bounds: np.ndarray | None = None
    iteration_times: np.ndarray | None = None  # (T,) seconds from EM's start, per iteration


@dataclass(frozen=True)
class GivenStarts:
    """What the estimator fixed about the starts of :func:`fit_mixtures`, for one dataset:
    scikit-learn's other initialisations, and parameters that replace every start's.

    ``n_seedings`` starts from k-means++ seeds alone (scikit-learn's
    ``init_params="k-means++"``), then one start for each of the ``resp`` (R, N, K), by
    one M-step on those responsibilities (the estimator draws them as scikit-learn's
    ``"random"`` and ``"random_from_data"`` do). ``weights`` (K,), ``means`` (K, d) and
    ``precisions_cholesky`` (by covariance type), where given, replace those of every
    start (``weights_init``, ``means_init``, ``precisions_init``, or the previous fit for a
    warm start), and the covariances follow the precisions. Given all three and no other
    start, EM runs once from them, its first change measured from ``lower_bound``.
    """

    n_seedings: int = 0
    resp: np.ndarray | None = None
    weights: np.ndarray | None = None
    means: np.ndarray | None = None
    precisions_cholesky: np.ndarray | None = None
    lower_bound: float = -math.inf

    @property
    def complete(self) -> bool:
        return all(p is not None for p in (self.weights, self.means, self.precisions_cholesky))

    @property
    def n_runs(self) -> int:
        n_runs = self.n_seedings + (0 if self.resp is None else len(self.resp))
        return 1 if n_runs == 0 and self.complete else n_runs


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


def _mixture_starts(
    x: torch.Tensor,
    mask: torch.Tensor | None,
    generator: torch.Generator,
    *,
    n_components: int,
    covariance_type: str,
    reg_covar: float,
    n_kmeans_inits: int,
    backbone: Backbone | None,
    n_transformer_inits: int,
    device: str,
    sample_weight: torch.Tensor | None = None,
    given: GivenStarts | None = None,
    index: torch.Tensor | None = None,
) -> em.MixtureParams:
    """The starts of :func:`fit_mixtures` for the datasets ``x`` (B, N, d), flattened to
    (B * R, ...), dataset-major: the transformer's first, then k-means++'s, then
    ``given``'s (see :class:`GivenStarts`; ``index`` (B, N) is where ``x``'s rows sit in
    the data, or None), all with ``given``'s parameters in place of theirs. With
    ``sample_weight`` (B, N), the transformer reads rows drawn in proportion to their
    weights, and the other starts are weighted."""
    n_datasets = x.shape[0]
    run_params = []  # each (B, R_i, ...) parameters
    if n_transformer_inits > 0:
        model = _model_on(backbone.model, device)
        x_read, mask_read = x, mask
        if sample_weight is not None:
            x_read, mask_read = _weighted_draw(x, sample_weight, backbone.context_size, generator)
        starts = readout.mixture_inits(
            model, x_read, mask_read, n_components, generator, n_starts=n_transformer_inits
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
            **_weighted(sample_weight, n_kmeans_inits),
        )
        run_params.append(runs.unflatten(params, n_datasets))
    if given is None:
        return runs.flatten(runs.concatenate(run_params))
    run_params += _given_starts(
        x,
        mask,
        sample_weight,
        index,
        generator,
        given,
        n_components=n_components,
        covariance_type=covariance_type,
        reg_covar=reg_covar,
    )
    return _with_given(runs.flatten(runs.concatenate(run_params)), given, covariance_type)


def _weighted(sample_weight: torch.Tensor | None, n_runs: int) -> dict:
    """``sample_weight=`` for ``n_runs`` runs on each dataset, or nothing when unweighted."""
    return {} if sample_weight is None else {"sample_weight": runs.repeat(sample_weight, n_runs)}


def _weighted_draw(
    x: torch.Tensor, sample_weight: torch.Tensor, context_size: int, generator: torch.Generator
) -> tuple[torch.Tensor, None]:
    """The rows the transformer reads of weighted data: ``min(N, context_size)`` rows of
    each dataset of ``x`` (B, N, d), drawn with replacement in proportion to their weights
    (B, N), so a row of weight w is read about w times as often as one of weight 1; and
    their mask (None: no drawn row is padding, whose weight is zero)."""
    cumulative = sample_weight.cumsum(dim=-1)  # (B, N)
    n_read = min(x.shape[1], context_size)
    u = torch.rand(x.shape[0], n_read, generator=generator, dtype=x.dtype, device=x.device)
    # The first row whose cumulative weight exceeds u * total: never one of weight zero.
    index = torch.searchsorted(cumulative, u * cumulative[:, -1:], right=True)
    return take_rows(x, index.clamp_max_(x.shape[1] - 1)), None


def _given_starts(
    x: torch.Tensor,
    mask: torch.Tensor | None,
    sample_weight: torch.Tensor | None,
    index: torch.Tensor | None,
    generator: torch.Generator,
    given: GivenStarts,
    *,
    n_components: int,
    covariance_type: str,
    reg_covar: float,
) -> list[em.MixtureParams]:
    """``given``'s own starts (each (B, R_i, ...)): its k-means++ seedings, its
    responsibilities (their rows at ``index``), or, with neither, its parameters."""
    n_datasets, starts = x.shape[0], []
    options = dict(covariance_type=covariance_type, reg_covar=reg_covar)
    if given.n_seedings > 0:
        params = em.initialize_kmeans_plusplus(
            runs.repeat(x, given.n_seedings),
            n_components,
            generator=generator,
            mask=None if mask is None else runs.repeat(mask, given.n_seedings),
            **_weighted(sample_weight, given.n_seedings),
            **options,
        )
        starts.append(runs.unflatten(params, n_datasets))
    if given.resp is not None:
        resp = _tensor(given.resp, str(x.device), x.dtype)  # (R, N, K), for one dataset
        if index is not None:
            resp = take_rows(resp, index.expand(resp.shape[0], -1))
        params = em.estimate_gaussian_parameters(
            x, resp, mask=mask, **_weighted(sample_weight, 1), **options
        )
        starts.append(runs.unflatten(params, n_datasets))
    if given.n_runs == 1 and not starts:  # complete: one start, which _with_given fills in
        shapes = (given.weights.shape, given.means.shape, given.precisions_cholesky.shape)
        weights, means, precisions_cholesky = (x.new_zeros(n_datasets, 1, *s) for s in shapes)
        starts.append(em.MixtureParams(weights, means, precisions_cholesky, precisions_cholesky))
    return starts


def _with_given(
    params: em.MixtureParams, given: GivenStarts, covariance_type: str
) -> em.MixtureParams:
    """``params`` (B * R, ...) with ``given``'s weights, means and precisions in place of
    theirs, and the covariances those precisions give."""

    def replace(array: np.ndarray | None, like: torch.Tensor) -> torch.Tensor:
        if array is None:
            return like
        return _tensor(array, str(like.device), like.dtype).expand_as(like).contiguous()

    weights = replace(given.weights, params.weights)
    means = replace(given.means, params.means)
    if given.precisions_cholesky is None:
        return em.MixtureParams(weights, means, params.covariances, params.precisions_cholesky)
    precisions_cholesky = replace(given.precisions_cholesky, params.precisions_cholesky)
    covariances = em.covariances_from_precisions_cholesky(precisions_cholesky, covariance_type)
    return em.MixtureParams(weights, means, covariances, precisions_cholesky)


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
    sample_weight: list[np.ndarray] | np.ndarray | None = None,
    given: GivenStarts | None = None,
) -> MixtureFits:
    """EM on B datasets (padded into one batch) from every initialisation at once; keep
    each dataset's best run (see :func:`transformer_gmm.runs.choose`).

    Each dataset's runs are, in order: the first ``n_transformer_inits`` of the starts
    of ``backbone``'s transformer (see :func:`transformer_gmm.readout.mixture_inits`:
    per view of the data, from its mixture, then from its per-point head; covariances
    from one M-step on their responsibilities), then
    ``n_kmeans_inits`` starts from k-means++ and Lloyd (scikit-learn's default
    initialisation), then ``given``'s (for one dataset; see :class:`GivenStarts`).

    ``sample_weight`` (one non-negative array per dataset, of its number of rows) weighs
    the rows as frequencies: the transformer reads rows drawn in proportion to their
    weights, k-means++, Lloyd and EM are weighted, and the lower bound is the weighted
    mean log-likelihood.

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
    n_runs = n_transformer_inits + n_kmeans_inits + (0 if given is None else given.n_runs)
    x_all, mask_all = x, mask
    weights_all = None if sample_weight is None else _pad(sample_weight, device, dtype)[0]
    x, mask, index = _selection_rows(x, mask, n_runs, generator)  # (B, S, d)
    weights = weights_all  # (B, S) or None
    if weights is not None and index is not None:
        weights = take_rows(weights[..., None], index)[..., 0]
    extra = {} if given is None else {"initial_lower_bound": x.new_full((1,), given.lower_bound)}
    params = _mixture_starts(  # (B * R, ...), dataset-major
        x,
        mask,
        generator,
        n_components=n_components,
        covariance_type=covariance_type,
        reg_covar=reg_covar,
        n_kmeans_inits=n_kmeans_inits,
        backbone=backbone,
        n_transformer_inits=n_transformer_inits,
        device=device,
        sample_weight=weights,
        given=given,
        index=index,
    )
    result = em.fit_em(
        runs.repeat(x, n_runs),
        params,
        covariance_type=covariance_type,
        reg_covar=reg_covar,
        max_iter=max_iter,
        tol=tol,
        mask=None if mask is None else runs.repeat(mask, n_runs),
        **_weighted(weights, n_runs),
        **extra,
    )
    lower_bounds = result.lower_bounds.view(n_datasets, n_runs, result.lower_bounds.shape[1])
    times = result.iteration_times
    n_rows = x.shape[1] if mask is None else mask.sum(dim=1)  # rows each bound is over
    if weights is not None:  # frequency weights: the bound is over their sum
        n_rows = weights.sum(dim=1)
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
            **_weighted(weights_all, 1),
        )
        result.n_iter.add_(n_iter)
        lower_bounds, times = _then(lower_bounds, times, best, result)
        kept = torch.arange(n_datasets, device=best.device)
    # One transfer per field for the whole batch: no per-dataset indexing of tensors.
    fields = [result.params.weights, result.params.means, result.params.covariances]
    fields += [result.params.precisions_cholesky, result.lower_bound]
    return MixtureFits(
        *(_numpy(t[kept]) for t in fields),
        n_iter=result.n_iter[kept].cpu().numpy(),
        converged=result.converged[kept].cpu().numpy(),
        best_run=best.cpu().numpy(),
        lower_bounds=_numpy(lower_bounds),
        iteration_times=np.asarray(times, dtype=np.float64),
    )


def _then(
    lower_bounds: torch.Tensor, times: list[float], best: torch.Tensor, second: em.EMResult
) -> tuple[torch.Tensor, list[float]]:
    """The lower bounds (B, R, T) and iteration times of EM on a subsample, followed by
    those of ``second``, the kept runs ``best`` (B,) going on over every row."""
    more = lower_bounds.new_full((*lower_bounds.shape[:2], second.lower_bounds.shape[1]), math.nan)
    more[torch.arange(len(best), device=best.device), best] = second.lower_bounds
    elapsed = times[-1] if times else 0.0
    times = times + [elapsed + t for t in second.iteration_times]
    return torch.cat([lower_bounds, more], dim=2), times


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
    labels: np.ndarray | None  # None from fit_kmeans_by_blocks: the caller labels lazily
    inertia: float
    n_iter: int
    best_run: int
    n_distinct: int  # clusters that hold a point under the returned centres


def _kmeans_starts(
    x: torch.Tensor,
    generator: torch.Generator,
    *,
    n_clusters: int,
    n_kmeans_inits: int,
    backbone: Backbone | None,
    n_transformer_inits: int,
    device: str,
) -> torch.Tensor:
    """The starting centres (R, K, d) of :func:`fit_kmeans` for one dataset ``x``
    (1, N, d): the transformer's first, then k-means++'s."""
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
    return torch.cat(starts)


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
    centers = _kmeans_starts(
        x,
        generator,
        n_clusters=n_clusters,
        n_kmeans_inits=n_kmeans_inits,
        backbone=backbone,
        n_transformer_inits=n_transformer_inits,
        device=device,
    )
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
    labels = labels[kept].cpu().numpy().astype(np.int32)
    return KMeansFit(
        centers=_numpy(centers[kept]),
        labels=labels,
        inertia=float(inertia[kept]),
        n_iter=int(n_iter[kept]),
        best_run=best,
        n_distinct=len(np.unique(labels)),
    )


# --- fitting by blocks of rows (a Dask array) ----------------------------------------
# Here the data are seen through ``reduce_blocks(function, args, length)``: the sum over
# every block of rows of ``function(block, *args)``, each a float64 array of shape
# (1, length). transformer_gmm._dask computes it with Dask where the blocks live, applying
# the block_* functions below; they run on CPU in float64, whatever device built the starts.

ReduceBlocks = Callable[[Callable[..., np.ndarray], tuple, int], np.ndarray]

# Elements of the largest (runs, rows, d or K) temporary while a block is read, in slices
# of rows: 4 MB in float64, so a block costs its own memory and a few of these.
_BLOCK_ELEMENTS = 1 << 19


def _slices(block: np.ndarray, n_runs: int, width: int):
    """The rows of ``block`` as (1, rows, d) float64 tensors, a bounded slice at a time."""
    step = max(1, _BLOCK_ELEMENTS // (n_runs * width))
    for start in range(0, block.shape[0], step):
        yield _tensor(block[start : start + step], "cpu")[None]


def block_mixture_statistics(
    block: np.ndarray,
    weights: np.ndarray,
    means: np.ndarray,
    precisions_cholesky: np.ndarray,
    covariance_type: str,
) -> np.ndarray:
    """The :class:`~transformer_gmm.sufficient_stats.MixtureStatistics` of the rows
    ``block`` (n, d) for the R runs of the parameters (shapes (R, ...)), as (1, length)."""
    params = em.MixtureParams(
        _tensor(weights, "cpu"), _tensor(means, "cpu"), None, _tensor(precisions_cholesky, "cpu")
    )
    n_runs, n_components, n_features = means.shape
    size = sufficient_stats.mixture_statistics_size(
        n_runs, n_components, n_features, covariance_type
    )
    total = torch.zeros(size, dtype=torch.float64)
    for x in _slices(block, n_runs, max(n_components, n_features)):
        total += sufficient_stats.mixture_statistics(x, params, covariance_type).to_vector()
    return total.numpy()[None]


def block_lloyd_statistics(
    block: np.ndarray, centers: np.ndarray, offset: np.ndarray, with_inertia: bool
) -> np.ndarray:
    """The :class:`~transformer_gmm.sufficient_stats.LloydStatistics` of the rows
    ``block`` (n, d) for R runs' ``centers`` (R, K, d), as (1, length)."""
    n_runs, n_clusters, n_features = centers.shape
    centers_t, offset_t = _tensor(centers, "cpu"), _tensor(offset, "cpu").reshape(1, 1, -1)
    size = sufficient_stats.lloyd_statistics_size(n_runs, n_clusters, n_features)
    total = torch.zeros(size, dtype=torch.float64)
    for x in _slices(block, n_runs, max(n_clusters, n_features)):
        statistics = sufficient_stats.lloyd_statistics(
            x, centers_t, offset_t, with_inertia=with_inertia
        )
        total += statistics.to_vector()
    return total.numpy()[None]


def check_range(highest: np.ndarray, lowest: np.ndarray, n_rows: int) -> None:
    """The overflow check of the in-memory fits, for data known by the largest and smallest
    value of each feature (d,) and the number of rows; in float64, as the blocks compute."""
    _check_range(
        _tensor(highest, "cpu")[None],
        _tensor(lowest, "cpu")[None],
        torch.tensor([float(n_rows)], dtype=torch.float64),
        highest.shape[-1],
    )


def _on_cpu(weights, means, covariances, covariance_type: str) -> em.MixtureParams:
    """Starts in float64 on CPU, where EM by blocks runs, with the precisions computed
    there (on CPU the same as the starts', not float32 ones made float64 on a GPU)."""
    weights, means, covariances = (
        torch.as_tensor(t).to("cpu", torch.float64) for t in (weights, means, covariances)
    )
    return em.MixtureParams(
        weights, means, covariances, em.compute_precision_cholesky(covariances, covariance_type)
    )


@_explain_out_of_memory
def fit_mixtures_by_blocks(
    reduce_blocks: ReduceBlocks,
    sample: np.ndarray,
    n_rows: int,
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
    """:func:`fit_mixtures` on one dataset of ``n_rows`` rows that ``reduce_blocks``
    reads, of which ``sample`` (S, d) is a uniform sample of ``min(n_rows,
    _SELECTION_ROWS)`` rows (every row, in order, when there are no more).

    The starts are built on the sample, on ``device``, by the generator seeded with
    ``seed``. Where :func:`fit_mixtures` would compare them on a subsample of
    ``_SELECTION_ROWS`` rows, they are compared on the sample (by EM there) and EM by
    blocks goes on from the best, ``n_iter`` counting both; otherwise EM by blocks runs
    from every start, one pass over the blocks an iteration for all of them, and
    :func:`transformer_gmm.runs.choose` keeps one. When the sample holds every row, the
    starts and the choice are :func:`fit_mixtures`'s, and the fit equals it to rounding.
    """
    options = dict(
        n_components=n_components,
        covariance_type=covariance_type,
        reg_covar=reg_covar,
        n_kmeans_inits=n_kmeans_inits,
        backbone=backbone,
        n_transformer_inits=n_transformer_inits,
        device=device,
    )
    n_iter_before, best_run = 0, None
    if n_transformer_inits + n_kmeans_inits > 1 and n_rows > _SELECTION_ROWS:
        chosen = fit_mixtures([sample], max_iter=max_iter, tol=tol, seed=seed, **options)
        start = _on_cpu(chosen.weights, chosen.means, chosen.covariances, covariance_type)
        n_iter_before, best_run = chosen.n_iter, chosen.best_run
    else:
        x = _tensor(sample, device)[None]  # (1, S, d)
        starts = _mixture_starts(x, None, _generator(seed, device), **options)
        start = _on_cpu(starts.weights, starts.means, starts.covariances, covariance_type)
    n_features = sample.shape[1]

    def statistics_of(params: em.MixtureParams) -> sufficient_stats.MixtureStatistics:
        n_runs = params.means.shape[0]
        args = (_numpy(params.weights), _numpy(params.means), _numpy(params.precisions_cholesky))
        length = sufficient_stats.mixture_statistics_size(
            n_runs, n_components, n_features, covariance_type
        )
        vector = reduce_blocks(block_mixture_statistics, (*args, covariance_type), length)
        return sufficient_stats.MixtureStatistics.from_vector(
            torch.from_numpy(np.asarray(vector, dtype=np.float64).reshape(-1)),
            n_runs,
            n_components,
            n_features,
            covariance_type,
        )

    result = sufficient_stats.fit_em_from_statistics(
        start,
        statistics_of,
        n_rows,
        covariance_type=covariance_type,
        reg_covar=reg_covar,
        max_iter=max_iter,
        tol=tol,
    )
    kept = 0
    if best_run is None:
        best = runs.choose(result.lower_bound[None], n_transformer_inits, n_rows)  # (1,)
        kept, best_run = int(best[0]), best.numpy()
    one = slice(kept, kept + 1)  # a batch of one dataset, as fit_mixtures returns
    fields = [result.params.weights, result.params.means, result.params.covariances]
    fields += [result.params.precisions_cholesky, result.lower_bound]
    return MixtureFits(
        *(_numpy(t[one]) for t in fields),
        n_iter=result.n_iter[one].numpy() + n_iter_before,
        converged=result.converged[one].numpy(),
        best_run=best_run,
    )


@_explain_out_of_memory
def fit_kmeans_by_blocks(
    reduce_blocks: ReduceBlocks,
    sample: np.ndarray,
    n_rows: int,
    mean: np.ndarray,
    sum_of_squares: float,
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
    """:func:`fit_kmeans` on one dataset of ``n_rows`` rows that ``reduce_blocks`` reads,
    with ``sample`` as in :func:`fit_mixtures_by_blocks`: the starts are built on it, and
    compared on it where :func:`fit_kmeans` would compare them on a subsample.

    ``mean`` (d,) is the mean of every row, on which Lloyd centres the data, and
    ``sum_of_squares`` the sum of their squared differences from it, which scales
    ``tol``. The fit's ``labels`` are None (the caller labels the rows lazily); a last
    pass gives the inertia and the number of clusters that hold a row.
    """
    options = dict(
        n_kmeans_inits=n_kmeans_inits,
        backbone=backbone,
        n_transformer_inits=n_transformer_inits,
        device=device,
    )
    n_iter_before, best_run = 0, None
    if n_transformer_inits + n_kmeans_inits > 1 and n_rows > _SELECTION_ROWS:
        chosen = fit_kmeans(
            sample, n_clusters=n_clusters, max_iter=max_iter, tol=tol, seed=seed, **options
        )
        centers = torch.from_numpy(chosen.centers)[None]
        n_iter_before, best_run = chosen.n_iter, chosen.best_run
    else:
        x = _tensor(sample, device)[None]  # (1, S, d)
        centers = _kmeans_starts(x, _generator(seed, device), n_clusters=n_clusters, **options)
        centers = centers.to("cpu", torch.float64)
    n_features = sample.shape[1]
    offset = torch.from_numpy(np.asarray(mean, dtype=np.float64)).reshape(1, 1, -1)

    def statistics_of(
        centers: torch.Tensor, with_inertia: bool = False
    ) -> sufficient_stats.LloydStatistics:
        n_runs = centers.shape[0]
        args = (_numpy(centers), _numpy(offset.flatten()), with_inertia)
        length = sufficient_stats.lloyd_statistics_size(n_runs, n_clusters, n_features)
        vector = reduce_blocks(block_lloyd_statistics, args, length)
        return sufficient_stats.LloydStatistics.from_vector(
            torch.from_numpy(np.asarray(vector, dtype=np.float64).reshape(-1)),
            n_runs,
            n_clusters,
            n_features,
        )

    # lloyd's threshold: tol times the mean over features of the variance of the rows.
    threshold = tol * sum_of_squares / (n_rows * n_features)
    centers, n_iter = sufficient_stats.lloyd_from_statistics(
        centers, statistics_of, offset, threshold, max_iter
    )
    final = statistics_of(centers, with_inertia=True)  # the returned centres' pass
    kept = 0
    if best_run is None:
        kept = best_run = int(torch.argmin(final.inertia))
    return KMeansFit(
        centers=_numpy(centers[kept]),
        labels=None,
        inertia=float(final.inertia[kept]),
        n_iter=int(n_iter[kept]) + int(n_iter_before),
        best_run=best_run,
        n_distinct=int((final.counts[kept] > 0).sum()),
    )
