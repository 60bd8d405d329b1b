"""Missing values: our estimators on data with NaN against imputation then scikit-learn.

Datasets: the small ones of ``real_datasets.py`` with classes and at least two features
(``--datasets``; the default leaves out faithful, which has no classes, and digits and
breast_cancer, of 61 and 30 features, to keep the run short; K = the number of classes),
standardized; or, with ``--large``, 20,000 rows drawn from each of the four large tables
of ``large_datasets.py`` that have classes. For each (dataset, seed) a
quarter of the rows is held out; then entries are removed from all rows at rate 10, 30
and 50 %:

- MCAR (missing completely at random): each entry independently;
- MAR (missing at random): one feature, drawn by the seed, is always observed, and each
  other entry of a row is missing with a probability that grows linearly with the rank of
  that row's observed feature (scaled so that the rate over all entries is the target).

A row left with no observed entry gets one back, drawn at random (rows with nothing
observed are refused, and carry nothing).

Methods, all with ``random_state`` = the seed, on the same rows with the same gaps:

- mixtures: ``TransformerGMM`` on the data with NaN ("TGMM"); ``SimpleImputer(mean)``,
  ``IterativeImputer`` and ``KNNImputer``, each then ``GaussianMixture`` (full
  covariances, scikit-learn's defaults otherwise); ``GaussianMixture`` on the complete
  rows alone ("complete-case");
- clusterers: ``TransformerClusterer`` on the data with NaN, and the same three imputers
  then ``KMeans(n_init=10)``.

Mixtures have full covariances (``--covariance`` sets another type for all of them).

Metrics: the adjusted Rand index against the classes of the fitted rows (TGMM and the
complete-case fit label a row by its observed features' marginal; the pipelines label the
imputed rows); the held-out log-likelihood per row of the observed entries of the held-out
rows, each row's marginal over its observed features under the fitted mixture (for the
pipelines, from GaussianMixture's fitted parameters); the wall time of the fit (imputation
included) as a ratio to the IterativeImputer pipeline of the same kind in the same loop.
One BLAS, OpenMP and torch thread.

    python benchmarks/missing.py             # 8 datasets, 3 rates, MCAR and MAR, 3 seeds
    python benchmarks/missing.py --quick     # iris and crabs, 30 %, one seed
    python benchmarks/missing.py --seeds 5 --datasets iris wine
    python benchmarks/missing.py --covariance diag --out missing_diag
    python benchmarks/missing.py --large --seeds 2 --out missing_large

Prints the tables (means with standard errors over the (dataset, seed) pairs; ours minus
the best pipeline of each cell, paired) and writes missing_fits.csv (one row per fit),
missing.csv (the summary), missing_paired.csv, missing_datasets.csv (per dataset) and
missing.png under benchmarks/results/ (``--out`` renames them).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from scipy.special import logsumexp
from sklearn.cluster import KMeans
from sklearn.experimental import enable_iterative_imputer  # noqa: F401
from sklearn.impute import IterativeImputer, KNNImputer, SimpleImputer
from sklearn.metrics import adjusted_rand_score
from sklearn.mixture import GaussianMixture

sys.path.insert(0, str(Path(__file__).parent))
from common import (  # noqa: E402
    save_figure,
    shared_parser,
    single_threaded,
    standard_parser,
    timed,
    write_csv,
)
from large_datasets import LARGE_DATASETS  # noqa: E402
from real_datasets import DATASETS as REAL_DATASETS  # noqa: E402
from real_datasets import load_dataset  # noqa: E402

from transformer_gmm import TransformerClusterer, TransformerGMM  # noqa: E402
from transformer_gmm.engine.missing import weighted_log_prob  # noqa: E402

DATASETS = ("iris", "wine", "penguins", "crabs", "fgl", "biopsy", "pima", "synth")
QUICK_DATASETS = ("iris", "crabs")
# The large tables of realdata_large.py with classes (county_murders has none), each a
# uniform draw of LARGE_ROWS rows: KNNImputer's time grows with the square of the rows.
LARGE = ("diamonds", "flights", "cps", "mpls_stops")
LARGE_ROWS = 20_000
RATES = (0.1, 0.3, 0.5)
PATTERNS = ("MCAR", "MAR")
HELD_OUT = 0.25
TGMM, CLUSTERER, COMPLETE = "TGMM", "TransformerClusterer", "complete-case GMM"
IMPUTERS = {
    "mean": lambda seed: SimpleImputer(strategy="mean"),
    "iterative": lambda seed: IterativeImputer(random_state=seed),
    "knn": lambda seed: KNNImputer(),
}
REFERENCE = "iterative"  # the pipelines whose time is 1


def gmm_name(imputer: str) -> str:
    return f"{imputer} + GMM"


def kmeans_name(imputer: str) -> str:
    return f"{imputer} + KMeans"


# --- the gaps ------------------------------------------------------------------------------


def mcar(rng: np.random.Generator, shape: tuple[int, int], rate: float) -> np.ndarray:
    return rng.random(shape) < rate


def mar(rng: np.random.Generator, X: np.ndarray, rate: float) -> np.ndarray:
    """Feature ``driver`` always observed; the others missing with probability
    ``c * rank(driver) / (n - 1)``, ``c`` set by bisection so that the mean probability
    over all entries is ``rate``."""
    n, d = X.shape
    driver = rng.integers(d)
    rank = np.argsort(np.argsort(X[:, driver])) / max(n - 1, 1)
    target = rate * d / (d - 1)  # the others carry every gap

    def mean_probability(c: float) -> float:
        return float(np.clip(c * rank, 0, 1).mean())

    low, high = 0.0, 2.0 / max(rank.mean(), 1e-12) * 4
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if mean_probability(middle) < target else (low, middle)
    gaps = rng.random((n, d)) < np.clip(low * rank, 0, 1)[:, None]
    gaps[:, driver] = False
    return gaps


def with_gaps(rng: np.random.Generator, X: np.ndarray, pattern: str, rate: float) -> np.ndarray:
    gaps = mcar(rng, X.shape, rate) if pattern == "MCAR" else mar(rng, X, rate)
    empty = np.flatnonzero(gaps.all(axis=1))
    gaps[empty, rng.integers(X.shape[1], size=len(empty))] = False
    return np.where(gaps, np.nan, X)


# --- the methods ---------------------------------------------------------------------------


def marginal_ll(X: np.ndarray, gmm) -> float:
    """Mean log-likelihood per row of the observed entries of ``X`` (NaN: missing) under
    ``gmm``'s fitted parameters: each row's marginal over its observed features."""
    log_prob = weighted_log_prob(X, gmm.weights_, gmm.means_, gmm.precisions_cholesky_,
                                 gmm.covariance_type)
    return float(logsumexp(log_prob, axis=1).mean())


def marginal_labels(X: np.ndarray, gmm) -> np.ndarray:
    log_prob = weighted_log_prob(X, gmm.weights_, gmm.means_, gmm.precisions_cholesky_,
                                 gmm.covariance_type)
    return log_prob.argmax(axis=1)


def _quietly(fit):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return timed(fit)


def fit_all(X: np.ndarray, held: np.ndarray, labels: np.ndarray, k: int,
            seed: int, covariance: str = "full") -> list[dict]:
    """One row (method, ari, heldout_ll, ms) per method on the rows ``X`` with gaps."""
    rows = []

    def record(method, kind, fitted, ms, predicted, mixture=None, error=""):
        rows.append(dict(
            method=method, kind=kind, ms=ms, error=error,
            ari=adjusted_rand_score(labels, predicted) if predicted is not None else np.nan,
            heldout_ll=marginal_ll(held, mixture) if mixture is not None else np.nan,
        ))

    gmm, ms = _quietly(lambda: TransformerGMM(
        k, covariance_type=covariance, random_state=seed).fit(X))
    record(TGMM, "mixture", gmm, ms, gmm.predict(X), gmm)
    for name, make in IMPUTERS.items():
        imputed, ms_impute = _quietly(lambda make=make: make(seed).fit_transform(X))
        mixture, ms = _quietly(lambda imputed=imputed: GaussianMixture(
            k, covariance_type=covariance, random_state=seed).fit(imputed))
        record(gmm_name(name), "mixture", mixture, ms_impute + ms, mixture.predict(imputed),
               mixture)
        km, ms = _quietly(lambda imputed=imputed: KMeans(
            k, n_init=10, random_state=seed).fit(imputed))
        record(kmeans_name(name), "clusterer", km, ms_impute + ms, km.labels_)
    complete = ~np.isnan(X).any(axis=1)
    try:
        mixture, ms = _quietly(lambda: GaussianMixture(
            k, covariance_type=covariance, random_state=seed).fit(X[complete]))
        record(COMPLETE, "mixture", mixture, ms, marginal_labels(X, mixture), mixture)
    except ValueError as error:  # fewer complete rows than components: a result
        record(COMPLETE, "mixture", None, np.nan, None, error=str(error).splitlines()[0])
    km, ms = _quietly(lambda: TransformerClusterer(k, random_state=seed).fit(X))
    record(CLUSTERER, "clusterer", km, ms, km.labels_)
    reference = {r["kind"]: r["ms"] for r in rows
                 if r["method"] in (gmm_name(REFERENCE), kmeans_name(REFERENCE))}
    for r in rows:
        r["time_ratio"] = r["ms"] / reference[r["kind"]]
    return rows


def split(n: int, seed: int) -> np.ndarray:
    """True for the rows held out (a quarter, drawn by the seed)."""
    rng = np.random.default_rng([seed, n, 1])
    out = np.zeros(n, dtype=bool)
    out[rng.choice(n, round(HELD_OUT * n), replace=False)] = True
    return out


def warm_up() -> None:
    """Load the checkpoint and let torch set itself up before anything is timed."""
    X = np.random.default_rng(0).standard_normal((64, 3))
    X[::3, 0] = np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        TransformerGMM(2, random_state=0).fit(X)
        TransformerClusterer(2, random_state=0).fit(X)


def load(name: str):
    """A small dataset of ``real_datasets.py``, or LARGE_ROWS rows of a large one."""
    if name not in LARGE_DATASETS:
        return load_dataset(name)
    data = LARGE_DATASETS[name]()
    keep = np.sort(np.random.default_rng(0).choice(len(data.X), LARGE_ROWS, replace=False))
    return type(data)(name, data.X[keep], data.labels[keep], data.n_components)


def gapped(datasets, rates, patterns, seeds):
    """Every problem of the benchmark, in order: (dataset, seed, pattern, rate, the rows
    with gaps, which rows are held out); a line is printed after each (dataset, seed)."""
    for name in datasets:
        data = load(name)
        for seed in seeds:
            out = split(len(data.X), seed)
            for pattern in patterns:
                for rate in rates:
                    rng = np.random.default_rng([seed, int(rate * 100), len(pattern)])
                    yield data, seed, pattern, rate, with_gaps(rng, data.X, pattern, rate), out
            print(f"{name}: seed {seed} done", flush=True)


def run(datasets, rates, patterns, seeds, covariance: str = "full") -> list[dict]:
    warm_up()
    rows = []
    for data, seed, pattern, rate, X, out in gapped(datasets, rates, patterns, seeds):
        setting = dict(dataset=data.name, n=len(X), d=X.shape[1], K=data.n_components,
                       pattern=pattern, rate=rate, seed=seed,
                       observed_rate=float(1 - np.isnan(X).mean()))
        fits = fit_all(X[~out], X[out], data.labels[~out], data.n_components, seed, covariance)
        rows += [dict(setting, **fit) for fit in fits]
    return rows


# --- the tables ----------------------------------------------------------------------------


def _mean_se(values) -> tuple[float, float]:
    values = np.asarray([v for v in values if np.isfinite(v)], dtype=float)
    if len(values) == 0:
        return np.nan, np.nan
    se = values.std(ddof=1) / np.sqrt(len(values)) if len(values) > 1 else np.nan
    return float(values.mean()), float(se)


def _cells(rows):
    return list(dict.fromkeys((r["pattern"], r["rate"]) for r in rows))


def summary(rows: list[dict]) -> list[dict]:
    table = []
    for pattern, rate in _cells(rows):
        cell = [r for r in rows if r["pattern"] == pattern and r["rate"] == rate]
        for method in dict.fromkeys(r["method"] for r in cell):
            mine = [r for r in cell if r["method"] == method]
            ari, ari_se = _mean_se(r["ari"] for r in mine)
            ll, ll_se = _mean_se(r["heldout_ll"] for r in mine)
            ratios = [r["time_ratio"] for r in mine if np.isfinite(r["time_ratio"])]
            table.append(dict(
                pattern=pattern, rate=rate, method=method, kind=mine[0]["kind"],
                n_fits=len(mine), n_failed=sum(bool(r["error"]) for r in mine),
                ari=ari, ari_se=ari_se, heldout_ll=ll, heldout_ll_se=ll_se,
                time_ratio=float(np.exp(np.mean(np.log(ratios)))) if ratios else np.nan,
            ))
    return table


def per_dataset(rows: list[dict]) -> list[dict]:
    """Per (dataset, method), over patterns, rates and seeds: the mean ARI and the median
    held-out log-likelihood (the mean is ruled by a few held-out rows far out in the
    tails of an overfitted covariance)."""
    table = []
    for dataset in dict.fromkeys(r["dataset"] for r in rows):
        for method in dict.fromkeys(r["method"] for r in rows):
            mine = [r for r in rows if r["dataset"] == dataset and r["method"] == method]
            lls = [r["heldout_ll"] for r in mine if np.isfinite(r["heldout_ll"])]
            table.append(dict(dataset=dataset, method=method, kind=mine[0]["kind"],
                              ari=_mean_se(r["ari"] for r in mine)[0],
                              median_heldout_ll=float(np.median(lls)) if lls else np.nan))
    return table


def print_per_dataset(table: list[dict]) -> None:
    methods = list(dict.fromkeys(t["method"] for t in table))
    for metric in ("ari", "median_heldout_ll"):
        shown = [m for m in methods
                 if any(np.isfinite(t[metric]) for t in table if t["method"] == m)]
        print(f"\n{metric} per dataset (over patterns, rates and seeds)")
        print(f"{'dataset':>9} " + " ".join(f"{m:>19}" for m in shown))
        for dataset in dict.fromkeys(t["dataset"] for t in table):
            cells = [next(t[metric] for t in table if t["dataset"] == dataset
                          and t["method"] == m) for m in shown]
            print(f"{dataset:>9} " + " ".join(f"{c:>19.3f}" for c in cells))


def paired(rows: list[dict], table: list[dict]) -> list[dict]:
    """Ours minus the best pipeline of each cell (the highest mean), paired over the
    (dataset, seed) pairs: mean and standard error of the differences."""
    out = []
    for ours, kind, metrics in ((TGMM, "mixture", ("ari", "heldout_ll")),
                                (CLUSTERER, "clusterer", ("ari",))):
        for pattern, rate in _cells(rows):
            cell = [t for t in table if t["pattern"] == pattern and t["rate"] == rate
                    and t["kind"] == kind and t["method"] != ours]
            for metric in metrics:
                best = max(cell, key=lambda t: -np.inf if np.isnan(t[metric]) else t[metric])
                by_pair = {}
                for r in rows:
                    if r["pattern"] == pattern and r["rate"] == rate:
                        by_pair.setdefault((r["dataset"], r["seed"]), {})[r["method"]] = r
                diffs = [p[ours][metric] - p[best["method"]][metric] for p in by_pair.values()
                         if np.isfinite(p[ours][metric])
                         and np.isfinite(p[best["method"]][metric])]
                mean, se = _mean_se(diffs)
                out.append(dict(ours=ours, pattern=pattern, rate=rate, metric=metric,
                                best=best["method"], difference=mean, se=se,
                                level_or_better=bool(mean >= -2 * se) if np.isfinite(se)
                                else bool(mean >= 0)))
    return out


def print_tables(table: list[dict], pairs: list[dict]) -> None:
    for kind, metrics in (("mixture", ("ari", "heldout_ll", "time_ratio")),
                          ("clusterer", ("ari", "time_ratio"))):
        methods = list(dict.fromkeys(t["method"] for t in table if t["kind"] == kind))
        for metric in metrics:
            print(f"\n{metric} ({kind}s; mean +- se over datasets and seeds"
                  + ("; geometric mean" if metric == "time_ratio" else "") + ")")
            print(f"{'pattern':>7} {'rate':>5} " + " ".join(f"{m:>19}" for m in methods))
            for pattern, rate in dict.fromkeys((t["pattern"], t["rate"]) for t in table):
                cells = []
                for method in methods:
                    t = next(t for t in table if t["method"] == method
                             and t["pattern"] == pattern and t["rate"] == rate)
                    cells.append(f"{t[metric]:.3f}" if metric == "time_ratio"
                                 else f"{t[metric]:.3f}+-{t[metric + '_se']:.3f}")
                print(f"{pattern:>7} {rate:>5} " + " ".join(f"{c:>19}" for c in cells))
    print("\nours minus the best pipeline of the cell, paired (mean +- se)")
    for p in pairs:
        print(f"{p['ours']:>20} {p['pattern']:>5} {p['rate']:>4} {p['metric']:>10} "
              f"{p['difference']:+.3f}+-{p['se']:.3f}  best: {p['best']:<18} "
              f"{'level or better' if p['level_or_better'] else 'worse'}")


def plot(table: list[dict], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("mixture", "ari", "ARI, mixtures"), ("mixture", "heldout_ll",
              "held-out LL of the observed entries"), ("clusterer", "ari", "ARI, clusterers")]
    patterns = list(dict.fromkeys(t["pattern"] for t in table))
    fig, axes = plt.subplots(len(patterns), 3, figsize=(13, 3.6 * len(patterns)),
                             squeeze=False)
    for i, pattern in enumerate(patterns):
        for j, (kind, metric, title) in enumerate(panels):
            ax = axes[i, j]
            mine = [t for t in table if t["pattern"] == pattern and t["kind"] == kind]
            for method in dict.fromkeys(t["method"] for t in mine):
                points = sorted((t["rate"], t[metric], t[metric + "_se"]) for t in mine
                                if t["method"] == method)
                rate, mean, se = (np.array(v) for v in zip(*points, strict=True))
                ax.errorbar(100 * rate, mean, yerr=se, marker="o", capsize=3, label=method,
                            lw=2.5 if method in (TGMM, CLUSTERER) else 1)
            if metric == "heldout_ll":  # complete-case fits reach -10^5: a log scale past -10
                ax.set_yscale("symlog", linthresh=10)
            ax.set_title(f"{title} ({pattern})")
            ax.set_xlabel("entries missing (%)")
            if i == 0:
                ax.legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, path)


# --- shared by the scripts that study one stage of the fit on these gaps --------------------
# (missing_acceleration.py, missing_start.py): their options, problems, cells and files.


def stage_parser(doc: str, out: str) -> argparse.ArgumentParser:
    """The standard options, ``--large``, ``--seeds`` and ``--covariance`` (full or diag)."""
    parser = standard_parser(doc, out, "two small tables, one seed", tasks=False)
    parser.add_argument("--large", action="store_true", help="the four large tables")
    parser.add_argument("--seeds", type=int, default=None, help="seeds (3; 2 with --large)")
    parser.add_argument("--covariance", default="full", choices=("full", "diag"))
    return parser


def stage_problems(options: argparse.Namespace) -> tuple[tuple[str, ...], list[int]]:
    """The datasets and seeds ``options`` ask for (seeds as ``main`` numbers them)."""
    datasets = QUICK_DATASETS if options.quick else LARGE if options.large else DATASETS
    n_seeds = options.seeds or (1 if options.quick else 2 if options.large else 3)
    return datasets, [1000 * options.seed + i for i in range(n_seeds)]


def stage_cells(rows: list[dict]) -> Iterator[tuple[str, float, list[dict]]]:
    """Each (pattern, rate) with its rows, in the order of the tables."""
    for pattern in PATTERNS:
        for rate in RATES:
            cell = [r for r in rows if r["pattern"] == pattern and r["rate"] == rate]
            if cell:
                yield pattern, rate, cell


def paired_text(diff: np.ndarray, digits: int = 4) -> str:
    """A paired difference's mean and standard error."""
    se = diff.std(ddof=1) / np.sqrt(len(diff)) if len(diff) > 1 else np.nan
    return f"{diff.mean():+.{digits}f} ± {se:.{digits}f}"


def stage_main(options: argparse.Namespace, run, summary, print_table) -> tuple[list, list]:
    """A stage script's run: ``run(datasets, seeds)``'s rows on the problems ``options`` ask
    for (one thread), its ``summary`` printed, and both written to
    ``<out>{_large}{_diag}_fits.csv`` (the rows) and ``<out>{_large}{_diag}.csv``."""
    import torch

    datasets, seeds = stage_problems(options)
    torch.set_num_threads(1)
    with single_threaded():
        rows = run(datasets, seeds)
    table = summary(rows)
    print_table(table)
    out = options.out + ("_large" if options.large else "") + (
        "_diag" if options.covariance == "diag" else ""
    )
    results = Path(options.results)
    write_csv(rows, results / f"{out}_fits.csv")
    write_csv(table, results / f"{out}.csv")
    return rows, table


def main(argv=None):
    parser = shared_parser(__doc__, "iris and crabs, 30 % missing, MCAR and MAR, one seed")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per dataset (default 3)")
    parser.add_argument("--datasets", nargs="+", default=None,
                        choices=sorted(set(REAL_DATASETS) - {"faithful"}) + list(LARGE))
    parser.add_argument("--large", action="store_true",
                        help=f"the large tables ({', '.join(LARGE)}), {LARGE_ROWS:,} rows each")
    parser.add_argument("--covariance", default="full",
                        choices=("full", "tied", "diag", "spherical"),
                        help="covariance type of every mixture (default full)")
    parser.add_argument("--out", default="missing", help="file stem of the CSV and PNG files")
    options = parser.parse_args(argv)
    datasets = options.datasets or (
        QUICK_DATASETS if options.quick else LARGE if options.large else DATASETS)
    rates = (0.3,) if options.quick else RATES
    n_seeds = 1 if options.quick else options.seeds
    seeds = [1000 * options.seed + i for i in range(n_seeds)]
    with single_threaded():
        import torch

        torch.set_num_threads(1)
        rows = run(datasets, rates, PATTERNS, seeds, options.covariance)
    table = summary(rows)
    pairs = paired(rows, table)
    datasets_table = per_dataset(rows)
    print_tables(table, pairs)
    print_per_dataset(datasets_table)
    results, out = options.results, options.out
    for path in (write_csv(rows, results / f"{out}_fits.csv"),
                 write_csv(table, results / f"{out}.csv"),
                 write_csv(pairs, results / f"{out}_paired.csv"),
                 write_csv(datasets_table, results / f"{out}_datasets.csv"),
                 plot(table, results / f"{out}.png")):
        print(f"wrote {path}")
    return rows, table, pairs


if __name__ == "__main__":
    main()
