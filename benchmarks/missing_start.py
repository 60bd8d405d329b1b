"""Where EM on the observed entries starts: with or without EM on the mean-imputed rows.

``TransformerGMM`` fits data with NaN by EM on the observed entries alone, from a start
read on the rows with each gap filled by its column's mean. With ``n_init="auto"`` that
start is the transformer's reading, with no EM on the imputed rows ("reading"); with an
int ``n_init`` the starts run EM on the imputed rows and the best goes on ("imputed EM";
``n_init=4``: the transformer's two starts and two k-means++ ones, as ``"auto"`` runs on
complete data). On the gaps and held-out rows of ``missing.py`` (MCAR and MAR, 10, 30 and
50 % of the entries), both fits and the ``IterativeImputer`` then ``GaussianMixture``
pipeline, each timed in the same loop on one thread. Reported per cell, reading minus
imputed EM, paired over datasets and seeds: ARI against the classes, the final mean
log-likelihood of the observed entries (the lower bound, what EM maximises), the held-out
rows' observed-entry log-likelihood; and each fit's time as a ratio to the pipeline's
(geometric mean).

    python benchmarks/missing_start.py            # the eight small tables, 3 seeds
    python benchmarks/missing_start.py --large    # the four large tables, 2 seeds
    python benchmarks/missing_start.py --quick    # two small tables, one seed

Prints the table and writes benchmarks/results/missing_start{,_large}.csv and its
``_fits.csv``.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
import torch
from sklearn.experimental import enable_iterative_imputer  # noqa: F401
from sklearn.impute import IterativeImputer
from sklearn.metrics import adjusted_rand_score
from sklearn.mixture import GaussianMixture

sys.path.insert(0, str(Path(__file__).parent))
from common import single_threaded, standard_parser, timed, write_csv  # noqa: E402
from missing import (  # noqa: E402
    DATASETS,
    LARGE,
    PATTERNS,
    QUICK_DATASETS,
    RATES,
    gapped,
    marginal_ll,
    warm_up,
)

from transformer_gmm import TransformerGMM  # noqa: E402

STARTS = {"reading": "auto", "imputed EM": 4}  # the name of each start, and its n_init


def fit_both(X, held, labels, k: int, seed: int, covariance: str) -> dict:
    """Both fits of ``X`` and the pipeline's, for one (dataset, seed, gaps): a row of
    each fit's ARI, lower bound, held-out log-likelihood, iterations and time ratio."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")

        def pipeline():
            imputed = IterativeImputer(random_state=seed).fit_transform(X)
            return GaussianMixture(k, covariance_type=covariance, random_state=seed).fit(imputed)

        _, reference_ms = timed(pipeline)
        row = {}
        for name, n_init in STARTS.items():
            gmm, ms = timed(lambda n_init=n_init: TransformerGMM(
                k, covariance_type=covariance, n_init=n_init, random_state=seed).fit(X))
            row |= {
                f"{name}_ari": adjusted_rand_score(labels, gmm.predict(X)),
                f"{name}_ll": gmm.lower_bound_,
                f"{name}_held_ll": marginal_ll(held, gmm),
                f"{name}_iter": gmm.n_iter_,
                f"{name}_time_ratio": ms / reference_ms,
            }
    return row


def run(datasets, seeds, covariance: str) -> list[dict]:
    warm_up()
    rows = []
    for data, seed, pattern, rate, X, out in gapped(datasets, RATES, PATTERNS, seeds):
        fitted = fit_both(X[~out], X[out], data.labels[~out], data.n_components, seed,
                          covariance)
        rows.append(dict(dataset=data.name, n=int((~out).sum()), d=X.shape[1],
                         pattern=pattern, rate=rate, seed=seed, covariance=covariance,
                         **fitted))
    return rows


def _paired(diff: np.ndarray, digits: int = 3) -> str:
    se = diff.std(ddof=1) / np.sqrt(len(diff)) if len(diff) > 1 else np.nan
    return f"{diff.mean():+.{digits}f} ± {se:.{digits}f}"


def summary(rows: list[dict]) -> list[dict]:
    table = []
    for pattern in PATTERNS:
        for rate in RATES:
            cell = [r for r in rows if r["pattern"] == pattern and r["rate"] == rate]
            if not cell:
                continue

            def difference(key, cell=cell):
                return np.array([r[f"reading_{key}"] - r[f"imputed EM_{key}"] for r in cell])

            def time_ratio(name, cell=cell):
                ratios = np.array([r[f"{name}_time_ratio"] for r in cell])
                return float(np.exp(np.log(ratios).mean()))

            ll = difference("ll")
            table.append(dict(
                pattern=pattern,
                rate=rate,
                fits=len(cell),
                ari=_paired(difference("ari")),
                ll=_paired(ll, 4),
                ll_median=float(np.median(ll)),
                ll_at_least=float(np.mean(ll >= -1e-3)),  # level within 0.001 nats a row
                held_ll_median=float(np.median(difference("held_ll"))),
                reading_time=time_ratio("reading"),
                imputed_em_time=time_ratio("imputed EM"),
            ))
    return table


def print_table(table: list[dict]) -> None:
    print(
        "\n| pattern | missing | fits | ARI, reading - imputed EM | lower bound, reading - "
        "imputed EM (median; at least as likely) | held-out LL, median difference | time, "
        "reading / imputed EM |"
    )
    print("|---|---|---|---|---|---|---|")
    for t in table:
        print(
            f"| {t['pattern']} | {t['rate']:.0%} | {t['fits']} | {t['ari']} | {t['ll']} "
            f"({t['ll_median']:+.4f}; {t['ll_at_least']:.0%}) | {t['held_ll_median']:+.4f} | "
            f"{t['reading_time']:.2f} / {t['imputed_em_time']:.2f} |"
        )


def main(argv=None):
    parser = standard_parser(__doc__, "missing_start", "two small tables, one seed",
                             tasks=False)
    parser.add_argument("--large", action="store_true", help="the four large tables")
    parser.add_argument("--seeds", type=int, default=None, help="seeds (3; 2 with --large)")
    parser.add_argument("--covariance", default="full", choices=("full", "diag"))
    args = parser.parse_args(argv)
    datasets = QUICK_DATASETS if args.quick else (LARGE if args.large else DATASETS)
    n_seeds = args.seeds or (1 if args.quick else 2 if args.large else 3)
    torch.set_num_threads(1)
    with single_threaded():
        rows = run(datasets, range(args.seed, args.seed + n_seeds), args.covariance)
    table = summary(rows)
    print_table(table)
    out = args.out + ("_large" if args.large else "") + (
        "_diag" if args.covariance == "diag" else ""
    )
    results = Path(args.results)
    write_csv(rows, results / f"{out}_fits.csv")
    write_csv(table, results / f"{out}.csv")
    return rows, table


if __name__ == "__main__":
    main()
