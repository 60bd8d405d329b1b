"""The one boundary between numpy and torch.

The estimators hand numpy arrays in and get numpy arrays back; every tensor is made and
dropped here. Fitting runs on the resolved device in float64 on CPU (to agree with
scikit-learn) and float32 on CUDA (where float64 is slow); fitted parameters come back
as float64 numpy arrays so a model fitted on CUDA predicts and pickles on CPU.
"""

from __future__ import annotations

import copy
import os
import weakref
from dataclasses import dataclass

import numpy as np
import torch

from . import checkpoints, em

# Rows per chunk when scoring: bounds memory at O(chunk * K * d) whatever n_samples is.
_CHUNK_ROWS = 65536


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


def _tensor(array: np.ndarray, device: str) -> torch.Tensor:
    # torch.tensor copies, so read-only and non-contiguous inputs are fine.
    return torch.tensor(np.ascontiguousarray(array), dtype=_dtype(device), device=device)


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().to("cpu", torch.float64).numpy()


@dataclass(frozen=True)
class Backbone:
    """A loaded transformer and what the estimators need to know about it."""

    model: torch.nn.Module
    d_max: int
    context_size: int
    supported_n_components: range


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
    """The backbone's answer for one dataset, in model space."""

    weights: np.ndarray  # (K,)
    means: np.ndarray  # (K, d_max)
    scales: np.ndarray  # (K, 1) or (K, d_max), standard deviations
    point_probs: np.ndarray  # (n, K), the per-point head's cluster probabilities


def transformer_estimate(
    backbone: Backbone, Z: np.ndarray, n_components: int, device: str
) -> TransformerEstimate:
    """One forward pass over the standardized points ``Z`` of shape (n, d_max)."""
    model = _model_on(backbone.model, device)
    x = torch.tensor(Z, dtype=torch.float32, device=device)[None]  # (1, n, d_max)
    with torch.inference_mode():
        out = model(x, n_components)
    return TransformerEstimate(
        weights=_numpy(out.weights[0]),
        means=_numpy(out.means[0]),
        scales=_numpy(out.scales[0]),
        point_probs=_numpy(out.point_logits[0].softmax(dim=-1)),
    )


def model_space_responsibilities(estimate: TransformerEstimate, Z: np.ndarray) -> np.ndarray:
    """Posterior of each point under the transformer's own mixture, in model space."""
    z = torch.tensor(Z, dtype=torch.float64)[None]  # (1, n, d_max)
    variances = torch.tensor(estimate.scales, dtype=torch.float64) ** 2  # (K, 1 | d_max)
    variances = variances.expand(-1, Z.shape[1])  # (K, d_max)
    precisions_cholesky = variances.rsqrt()[None]
    weights = torch.tensor(estimate.weights, dtype=torch.float64)[None]
    means = torch.tensor(estimate.means, dtype=torch.float64)[None]
    params = em.MixtureParams(weights, means, variances[None], precisions_cholesky)
    _, log_resp = em.e_step(z, params, "diag")
    return _numpy(log_resp[0].exp())


# --- Gaussian mixtures ---------------------------------------------------------------


@dataclass(frozen=True)
class MixtureFit:
    """The best of the EM runs, as numpy arrays in the user's space."""

    weights: np.ndarray
    means: np.ndarray
    covariances: np.ndarray
    precisions_cholesky: np.ndarray
    lower_bound: float
    n_iter: int
    converged: bool
    best_run: int  # index of the kept run: 0 is the first initialisation given


def fit_mixture(
    X: np.ndarray,
    *,
    n_components: int,
    covariance_type: str,
    reg_covar: float,
    max_iter: int,
    tol: float,
    device: str,
    seed: int,
    n_kmeans_inits: int,
    init_resp: np.ndarray | None = None,
    init_weights: np.ndarray | None = None,
    init_means: np.ndarray | None = None,
) -> MixtureFit:
    """Run EM from every initialisation at once (one batch) and keep the best lower bound.

    The first run, when ``init_resp`` is given, starts from those responsibilities with
    the weights and means given (one M-step supplies the covariances). ``n_kmeans_inits``
    more runs start from k-means++ and Lloyd, as scikit-learn's default initialisation.
    """
    x = _tensor(X, device)[None]  # (1, n, d)
    inits = []
    if init_resp is not None:
        resp = _tensor(init_resp, device)[None]  # (1, n, K)
        params = em.estimate_gaussian_parameters(
            x,
            resp,
            covariance_type=covariance_type,
            reg_covar=reg_covar,
            means=_tensor(init_means, device)[None],
        )
        params.weights = _tensor(init_weights, device)[None]
        inits.append(params)
    if n_kmeans_inits > 0:
        generator = _generator(seed, device)
        inits.append(
            em.initialize_kmeans(
                x.expand(n_kmeans_inits, -1, -1),
                n_components,
                covariance_type=covariance_type,
                reg_covar=reg_covar,
                generator=generator,
            )
        )
    params = _concatenate(inits)
    result = em.fit_em(
        x, params, covariance_type=covariance_type, reg_covar=reg_covar, max_iter=max_iter, tol=tol
    )
    best = int(torch.argmax(result.lower_bound))
    return MixtureFit(
        weights=_numpy(result.params.weights[best]),
        means=_numpy(result.params.means[best]),
        covariances=_numpy(result.params.covariances[best]),
        precisions_cholesky=_numpy(result.params.precisions_cholesky[best]),
        lower_bound=float(result.lower_bound[best]),
        n_iter=int(result.n_iter[best]),
        converged=bool(result.converged[best]),
        best_run=best,
    )


def _concatenate(inits: list[em.MixtureParams]) -> em.MixtureParams:
    return em.MixtureParams(
        *(torch.cat([getattr(p, name) for p in inits]) for name in _PARAM_FIELDS)
    )


_PARAM_FIELDS = ("weights", "means", "covariances", "precisions_cholesky")


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


def fit_kmeans(
    X: np.ndarray,
    *,
    n_clusters: int,
    max_iter: int,
    tol: float,
    device: str,
    seed: int,
    n_kmeans_inits: int,
    init_centers: np.ndarray | None = None,
) -> KMeansFit:
    """Lloyd from ``init_centers`` (if given) and from ``n_kmeans_inits`` k-means++
    seedings, all in one batch; keep the lowest inertia."""
    x = _tensor(X, device)[None]  # (1, n, d)
    starts = []
    if init_centers is not None:
        starts.append(_tensor(init_centers, device)[None])
    if n_kmeans_inits > 0:
        generator = _generator(seed, device)
        starts.append(
            em.kmeans_plusplus(x.expand(n_kmeans_inits, -1, -1), n_clusters, generator=generator)
        )
    centers = torch.cat(starts)
    centers, labels, inertia, n_iter = em.lloyd(
        x.expand(centers.shape[0], -1, -1), centers, max_iter=max_iter, tol=tol
    )
    best = int(torch.argmin(inertia))
    return KMeansFit(
        centers=_numpy(centers[best]),
        labels=labels[best].cpu().numpy().astype(np.int32),
        inertia=float(inertia[best]),
        n_iter=int(n_iter[best]),
        best_run=best,
    )
