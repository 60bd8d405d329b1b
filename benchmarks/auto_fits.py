"""The fit that ``n_components="auto"`` returns: read from the pass that chose K, against a
fit of the same K with a pass of its own.

With the posterior (the default where the checkpoint reads P(K | X)), the chosen K's
readout head reads the backbone's tokens under the "K unknown" embedding, the pass that
gave P(K | X), so the whole fit costs one pass. The alternative, "own pass", is the fit of
an int ``n_components`` equal to the K chosen, with the same ``random_state``: a second
pass under K's own embedding, then the same starts and EM. Both start from the same
problems and seeds as ``choose_k.py`` (its synthetic settings, well-separated settings
and real datasets with classes); a problem whose chosen K is 1 is left out (no transformer
reads it). Per problem, for ``TransformerGMM`` (``--max-iter`` EM iterations, 100 by
default; 0 compares the transformer's own estimates) and ``TransformerClusterer``: the ARI
of each fit's labels against the truth, the difference in mean log-likelihood per point
(mixture) and the relative difference in inertia (clusterer), and the time of each fit.

    python benchmarks/auto_fits.py                     # 50 tasks per setting, 3 seeds of real data
    python benchmarks/auto_fits.py --max-iter 0        # the transformer's own estimates
    python benchmarks/auto_fits.py --quick --no-real

Prints the paired table in Markdown (means, paired standard errors, medians) and writes
auto_fits.csv (one row per problem and estimator) and auto_fits_summary.csv under
--results.
"""

from __future__ import annotations

import sys
import time
import warnings
from pathlib import Path

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.metrics import adjusted_rand_score

sys.path.insert(0, str(Path(__file__).parent))
from choose_k import (  # noqa: E402
    Problem,
    real_problems,
    separated_problems,
    synthetic_problems,
)
from common import single_threaded, standard_parser, summarise, write_csv  # noqa: E402

from transformer_gmm import FallbackWarning, TransformerClusterer, TransformerGMM  # noqa: E402


def _timed(estimator, X):
    start = time.perf_counter()
    estimator.fit(X)
    return estimator, time.perf_counter() - start


def compare(problem: Problem, estimator: type, checkpoint: str, max_iter: int) -> dict | None:
    """The "auto" fit and the int-K fit of the K it chose, on one problem; None for K = 1."""
    X, y = problem.X, problem.labels
    params = dict(checkpoint=checkpoint, random_state=problem.seed)
    if estimator is TransformerGMM:
        params["max_iter"] = max_iter
        name, k_attribute = "n_components", "n_components_"
    else:
        name, k_attribute = "n_clusters", "n_clusters_"
    auto, auto_time = _timed(estimator(**{name: "auto"}, **params), X)
    K = getattr(auto, k_attribute)
    if K == 1:
        return None
    own, own_time = _timed(estimator(**{name: K}, **params), X)
    row = dict(
        setting=problem.setting,
        problem=problem.name,
        seed=problem.seed,
        estimator=estimator.__name__,
        true_k=problem.true_k,
        chosen_k=K,
        ari_auto=adjusted_rand_score(y, auto.predict(X)),
        ari_own_pass=adjusted_rand_score(y, own.predict(X)),
        time_auto_s=auto_time,
        time_own_pass_s=own_time,
    )
    if estimator is TransformerGMM:
        row["fit_difference"] = auto.score(X) - own.score(X)  # nats per point
    else:
        row["fit_difference"] = auto.inertia_ / own.inertia_ - 1.0  # relative inertia
    return row


def summary(rows: list[dict]) -> list[dict]:
    table = []
    keys = dict.fromkeys((r["estimator"], r["setting"]) for r in rows)
    for estimator, setting in keys:
        cell = [r for r in rows if r["estimator"] == estimator and r["setting"] == setting]
        ari_auto = np.array([r["ari_auto"] for r in cell])
        ari_own = np.array([r["ari_own_pass"] for r in cell])
        fit_difference = [r["fit_difference"] for r in cell]
        ari_difference, ari_difference_se = summarise(ari_auto - ari_own)
        mean_difference, mean_difference_se = summarise(fit_difference)
        time_ratio = [r["time_auto_s"] / r["time_own_pass_s"] for r in cell]
        table.append(
            dict(
                estimator=estimator,
                setting=setting,
                problems=len(cell),
                ari_auto=float(ari_auto.mean()),
                ari_own_pass=float(ari_own.mean()),
                ari_difference=ari_difference,
                ari_difference_se=ari_difference_se,
                fit_difference_mean=mean_difference,
                fit_difference_se=mean_difference_se,
                fit_difference_median=float(np.median(fit_difference)),
                median_time_ratio=float(np.median(time_ratio)),
            )
        )
    return table


def print_summary(table: list[dict], max_iter: int) -> None:
    print(
        f"\n`TransformerGMM` with max_iter={max_iter}; the fit difference is the mean "
        "log-likelihood per point (auto - own pass) for the mixture, the relative inertia "
        "(auto / own pass - 1) for the clusterer; the time ratio is auto (choosing K "
        "included) / own pass (K given).\n"
    )
    header = (
        "| estimator | setting | problems | ARI auto | ARI own pass | difference +- SE "
        "| fit difference mean +- SE | median | time ratio |"
    )
    print(header)
    print("|---" * 9 + "|")
    for r in table:
        print(
            f"| {r['estimator']} | {r['setting']} | {r['problems']} | {r['ari_auto']:.3f} "
            f"| {r['ari_own_pass']:.3f} | {r['ari_difference']:+.4f} +- "
            f"{r['ari_difference_se']:.4f} | {r['fit_difference_mean']:+.4f} +- "
            f"{r['fit_difference_se']:.4f} | {r['fit_difference_median']:+.4f} "
            f"| {r['median_time_ratio']:.2f} |"
        )


def main(argv=None):
    parser = standard_parser(__doc__, "auto_fits", "12 tasks per setting, 1 seed of real data")
    parser.add_argument("--max-iter", type=int, default=100, help="TransformerGMM's max_iter")
    parser.add_argument("--no-real", action="store_true", help="synthetic tasks only")
    args = parser.parse_args(argv)
    n_tasks = args.tasks if args.tasks is not None else (12 if args.quick else 50)
    problems = synthetic_problems(args.seed, n_tasks) + separated_problems(args.seed, n_tasks)
    if not args.no_real:
        problems += real_problems(args.seed, 1 if args.quick else 3)
    estimators = [TransformerGMM] + ([TransformerClusterer] if args.max_iter > 0 else [])
    print(
        f"{n_tasks} tasks per synthetic setting; checkpoint {args.checkpoint!r}; "
        f"TransformerGMM max_iter={args.max_iter}; one BLAS, OpenMP and torch thread"
    )

    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    rows = []
    try:
        with single_threaded(), warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            warnings.simplefilter("ignore", FallbackWarning)
            for estimator in estimators:  # warm up: load the checkpoint, first calls
                compare(problems[0], estimator, args.checkpoint, args.max_iter)
            for problem in problems:
                for estimator in estimators:
                    row = compare(problem, estimator, args.checkpoint, args.max_iter)
                    if row is not None:
                        rows.append(row)
    finally:
        torch.set_num_threads(threads)
    table = summary(rows)
    print_summary(table, args.max_iter)
    suffix = "" if args.max_iter == 100 else f"_max_iter{args.max_iter}"
    paths = [
        write_csv(rows, args.results / f"{args.out}{suffix}.csv"),
        write_csv(table, args.results / f"{args.out}{suffix}_summary.csv"),
    ]
    print("\nwrote " + ", ".join(str(p) for p in paths))
    return rows, table


if __name__ == "__main__":
    main()
