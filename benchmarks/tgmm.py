"""The TGMM experiments (Chen, Wu & Fang 2025): mixture estimation against honest baselines.

Tasks follow the TGMM protocol (``common.sample_tgmm_task``): means uniform in [-5, 5]^d
with pairwise cosine similarity below 0.8, weights U[0.2, 0.8] normalised, unit isotropic
noise, N = 128 unless the experiment varies it. Experiments (``--experiment``):

- ``dims`` (2a): d in {2, 8, 32, 128} x K in {2, 3, 4, 5}.
- ``sample_size`` (2b): N in {16, 32, ..., 1024} (powers of 2), d in {2, 32}, K = 3.
- ``shift`` (2c): every mean moved by s N(0, I), s in {0, 0.5, 1, 2, 5, 10}, d in
  {2, 32}, K = 3 (the means then leave the [-5, 5] box and the cosine bound).
- ``anisotropic`` (2d): diagonal covariances, every standard deviation log-uniform in
  [0.5, 2]; d in {2, 8, 32} x K in {3, 5}. TransformerGMM and GMM fit diagonal
  covariances; the paper's EM and the spectral method keep their spherical models.
- ``k_gt_d`` (2e): K > d, d in {1, 2, 3}, K from d + 1 to 6 (the spectral method does
  not apply: its column is n/a).

Methods, on the same tasks and seeds: TransformerGMM with ``max_iter=0`` (the
transformer's estimate; also with ``n_views=4``, from four readings of the data), by
default (EM polish from the transformer's two starts and two k-means++ starts) and with
``n_init=2`` (EM from the transformer's two starts only);
GaussianMixture with k-means initialisation, ``n_init=1`` and ``10``; the paper's EM
(unit covariance known, N(0, I) means, one run, 100 iterations); Hsu & Kakade's spectral
method (``spectral.py``); the oracle (parameters: the means and proportions of the true
clusters; density and labels: the true mixture, i.e. the Bayes classifier).
Metrics: mean error (``common.mean_error``), weight error (mean absolute, after the same
matching), mean log-likelihood on the task's data and on 1024 fresh samples from the true
mixture (the paper's EM uses its known unit variance; the spectral method its own sigma^2,
floored at 0.01 because it is 0 when N <= d), and clustering accuracy (best matching of
labels). The figure plots mean error, the held-out log-likelihood below the oracle's (an
estimate of the KL divergence from the truth) and accuracy.

    python benchmarks/tgmm.py                          # all experiments, 200 tasks per cell
    python benchmarks/tgmm.py --quick                  # a subset, 20 tasks: about a minute
    python benchmarks/tgmm.py --experiment dims --checkpoint path/to/checkpoint

Prints the tables and writes tgmm_<experiment>.csv and .png under benchmarks/results/.
"""

from __future__ import annotations

import itertools
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.special import logsumexp
from sklearn.exceptions import ConvergenceWarning
from sklearn.mixture import GaussianMixture

sys.path.insert(0, str(Path(__file__).parent))
from common import (  # noqa: E402
    Panel,
    Task,
    clustering_accuracy,
    mean_error,
    oracle_means,
    paper_em_mixture,
    plot_panels,
    print_table,
    run_methods,
    sample_anisotropic_task,
    sample_like,
    sample_means,
    sample_tgmm_task,
    single_threaded,
    standard_parser,
    task_rng,
    task_variances,
    weight_error,
    weighted_log_prob,
    write_csv,
)
from spectral import noise_variance, spectral_fit  # noqa: E402

from transformer_gmm import FallbackWarning, TransformerGMM  # noqa: E402

N_HELDOUT = 1024
METRICS = {  # key: table title
    "error": "Mean error (lower is better)",
    "weight_error": "Weight error, mean absolute (lower is better)",
    "loglik": "Mean log-likelihood on the task's data (higher is better)",
    "loglik_heldout": "Mean log-likelihood on held-out samples (higher is better)",
    "accuracy": "Clustering accuracy (higher is better)",
}
KEYS = [*METRICS, "heldout_gap", "transformer_init"]


# --- the grids -----------------------------------------------------------------------------


def grid(d=(2,), K=(3,), N=(128,), shift=(0.0,)) -> list[dict]:
    return [dict(d=a, K=b, N=c, shift=s) for a, b, c, s in itertools.product(d, K, N, shift)]


@dataclass(frozen=True)
class Experiment:
    full: list  # the settings of the full run
    quick: list  # the subset --quick runs
    panel: str  # the setting whose values make the figure's columns
    x: str  # the setting on the x axis
    xlabel: str
    xlog: bool = False
    anisotropic: bool = False


K_GT_D = [dict(d=d, K=k, N=128, shift=0.0) for d in (1, 2, 3) for k in range(d + 1, 7)]
EXPERIMENTS = {
    "dims": Experiment(grid(d=(2, 8, 32, 128), K=(2, 3, 4, 5)),
                       grid(d=(2, 8, 32), K=(3, 5)), "K", "d", "d", xlog=True),
    "sample_size": Experiment(grid(d=(2, 32), N=tuple(2**i for i in range(4, 11))),
                              grid(N=(16, 64, 256, 1024)), "d", "N", "N", xlog=True),
    "shift": Experiment(grid(d=(2, 32), shift=(0.0, 0.5, 1.0, 2.0, 5.0, 10.0)),
                        grid(shift=(0.0, 2.0, 10.0)), "d", "shift", "scale of the mean shift"),
    "anisotropic": Experiment(grid(d=(2, 8, 32), K=(3, 5)), grid(d=(2, 8)), "K", "d", "d",
                              xlog=True, anisotropic=True),
    "k_gt_d": Experiment(K_GT_D, [s for s in K_GT_D if s["d"] <= 2 and s["K"] in (3, 5)],
                         "d", "K", "K"),
}


@dataclass(frozen=True)
class Case:
    """A task with its held-out samples and the true mixture's log-likelihood on them."""
    task: Task
    heldout: np.ndarray
    oracle_heldout: float


def make_case(name: str, setting: dict, rng: np.random.Generator,
              heldout_rng: np.random.Generator) -> Case:
    d, k, n = setting["d"], setting["K"], setting["N"]
    if EXPERIMENTS[name].anisotropic:
        task = sample_anisotropic_task(rng, k, d, n)
    else:
        means = sample_means(rng, k, d) + setting["shift"] * rng.standard_normal((k, d))
        task = sample_tgmm_task(rng, k, d, n, means=means)
    heldout = sample_like(task, heldout_rng, N_HELDOUT)
    true_density = (task.weights, task.means, task_variances(task))
    return Case(task, heldout, _mean_log_likelihood(heldout, true_density))


def _mean_log_likelihood(X, density) -> float:
    return float(logsumexp(weighted_log_prob(X, *density), axis=1).mean())


# --- the methods -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Fit:
    weights: np.ndarray  # (K,)
    means: np.ndarray  # (K, d)
    variances: np.ndarray | float  # scalar, (K,) or (K, d)
    density: tuple | None = None  # scored instead of the estimate (the oracle's truth)
    init: str | None = None  # TransformerGMM's init_method_


def methods(checkpoint, covariance_type: str) -> dict:
    """Each method maps (case, seed) to a Fit, or None where it does not apply."""

    def transformer_gmm(max_iter, n_init="auto", n_views=1):
        # The default n_init: with max_iter=0 that is the transformer's two starts alone
        # (its mixture and its labels, the likelier kept), no k-means++ start.
        def fit(case, seed):
            gmm = TransformerGMM(case.task.means.shape[0], covariance_type=covariance_type,
                                 checkpoint=checkpoint, max_iter=max_iter, n_init=n_init,
                                 n_views=n_views, random_state=seed).fit(case.task.X)
            return Fit(gmm.weights_, gmm.means_, gmm.covariances_, init=gmm.init_method_)
        return fit

    def gaussian_mixture(n_init):
        def fit(case, seed):
            gmm = GaussianMixture(case.task.means.shape[0], covariance_type=covariance_type,
                                  n_init=n_init, random_state=seed).fit(case.task.X)
            return Fit(gmm.weights_, gmm.means_, gmm.covariances_)
        return fit

    def em_paper(case, seed):
        means, weights, _ = paper_em_mixture(case.task.X, len(case.task.weights),
                                             np.random.default_rng(seed))
        return Fit(weights, means, 1.0)

    def spectral(case, seed):
        X, k = case.task.X, len(case.task.weights)
        if X.shape[1] < k:
            return None
        weights, means = spectral_fit(X, k, np.random.default_rng(seed))
        return Fit(weights, means, max(noise_variance(X, k), 0.01))

    def oracle(case, seed):
        task = case.task
        proportions = np.bincount(task.labels, minlength=len(task.weights)) / len(task.X)
        return Fit(proportions, oracle_means(task), task_variances(task),
                   density=(task.weights, task.means, task_variances(task)))

    return {
        "TransformerGMM max_iter=0": transformer_gmm(0),
        # The same from four readings of the data (it and three reflections).
        "TransformerGMM max_iter=0 n_views=4": transformer_gmm(0, n_views=4),
        "TransformerGMM": transformer_gmm(100),
        # EM from the transformer's two starts only: what the k-means++ starts add or cost.
        "TransformerGMM n_init=2": transformer_gmm(100, n_init=2),
        "GMM n_init=1": gaussian_mixture(1),
        "GMM n_init=10": gaussian_mixture(10),
        "paper EM": em_paper,
        "spectral": spectral,
        "oracle": oracle,
    }


def score(case: Case, fit: Fit) -> dict:
    task = case.task
    density = fit.density or (fit.weights, fit.means, fit.variances)
    on_task = weighted_log_prob(task.X, *density)  # (n, K)
    heldout = _mean_log_likelihood(case.heldout, density)
    return dict(
        error=mean_error(fit.means, task.means),
        weight_error=weight_error(fit.weights, fit.means, task.weights, task.means),
        loglik=float(logsumexp(on_task, axis=1).mean()),
        loglik_heldout=heldout,
        accuracy=clustering_accuracy(task.labels, on_task.argmax(axis=1)),
        heldout_gap=case.oracle_heldout - heldout,
        transformer_init=float(fit.init == "transformer") if fit.init else np.nan,
    )


# --- running and reporting ---------------------------------------------------------------


def run(name: str, settings: list[dict], n_tasks: int, checkpoint, seed: int = 0) -> list:
    experiment = EXPERIMENTS[name]
    fits = methods(checkpoint, "diag" if experiment.anisotropic else "spherical")
    rows = []
    for setting in settings:
        values = tuple(setting.values())
        rng, heldout_rng = task_rng(seed, name, *values), task_rng(seed, name, "heldout", *values)
        cases = [make_case(name, setting, rng, heldout_rng) for _ in range(n_tasks)]
        rows += run_methods(cases, fits, score, KEYS, dict(experiment=name, **setting))
    return rows


def _short(name: str) -> str:
    return name.replace("TransformerGMM", "TGMM")


def report(name: str, rows: list) -> None:
    experiment = EXPERIMENTS[name]
    keys = [experiment.panel, experiment.x]
    print(f"\n=== {name}: {len(rows) and rows[0]['n_tasks']} tasks per cell; mean+-standard "
          "error; TGMM = TransformerGMM")
    for metric, title in METRICS.items():
        print_table(rows, keys, metric, title, short=_short)
    kept = [r["transformer_init"] for r in rows if r["method"] == "TransformerGMM"]
    print(f"\nTransformerGMM kept the transformer's initialisation in {np.mean(kept):.0%} "
          "of fits")


def plot(name: str, rows: list, path: Path) -> Path:
    experiment = EXPERIMENTS[name]
    panels = [
        Panel(f"{experiment.panel} = {value:g}",
              [r for r in rows if r[experiment.panel] == value],
              experiment.x, experiment.xlabel, experiment.xlog)
        for value in dict.fromkeys(r[experiment.panel] for r in rows)
    ]
    metrics = [("error", "mean error", True),
               ("heldout_gap", "held-out log-lik.\noracle minus method", True),
               ("accuracy", "clustering accuracy", False)]
    n_tasks = rows[0]["n_tasks"]
    return plot_panels(panels, metrics, path, f"TGMM protocol, experiment '{name}': mean and "
                       f"standard error over {n_tasks} tasks per point")


def main(argv=None):
    parser = standard_parser(__doc__, "tgmm", "20 tasks per cell on a subset of each grid")
    parser.add_argument("--experiment", choices=[*EXPERIMENTS, "all"], default="all")
    args = parser.parse_args(argv)
    names = list(EXPERIMENTS) if args.experiment == "all" else [args.experiment]
    n_tasks = args.tasks or (20 if args.quick else 200)
    all_rows = []
    for name in names:
        settings = EXPERIMENTS[name].quick if args.quick else EXPERIMENTS[name].full
        with warnings.catch_warnings(), single_threaded():
            # The fallback warns on every fit (reported once, as the share of transformer
            # initialisations); non-convergence within max_iter is part of the result.
            warnings.simplefilter("ignore", FallbackWarning)
            warnings.simplefilter("ignore", ConvergenceWarning)
            rows = run(name, settings, n_tasks, args.checkpoint, args.seed)
        report(name, rows)
        csv_path = write_csv(rows, args.results / f"{args.out}_{name}.csv")
        png_path = plot(name, rows, args.results / f"{args.out}_{name}.png")
        print(f"\nwrote {csv_path} and {png_path}")
        all_rows += rows
    return all_rows


if __name__ == "__main__":
    main()
