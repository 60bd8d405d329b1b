"""Few rows of many features: the starts compete at full width, or in a projection first.

On wide data the starts can compete in the data's leading principal directions before one
runs at full width (``engine/screening.py``). This script measures both ways on the same
tasks and seeds, for each estimator: every start run at full width (no screening), and
every start screened (``screening.SCREEN_DIAG_FROM_VALUES`` set to 0, the rule before it
existed). The package screens diagonal fits only from ``SCREEN_DIAG_FROM_VALUES`` values
(rows x features), and every other fit from 64 features; the table gives the figures
behind that, for all tasks and for those below the bound.

Tasks: ``n`` rows (40 to 1,000) of ``d`` features (200 to 2,000), K = 2, 3 or 5 clusters
whose centres are drawn per coordinate with a standard deviation of 0.03 to 0.2 (so from
barely to well apart in d dimensions), noise of a standard deviation drawn per feature in
[0.5, 1.5]. Each fit is timed single-threaded, the two ways interleaved.

    python benchmarks/wide_rows.py            # 60 tasks
    python benchmarks/wide_rows.py --quick    # 2 tasks
    python benchmarks/wide_rows.py --starts-alone --tasks 40   # see below

With ``--starts-alone``, the diagonal fits of tasks under ``ALONE_BELOW_VALUES`` values
instead, two ways: the default (the transformer's two starts and two k-means++ starts)
and the transformer's starts alone (``n_init=2``), as the default runs on small data with
full covariances (``_fitting.transformer_starts_suffice``); writes wide_rows_alone.csv.

Prints paired differences (full width less screened: mean log-likelihood per row, or
minus the inertia per row, and ARI, with standard errors; the fits likelier either way;
the median and the total time ratio) and writes benchmarks/results/wide_rows.csv.
"""

from __future__ import annotations

import sys
import time
import warnings
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from sklearn.metrics import adjusted_rand_score

sys.path.insert(0, str(Path(__file__).parent))
from common import shared_parser, single_threaded, summarise, write_csv  # noqa: E402

from transformer_gmm import TransformerClusterer, TransformerGMM  # noqa: E402
from transformer_gmm.engine import screening as screening_rule  # noqa: E402

ESTIMATORS = ("diag", "spherical", "clusterer")
# The values (rows x features) below which --starts-alone compares: those of fits whose
# starts run on every row and whose EM is cheap (engine.fit.GATED_FROM_VALUES).
ALONE_BELOW_VALUES = 1 << 17
# Two fits count as at one optimum within this (nats per row; inertia per row, relative).
SAME = 1e-3


def task(rng):
    n, d = int(rng.choice([40, 100, 300, 1000])), int(rng.choice([200, 500, 1000, 2000]))
    k = int(rng.choice([2, 3, 5]))
    centres = rng.normal(size=(k, d)) * float(rng.choice([0.03, 0.06, 0.1, 0.2]))
    labels = rng.integers(k, size=n)
    X = centres[labels] + rng.normal(size=(n, d)) * rng.uniform(0.5, 1.5, size=d)
    return X, labels, k


@contextmanager
def screening(screened: bool):
    """Every wide fit screened (``screened``), or none."""
    saved = screening_rule.SCREEN_FROM_FEATURES, screening_rule.SCREEN_DIAG_FROM_VALUES
    if screened:
        screening_rule.SCREEN_DIAG_FROM_VALUES = 0
    else:
        screening_rule.SCREEN_FROM_FEATURES = 10**9
    try:
        yield
    finally:
        screening_rule.SCREEN_FROM_FEATURES, screening_rule.SCREEN_DIAG_FROM_VALUES = saved


def fit(estimator: str, X, k: int, seed: int, screened: bool):
    if estimator == "clusterer":
        model = TransformerClusterer(k, random_state=seed)
    else:
        model = TransformerGMM(k, covariance_type=estimator, random_state=seed)
    start = time.perf_counter()
    with screening(screened):
        model.fit(X)
    return model, 1000 * (time.perf_counter() - start)


def quality(model, X) -> float:
    """Mean log-likelihood per row, or minus the inertia per row: higher is better."""
    if isinstance(model, TransformerClusterer):
        return -float(model.inertia_) / len(X)
    return float(model.score(X))


def starts_alone(n_tasks: int, seed: int) -> list[dict]:
    """``--starts-alone``: the default's diagonal fit and ``n_init=2``'s on each of the first
    ``n_tasks`` tasks of under ``ALONE_BELOW_VALUES`` values."""
    rows, t = [], 0
    while len(rows) < n_tasks:
        X, labels, k = task(np.random.default_rng([seed, t]))
        t += 1
        if X.size >= ALONE_BELOW_VALUES:
            continue
        row = dict(task=t - 1, rows=len(X), features=X.shape[1], k=k)
        for name, n_init in (("default", "auto"), ("alone", 2)):
            model = TransformerGMM(k, covariance_type="diag", n_init=n_init, random_state=seed + t)
            start = time.perf_counter()
            model.fit(X)
            row[f"{name}_ms"] = 1000 * (time.perf_counter() - start)
            row[f"{name}_quality"] = quality(model, X)
            row[f"{name}_ari"] = adjusted_rand_score(labels, model.predict(X))
        rows.append(row)
    gaps = np.array([r["alone_quality"] - r["default_quality"] for r in rows])
    gap, gap_se = summarise(gaps)
    ari, ari_se = summarise([r["alone_ari"] - r["default_ari"] for r in rows])
    median = np.median([r["alone_ms"] / r["default_ms"] for r in rows])
    print(f"{len(rows)} diagonal fits under {ALONE_BELOW_VALUES:,} values, the starts alone "
          f"less the default: log-likelihood {gap:+.4f} +- {gap_se:.4f} nats per row, likelier "
          f"in {int(np.sum(gaps > SAME))} and less likely in {int(np.sum(gaps < -SAME))}; "
          f"ARI {ari:+.3f} +- {ari_se:.3f}; time {median:.2f} (median ratio)")
    return rows


def main(argv=None) -> list[dict]:
    parser = shared_parser(__doc__, "2 tasks")
    parser.add_argument("--tasks", type=int, default=60)
    parser.add_argument("--starts-alone", action="store_true",
                        help="the default against the transformer's starts alone (diag)")
    args = parser.parse_args(argv)
    n_tasks = 2 if args.quick else args.tasks
    if args.starts_alone:
        with warnings.catch_warnings(), single_threaded():
            warnings.simplefilter("ignore")  # collapse and convergence warnings
            fit("diag", task(np.random.default_rng(0))[0][:50], 2, 0, False)  # warm-up
            rows = starts_alone(n_tasks, args.seed)
        path = write_csv(rows, args.results / "wide_rows_alone.csv")
        print(f"wrote {path}")
        return rows
    rows = []
    with warnings.catch_warnings(), single_threaded():
        warnings.simplefilter("ignore")  # collapse and convergence warnings: not measured
        fit("diag", task(np.random.default_rng(0))[0][:50], 2, 0, False)  # warm-up
        for t in range(n_tasks):
            X, labels, k = task(np.random.default_rng([args.seed, t]))
            for estimator in ESTIMATORS:
                row = dict(task=t, rows=len(X), features=X.shape[1], k=k, estimator=estimator)
                for screened, name in ((False, "full_width"), (True, "screened")):
                    model, ms = fit(estimator, X, k, args.seed + t, screened)
                    row[f"{name}_quality"] = quality(model, X)
                    row[f"{name}_ari"] = adjusted_rand_score(labels, model.predict(X))
                    row[f"{name}_ms"] = ms
                rows.append(row)
    summary(rows)
    path = write_csv(rows, args.results / "wide_rows.csv")
    print(f"wrote {path}")
    return rows


def summary(rows: list[dict]) -> None:
    bound = screening_rule.SCREEN_DIAG_FROM_VALUES
    print(f"{'estimator':<10} {'tasks':<17} {'fits':>4} {'quality: full - screened':>26} "
          f"{'likelier / less':>15} {'ARI: full - screened':>22} {'time: median, total':>20}")
    for estimator in ESTIMATORS:
        for tasks in ("all", f"< {bound:,} values"):
            mine = [r for r in rows if r["estimator"] == estimator
                    and (tasks == "all" or r["rows"] * r["features"] < bound)]
            if not mine:
                continue
            gaps = np.array([r["full_width_quality"] - r["screened_quality"] for r in mine])
            scale = np.array([1.0 if estimator != "clusterer" else abs(r["screened_quality"])
                              for r in mine])
            likelier, less = int(np.sum(gaps > SAME * scale)), int(np.sum(gaps < -SAME * scale))
            gap, gap_se = summarise(gaps)
            ari, ari_se = summarise([r["full_width_ari"] - r["screened_ari"] for r in mine])
            median = np.median([r["full_width_ms"] / r["screened_ms"] for r in mine])
            total = sum(r["full_width_ms"] for r in mine) / sum(r["screened_ms"] for r in mine)
            print(f"{estimator:<10} {tasks:<17} {len(mine):>4} {gap:>+16.4f} +- {gap_se:<6.4f} "
                  f"{likelier:>7} / {less:<5} {ari:>+12.3f} +- {ari_se:<6.3f} "
                  f"{median:>12.2f}, {total:.2f}")


if __name__ == "__main__":
    main()
