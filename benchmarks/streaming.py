"""Learning from a stream: ``partial_fit`` batch by batch against one fit on every row.

Two streams, each read in batches drawn afresh from their own seeds, so the stream never
holds more than a batch:

- ``synthetic``: rows of one fixed mixture (K = 5 Gaussians of random full covariances in
  d = 8, weights from a Dirichlet);
- ``flights``: the largest table of the large real-data benchmark
  (``large_datasets.flights``: 100,000 rows x 6, standardized, K = 3), resampled with
  replacement to the length of the stream.

Per stream and batch size:

- mixtures: ``TransformerGMM.partial_fit`` over the stream; ``TransformerGMM.fit`` on all
  the rows at once (held in memory: 10^7 x 8 float64 is 640 MB); ``GaussianMixture``
  fitted on one batch's rows that the stream never shows (the memory the stream holds);
- clusterings: ``TransformerClusterer.partial_fit`` against ``MiniBatchKMeans.partial_fit``
  on the same batches.

Measured: the mean log-likelihood per row on all the rows (mixtures) or the mean inertia
per row (clusterings), read 10^5 rows at a time from every row held at once; the peak
memory growth of the fit over what was resident before it (``VmHWM``, reset through
``/proc/self/clear_refs``; in one process, so a later fit may reuse memory an earlier one
freed), the batch being made included; rows per second of the fitting calls alone
(making the batches is left out of the time, the same for every method). The
transformer's weights are loaded once before any measure. All on CPU with one thread.

The targets, checked and printed (and written to ``streaming_targets.csv``):

- after one pass in batches of 10^4, the mixture's mean log-likelihood on all rows within
  0.01 nats per row of the full-batch fit's;
- the peak memory growth of ``partial_fit`` at most two batches plus 50 MB;
- the clusterer's final inertia at most ``MiniBatchKMeans``'s with the same batch size, in
  no more of its time.

    python benchmarks/streaming.py --quick --datasets synthetic flights  # 10^5 rows
    python benchmarks/streaming.py --datasets synthetic flights   # 10^7 rows, 10^3 to 10^5
    python benchmarks/streaming.py --gaps 0.2 --n-rows 1000000 --datasets synthetic flights \
        --out streaming_gaps   # a fifth of the entries missing: our estimators alone

Prints a table and writes benchmarks/results/streaming.csv, streaming_targets.csv and
streaming.png. Linux only (memory).
"""

from __future__ import annotations

import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from common import (  # noqa: E402
    MiB,
    peak_memory_growth,
    save_figure,
    shared_parser,
    single_threaded,
    write_csv,
)

N_COMPONENTS, N_FEATURES = 5, 8
GAP_TARGET = 0.01  # nats per row, at batches of TARGET_BATCH
TARGET_BATCH = 10**4
MEMORY_SLACK_MIB = 50 * 10**6 / MiB  # 50 MB


# --- the streams -----------------------------------------------------------------------------


BLOCK = 1_000  # rows drawn at once; batch sizes are multiples of it


class Stream:
    """Rows in blocks of ``BLOCK``, block ``j`` drawn from the seed and ``j`` alone, and a
    batch is consecutive blocks: every batch size streams the same rows, and block
    ``10**9`` on are rows the stream never shows."""

    name: str
    n_components: int
    n_features: int

    def block(self, j: int) -> np.ndarray:
        raise NotImplementedError

    def batch(self, i: int, size: int) -> np.ndarray:
        per_batch = size // BLOCK
        return np.concatenate([self.block(i * per_batch + j) for j in range(per_batch)])

    def stream(self, n_rows: int, size: int) -> Iterator[np.ndarray]:
        for i in range(n_rows // size):
            yield self.batch(i, size)

    def unseen(self, size: int) -> np.ndarray:
        """``size`` rows the stream never shows."""
        return self.batch(10**9 // (size // BLOCK), size)


class Mixture(Stream):
    """A fixed mixture to draw rows from."""

    name, n_components, n_features = "synthetic", N_COMPONENTS, N_FEATURES

    def __init__(self, seed: int):
        rng = np.random.default_rng(seed)
        self.seed = seed
        self.weights = rng.dirichlet(np.full(N_COMPONENTS, 5.0))
        self.means = rng.uniform(-6, 6, (N_COMPONENTS, N_FEATURES))
        factors = rng.normal(size=(N_COMPONENTS, N_FEATURES, N_FEATURES)) / np.sqrt(N_FEATURES)
        self.chol = factors + np.eye(N_FEATURES)  # covariances chol @ chol.T, well conditioned

    def block(self, j: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, j])
        component = rng.choice(N_COMPONENTS, size=BLOCK, p=self.weights)
        noise = rng.normal(size=(BLOCK, N_FEATURES))
        return self.means[component] + np.einsum("nij,nj->ni", self.chol[component], noise)


class Resampled(Stream):
    """The rows of a real table, drawn uniformly with replacement."""

    def __init__(self, dataset, seed: int):
        self.name, self.X, self.seed = dataset.name, dataset.X, seed
        self.n_components, self.n_features = dataset.n_components, dataset.X.shape[1]

    def block(self, j: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, 1, j])
        return self.X[rng.integers(0, len(self.X), BLOCK)]


class WithGaps(Stream):
    """Another stream's rows with a share of their entries missing at random (NaN), each
    row keeping one: block ``j``'s gaps drawn from the seed and ``j`` alone."""

    def __init__(self, source: Stream, share: float):
        self.source, self.share = source, share
        self.name, self.seed = f"{source.name} {share:.0%} gaps", source.seed
        self.n_components, self.n_features = source.n_components, source.n_features

    def block(self, j: int) -> np.ndarray:
        rows = self.source.block(j).astype(np.float64)
        rng = np.random.default_rng([self.seed, 2, j])
        gaps = rng.random(rows.shape) < self.share
        gaps[gaps.all(axis=1), 0] = False
        rows[gaps] = np.nan
        return rows


def make_stream(name: str, seed: int, gaps: float = 0.0) -> Stream:
    if name == "synthetic":
        source = Mixture(seed)
    else:
        from large_datasets import LARGE_DATASETS

        source = Resampled(LARGE_DATASETS[name](), seed)
    return WithGaps(source, gaps) if gaps else source


def every_row(source: Stream, n_rows: int) -> np.ndarray:
    """The stream's ``n_rows`` rows at once (to score the models on, and the full fit)."""
    size = max(s for s in (10**5, 10**4, BLOCK) if n_rows % s == 0)
    return np.concatenate(list(source.stream(n_rows, size)))


def over_rows(X: np.ndarray, score: Callable) -> float:
    """The mean per row of ``score(batch)`` (a sum over the batch) over every row of ``X``,
    read 10^5 rows at a time."""
    return sum(score(X[i:i + 10**5]) for i in range(0, len(X), 10**5)) / len(X)


# --- the methods -----------------------------------------------------------------------------


def streamed(estimator, source: Stream, n_rows: int, size: int, clock: list):
    """A fit over the stream; ``clock`` gets the seconds spent in ``partial_fit`` alone."""

    def fit():
        spent = 0.0
        for batch in source.stream(n_rows, size):
            start = time.perf_counter()
            estimator.partial_fit(batch)
            spent += time.perf_counter() - start
        clock.append(spent)
        return estimator

    return fit


def run_size(source: Stream, X: np.ndarray, size: int, checkpoint, seed: int) -> list[dict]:
    from sklearn.cluster import MiniBatchKMeans
    from sklearn.mixture import GaussianMixture

    from transformer_gmm import TransformerClusterer, TransformerGMM

    k, n_rows = source.n_components, len(X)

    def log_likelihood(model) -> float:
        return over_rows(X, lambda b: float(model.score_samples(b).sum()))

    def inertia(model) -> float:
        return over_rows(X, lambda b: -float(model.score(b)))

    subsample = source.unseen(size)
    gmm = dict(n_components=k, checkpoint=checkpoint, random_state=seed, device="cpu")

    def fit_subsample(clock):
        def fit():
            start = time.perf_counter()
            model = GaussianMixture(k, random_state=seed).fit(subsample)
            clock.append(time.perf_counter() - start)
            return model

        return fit

    methods = {
        ("mixture", "TransformerGMM.partial_fit"):
            lambda c: streamed(TransformerGMM(**gmm), source, n_rows, size, c),
        ("mixture", f"GaussianMixture on {size:,} rows"): fit_subsample,
        ("clustering", "TransformerClusterer.partial_fit"): lambda c: streamed(
            TransformerClusterer(k, checkpoint=checkpoint, random_state=seed, device="cpu"),
            source, n_rows, size, c),
        ("clustering", "MiniBatchKMeans.partial_fit"): lambda c: streamed(
            MiniBatchKMeans(k, random_state=seed, n_init=1), source, n_rows, size, c),
    }
    if isinstance(source, WithGaps):  # of these, only our streams take NaN
        methods = {key: make for key, make in methods.items()
                   if key[1].startswith("Transformer")}
    rows = []
    for (kind, method), make in methods.items():
        clock = []
        model, memory, _ = peak_memory_growth(make(clock))
        metric = log_likelihood(model) if kind == "mixture" else inertia(model)
        rows.append(dict(dataset=source.name, n_features=source.n_features, kind=kind,
                         method=method, metric=metric,
                         memory_mib=memory, seconds=clock[0], n_rows=n_rows, batch_size=size,
                         rows_per_second=(n_rows if "partial_fit" in method else size)
                         / clock[0]))
        print(f"  {source.name} {size:,} {method}: {metric:.4f}, {memory:.1f} MiB, "
              f"{clock[0]:.1f} s", flush=True)
    return rows


def run_full_fit(source: Stream, X: np.ndarray, checkpoint, seed: int) -> dict:
    """``TransformerGMM.fit`` on every row: the rows are made first, outside the measure."""
    from transformer_gmm import TransformerGMM

    n_rows = len(X)
    gmm = TransformerGMM(source.n_components, checkpoint=checkpoint, random_state=seed,
                         device="cpu")
    model, memory, seconds = peak_memory_growth(lambda: gmm.fit(X))
    metric = float(model.score(X))
    print(f"  {source.name} fit on {n_rows:,} rows: {metric:.4f}, {memory:.1f} MiB, "
          f"{seconds:.1f} s, {model.n_iter_} iterations", flush=True)
    return dict(dataset=source.name, n_features=source.n_features, kind="mixture",
                method="TransformerGMM.fit (all rows)",
                metric=metric, memory_mib=memory, seconds=seconds, n_rows=n_rows,
                batch_size=n_rows, rows_per_second=n_rows / seconds)


def warm_up(checkpoint, seed: int) -> None:
    """Load the transformer's weights (once per process) before any measure."""
    from transformer_gmm import TransformerClusterer, TransformerGMM

    X = np.random.default_rng(seed).normal(size=(500, 2))
    TransformerGMM(2, checkpoint=checkpoint, random_state=seed, device="cpu").fit(X)
    TransformerClusterer(2, checkpoint=checkpoint, random_state=seed, device="cpu").fit(X)


# --- the targets -----------------------------------------------------------------------------


def check_targets(rows: list[dict]) -> list[dict]:
    """One row per target, stream and batch size: the measure, the bound, whether it holds."""
    checks = []

    def add(row, target, value, bound, holds):
        checks.append(dict(dataset=row["dataset"], n_rows=row["n_rows"],
                           batch_size=row["batch_size"], target=target, value=value,
                           bound=bound, holds=bool(holds)))

    for row in rows:
        if row["method"] != "TransformerGMM.partial_fit":
            continue
        if row["batch_size"] == TARGET_BATCH and row["gap_to_full_fit"] != "":
            add(row, "mixture log-likelihood gap to fit (nats/row)", row["gap_to_full_fit"],
                -GAP_TARGET, abs(row["gap_to_full_fit"]) <= GAP_TARGET)
    for row in rows:
        if row["method"].endswith("partial_fit") and row["method"] != "MiniBatchKMeans.partial_fit":
            batch_mib = row["batch_size"] * row["n_features"] * 8 / MiB
            bound = 2 * batch_mib + MEMORY_SLACK_MIB
            add(row, f"{row['method'].split('.')[0]} peak memory growth (MiB)",
                row["memory_mib"], bound, row["memory_mib"] <= bound)
    for row in rows:
        if row["method"] != "TransformerClusterer.partial_fit":
            continue
        ours = row
        theirs = next((r for r in rows if r["method"] == "MiniBatchKMeans.partial_fit"
                       and r["dataset"] == row["dataset"]
                       and r["batch_size"] == row["batch_size"]
                       and r["n_rows"] == row["n_rows"]), None)
        if theirs is None:  # a stream with gaps, which MiniBatchKMeans does not take
            continue
        tolerance = 1e-9 * abs(theirs["metric"])  # the same centres, to rounding
        add(ours, "clusterer inertia per row (<= MiniBatchKMeans)", ours["metric"],
            theirs["metric"], ours["metric"] <= theirs["metric"] + tolerance)
        add(ours, "clusterer seconds (<= MiniBatchKMeans)", ours["seconds"],
            theirs["seconds"], ours["seconds"] <= theirs["seconds"])
    return checks


# --- reporting -------------------------------------------------------------------------------


def print_table(rows: list[dict]) -> None:
    print(f"\n{'data':<10} {'rows':>11} {'batch':>11}  {'method':<36} {'metric':>10} "
          f"{'gap':>8} {'MiB':>8} {'rows/s':>11}")
    for row in rows:
        gap = "" if row["gap_to_full_fit"] == "" else f"{row['gap_to_full_fit']:+.4f}"
        print(f"{row['dataset']:<10} {row['n_rows']:>11,} {row['batch_size']:>11,}  "
              f"{row['method']:<36} {row['metric']:>10.4f} {gap:>8} "
              f"{row['memory_mib']:>8.1f} {row['rows_per_second']:>11,.0f}")
    print("metric: mean log-likelihood per row on all rows (mixture, higher is better), "
          "mean inertia per row (clustering, lower is better); gap: to the fit on all rows; "
          "rows/s: of the fitting calls (GaussianMixture: its subsample)")


def print_targets(checks: list[dict]) -> None:
    print("\nTargets")
    for check in checks:
        print(f"{check['dataset']:<10} {check['batch_size']:>9,}  {check['target']:<48} "
              f"{check['value']:>10.4f} vs {check['bound']:>10.4f}  "
              f"{'holds' if check['holds'] else 'MISSED'}")


def plot(rows: list[dict], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    columns = [
        ("mixture", "gap_to_full_fit", "log-likelihood - fit on all rows\n(nats/row)", False),
        ("clustering", "metric", "inertia per row", False),
        (None, "rows_per_second", "rows per second", True),
        (None, "memory_mib", "peak memory growth (MiB)", False),
    ]
    fig, axes = plt.subplots(len(datasets), len(columns), squeeze=False,
                             figsize=(3.3 * len(columns), 2.8 * len(datasets) + 0.9))
    methods = list(dict.fromkeys(r["method"].split(" on ")[0] for r in rows))
    for i, dataset in enumerate(datasets):
        for (kind, key, label, ylog), ax in zip(columns, axes[i], strict=True):
            for index, method in enumerate(methods):
                line = [r for r in rows if r["dataset"] == dataset
                        and r["method"].split(" on ")[0] == method
                        and (kind is None or r["kind"] == kind) and r[key] != ""]
                if not line or method.startswith("TransformerGMM.fit"):
                    continue
                ax.plot([r["batch_size"] for r in line], [r[key] for r in line], marker="o",
                        markersize=3, color=f"C{index}", label=method)
            if kind is None or kind == "mixture":
                full = [r for r in rows if r["dataset"] == dataset
                        and r["method"].startswith("TransformerGMM.fit")]
                if full and key != "gap_to_full_fit":
                    ax.axhline(full[0][key], color="k", lw=0.8, ls="--",
                               label="TransformerGMM.fit (all rows)")
            if key == "memory_mib":
                sizes = sorted({r["batch_size"] for r in rows if r["dataset"] == dataset
                                and r["method"].endswith("partial_fit")})
                width = next(r["n_features"] for r in rows if r["dataset"] == dataset)
                ax.plot(sizes, [2 * s * width * 8 / MiB + MEMORY_SLACK_MIB for s in sizes],
                        color="0.5", lw=0.8, ls=":", label="two batches + 50 MB")
                ax.set_yscale("symlog", linthresh=1.0)
            if key == "gap_to_full_fit":
                ax.axhspan(-GAP_TARGET, GAP_TARGET, color="0.85", zorder=0)
                ax.set_yscale("symlog", linthresh=0.01)
            ax.set_xscale("log")
            if ylog:
                ax.set_yscale("log")
            ax.grid(alpha=0.3)
            ax.set_xlabel("batch size")
            if i == 0:
                ax.set_title(label, fontsize=9)
        axes[i, 0].set_ylabel(f"{dataset}\n({rows[0]['n_rows']:,} rows)")
    handles, labels = {}, {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=3, fontsize=8)
    del labels
    fig.tight_layout(rect=(0, 0.7 / fig.get_figheight(), 1, 1))
    return save_figure(fig, path)


def read_csv(path: Path) -> list[dict]:
    """The rows ``main`` wrote, numbers as numbers (an empty cell stays "")."""
    import csv

    def value(key, text):
        if text == "" or key in ("dataset", "kind", "method"):
            return text
        number = float(text)
        return int(number) if key in ("n_rows", "batch_size", "n_features") else number

    with path.open() as file:
        return [{k: value(k, v) for k, v in row.items()} for row in csv.DictReader(file)]


def main(argv=None) -> list[dict]:
    parser = shared_parser(__doc__, "10^5 rows in batches of 10^3 and 10^4: seconds")
    parser.add_argument("--n-rows", type=int, help="rows (default 10^7; --quick 10^5)")
    parser.add_argument("--batch-sizes", type=int, nargs="+",
                        help="rows per batch (default 10^3 10^4 10^5; --quick 10^3 10^4)")
    parser.add_argument("--datasets", nargs="+", default=["synthetic"],
                        choices=["synthetic", "diamonds", "flights", "cps", "mpls_stops",
                                 "county_murders"],
                        help="the streams (default synthetic; the published tables: "
                             "synthetic flights)")
    parser.add_argument("--no-full-fit", action="store_true",
                        help="leave out the fit on all rows (which holds them all in memory)")
    parser.add_argument("--checkpoint", default="default",
                        help="the transformer that starts the fits ('none': k-means++)")
    parser.add_argument("--out", default="streaming", help="file stem of the CSV and PNG")
    parser.add_argument("--gaps", type=float, default=0.0,
                        help="a share of every stream's entries missing at random (NaN, each "
                             "row keeping one): our streams and the fit on all rows alone, the "
                             "only methods that take them")
    parser.add_argument("--replot", action="store_true",
                        help="redraw the PNG and the targets from the CSV already written")
    args = parser.parse_args(argv)
    if args.replot:
        rows = read_csv(args.results / f"{args.out}.csv")
        print_table(rows)
        checks = check_targets(rows)
        print_targets(checks)
        write_csv(checks, args.results / f"{args.out}_targets.csv")
        plot(rows, args.results / f"{args.out}.png")
        return rows
    n_rows = args.n_rows or (10**5 if args.quick else 10**7)
    sizes = args.batch_sizes or ([10**3, 10**4] if args.quick else [10**3, 10**4, 10**5])
    if any(size % BLOCK or n_rows % size for size in sizes):
        parser.error(f"batch sizes must be multiples of {BLOCK} that divide --n-rows")
    checkpoint = None if args.checkpoint == "none" else args.checkpoint
    import torch

    torch.set_num_threads(1)
    rows = []
    with single_threaded(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # convergence warnings of the small fits
        warm_up(checkpoint, args.seed)
        for name in args.datasets:
            source = make_stream(name, args.seed, args.gaps)
            X, part = every_row(source, n_rows), []
            if not args.no_full_fit:
                part.append(run_full_fit(source, X, checkpoint, args.seed))
            for size in sizes:
                part.extend(run_size(source, X, size, checkpoint, args.seed))
            del X
            full = part[0]["metric"] if not args.no_full_fit else None
            for row in part:
                row["gap_to_full_fit"] = (row["metric"] - full if row["kind"] == "mixture"
                                          and full is not None else "")
            rows.extend(part)
            write_csv(rows, args.results / f"{args.out}.csv")  # what is done so far
    print_table(rows)
    checks = check_targets(rows)
    print_targets(checks)
    write_csv(rows, args.results / f"{args.out}.csv")
    write_csv(checks, args.results / f"{args.out}_targets.csv")
    plot(rows, args.results / f"{args.out}.png")
    return rows


if __name__ == "__main__":
    main()
