"""Choosing the number of components: how often each method finds the true K.

Every method chooses K among 1..10 on the same data; the truth is the number of
components that drew the data (synthetic) or the number of classes (real).

Synthetic tasks: the mixtures the transformer is trained on
(``transformer_gmm.training.tasks.sample_task``), N = 300 points, unit isotropic noise, K
uniform in 1..10 (every component draws at least one point), means uniform in
[-h, h]^d, in four settings: d in {2, 5} x {"easy": h = 6, "hard": h = 3}. The tasks are
fixed by ``--seed`` and the setting, the same for every method. Real data: the datasets of
``real_datasets.py`` that have classes, standardized, with seeds ``1000 * --seed + i``
for i < 3.

Methods (the seed of the task or of the real-data run is each one's ``random_state``):

- ``bic1`` "BIC loop GMM(n_init=1)": ``GaussianMixture(k)`` (full covariance) for every
  k, the lowest BIC;
- ``bic10`` "BIC loop GMM(n_init=10)": the same with ``n_init=10``;
- ``dpgmm`` "BayesianGMM DP": ``BayesianGaussianMixture(10)`` with a Dirichlet-process
  prior on the weights, K = the components of weight above 1 / 20;
- ``silhouette`` "KMeans silhouette": ``KMeans(k)`` for k = 2..10, the best silhouette
  (it never answers K = 1);
- ``tgmm`` "TGMM posterior": ``TransformerGMM(n_components="auto", criterion="posterior")``,
  the most probable K under the checkpoint's P(K | X), then one fit (what the default
  ``criterion="auto"`` does with the bundled checkpoint);
- ``tgmm-bic`` "TGMM auto bic": ``TransformerGMM(n_components="auto", criterion="bic")``,
  which fits every candidate and keeps the lowest BIC;
- ``tgmm-posterior-bic`` "TGMM posterior x BIC": the posterior as a prior over BIC, the
  lowest BIC / 2 - log P(K | X) from one ``criterion="bic"`` fit (needs a K-posterior head);
- ``clusterer`` "Clusterer posterior": ``TransformerClusterer(n_clusters="auto",
  criterion="posterior")``;
- ``clusterer-bic`` "Clusterer auto bic": ``TransformerClusterer(n_clusters="auto",
  criterion="bic")``, the lowest BIC of its hard-assignment mixture of spherical Gaussians
  (X-means);
- ``clusterer-merge`` "Clusterer merged": ``TransformerClusterer(n_clusters="auto",
  merge=True)``, the posterior's mixture with its components merged into clusters by the
  entropy criterion (Baudry et al. 2010);
- ``hdbscan`` "HDBSCAN": ``sklearn.cluster.HDBSCAN()``'s number of clusters (the noise
  label -1 not counted; its noise points are one more group for the ARI).

A ``shapes`` setting holds clusters that are not Gaussian (``shapes.py``: moons, circles,
anisotropic and varied-variance blobs, rings, spirals and nested shells, 2 to 10
clusters), ``--shape-tasks`` of them (35 by default, 14 with ``--quick``), fixed by
``--seed``.

Besides the four settings (pooled as "synthetic"), two settings of well-separated
clusters, in 2 and 5 dimensions (``separated``: equal sizes, means at least 6 noise
standard deviations apart), show where the posterior fails.

Metrics per setting and method: the share of tasks where the chosen K is the true K
(exact) or within one of it, the mean of chosen minus true K (bias), the mean time per
task, the median over tasks of the time as a ratio to "BIC loop GMM(n_init=1)" on the
same task, the median |chosen - true K|, the mean adjusted Rand index of the partition
each method returns against the true labels (ARI), and the exact accuracy minus that of
"TGMM posterior" on the same tasks with its paired standard error. A failed choice counts
as a miss. The methods run interleaved, task by task, with one BLAS, OpenMP and torch
thread, timed by ``time.perf_counter``.
Warnings are kept from the output during the run (``ConvergenceWarning`` and
``FallbackWarning`` are expected) and counted at the end, with the choices that failed.

    python benchmarks/choose_k.py                  # 100 tasks per setting, 3 seeds of real data
    python benchmarks/choose_k.py --quick          # 12 tasks per setting, 1 seed of real data
    python benchmarks/choose_k.py --checkpoint path/to/checkpoint --results /tmp/choose_k
    python benchmarks/choose_k.py --quick --methods bic1 silhouette tgmm   # a subset
    python benchmarks/choose_k.py --tasks 30 --no-real   # synthetic tasks only
    python benchmarks/choose_k.py --methods tgmm --baseline-checkpoint old/   # paired heads

``--baseline-checkpoint`` adds "TGMM posterior [baseline]": the posterior's choice with a
second checkpoint on the same problems and seeds, whose paired difference from "TGMM
posterior" is the last column of the per-setting table.

Prints the tables in Markdown and writes choose_k.csv (one row per task and method),
choose_k_summary.csv (the metrics per setting and method), choose_k_per_k.csv (exact
accuracy per true K, synthetic settings pooled) and choose_k.png under --results.
"""

from __future__ import annotations

import sys
import time
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from sklearn.cluster import HDBSCAN, KMeans
from sklearn.exceptions import ConvergenceWarning
from sklearn.metrics import adjusted_rand_score, silhouette_score
from sklearn.mixture import BayesianGaussianMixture, GaussianMixture
from sklearn.preprocessing import StandardScaler

sys.path.insert(0, str(Path(__file__).parent))
from common import (  # noqa: E402
    save_figure,
    single_threaded,
    standard_parser,
    summarise,
    task_rng,
    write_csv,
)
from real_datasets import DATASETS, load_dataset  # noqa: E402
from shapes import shape_task  # noqa: E402

from transformer_gmm import FallbackWarning, TransformerClusterer, TransformerGMM  # noqa: E402
from transformer_gmm.training.tasks import Prior, sample_task  # noqa: E402

MAX_K = 10  # every method chooses among 1..MAX_K (KMeans silhouette among 2..MAX_K)
N_SAMPLES = 300
D_MAX = 9  # the input width of the model the tasks are drawn for
HALF_WIDTHS = {"easy": 6.0, "hard": 3.0}
DIMENSIONS = (2, 5)
REAL = "real"
SYNTHETIC = "synthetic"  # the four synthetic settings pooled
SILENCED = (ConvergenceWarning, FallbackWarning)

BIC1, BIC10, DPGMM = "BIC loop GMM(n_init=1)", "BIC loop GMM(n_init=10)", "BayesianGMM DP"
SILHOUETTE, TGMM, TGMM_BIC, TGMM_POSTERIOR_BIC, CLUSTERER, CLUSTERER_BIC = (
    "KMeans silhouette",
    "TGMM posterior",
    "TGMM auto bic",
    "TGMM posterior x BIC",
    "Clusterer posterior",
    "Clusterer auto bic",
)
CLUSTERER_MERGE, HDBSCAN_NAME = "Clusterer merged", "HDBSCAN"
SHAPES = "shapes"
TIME_REFERENCE, ACCURACY_REFERENCE = BIC1, TGMM

# (X, seed, checkpoint) -> (K, how, labels of the partition returned)
Chooser = Callable[[np.ndarray, int, str], tuple[int, str, np.ndarray]]


# --- tasks ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Problem:
    """One dataset to choose K on: a synthetic task or a (real dataset, seed) pair."""

    setting: str  # "d=2 easy", ..., or "real"
    index: int  # the task's index in its setting; for real data, the seed's
    name: str  # "task 3" or the dataset's name
    X: np.ndarray  # (n, d)
    true_k: int
    seed: int  # every method's random_state
    labels: np.ndarray | None = None  # (n,) the component or class of each row


def setting_name(d: int, difficulty: str) -> str:
    return f"d={d} {difficulty}"


def synthetic_problems(seed: int, n_tasks: int) -> list[Problem]:
    """``n_tasks`` tasks per setting, fixed by ``seed`` and the setting."""
    problems = []
    for d in DIMENSIONS:
        for difficulty, h in HALF_WIDTHS.items():
            rng = task_rng(seed, "choose_k", d, difficulty)
            prior = Prior(half_width=(h, h), scale_range=(1.0, 1.0))
            for index in range(n_tasks):
                k = int(rng.integers(1, MAX_K + 1))
                task = sample_task(rng, prior, k, d, N_SAMPLES, d_max=D_MAX)
                problems.append(
                    Problem(
                        setting_name(d, difficulty),
                        index,
                        f"task {index}",
                        task.X,
                        k,
                        1000 * seed + index,
                        task.labels,
                    )
                )
    return problems


# Well-separated clusters, reported apart from the four settings above: equal sizes, unit
# noise, means uniform in a box of half-width SEPARATED_HALF_WIDTHS[d] and at least
# MIN_SEPARATION noise standard deviations apart (drawn again until they are).
SEPARATED = "separated"
MIN_SEPARATION = 6.0
SEPARATED_HALF_WIDTHS = {2: 12.0, 5: 8.0}


def separated_problems(seed: int, n_tasks: int) -> list[Problem]:
    """``n_tasks`` well-separated tasks per dimension, fixed by ``seed``."""
    problems = []
    for d, h in SEPARATED_HALF_WIDTHS.items():
        rng = task_rng(seed, "choose_k", d, SEPARATED)
        for index in range(n_tasks):
            k = int(rng.integers(1, MAX_K + 1))
            while True:
                means = rng.uniform(-h, h, (k, d))
                gaps = np.linalg.norm(means[:, None] - means[None], axis=-1)
                if k == 1 or gaps[~np.eye(k, dtype=bool)].min() >= MIN_SEPARATION:
                    break
            labels = np.arange(N_SAMPLES) % k
            X = means[labels] + rng.standard_normal((N_SAMPLES, d))
            name = setting_name(d, SEPARATED)
            seed_i = 1000 * seed + index
            problems.append(Problem(name, index, f"task {index}", X, k, seed_i, labels))
    return problems


def is_pooled(setting: str) -> bool:
    """The four settings of means in a box, pooled as "synthetic"."""
    return setting not in (REAL, SYNTHETIC, SHAPES) and not setting.endswith(SEPARATED)


def shape_problems(seed: int, n_tasks: int) -> list[Problem]:
    """``n_tasks`` tasks of non-Gaussian clusters (``shapes.py``), fixed by ``seed``."""
    rng = task_rng(seed, "choose_k", SHAPES)
    problems = []
    for index in range(n_tasks):
        family, X, labels, k = shape_task(rng, index, N_SAMPLES)
        problems.append(Problem(SHAPES, index, family, X, k, 1000 * seed + index, labels))
    return problems


def real_problems(seed: int, n_seeds: int) -> list[Problem]:
    """Every dataset with classes, standardized, once per seed."""
    problems = []
    for name in DATASETS:
        dataset = load_dataset(name)
        if dataset.labels is None:
            continue
        X = StandardScaler().fit_transform(dataset.X)
        for index in range(n_seeds):
            problems.append(
                Problem(
                    REAL, index, name, X, dataset.n_components, 1000 * seed + index, dataset.labels
                )
            )
    return problems


# --- methods -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Method:
    """``choose(X, seed, checkpoint)`` returns the K chosen and how the estimator chose it
    (its ``selection_criterion_``; "" for the scikit-learn methods)."""

    name: str
    key: str  # the short name --methods takes
    choose: Chooser


def bic_loop(n_init: int) -> Chooser:
    def choose(X: np.ndarray, seed: int, checkpoint: str) -> tuple[int, str, np.ndarray]:
        fits = [
            GaussianMixture(k, n_init=n_init, random_state=seed).fit(X) for k in range(1, MAX_K + 1)
        ]
        best = int(np.argmin([f.bic(X) for f in fits]))
        return best + 1, "", fits[best].predict(X)

    return choose


def dirichlet_process(X: np.ndarray, seed: int, checkpoint: str) -> tuple[int, str, np.ndarray]:
    model = BayesianGaussianMixture(
        n_components=MAX_K,
        weight_concentration_prior_type="dirichlet_process",
        random_state=seed,
        max_iter=500,
    ).fit(X)
    return int((model.weights_ > 1 / (2 * MAX_K)).sum()), "", model.predict(X)


def kmeans_silhouette(X: np.ndarray, seed: int, checkpoint: str) -> tuple[int, str, np.ndarray]:
    labels = [
        KMeans(k, n_init="auto", random_state=seed).fit_predict(X) for k in range(2, MAX_K + 1)
    ]
    best = int(np.argmax([silhouette_score(X, y) for y in labels]))
    return best + 2, "", labels[best]


def hdbscan(X: np.ndarray, seed: int, checkpoint: str) -> tuple[int, str, np.ndarray]:
    """HDBSCAN's clusters with its defaults; noise (-1) is no cluster."""
    labels = HDBSCAN(copy=True).fit_predict(X)  # copy: its default's FutureWarning
    return len(set(labels.tolist()) - {-1}), "", labels


def transformer(estimator: type, **params) -> Chooser:
    """The choice of ``estimator`` (TransformerGMM or TransformerClusterer) among 1..MAX_K."""
    k_name, max_name = (
        ("n_components", "max_components")
        if estimator is TransformerGMM
        else ("n_clusters", "max_clusters")
    )

    def choose(X: np.ndarray, seed: int, checkpoint: str) -> tuple[int, str, np.ndarray]:
        model = estimator(
            **{k_name: "auto", max_name: MAX_K},
            checkpoint=checkpoint,
            random_state=seed,
            **params,
        ).fit(X)
        labels = model.labels_ if hasattr(model, "labels_") else model.predict(X)
        return int(getattr(model, k_name + "_")), model.selection_criterion_, labels

    return choose


def posterior_and_bic(X: np.ndarray, seed: int, checkpoint: str) -> tuple[int, str, None]:
    """The posterior as a prior over BIC: the lowest BIC / 2 - log P(K | X), both from
    one ``criterion="bic"`` fit (which reports ``k_posterior_`` where the model reads it)."""
    model = TransformerGMM(
        n_components="auto",
        criterion="bic",
        max_components=MAX_K,
        checkpoint=checkpoint,
        random_state=seed,
    ).fit(X)
    if not hasattr(model, "k_posterior_"):
        return int(model.n_components_), "bic", None
    with np.errstate(divide="ignore"):
        score = model.criterion_ / 2 - np.log(model.k_posterior_)
    return int(model.candidates_[np.argmin(score)]), "posterior+bic", None


METHODS = (
    Method(BIC1, "bic1", bic_loop(1)),
    Method(BIC10, "bic10", bic_loop(10)),
    Method(DPGMM, "dpgmm", dirichlet_process),
    Method(SILHOUETTE, "silhouette", kmeans_silhouette),
    Method(TGMM, "tgmm", transformer(TransformerGMM, criterion="posterior")),
    Method(TGMM_BIC, "tgmm-bic", transformer(TransformerGMM, criterion="bic")),
    Method(TGMM_POSTERIOR_BIC, "tgmm-posterior-bic", posterior_and_bic),
    Method(CLUSTERER, "clusterer", transformer(TransformerClusterer, criterion="posterior")),
    Method(CLUSTERER_BIC, "clusterer-bic", transformer(TransformerClusterer, criterion="bic")),
    Method(CLUSTERER_MERGE, "clusterer-merge", transformer(TransformerClusterer, merge=True)),
    Method(HDBSCAN_NAME, "hdbscan", hdbscan),
)


def baseline_posterior(baseline: str) -> Method:
    """ "TGMM posterior" with the checkpoint ``baseline``, whatever the run's checkpoint."""
    choose = transformer(TransformerGMM, criterion="posterior")
    return Method(
        TGMM + " [baseline]", "tgmm-baseline", lambda X, seed, _: choose(X, seed, baseline)
    )


def select_methods(names: list[str] | None) -> list[Method]:
    """The methods named by key or full name, in the order of METHODS; all for None."""
    if not names:
        return list(METHODS)
    unknown = set(names) - {m.key for m in METHODS} - {m.name for m in METHODS}
    if unknown:
        raise ValueError(
            f"unknown methods {sorted(unknown)}; choose among {[m.key for m in METHODS]}"
        )
    return [m for m in METHODS if m.key in names or m.name in names]


def run_one(method: Method, problem: Problem, checkpoint: str) -> dict:
    """One choice of K, timed; an exception is a result (chosen_k NaN), not fatal."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # recorded, so counted and never printed
        start = time.perf_counter()
        try:
            chosen, how, labels = method.choose(problem.X, problem.seed, checkpoint)
            error = ""
        except Exception as exc:
            chosen, how, labels, error = np.nan, "", None, f"{type(exc).__name__}: {exc}"
        seconds = time.perf_counter() - start
    ari = np.nan
    if labels is not None and problem.labels is not None:
        ari = adjusted_rand_score(problem.labels, np.asarray(labels))
    return dict(
        setting=problem.setting,
        task=problem.index,
        dataset=problem.name,
        n=problem.X.shape[0],
        d=problem.X.shape[1],
        true_k=problem.true_k,
        seed=problem.seed,
        method=method.name,
        chosen_k=chosen,
        ari=ari,
        time_s=seconds if not error else np.nan,
        criterion=how,
        warnings=" ".join(sorted({w.category.__name__ for w in caught})),
        error=error,
    )


def warm_up(methods: list[Method], checkpoint: str) -> None:
    """Load the checkpoint and let torch set itself up before anything is timed."""
    X = np.random.default_rng(0).standard_normal((64, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for method in methods:
            method.choose(X, 0, checkpoint)


def run(problems: list[Problem], methods: list[Method], checkpoint: str) -> list[dict]:
    """One row per (problem, method): every method on a problem before the next problem."""
    rows = []
    for setting in dict.fromkeys(p.setting for p in problems):
        start = time.perf_counter()
        for problem in (p for p in problems if p.setting == setting):
            rows.extend(run_one(method, problem, checkpoint) for method in methods)
        print(
            f"{setting}: {sum(p.setting == setting for p in problems)} problems, "
            f"{time.perf_counter() - start:.1f} s",
            flush=True,
        )
    return rows


# --- metrics -------------------------------------------------------------------------------


def _exact(row: dict) -> float:
    return float(row["chosen_k"] == row["true_k"])  # NaN (failed) counts as a miss


def _within_one(row: dict) -> float:
    return float(abs(row["chosen_k"] - row["true_k"]) <= 1)


def _mean(values) -> float:
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    return float(values.mean()) if len(values) else np.nan


def _median(values) -> float:
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    return float(np.median(values)) if len(values) else np.nan


def _problem_key(row: dict) -> tuple:
    return row["setting"], row["dataset"], row["task"]


def paired(
    rows: list[dict], method: str, other: str, value: Callable[[dict], float], ratio: bool = False
) -> np.ndarray:
    """``method``'s value minus (or over) ``other``'s on the same problems."""
    theirs = {_problem_key(r): value(r) for r in rows if r["method"] == other}
    compare = np.divide if ratio else np.subtract
    diffs = [
        compare(value(r), theirs[_problem_key(r)])
        for r in rows
        if r["method"] == method and _problem_key(r) in theirs
    ]
    return np.asarray(diffs, dtype=float)


def summary_rows(rows: list[dict], setting: str) -> list[dict]:
    """The metrics of every method on ``rows`` (the problems of one setting)."""
    out = []
    for method in dict.fromkeys(r["method"] for r in rows):
        mine = [r for r in rows if r["method"] == method]
        exact_diff = paired(rows, method, ACCURACY_REFERENCE, _exact)
        diff, diff_se = summarise(exact_diff) if len(exact_diff) else (np.nan, np.nan)
        out.append(
            dict(
                setting=setting,
                method=method,
                n_tasks=len(mine),
                failed=sum(bool(r["error"]) for r in mine),
                exact=_mean([_exact(r) for r in mine]),
                within_one=_mean([_within_one(r) for r in mine]),
                bias=_mean([r["chosen_k"] - r["true_k"] for r in mine]),
                median_abs_error=_median([abs(r["chosen_k"] - r["true_k"]) for r in mine]),
                ari=_mean([r["ari"] for r in mine]),
                ms=1000 * _mean([r["time_s"] for r in mine]),
                time_ratio=_median(
                    paired(rows, method, TIME_REFERENCE, lambda r: r["time_s"], ratio=True)
                ),
                exact_vs_tgmm=diff,
                exact_vs_tgmm_se=diff_se,
            )
        )
    return out


def summary(rows: list[dict]) -> list[dict]:
    """Per synthetic setting, the synthetic settings pooled, and real data."""
    settings = list(dict.fromkeys(r["setting"] for r in rows))
    synthetic = [s for s in settings if s not in (REAL, SHAPES)]
    out = []
    for setting in synthetic:
        out += summary_rows([r for r in rows if r["setting"] == setting], setting)
    if SHAPES in settings:
        out += summary_rows([r for r in rows if r["setting"] == SHAPES], SHAPES)
    if len(synthetic) > 1:
        out += summary_rows([r for r in rows if is_pooled(r["setting"])], SYNTHETIC)
    if REAL in settings:
        out += summary_rows([r for r in rows if r["setting"] == REAL], REAL)
    return out


def per_true_k(rows: list[dict]) -> list[dict]:
    """Exact accuracy per true K and method, synthetic settings pooled."""
    synthetic = [r for r in rows if is_pooled(r["setting"])]
    out = []
    for k in range(1, MAX_K + 1):
        at_k = [r for r in synthetic if r["true_k"] == k]
        if not at_k:
            continue
        row: dict = dict(true_k=k, n_tasks=len({_problem_key(r) for r in at_k}))
        for method in dict.fromkeys(r["method"] for r in synthetic):
            row[method] = _mean([_exact(r) for r in at_k if r["method"] == method])
        out.append(row)
    return out


# --- printing ------------------------------------------------------------------------------


def _f(value: float, spec: str) -> str:
    return "n/a" if not np.isfinite(value) else format(value, spec)


def markdown(header: list[str], lines: list[list[str]]) -> str:
    return "\n".join(
        [
            "| " + " | ".join(header) + " |",
            "|" + "|".join("---" for _ in header) + "|",
            *("| " + " | ".join(line) + " |" for line in lines),
        ]
    )


def print_accuracy_table(table: list[dict]) -> None:
    settings = list(dict.fromkeys(r["setting"] for r in table))
    methods = list(dict.fromkeys(r["method"] for r in table))
    cell = {(r["setting"], r["method"]): r["exact"] for r in table}
    print("\nExact-K accuracy (share of tasks where the chosen K is the true K):\n")
    print(
        markdown(
            ["method", *settings],
            [[m, *(_f(cell.get((s, m), np.nan), ".2f") for s in settings)] for m in methods],
        )
    )


def print_summary(table: list[dict]) -> None:
    print(
        f"\nPer setting: exact and within-one accuracy, mean chosen minus true K (bias), "
        f"mean time per task, median time ratio to {TIME_REFERENCE} on the same task, "
        f"exact accuracy minus {ACCURACY_REFERENCE}'s on the same tasks +- paired "
        "standard error:\n"
    )
    header = [
        "setting",
        "method",
        "tasks",
        "exact",
        "within 1",
        "bias",
        "median abs err",
        "ARI",
        "ms",
        "time ratio",
        f"exact - {ACCURACY_REFERENCE}",
    ]
    lines = [
        [
            r["setting"],
            r["method"],
            str(r["n_tasks"]) + (f" ({r['failed']} failed)" if r["failed"] else ""),
            _f(r["exact"], ".2f"),
            _f(r["within_one"], ".2f"),
            _f(r["bias"], "+.2f"),
            _f(r["median_abs_error"], ".1f"),
            _f(r["ari"], ".2f"),
            _f(r["ms"], ".0f"),
            _f(r["time_ratio"], ".2f"),
            "-"
            if r["method"] == ACCURACY_REFERENCE
            else f"{_f(r['exact_vs_tgmm'], '+.2f')} +- {_f(r['exact_vs_tgmm_se'], '.2f')}",
        ]
        for r in table
    ]
    print(markdown(header, lines))


def print_per_true_k(table: list[dict]) -> None:
    if not table:
        return
    methods = [k for k in table[0] if k not in ("true_k", "n_tasks")]
    print(
        "\nExact accuracy per true K, synthetic settings pooled "
        f"({SILHOUETTE} cannot answer K = 1):\n"
    )
    print(
        markdown(
            ["true K", "tasks", *methods],
            [
                [str(r["true_k"]), str(r["n_tasks"]), *(_f(r[m], ".2f") for m in methods)]
                for r in table
            ],
        )
    )


def print_real_choices(rows: list[dict]) -> None:
    """The K each method chose on each dataset, one per seed."""
    real = [r for r in rows if r["setting"] == REAL]
    if not real:
        return
    methods = list(dict.fromkeys(r["method"] for r in real))
    datasets = list(dict.fromkeys((r["dataset"], r["true_k"]) for r in real))

    def chosen(name: str, method: str) -> str:
        ks = [r["chosen_k"] for r in real if (r["dataset"], r["method"]) == (name, method)]
        return ", ".join("fail" if not np.isfinite(k) else str(int(k)) for k in ks)

    print("\nReal data: the K chosen, one per seed:\n")
    print(
        markdown(
            ["dataset", "n x d", "classes", *methods],
            [
                [name, _shape(real, name), str(k), *(chosen(name, m) for m in methods)]
                for name, k in datasets
            ],
        )
    )


def _shape(rows: list[dict], name: str) -> str:
    row = next(r for r in rows if r["dataset"] == name)
    return f"{row['n']} x {row['d']}"


def print_criteria(rows: list[dict]) -> None:
    """How the transformer's estimators chose: by P(K | X) or by BIC."""
    used = Counter((r["method"], r["criterion"]) for r in rows if r["criterion"])
    if not used:
        return
    print("\nHow the transformer's estimators chose (selection_criterion_):")
    for method in dict.fromkeys(method for method, _ in used):
        total = sum(r["method"] == method for r in rows)
        print(
            f"  {method}: "
            + ", ".join(
                f"{criterion} in {count} of {total}"
                for (m, criterion), count in used.items()
                if m == method
            )
        )


def print_problems(rows: list[dict]) -> None:
    failed = [r for r in rows if r["error"]]
    warned = Counter((r["method"], w) for r in rows for w in r["warnings"].split())
    if not failed and not warned:
        print("\nNo choice failed or warned.")
        return
    print(
        "\nChoices that failed or warned (every warning was kept from the output during "
        "the run; the expected ones are " + " and ".join(c.__name__ for c in SILENCED) + "):"
    )
    for r in failed:
        print(
            f"  failed: {r['setting']} {r['dataset']} seed {r['seed']} {r['method']}: {r['error']}"
        )
    expected = {c.__name__ for c in SILENCED}
    for (method, warning), count in warned.items():
        print(
            f"  {method}: {warning}{'' if warning in expected else ' (unexpected)'} in "
            f"{count} of {sum(r['method'] == method for r in rows)} choices"
        )


# --- the figure ----------------------------------------------------------------------------


def plot(table: list[dict], path: Path) -> Path:
    """Exact accuracy and time ratio per setting, one bar per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    settings = [s for s in dict.fromkeys(r["setting"] for r in table) if s != SYNTHETIC]
    methods = list(dict.fromkeys(r["method"] for r in table))
    cell = {(r["setting"], r["method"]): r for r in table}
    fig, axes = plt.subplots(2, 1, figsize=(max(8.0, 1.5 * len(settings) + 2), 7.5), sharex=True)
    x = np.arange(len(settings))
    width = 0.8 / len(methods)
    for index, method in enumerate(methods):
        offset = x - 0.4 + (index + 0.5) * width
        for ax, key in zip(axes, ("exact", "time_ratio"), strict=True):
            values = [
                cell[s, m][key] if (s, m) in cell else np.nan
                for s, m in ((s, method) for s in settings)
            ]
            ax.bar(offset, values, width, label=method, color=f"C{index % 10}")
    axes[0].set(ylabel="exact-K accuracy", ylim=(0, 1))
    axes[1].set(ylabel=f"time / {TIME_REFERENCE}\n(median over tasks)", yscale="log")
    axes[1].axhline(1.0, color="k", lw=0.6, ls="--")
    axes[1].yaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))
    axes[1].yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axes[1].yaxis.set_minor_formatter(NullFormatter())
    for ax in axes:
        ax.grid(alpha=0.3, axis="y")
    axes[1].set_xticks(x, settings)
    axes[1].legend(fontsize=8, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.12))
    fig.suptitle(
        f"Choosing K among 1..{MAX_K}: synthetic N = {N_SAMPLES} tasks and real datasets",
        fontsize=10,
    )
    fig.tight_layout()
    return save_figure(fig, path)


# --- main ----------------------------------------------------------------------------------


def main(argv=None):
    parser = standard_parser(__doc__, "choose_k", "12 tasks per setting, 1 seed of real data")
    parser.add_argument(
        "--seeds", type=int, default=None, help="seeds per real dataset (3; 1 with --quick)"
    )
    parser.add_argument(
        "--methods",
        nargs="+",
        default=None,
        help="a subset, by key (" + ", ".join(m.key for m in METHODS) + ") or full name",
    )
    parser.add_argument("--no-real", action="store_true", help="synthetic tasks only")
    parser.add_argument(
        "--shape-tasks", type=int, default=None, help="shapes tasks (35; 14 with --quick)"
    )
    parser.add_argument(
        "--baseline-checkpoint",
        default=None,
        help="also choose by the posterior of this checkpoint, paired on the same problems",
    )
    tasks = next(a for a in parser._actions if a.dest == "tasks")
    tasks.help = "tasks per synthetic setting (100; 12 with --quick)"
    args = parser.parse_args(argv)
    n_tasks = args.tasks if args.tasks is not None else (12 if args.quick else 100)
    n_seeds = args.seeds if args.seeds is not None else (1 if args.quick else 3)
    try:
        methods = select_methods(args.methods)
    except ValueError as exc:
        parser.error(str(exc))
    if args.baseline_checkpoint is not None:
        methods.append(baseline_posterior(args.baseline_checkpoint))
    n_shapes = args.shape_tasks if args.shape_tasks is not None else (14 if args.quick else 35)
    problems = synthetic_problems(args.seed, n_tasks) + separated_problems(args.seed, n_tasks)
    problems += shape_problems(args.seed, n_shapes)
    if not args.no_real:
        problems += real_problems(args.seed, n_seeds)
    print(
        f"{n_tasks} tasks per synthetic setting (N = {N_SAMPLES}), "
        + ("no real data" if args.no_real else f"{n_seeds} seed(s) per real dataset")
        + f"; K among 1..{MAX_K}; checkpoint {args.checkpoint!r}; methods: "
        + ", ".join(m.name for m in methods)
        + "; one BLAS, OpenMP and torch thread"
    )

    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    start = time.perf_counter()
    try:
        with single_threaded():
            warm_up(methods, args.checkpoint)
            rows = run(problems, methods, args.checkpoint)
    finally:
        torch.set_num_threads(threads)
    print(f"all: {time.perf_counter() - start:.1f} s")

    table = summary(rows)
    by_k = per_true_k(rows)
    print_accuracy_table(table)
    print_summary(table)
    print_per_true_k(by_k)
    print_real_choices(rows)
    print_criteria(rows)
    print_problems(rows)

    paths = [
        write_csv(rows, args.results / f"{args.out}.csv"),
        write_csv(table, args.results / f"{args.out}_summary.csv"),
    ]
    if by_k:
        paths.append(write_csv(by_k, args.results / f"{args.out}_per_k.csv"))
    paths.append(plot(table, args.results / f"{args.out}.png"))
    print("\nwrote " + ", ".join(str(p) for p in paths))
    return rows, table


if __name__ == "__main__":
    main()
