"""What the benchmark scripts share: the TGMM task protocol, the metrics, the baselines
that are not in scikit-learn, and the writing of tables, CSV and figures."""

from __future__ import annotations

import csv
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.optimize import linear_sum_assignment
from scipy.special import logsumexp

RESULTS = Path(__file__).parent / "results"


# --- tasks -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Task:
    X: np.ndarray  # (n, d)
    labels: np.ndarray  # (n,) the component each point came from
    means: np.ndarray  # (K, d)
    weights: np.ndarray  # (K,)
    noise: float  # the isotropic standard deviation


def sample_means(rng: np.random.Generator, n_components: int, n_features: int,
                 half_width: float = 5.0, max_cosine: float = 0.8) -> np.ndarray:
    """Means uniform in [-w, w]^d whose pairwise cosine similarity is below ``max_cosine``
    (the TGMM protocol), by rejection."""
    for _ in range(10_000):
        means = rng.uniform(-half_width, half_width, (n_components, n_features))
        if n_features == 1 or n_components == 1:
            return means
        unit = means / np.linalg.norm(means, axis=1, keepdims=True)
        cosine = unit @ unit.T
        if cosine[np.triu_indices(n_components, 1)].max() < max_cosine:
            return means
    raise RuntimeError(f"no {n_components} means in d={n_features} meet the cosine bound")


def sample_tgmm_task(rng: np.random.Generator, n_components: int, n_features: int,
                     n_samples: int = 128, means: np.ndarray | None = None) -> Task:
    """One task of Chen, Wu & Fang 2025: weights U[0.2, 0.8] normalised, unit noise."""
    if means is None:
        means = sample_means(rng, n_components, n_features)
    weights = rng.uniform(0.2, 0.8, n_components)
    weights /= weights.sum()
    labels = rng.choice(n_components, n_samples, p=weights)
    X = means[labels] + rng.standard_normal((n_samples, n_features))
    return Task(X, labels, means, weights, 1.0)


# --- metrics -----------------------------------------------------------------------------


def mean_error(estimated: np.ndarray, true: np.ndarray) -> float:
    """TGMM's permutation-invariant error: Hungarian matching on the per-coordinate squared
    distance, then the squared error averaged over components and coordinates."""
    cost = ((estimated[:, None, :] - true[None, :, :]) ** 2).mean(axis=2)  # (K, K)
    rows, cols = linear_sum_assignment(cost)
    return float(cost[rows, cols].mean())


def oracle_means(task: Task) -> np.ndarray:
    """The means of the true clusters (an empty cluster keeps its true mean)."""
    return np.array([
        task.X[task.labels == k].mean(axis=0) if (task.labels == k).any() else task.means[k]
        for k in range(len(task.means))
    ])


def bayes_labels(task: Task) -> np.ndarray:
    """The Bayes classifier with the true parameters (isotropic noise)."""
    distances = ((task.X[:, None, :] - task.means[None]) ** 2).sum(axis=2)
    return np.argmax(np.log(task.weights) - distances / (2 * task.noise**2), axis=1)


# --- baselines not in scikit-learn ---------------------------------------------------------


def paper_em(X: np.ndarray, n_components: int, rng: np.random.Generator,
             max_iter: int = 100) -> tuple[np.ndarray, np.ndarray]:
    """The EM the TGMM paper reports: unit isotropic covariance known, means initialised
    N(0, I), uniform weights, one run. Returns (means, labels)."""
    means = rng.standard_normal((n_components, X.shape[1]))
    log_weights = np.full(n_components, -np.log(n_components))
    for _ in range(max_iter):
        log_prob = log_weights - 0.5 * ((X[:, None, :] - means[None]) ** 2).sum(axis=2)
        resp = np.exp(log_prob - logsumexp(log_prob, axis=1, keepdims=True))  # (n, K)
        nk = resp.sum(axis=0) + 10 * np.finfo(float).eps
        means = resp.T @ X / nk[:, None]
        log_weights = np.log(nk / nk.sum())
    return means, log_prob.argmax(axis=1)


# --- running and reporting ---------------------------------------------------------------


def timed(fit: Callable[[], object]) -> tuple[object, float]:
    start = time.perf_counter()
    result = fit()
    return result, 1000 * (time.perf_counter() - start)


def summarise(values: list[float]) -> tuple[float, float]:
    """Mean and standard error."""
    array = np.asarray(values, dtype=float)
    se = array.std(ddof=1) / np.sqrt(len(array)) if len(array) > 1 else float("nan")
    return float(array.mean()), float(se)


def write_csv(rows: list[dict], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path
