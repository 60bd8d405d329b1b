"""The clustering experiments of He et al. 2025: ARI and NMI against the signal-to-noise
ratio, d, N, the number of classes and an imbalance ratio.

Tasks: K centroids drawn N(0, I_d) and rescaled so that the smallest distance between two
of them is ``min_distance`` (the signal-to-noise ratio, as the noise is unit isotropic);
class weights geometric from 1 to ``imbalance`` (the ratio of the largest to the smallest),
normalised; N points. Defaults: d = 8, K = 4, N = 128, min_distance = 4, imbalance = 1.
Each experiment (``--experiment``) varies one of them:

- ``snr``: min_distance in {1, 2, 3, 4, 5, 6, 8};
- ``dims``: d in {2, 8, 32, 128};
- ``sample_size``: N in {16, 32, ..., 1024} (powers of 2);
- ``classes``: K in {2, 3, 4, 5, 6, 8, 10};
- ``imbalance``: ratio in {1, 2, 4, 8, 16}.

Methods, on the same tasks and seeds: TransformerClusterer with ``max_iter=0`` (the
transformer's labels, relabelled by the nearest of their centres) and by default (Lloyd
refinement); KMeans (Lloyd from greedy k-means++) with ``n_init=1`` and ``10``;
GaussianMixture (spherical, k-means initialisation) with ``n_init=1`` and ``10``; the
Bayes classifier with the true parameters (the oracle). Metrics: adjusted Rand index and
normalised mutual information against the true classes (higher is better).

He et al.'s depth experiment (error of backbones of 1..L layers against Lloyd/EM
iterations) needs checkpoints of several depths; none exist yet, so it is skipped with a
note.

    python benchmarks/clustering.py              # every experiment, 200 tasks per cell
    python benchmarks/clustering.py --quick      # 20 tasks per cell, 3 values each

Prints the tables and writes clustering.csv and clustering.png under benchmarks/results/.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
from scipy.spatial.distance import pdist
from sklearn.cluster import KMeans
from sklearn.exceptions import ConvergenceWarning
from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score
from sklearn.mixture import GaussianMixture

sys.path.insert(0, str(Path(__file__).parent))
from common import (  # noqa: E402
    Panel,
    Task,
    bayes_labels,
    plot_panels,
    print_table,
    run_methods,
    single_threaded,
    standard_parser,
    task_rng,
    write_csv,
)

from transformer_gmm import FallbackWarning, TransformerClusterer  # noqa: E402

DEFAULTS = dict(d=8, K=4, N=128, min_distance=4.0, imbalance=1.0)
# experiment: (the setting it varies, full grid, quick grid, x label, log x axis)
EXPERIMENTS = {
    "snr": ("min_distance", (1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0), (2.0, 4.0, 6.0),
            "minimum distance between centroids", False),
    "dims": ("d", (2, 8, 32, 128), (2, 8, 32), "d", True),
    "sample_size": ("N", tuple(2**i for i in range(4, 11)), (32, 128, 512), "N", True),
    "classes": ("K", (2, 3, 4, 5, 6, 8, 10), (2, 4, 8), "number of classes K", False),
    "imbalance": ("imbalance", (1.0, 2.0, 4.0, 8.0, 16.0), (1.0, 4.0, 16.0),
                  "imbalance ratio (largest / smallest weight)", True),
}
METRICS = {"ari": "Adjusted Rand index", "nmi": "Normalised mutual information"}


# --- tasks -------------------------------------------------------------------------------


def sample_centroids(rng: np.random.Generator, n_classes: int, n_features: int,
                     min_distance: float) -> np.ndarray:
    """K Gaussian centroids rescaled so that the closest two are ``min_distance`` apart."""
    centroids = rng.standard_normal((n_classes, n_features))
    return centroids * (min_distance / pdist(centroids).min())


def imbalanced_weights(n_classes: int, ratio: float) -> np.ndarray:
    """Weights geometric from 1 to ``ratio``, normalised (uniform when ratio = 1)."""
    weights = ratio ** (np.arange(n_classes) / max(n_classes - 1, 1))
    return weights / weights.sum()


def sample_clustering_task(rng: np.random.Generator, d: int, K: int, N: int,
                           min_distance: float, imbalance: float) -> Task:
    means = sample_centroids(rng, K, d, min_distance)
    weights = imbalanced_weights(K, imbalance)
    labels = rng.choice(K, N, p=weights)
    return Task(means[labels] + rng.standard_normal((N, d)), labels, means, weights, 1.0)


# --- methods -------------------------------------------------------------------------------


def methods(checkpoint) -> dict:
    """Each method maps (task, seed) to (labels, init_method_ or None)."""

    def clusterer(max_iter):
        # The default n_init: with max_iter=0 that is the transformer's two starts alone
        # (the centres of its labels and the means of its mixture), no k-means++ start.
        def fit(task, seed):
            model = TransformerClusterer(len(task.means), checkpoint=checkpoint,
                                         max_iter=max_iter, random_state=seed).fit(task.X)
            return model.labels_, model.init_method_
        return fit

    def kmeans(n_init):
        def fit(task, seed):
            model = KMeans(len(task.means), n_init=n_init, random_state=seed)
            return model.fit(task.X).labels_, None
        return fit

    def gaussian_mixture(n_init):
        def fit(task, seed):
            gmm = GaussianMixture(len(task.means), covariance_type="spherical", n_init=n_init,
                                  random_state=seed)
            return gmm.fit_predict(task.X), None
        return fit

    return {
        "TransformerClusterer max_iter=0": clusterer(0),
        "TransformerClusterer": clusterer(300),
        "KMeans n_init=1": kmeans(1),
        "KMeans n_init=10": kmeans(10),
        "GMM n_init=1": gaussian_mixture(1),
        "GMM n_init=10": gaussian_mixture(10),
        "oracle (Bayes)": lambda task, seed: (bayes_labels(task), None),
    }


def score(task: Task, result) -> dict:
    labels, init = result
    return dict(
        ari=adjusted_rand_score(task.labels, labels),
        nmi=normalized_mutual_info_score(task.labels, labels),
        transformer_init=float(init == "transformer") if init else np.nan,
    )


# --- running and reporting ---------------------------------------------------------------


def run(name: str, values, n_tasks: int, checkpoint, seed: int = 0) -> list[dict]:
    key = EXPERIMENTS[name][0]
    fits = methods(checkpoint)
    rows = []
    for value in values:
        setting = dict(DEFAULTS, **{key: value})
        rng = task_rng(seed, name, *setting.values())
        tasks = [sample_clustering_task(rng, **setting) for _ in range(n_tasks)]
        rows += run_methods(tasks, fits, score, [*METRICS, "transformer_init"],
                            dict(experiment=name, **setting))
    return rows


def _short(name: str) -> str:
    return name.replace("TransformerClusterer", "TC").replace(" (Bayes)", "")


def report(rows: list[dict]) -> None:
    print(f"{rows[0]['n_tasks']} tasks per cell; mean+-standard error; higher is better; "
          f"TC = TransformerClusterer; defaults {DEFAULTS}")
    for name in dict.fromkeys(r["experiment"] for r in rows):
        key = EXPERIMENTS[name][0]
        part = [r for r in rows if r["experiment"] == name]
        for metric, title in METRICS.items():
            print_table(part, [key], metric, f"{title} against {key}", short=_short)
    kept = [r["transformer_init"] for r in rows if r["method"] == "TransformerClusterer"]
    print(f"\nTransformerClusterer kept the transformer's clustering in {np.mean(kept):.0%} "
          "of fits")


def plot(rows: list[dict], path: Path) -> Path:
    panels = []
    for name in dict.fromkeys(r["experiment"] for r in rows):
        key, _, _, xlabel, xlog = EXPERIMENTS[name]
        panels.append(Panel(f"'{name}': varying {key}",
                            [r for r in rows if r["experiment"] == name],
                            key, xlabel, xlog))
    return plot_panels(panels, [("ari", "adjusted Rand index", False),
                                ("nmi", "normalised mutual information", False)], path,
                       f"He et al. protocol, defaults {DEFAULTS}; mean and standard error "
                       f"over {rows[0]['n_tasks']} tasks per point")


def main(argv=None):
    parser = standard_parser(__doc__, "clustering", "20 tasks per cell, 3 values per sweep")
    parser.add_argument("--experiment", choices=[*EXPERIMENTS, "all"], default="all")
    args = parser.parse_args(argv)
    names = list(EXPERIMENTS) if args.experiment == "all" else [args.experiment]
    n_tasks = args.tasks or (20 if args.quick else 200)
    rows = []
    with warnings.catch_warnings(), single_threaded():
        # The fallback warns on every fit (reported once below, as the share of
        # transformer initialisations); non-convergence is part of the result.
        warnings.simplefilter("ignore", FallbackWarning)
        warnings.simplefilter("ignore", ConvergenceWarning)
        for name in names:
            _, full, quick, _, _ = EXPERIMENTS[name]
            rows += run(name, quick if args.quick else full, n_tasks, args.checkpoint,
                        args.seed)
    report(rows)
    print("\nDepth experiment (He et al.: backbones of 1..L layers against Lloyd and EM "
          "iterations): skipped, as checkpoints of several depths do not exist yet.")
    csv_path = write_csv(rows, args.results / f"{args.out}.csv")
    png_path = plot(rows, args.results / f"{args.out}.png")
    print(f"\nwrote {csv_path} and {png_path}")
    return rows


if __name__ == "__main__":
    main()
