"""Missing values: how much could the transformer gain by reading the gaps?

On data with NaN the transformer reads the rows with each gap filled by its column's mean.
A model that read the gaps themselves could at best start as well as one that reads the
same rows with no gaps at all. This measures that bound, on the datasets and gaps of
``missing.py`` (the same rows held out, the same entries removed), full covariances:

- "imputed": the transformer's start as a fit on the data with NaN makes it
  (``TransformerGMM(n_init=1, max_iter=0)``: its reading of the mean-imputed rows, one
  M-step);
- "complete": the same model's start on the same rows with nothing missing (an oracle no
  fit has: the reading and the M-step see every entry).

and, for each ``--checkpoint NAME=PATH``, a reading "NAME": that checkpoint's start on the
data with NaN (a checkpoint trained with ``reads_gaps`` reads where the gaps are; one
fine-tuned the same way without it is the control that tells the gaps' part from the
fine-tune's).

Each start alone (its held-out log-likelihood of the observed entries, per row, and the
ARI of its labels), and each followed by the same EM on the observed entries
(``TransformerGMM`` with the start as ``weights_init``, ``means_init`` and
``precisions_init``): ARI, held-out log-likelihood and EM iterations; and, for the
readings of the data with NaN, the whole default fit with that checkpoint
(``TransformerGMM(k)``: ``fit_ari``, ``fit_heldout_ll``). Each reading minus "imputed"
is paired over (dataset, seed).

    python benchmarks/missing_reading.py            # 8 datasets, 3 seeds (minutes)
    python benchmarks/missing_reading.py --quick    # iris and crabs, 30 %, one seed
    python benchmarks/missing_reading.py --large    # 4 tables of 20,000 rows, 2 seeds
    python benchmarks/missing_reading.py --checkpoint gaps=runs/gaps/checkpoint \
        control=runs/control/checkpoint --out missing_reading_gaps

Prints the table and writes missing_reading_fits.csv and missing_reading.csv.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
from sklearn.metrics import adjusted_rand_score

sys.path.insert(0, str(Path(__file__).parent))
import missing  # noqa: E402
from common import shared_parser, single_threaded, write_csv  # noqa: E402

from transformer_gmm import TransformerGMM  # noqa: E402


def start_and_fit(read_on: np.ndarray, X: np.ndarray, held: np.ndarray, labels, k: int,
                  seed: int, checkpoint: str = "default") -> dict:
    """``checkpoint``'s start read on ``read_on``, alone and then EM on ``X`` (with NaN);
    and its default fit of ``X`` where it reads ``X`` itself."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # max_iter=0 does not converge, by design
        start = TransformerGMM(
            k, n_init=1, max_iter=0, checkpoint=checkpoint, random_state=seed).fit(read_on)
        fitted = TransformerGMM(
            k, weights_init=start.weights_, means_init=start.means_,
            precisions_init=start.precisions_, random_state=seed,
        ).fit(X)
        default = None
        if read_on is X:
            default = TransformerGMM(k, checkpoint=checkpoint, random_state=seed).fit(X)
    return dict(
        start_ari=adjusted_rand_score(labels, missing.marginal_labels(X, start)),
        start_heldout_ll=missing.marginal_ll(held, start),
        ari=adjusted_rand_score(labels, fitted.predict(X)),
        heldout_ll=missing.marginal_ll(held, fitted), n_iter=int(fitted.n_iter_),
        fit_ari=np.nan if default is None else adjusted_rand_score(labels, default.predict(X)),
        fit_heldout_ll=np.nan if default is None else missing.marginal_ll(held, default),
    )


def run(datasets, rates, seeds, checkpoints: dict[str, str]) -> list[dict]:
    """Every reading of every problem: "imputed", "complete", then each of ``checkpoints``
    (name: path) reading the data with NaN."""
    missing.warm_up()
    rows = []
    for name in datasets:
        data = missing.load(name)
        for seed in seeds:
            out = missing.split(len(data.X), seed)
            for pattern in missing.PATTERNS:
                for rate in rates:
                    rng = np.random.default_rng([seed, int(rate * 100), len(pattern)])
                    X = missing.with_gaps(rng, data.X, pattern, rate)  # as missing.py's
                    setting = dict(dataset=name, pattern=pattern, rate=rate, seed=seed)
                    fitted, held, labels = X[~out], X[out], data.labels[~out]
                    readings = [("imputed", fitted, "default"),
                                ("complete", data.X[~out], "default"),
                                *((name, fitted, path) for name, path in checkpoints.items())]
                    for reading, read_on, checkpoint in readings:
                        rows.append(dict(setting, reading=reading, **start_and_fit(
                            read_on, fitted, held, labels, data.n_components, seed,
                            checkpoint)))
            print(f"{name}: seed {seed} done", flush=True)
    return rows


METRICS = ("start_ari", "start_heldout_ll", "ari", "heldout_ll", "n_iter", "fit_ari",
           "fit_heldout_ll")


def summary(rows: list[dict]) -> list[dict]:
    """Per (pattern, rate) and reading other than "imputed": its means, the imputed
    reading's, and their difference, paired over (dataset, seed)."""
    table = []
    others = [r for r in dict.fromkeys(r["reading"] for r in rows) if r != "imputed"]
    for pattern, rate in dict.fromkeys((r["pattern"], r["rate"]) for r in rows):
        cell = [r for r in rows if r["pattern"] == pattern and r["rate"] == rate]
        by_pair = {}
        for r in cell:
            by_pair.setdefault((r["dataset"], r["seed"]), {})[r["reading"]] = r
        for reading in others:
            line = dict(pattern=pattern, rate=rate, reading=reading, pairs=len(by_pair))
            for metric in METRICS:
                for name in ("imputed", reading):
                    line[f"{'reading' if name == reading else name}_{metric}"] = (
                        missing._mean_se(r[metric] for r in cell if r["reading"] == name)[0])
                mean, se = missing._mean_se(
                    p[reading][metric] - p["imputed"][metric] for p in by_pair.values())
                line[f"difference_{metric}"], line[f"difference_{metric}_se"] = mean, se
            table.append(line)
    return table


def print_summary(table: list[dict]) -> None:
    print("\neach reading - imputed reading, paired (mean +- se); the means beside")
    for metric in METRICS:
        print(f"\n{metric}")
        for t in table:
            print(f"  {t['pattern']:>4} {t['rate']:.0%} {t['reading']:>9}: "
                  f"imputed {t[f'imputed_{metric}']:9.3f}  it {t[f'reading_{metric}']:9.3f}"
                  f"  difference {t[f'difference_{metric}']:+8.3f} +- "
                  f"{t[f'difference_{metric}_se']:.3f}")


def main(argv=None):
    parser = shared_parser(__doc__, "iris and crabs, 30 % missing, MCAR and MAR, one seed")
    parser.add_argument("--seeds", type=int, default=None,
                        help="seeds per dataset (default 3; 2 with --large)")
    parser.add_argument("--out", default="missing_reading", help="file stem of the CSVs")
    parser.add_argument("--checkpoint", nargs="*", default=[], metavar="NAME=PATH",
                        help="more readings: each checkpoint reads the data with NaN")
    parser.add_argument("--large", action="store_true",
                        help=f"the large tables ({', '.join(missing.LARGE)}), "
                             f"{missing.LARGE_ROWS:,} rows each, 2 seeds")
    options = parser.parse_args(argv)
    checkpoints = dict(item.split("=", 1) for item in options.checkpoint)
    datasets = (missing.QUICK_DATASETS if options.quick
                else missing.LARGE if options.large else missing.DATASETS)
    n_seeds = options.seeds or (2 if options.large else 3)
    rates = (0.3,) if options.quick else missing.RATES
    seeds = [1000 * options.seed + i for i in range(1 if options.quick else n_seeds)]
    with single_threaded():
        import torch

        torch.set_num_threads(1)
        rows = run(datasets, rates, seeds, checkpoints)
    table = summary(rows)
    print_summary(table)
    for path in (write_csv(rows, options.results / f"{options.out}_fits.csv"),
                 write_csv(table, options.results / f"{options.out}.csv")):
        print(f"wrote {path}")
    return rows, table


if __name__ == "__main__":
    main()
