"""Large real data: does a start that reads many draws of rows lead EM further than one?

The transformer reads 128 rows of up to 100,000. Two ways to let one start see more of them,
each from ``--reads`` V independent draws (the views of one forward pass, each reading
other rows), then the same EM on every row as ``TransformerGMM(n_init=1)``:

- "merged": the V starts' responsibilities on every row, their components matched to one
  another (the Hungarian assignment on the overlap of the responsibilities, three rounds
  against the running mean) and averaged; one M-step on the average;
- "likeliest": the V starts (one M-step each), the likeliest on a uniform draw of 8,192
  rows chosen before EM;
- "summary" (``--ways summary``): one read of a weighted summary of many rows instead of
  128 drawn ones (``engine.summary``): Lloyd's algorithm cuts a uniform draw of 8,192
  rows, in model space, into 128 cells (from 128 drawn rows, at most 8 iterations); the
  model reads each cell's centre with the cell's count as its weight, which it reads
  exactly as that many copies (``MixtureTransformer.forward``'s ``weights``). Its mixture
  scores every row and one M-step gives the start, as the mixture start of ``n_init=1``
  does.

Against ``TransformerGMM(n_init=1)`` (one draw) and ``TransformerGMM(checkpoint=None,
n_init=1)`` (one k-means++ start, the same EM), paired on the fits of
``realdata_large.py`` (five tables, K = 3, 5, 8, full and diag, seeds ``1000 * --seed + i``).

    python benchmarks/merged_reads.py --seed 5    # about 25 minutes on one core
    python benchmarks/merged_reads.py --quick     # one dataset, 20,000 rows
    python benchmarks/merged_reads.py --ways summary --seed 44   # about 12 minutes

Prints realdata_large.py's table (with the paired columns against k-means++) and each
method against one read, and writes merged_reads_fits.csv and merged_reads.csv.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

sys.path.insert(0, str(Path(__file__).parent))
import realdata_large as large  # noqa: E402
from common import shared_parser  # noqa: E402
from large_datasets import LARGE_DATASETS  # noqa: E402

from transformer_gmm import TransformerGMM  # noqa: E402
from transformer_gmm.engine import readout  # noqa: E402
from transformer_gmm.engine.fit import SELECTION_ROWS  # noqa: E402
from transformer_gmm.engine.standardize import (  # noqa: E402
    fit_standardization,
    subsample_rows,
    take_rows,
)
from transformer_gmm.engine.summary import summarize  # noqa: E402
from transformer_gmm.storage import load_model  # noqa: E402

REG_COVAR = 1e-6  # TransformerGMM's default
CHOICE_ROWS = 8192
WAYS = ("merged", "likeliest", "summary")


def start_from(X: np.ndarray, resp: np.ndarray, covariance: str):
    """Weights, means and precisions of one M-step on ``resp`` (N, K)."""
    counts = resp.sum(0) + 10 * np.finfo(float).eps
    means = resp.T @ X / counts[:, None]
    if covariance == "diag":
        return counts / counts.sum(), means, 1 / (resp.T @ X**2 / counts[:, None] - means**2
                                                  + REG_COVAR)
    precisions = []
    for k, mean in enumerate(means):
        centred = X - mean
        covariance_k = (resp[:, k, None] * centred).T @ centred / counts[k]
        precisions.append(np.linalg.inv(covariance_k + REG_COVAR * np.eye(X.shape[1])))
    return counts / counts.sum(), means, np.array(precisions)


def mean_log_likelihood(X, weights, means, precisions, covariance: str) -> float:
    log_prob = np.empty((len(X), len(weights)))
    for k, (mean, precision) in enumerate(zip(means, precisions, strict=True)):
        centred = X - mean
        if covariance == "diag":
            log_prob[:, k] = -0.5 * (centred**2 * precision).sum(1) + 0.5 * np.log(precision).sum()
        else:
            factor = np.linalg.cholesky(precision)
            log_prob[:, k] = (-0.5 * ((centred @ factor) ** 2).sum(1)
                              + np.log(np.diag(factor)).sum())
    log_prob += np.log(weights) - 0.5 * X.shape[1] * np.log(2 * np.pi)
    top = log_prob.max(1, keepdims=True)
    return float((top[:, 0] + np.log(np.exp(log_prob - top).sum(1))).mean())


def merge(resps: list[np.ndarray], rounds: int = 3) -> np.ndarray:
    """The mean of responsibilities (N, K) whose components are matched to the running mean
    (the Hungarian assignment on their overlap), ``rounds`` times."""
    merged = resps[0]
    for _ in range(rounds):
        merged = np.mean([r[:, linear_sum_assignment(-(merged.T @ r))[1]] for r in resps], axis=0)
    return merged


def summary_responsibilities(X: np.ndarray, n_components: int, seed: int) -> np.ndarray:
    """Every row's responsibilities (N, K) under the mixture the model reads off a weighted
    summary of ``X`` (module docstring)."""
    model = load_model("default")
    reads = model.reading_config
    x = torch.from_numpy(X)[None]
    standardization = fit_standardization(x, None, model.config.d_max, n_components,
                                          reads.noise_directions)
    z = standardization.transform(x)  # (1, N, d_max)
    generator = torch.Generator().manual_seed(seed)
    index, _ = subsample_rows(tuple(z.shape[:2]), None, SELECTION_ROWS, generator)
    cells = summarize(z if index is None else take_rows(z, index), None, reads.context_size,
                      generator)
    with torch.inference_mode():
        out = model(cells.centres, n_components, weights=cells.counts)
    resp = readout.model_space_responsibilities(z.double(), standardization.n_kept, out, None)
    return resp[0].numpy()


class ReadsStart:
    """One start from ``reads`` draws of rows (``how``: "merged" or "likeliest"), then EM on
    every row as ``TransformerGMM(checkpoint=None, n_init=1)`` runs it from given starts."""

    def __init__(self, n_components, covariance, seed, reads, how):
        self.n_components, self.covariance, self.seed = n_components, covariance, seed
        self.reads, self.how = reads, how

    def _responsibilities(self, X: np.ndarray) -> list[np.ndarray]:
        generator = torch.Generator().manual_seed(self.seed)
        starts = readout.mixture_inits(load_model("default"), torch.from_numpy(X)[None], None,
                                       self.n_components, generator, n_starts=2 * self.reads)
        return [start.resp[0].numpy() for start in starts[::2]]  # each view's mixture start

    def fit(self, X: np.ndarray):
        if self.how == "summary":
            start = start_from(X, summary_responsibilities(X, self.n_components, self.seed),
                               self.covariance)
            return self._em(X, start)
        resps = self._responsibilities(X)
        if self.how == "merged":
            start = start_from(X, merge(resps), self.covariance)
        else:
            rows = X[np.random.default_rng(self.seed).choice(len(X), min(len(X), CHOICE_ROWS),
                                                             replace=False)]
            starts = [start_from(X, r, self.covariance) for r in resps]
            start = max(starts, key=lambda s: mean_log_likelihood(rows, *s, self.covariance))
        return self._em(X, start)

    def _em(self, X: np.ndarray, start):
        weights, means, precisions = start
        self.fitted_ = TransformerGMM(
            self.n_components, covariance_type=self.covariance, checkpoint=None,
            weights_init=weights, means_init=means, precisions_init=precisions,
            random_state=self.seed,
        ).fit(X)
        for name in ("n_iter_", "converged_", "weights_", "means_", "covariances_", "reg_covar"):
            setattr(self, name, getattr(self.fitted_, name))
        self.init_method_ = self.how
        return self

    def score(self, X):
        return self.fitted_.score(X)

    def predict(self, X):
        return self.fitted_.predict(X)


def against_one_read(rows: list[dict], method: str) -> str:
    """``method`` minus ``TransformerGMM(n_init=1)``, paired: likelier / less likely fits
    (0.001 nats per point) and the mean LL difference with its standard error."""
    ours, one = large._by_fit(rows, method), large._by_fit(rows, large.TGMM1)
    gaps = np.array([ours[k]["ll"] - one[k]["ll"] for k in ours if k in one])
    return (f"likelier {np.sum(gaps > large.AS_LIKELY)}, less likely "
            f"{np.sum(gaps < -large.AS_LIKELY)} of {len(gaps)}; mean dLL {gaps.mean():+.4f} "
            f"+- {gaps.std(ddof=1) / np.sqrt(len(gaps)) if len(gaps) > 1 else np.nan:.4f}")


def main(argv: list[str] | None = None) -> list[dict]:
    parser = shared_parser(__doc__, f"one dataset subsampled to {large.QUICK_ROWS:,} rows, "
                                    "K = 3, full, one seed")
    parser.add_argument("--reads", type=int, default=8, help="draws of rows a start reads (8)")
    parser.add_argument("--ways", nargs="+", choices=WAYS, default=WAYS[:2],
                        help="the starts beside one read (merged, likeliest)")
    parser.add_argument("--out", default="merged_reads", help="file stem of the CSVs")
    args = parser.parse_args(argv)
    found = {name: make for name, make in large.methods([]).items()
             if name in (large.GMM1, large.TGMM1, large.KMEANS_PP)}
    for how in args.ways:
        label = "a weighted summary" if how == "summary" else f"{how} of {args.reads} reads"
        found[f"{large.TGMM} {label}"] = (
            lambda k, cov, seed, how=how: ReadsStart(k, cov, seed, args.reads, how))
    names = ["cps"] if args.quick else list(LARGE_DATASETS)
    covariances = ["full"] if args.quick else ["full", "diag"]
    components = [3] if args.quick else list(large.COMPONENTS)
    seeds = [1000 * args.seed + i for i in range(1 if args.quick else 2)]
    rows = large.fit_every(names, components, covariances, seeds, found, args.quick)
    table = large.summary(rows)
    large.print_summary(table)
    print()
    for covariance in covariances:
        own = [r for r in rows if r["covariance"] == covariance]
        for method in (m for m in found if "reads" in m or "summary" in m):
            print(f"{covariance:5} {method:40} vs one read: {against_one_read(own, method)}")
    large.write_tables(rows, table, args.results, args.out)
    return rows


if __name__ == "__main__":
    main()
