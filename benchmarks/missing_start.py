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
from sklearn.experimental import enable_iterative_imputer  # noqa: F401
from sklearn.impute import IterativeImputer
from sklearn.metrics import adjusted_rand_score
from sklearn.mixture import GaussianMixture

sys.path.insert(0, str(Path(__file__).parent))
import missing as gaps  # noqa: E402
from common import timed  # noqa: E402

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
                f"{name}_held_ll": gaps.marginal_ll(held, gmm),
                f"{name}_iter": gmm.n_iter_,
                f"{name}_time_ratio": ms / reference_ms,
            }
    return row


def run(datasets, seeds, covariance: str) -> list[dict]:
    gaps.warm_up()
    rows = []
    problems = gaps.gapped(datasets, gaps.RATES, gaps.PATTERNS, seeds)
    for data, seed, pattern, rate, X, out in problems:
        fitted = fit_both(X[~out], X[out], data.labels[~out], data.n_components, seed,
                          covariance)
        rows.append(dict(dataset=data.name, n=int((~out).sum()), d=X.shape[1],
                         pattern=pattern, rate=rate, seed=seed, covariance=covariance,
                         **fitted))
    return rows


def summary(rows: list[dict]) -> list[dict]:
    table = []
    for pattern, rate, cell in gaps.stage_cells(rows):

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
            ari=gaps.paired_text(difference("ari"), 3),
            ll=gaps.paired_text(ll),
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
    options = gaps.stage_parser(__doc__, "missing_start").parse_args(argv)
    return gaps.stage_main(
        options, lambda datasets, seeds: run(datasets, seeds, options.covariance),
        summary, print_table,
    )


if __name__ == "__main__":
    main()
