"""Learning from a stream: ``partial_fit`` batch by batch against one fit on every row.

Rows of one fixed mixture (K = 5 Gaussians of random full covariances in d = 8, weights
from a Dirichlet) arrive in batches, each drawn afresh from its own seed, so the stream
never holds more than a batch. Per batch size:

- mixtures: ``TransformerGMM.partial_fit`` over the stream; ``TransformerGMM.fit`` on all
  the rows at once; ``GaussianMixture`` fitted on a random subsample of one batch's rows
  (the memory the stream holds);
- clusterings: ``TransformerClusterer.partial_fit`` against ``MiniBatchKMeans.partial_fit``
  on the same batches.

Measured: the mean log-likelihood per row on all the rows (mixtures) or the mean inertia
per row (clusterings), both read batch by batch; the peak memory growth of the fit over
what was resident before it (``VmHWM``, reset through ``/proc/self/clear_refs``; in one
process, so a later fit may reuse memory an earlier one freed); rows per second. All on
CPU with one thread.

    python benchmarks/streaming.py --quick   # 10^5 rows in batches of 10^3 and 10^4
    python benchmarks/streaming.py           # 10^7 rows in batches of 10^3, 10^4, 10^5

Prints a table and writes benchmarks/results/streaming.csv. Linux only (memory).
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from common import peak_memory_growth, shared_parser, single_threaded, write_csv  # noqa: E402

N_COMPONENTS, N_FEATURES = 5, 8


# --- the stream ------------------------------------------------------------------------------


BLOCK = 1_000  # rows drawn at once; batch sizes are multiples of it


class Mixture:
    """A fixed mixture to draw rows from. Rows come in blocks of ``BLOCK``, block ``j``
    drawn from the seed and ``j`` alone, and a batch is consecutive blocks: every batch
    size streams the same rows, and block ``10**9`` on are rows the stream never shows."""

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

    def batch(self, i: int, size: int) -> np.ndarray:
        per_batch = size // BLOCK
        return np.concatenate([self.block(i * per_batch + j) for j in range(per_batch)])

    def stream(self, n_rows: int, size: int) -> Iterator[np.ndarray]:
        for i in range(n_rows // size):
            yield self.batch(i, size)


def over_stream(mixture: Mixture, n_rows: int, size: int, score: Callable) -> float:
    """The mean per row of ``score(batch)`` (a sum over the batch) over every row."""
    return sum(score(batch) for batch in mixture.stream(n_rows, size)) / n_rows


# --- the methods -----------------------------------------------------------------------------


def streamed(estimator, mixture: Mixture, n_rows: int, size: int):
    def fit():
        for batch in mixture.stream(n_rows, size):
            estimator.partial_fit(batch)
        return estimator

    return fit


def run_size(mixture: Mixture, n_rows: int, size: int, checkpoint, seed: int) -> list[dict]:
    from sklearn.cluster import MiniBatchKMeans
    from sklearn.mixture import GaussianMixture

    from transformer_gmm import TransformerClusterer, TransformerGMM

    def log_likelihood(model) -> float:
        return over_stream(mixture, n_rows, size, lambda b: float(model.score_samples(b).sum()))

    def inertia(model) -> float:
        return over_stream(mixture, n_rows, size, lambda b: -float(model.score(b)))

    gmm = dict(n_components=N_COMPONENTS, checkpoint=checkpoint, random_state=seed, device="cpu")
    mixtures = {
        "TransformerGMM.partial_fit": streamed(TransformerGMM(**gmm), mixture, n_rows, size),
        f"GaussianMixture on {size:,} rows": lambda: GaussianMixture(
            N_COMPONENTS, random_state=seed
        ).fit(mixture.batch(10**9 // (size // BLOCK), size)),  # rows the stream never shows
    }
    clusterers = {
        "TransformerClusterer.partial_fit": streamed(
            TransformerClusterer(N_COMPONENTS, checkpoint=checkpoint, random_state=seed,
                                 device="cpu"),
            mixture, n_rows, size,
        ),
        "MiniBatchKMeans.partial_fit": streamed(
            MiniBatchKMeans(N_COMPONENTS, random_state=seed, n_init=1), mixture, n_rows, size
        ),
    }
    rows = []
    for method, fit in mixtures.items():
        model, memory, seconds = peak_memory_growth(fit)
        rows.append(dict(kind="mixture", method=method, metric=log_likelihood(model),
                         memory_mib=memory, seconds=seconds))
    for method, fit in clusterers.items():
        model, memory, seconds = peak_memory_growth(fit)
        rows.append(dict(kind="clustering", method=method, metric=inertia(model),
                         memory_mib=memory, seconds=seconds))
    for row in rows:
        row.update(n_rows=n_rows, batch_size=size, rows_per_second=n_rows / row["seconds"])
    return rows


def run_full_fit(mixture: Mixture, n_rows: int, size: int, checkpoint, seed: int) -> dict:
    """``TransformerGMM.fit`` on every row: the rows are made first, outside the measure."""
    from transformer_gmm import TransformerGMM

    X = np.concatenate(list(mixture.stream(n_rows, size)))
    gmm = TransformerGMM(N_COMPONENTS, checkpoint=checkpoint, random_state=seed, device="cpu")
    model, memory, seconds = peak_memory_growth(lambda: gmm.fit(X))
    metric = float(model.score(X))
    return dict(kind="mixture", method="TransformerGMM.fit (all rows)", metric=metric,
                memory_mib=memory, seconds=seconds, n_rows=n_rows, batch_size=n_rows,
                rows_per_second=n_rows / seconds)


def print_table(rows: list[dict]) -> None:
    print(f"{'rows':>11} {'batch':>9}  {'method':<36} {'metric':>10} {'MiB':>8} "
          f"{'rows/s':>11}")
    for row in rows:
        print(f"{row['n_rows']:>11,} {row['batch_size']:>9,}  {row['method']:<36} "
              f"{row['metric']:>10.4f} {row['memory_mib']:>8.1f} {row['rows_per_second']:>11,.0f}")
    print("metric: mean log-likelihood per row on all rows (mixture, higher is better), "
          "mean inertia per row (clustering, lower is better)")


def main(argv=None) -> list[dict]:
    parser = shared_parser(__doc__, "10^5 rows in batches of 10^3 and 10^4: a minute or two")
    parser.add_argument("--n-rows", type=int, help="rows (default 10^7; --quick 10^5)")
    parser.add_argument("--batch-sizes", type=int, nargs="+",
                        help="rows per batch (default 10^3 10^4 10^5; --quick 10^3 10^4)")
    parser.add_argument("--checkpoint", default="default",
                        help="the transformer that starts the fits ('none': k-means++)")
    args = parser.parse_args(argv)
    n_rows = args.n_rows or (10**5 if args.quick else 10**7)
    sizes = args.batch_sizes or ([10**3, 10**4] if args.quick else [10**3, 10**4, 10**5])
    if any(size % BLOCK or n_rows % size for size in sizes):
        parser.error(f"batch sizes must be multiples of {BLOCK} that divide --n-rows")
    checkpoint = None if args.checkpoint == "none" else args.checkpoint
    import torch

    torch.set_num_threads(1)
    mixture = Mixture(args.seed)
    rows = []
    with single_threaded(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # convergence warnings of the small fits
        rows.append(run_full_fit(mixture, n_rows, max(sizes), checkpoint, args.seed))
        for size in sizes:
            rows.extend(run_size(mixture, n_rows, size, checkpoint, args.seed))
    full = rows[0]["metric"]
    for row in rows:
        row["gap_to_full_fit"] = row["metric"] - full if row["kind"] == "mixture" else ""
    print_table(rows)
    write_csv(rows, args.results / "streaming.csv")
    return rows


if __name__ == "__main__":
    main()
