"""EM on the observed entries, plain against SQUAREM, from the same start.

``TransformerGMM`` fits data with NaN in two stages: a start read on the mean-imputed
rows, then EM on the observed entries alone (``engine.missing.fit_em_missing``). That EM
converges slowly where much is missing, and it runs accelerated by SQUAREM
(``engine.squarem``). This script isolates that second stage: for each dataset of
``missing.py`` (its gaps and held-out rows: MCAR and MAR, 10, 30 and 50 % of the
entries), a start is fitted once (the usual fit on the mean-imputed rows, as an int
``n_init`` runs it; the default's start, without that EM, is compared with it in
``missing_start.py``), then EM runs from its estimate twice, plain and accelerated,
timed on one thread (the better of ``--repeats``
alternating runs). Reported per cell: passes over the rows (iterations), time, the final
mean log-likelihood (the lower bound) and the held-out rows' observed-entry
log-likelihood, accelerated minus plain, paired over datasets and seeds.

    python benchmarks/missing_acceleration.py            # the small tables, 3 seeds
    python benchmarks/missing_acceleration.py --large    # the four large tables, 2 seeds
    python benchmarks/missing_acceleration.py --quick    # two small tables, one seed

Prints the tables and writes benchmarks/results/missing_acceleration{,_large}.csv and
its ``_fits.csv``.
"""

from __future__ import annotations

import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import missing as gaps  # noqa: E402

from transformer_gmm import TransformerGMM  # noqa: E402
from transformer_gmm._missing import mean_imputed  # noqa: E402
from transformer_gmm.engine.missing import fit_em_missing  # noqa: E402


def em_from(start: TransformerGMM, X: np.ndarray, accelerate: bool, repeats: int):
    """EM on the observed entries of ``X`` from ``start``'s estimate; (result, seconds)."""
    best = np.inf
    for _ in range(repeats):
        began = time.perf_counter()
        result = fit_em_missing(
            X,
            start.weights_,
            start.means_,
            start.covariances_,
            covariance_type=start.covariance_type,
            reg_covar=start.reg_covar,
            max_iter=start.max_iter,
            tol=start.tol,
            accelerate=accelerate,
        )
        best = min(best, time.perf_counter() - began)
    return result, best


def as_fitted(start: TransformerGMM, result) -> TransformerGMM:
    """``start`` holding ``result``'s parameters, to score held-out rows."""
    fitted = TransformerGMM(**start.get_params())
    fitted.__dict__.update(
        {k: v for k, v in vars(start).items() if k.endswith("_") and not k.startswith("__")}
    )
    fitted.weights_ = result.weights.numpy()
    fitted.means_ = result.means.numpy()
    fitted.covariances_ = result.covariances.numpy()
    fitted.precisions_cholesky_ = result.precisions_cholesky.numpy()
    return fitted


def run(datasets, seeds, covariance: str, repeats: int) -> list[dict]:
    gaps.warm_up()
    rows = []
    problems = gaps.gapped(datasets, gaps.RATES, gaps.PATTERNS, seeds)
    for data, seed, pattern, rate, X, out in problems:
        fit_rows, held = X[~out], X[out]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            start = TransformerGMM(
                data.n_components, covariance_type=covariance, random_state=seed
            ).fit(mean_imputed(fit_rows))
        row = dict(dataset=data.name, n=len(fit_rows), d=X.shape[1], pattern=pattern,
                   rate=rate, seed=seed, covariance=covariance)
        for accelerate in (False, True):
            result, seconds = em_from(start, fit_rows, accelerate, repeats)
            label = "squarem" if accelerate else "plain"
            row[f"{label}_iter"] = result.n_iter
            row[f"{label}_converged"] = result.converged
            row[f"{label}_s"] = seconds
            row[f"{label}_ll"] = result.lower_bound
            row[f"{label}_held_ll"] = gaps.marginal_ll(held, as_fitted(start, result))
        rows.append(row)
    return rows


def summary(rows: list[dict]) -> list[dict]:
    table = []
    for pattern, rate, cell in gaps.stage_cells(rows):

        def column(key, cell=cell):
            return np.array([r[key] for r in cell], dtype=float)

        table.append(dict(
            pattern=pattern,
            rate=rate,
            fits=len(cell),
            plain_iter=float(np.median(column("plain_iter"))),
            squarem_iter=float(np.median(column("squarem_iter"))),
            iter_ratio=float(np.median(column("squarem_iter") / column("plain_iter"))),
            time_ratio=float(np.median(column("squarem_s") / column("plain_s"))),
            ll=gaps.paired_text(column("squarem_ll") - column("plain_ll")),
            held_ll=gaps.paired_text(column("squarem_held_ll") - column("plain_held_ll")),
            plain_converged=int(column("plain_converged").sum()),
            squarem_converged=int(column("squarem_converged").sum()),
        ))
    return table


def print_table(table: list[dict]) -> None:
    print(
        "\n| pattern | missing | fits | passes, plain / SQUAREM | median ratio of passes | "
        "median ratio of time | lower bound, SQUAREM - plain | held-out LL, SQUAREM - plain "
        "| converged, plain / SQUAREM |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for t in table:
        print(
            f"| {t['pattern']} | {t['rate']:.0%} | {t['fits']} | "
            f"{t['plain_iter']:.0f} / {t['squarem_iter']:.0f} | {t['iter_ratio']:.2f} | "
            f"{t['time_ratio']:.2f} | {t['ll']} | {t['held_ll']} | "
            f"{t['plain_converged']} / {t['squarem_converged']} |"
        )


def main(argv=None):
    parser = gaps.stage_parser(__doc__, "missing_acceleration")
    parser.add_argument("--repeats", type=int, default=None, help="timed runs (3; 1 quick)")
    options = parser.parse_args(argv)
    repeats = options.repeats or (1 if options.quick else 3)
    return gaps.stage_main(
        options, lambda datasets, seeds: run(datasets, seeds, options.covariance, repeats),
        summary, print_table,
    )


if __name__ == "__main__":
    main()
