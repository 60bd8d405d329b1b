"""Accuracy on the TGMM protocol: our estimators against scikit-learn and the paper's EM.

Tasks (Chen, Wu & Fang 2025): d in {2, 8, 32, 128}, K in {2, 3, 4, 5}, N = 128, means
uniform in [-5, 5]^d with pairwise cosine similarity below 0.8, weights U[0.2, 0.8]
normalised, unit isotropic noise; the same tasks and seeds for every method.
Metrics: the permutation-invariant mean error (lower is better) and the adjusted Rand
index of the labels against the true components (higher is better).

    python benchmarks/accuracy.py            # 200 tasks per cell
    python benchmarks/accuracy.py --quick    # 10 tasks per cell, d in {2, 8}: under a minute
    python benchmarks/accuracy.py --seed 1 --results /tmp/fresh   # the same cells, fresh tasks
    python benchmarks/accuracy.py --checkpoint new/ --baseline-checkpoint default
    python benchmarks/accuracy.py --bfloat16   # the backbone's products in bfloat16

``--baseline-checkpoint`` adds the transformer alone, TransformerGMM, TransformerGMM
n_init=1 and TransformerClusterer with a second checkpoint (marked "[baseline]") on the
same tasks and seeds, and prints, cell by cell, where the first is behind the second by
more than two paired standard errors. ``--bfloat16`` adds the same four fitted under
``torch.set_float32_matmul_precision("medium")`` (marked "[bf16]"), compared in the same
way with float32.

``TransformerGMM checkpoint=None n_init=4`` is the default's engine with its four starts
all k-means++'s; the default is compared with it cell by cell in the same way: what the
transformer adds.

Prints a table and writes benchmarks/results/accuracy.csv and accuracy.png.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
from sklearn.cluster import KMeans
from sklearn.metrics import adjusted_rand_score
from sklearn.mixture import GaussianMixture

sys.path.insert(0, str(Path(__file__).parent))
from common import (  # noqa: E402
    bayes_labels,
    bfloat16_products,
    mean_error,
    oracle_means,
    paper_em,
    sample_tgmm_task,
    single_threaded,
    standard_parser,
    summarise,
    timed,
    write_csv,
)

from transformer_gmm import FallbackWarning, TransformerClusterer, TransformerGMM  # noqa: E402

BASELINE = " [baseline]"
BF16 = " [bf16]"
COMPARED = ("transformer alone", "TransformerGMM", "TransformerGMM n_init=1",
            "TransformerClusterer")  # the columns --baseline-checkpoint repeats
# The default's engine with its four starts all k-means++'s: the default against it, paired,
# is what the transformer adds.
ENGINE = "TransformerGMM checkpoint=None n_init=4"


def methods(checkpoint, baseline=None, bfloat16=False):
    """Each method maps (task, K, seed) to (means or None, labels)."""

    def transformer_gmm(**params):
        def fit(task, k, seed):
            gmm = TransformerGMM(k, covariance_type="spherical", random_state=seed,
                                 **{"checkpoint": checkpoint, **params})
            return gmm.fit(task.X).means_, gmm.predict(task.X), gmm.init_method_
        return fit

    def gaussian_mixture(n_init):
        def fit(task, k, seed):
            gmm = GaussianMixture(k, covariance_type="spherical", n_init=n_init, random_state=seed)
            return gmm.fit(task.X).means_, gmm.predict(task.X), None
        return fit

    def clusterer(task, k, seed):
        km = TransformerClusterer(k, checkpoint=checkpoint, random_state=seed).fit(task.X)
        return None, km.labels_, km.init_method_

    def kmeans(task, k, seed):
        return None, KMeans(k, n_init=10, random_state=seed).fit(task.X).labels_, None

    def em_paper(task, k, seed):
        means, labels = paper_em(task.X, k, np.random.default_rng(seed))
        return means, labels, None

    def oracle(task, k, seed):
        return oracle_means(task), bayes_labels(task), None

    fits = {
        # max_iter=0 with the default n_init: the transformer's two starts (its mixture and
        # its labels, from one forward pass), the likelier kept; no EM, no k-means++.
        "transformer alone": transformer_gmm(max_iter=0),
        "TransformerGMM": transformer_gmm(),
        "TransformerGMM n_init=1": transformer_gmm(n_init=1),
        # The transformer's two starts (its mixture and its labels), no k-means++.
        "TransformerGMM n_init=2": transformer_gmm(n_init=2),
        # Four readings of the data (it and three reflections), two starts from each.
        "transformer alone, 4 views": transformer_gmm(max_iter=0, n_views=4),
        "TransformerGMM n_views=4": transformer_gmm(n_views=4),
        ENGINE: transformer_gmm(checkpoint=None, n_init=4),
        "GMM n_init=1": gaussian_mixture(1),
        "GMM n_init=10": gaussian_mixture(10),
        "paper EM": em_paper,
        "TransformerClusterer": clusterer,
        "KMeans n_init=10": kmeans,
        "oracle": oracle,
    }
    if baseline is not None:
        again = methods(baseline)
        fits.update({name + BASELINE: again[name] for name in COMPARED})
    if bfloat16:
        fits.update({name + BF16: in_bfloat16(fits[name]) for name in COMPARED})
    return fits


def in_bfloat16(fit):
    def fit_in_bfloat16(task, k, seed):
        with bfloat16_products():
            return fit(task, k, seed)
    return fit_in_bfloat16


def run(dims, components, n_tasks, checkpoint, seed=0, baseline=None, bfloat16=False):
    """One row per cell and method, the per-task errors {(d, K, method): (n_tasks,)} and
    the per-task ARIs (the same keys, every method)."""
    rows, task_errors, task_aris = [], {}, {}
    fits = methods(checkpoint, baseline, bfloat16)
    for d in dims:
        for k in components:
            rng = np.random.default_rng([seed, d, k])
            tasks = [sample_tgmm_task(rng, k, d) for _ in range(n_tasks)]
            oracle_errors = [mean_error(oracle_means(task), task.means) for task in tasks]
            for name, fit in fits.items():
                errors, aris, times, inits = [], [], [], []
                for i, task in enumerate(tasks):
                    (means, labels, init), ms = timed(lambda: fit(task, k, i))  # noqa: B023
                    if means is not None:
                        errors.append(mean_error(means, task.means))
                    aris.append(adjusted_rand_score(task.labels, labels))
                    times.append(ms)
                    inits.append(init)
                if errors:
                    task_errors[d, k, name] = np.array(errors)
                task_aris[d, k, name] = np.array(aris)
                error, error_se = summarise(errors) if errors else (np.nan, np.nan)
                # Errors are heavy-tailed (one missed component dominates a mean): the
                # median and the share of tasks more than twice the oracle's error say more.
                error_median = float(np.median(errors)) if errors else np.nan
                misses = [e > 2 * o for e, o in zip(errors, oracle_errors, strict=False)]
                miss_rate = float(np.mean(misses)) if errors else np.nan
                ari, ari_se = summarise(aris)
                rows.append(dict(
                    d=d, K=k, method=name, n_tasks=n_tasks,
                    error=error, error_se=error_se, error_median=error_median,
                    miss_rate=miss_rate, ari=ari, ari_se=ari_se,
                    ms_per_fit=float(np.median(times)),
                    transformer_init=(np.mean([i == "transformer" for i in inits])
                                      if inits[0] is not None else np.nan),
                ))
    return rows, task_errors, task_aris


def print_table(rows, task_errors):
    names = list(dict.fromkeys(r["method"] for r in rows))
    error_names = [n for n in names if not np.isnan(_get(rows, n, "error"))]
    print("Mean error (lower is better), mean over tasks; +- is one standard error")
    print(f"{'d':>4} {'K':>2} " + " ".join(f"{n[:18]:>18}" for n in error_names))
    for d, k in dict.fromkeys((r["d"], r["K"]) for r in rows):
        cells = [_cell(rows, d, k, n, "error") for n in error_names]
        print(f"{d:>4} {k:>2} " + " ".join(f"{c:>18}" for c in cells))
    print("\nAdjusted Rand index (higher is better)")
    print(f"{'d':>4} {'K':>2} " + " ".join(f"{n[:18]:>18}" for n in names))
    for d, k in dict.fromkeys((r["d"], r["K"]) for r in rows):
        cells = [_cell(rows, d, k, n, "ari") for n in names]
        print(f"{d:>4} {k:>2} " + " ".join(f"{c:>18}" for c in cells))
    print("\nMedian error, and the share of tasks with more than twice the oracle's error")
    print(f"{'d':>4} {'K':>2} " + " ".join(f"{n[:18]:>18}" for n in error_names))
    for d, k in dict.fromkeys((r["d"], r["K"]) for r in rows):
        cells = [_median_cell(rows, d, k, n) for n in error_names]
        print(f"{d:>4} {k:>2} " + " ".join(f"{c:>18}" for c in cells))
    used = [r["transformer_init"] for r in rows if r["method"] == "TransformerGMM"]
    print(f"\nTransformerGMM kept the transformer's initialisation in {np.mean(used):.0%} of fits")
    print_targets(rows, task_errors)


def compare(errors, other):
    """How one method's per-task errors compare with another's on the same tasks.

    Returns ("tie", 0.0) when every task's two errors agree to rounding (1e-9 relative):
    where the clusters are far apart every method finds the true clusters' means, and a
    last-digit difference is the order of a sum, not an estimate. Otherwise ("lower" or
    "higher", z), z the difference of the means over its paired standard error.
    """
    if np.allclose(errors, other, rtol=1e-9, atol=0.0):
        return "tie", 0.0
    diff = errors - other
    se = diff.std(ddof=1) / np.sqrt(len(diff)) if len(diff) > 1 else np.nan
    z = diff.mean() / se if se > 0 else np.copysign(np.inf, diff.mean())
    return ("lower" if diff.mean() < 0 else "higher"), float(z)


def _count(task_errors, cells, name, other, allowed):
    """'n/cells' for the cells where ``name`` compares with ``other`` as ``allowed``, then
    the ties and the cells that miss, each with its paired z."""
    results = {cell: compare(task_errors[(*cell, name)], task_errors[(*cell, other)])
               for cell in cells}
    held = sum(verdict in allowed for verdict, _ in results.values())
    ties = [cell for cell, (verdict, _) in results.items() if verdict == "tie"]
    misses = [f"({d}, {k}) z={z:+.1f}" for (d, k), (verdict, z) in results.items()
              if verdict not in allowed and verdict != "tie"]
    text = f"{held}/{len(cells)} cells"
    if ties and "tie" not in allowed:
        text += f"; tied to rounding in {', '.join(f'({d}, {k})' for d, k in ties)}"
    if misses:
        text += f"; missed in {', '.join(misses)}"
    return text


def print_targets(rows, task_errors):
    """The targets of the default checkpoint, cell by cell: which hold. A miss carries its
    paired z (difference of the means over its standard error on the same tasks): a
    |z| below 2 is within the noise of this many tasks."""
    cells = list(dict.fromkeys((r["d"], r["K"]) for r in rows))

    def value(d, k, name, key="error"):
        return next(r[key] for r in rows if (r["d"], r["K"], r["method"]) == (d, k, name))

    gaps = [value(d, k, "KMeans n_init=10", "ari") - value(d, k, "TransformerClusterer", "ari")
            for d, k in cells]
    clusterer = (f"KMeans n_init=10 ARI - TransformerClusterer:  worst {max(gaps):+.4f},"
                 f" {sum(g <= 0.005 for g in gaps)}/{len(cells)} cells within 0.005")
    print("\nTargets, cell by cell")
    _print_mixture_targets(task_errors, cells, value, "transformer alone", "TransformerGMM",
                           clusterer)
    views = "transformer alone, 4 views"
    if (*cells[0], views) in task_errors:
        print("With n_views=4 (four readings of the data):")
        _print_mixture_targets(task_errors, cells, value, views, "TransformerGMM n_views=4")


def _print_mixture_targets(task_errors, cells, value, alone, polished, extra=None):
    """The mixture targets for one pair of columns: the transformer alone and with EM."""
    beats, as_good = {"lower"}, {"lower", "tie"}
    ratio = [value(d, k, polished) / value(d, k, "GMM n_init=10") for d, k in cells]
    lines = [
        "transformer alone < paper EM:                 "
        + _count(task_errors, cells, alone, "paper EM", beats),
        "TransformerGMM() <= GMM n_init=1:             "
        + _count(task_errors, cells, polished, "GMM n_init=1", as_good),
        f"TransformerGMM() / GMM n_init=10, mean:       {np.mean(ratio):.3f}"
        f" (worst {max(ratio):.3f})",
        *([extra] if extra else []),
        "stretch, transformer alone <= GMM n_init=10:  "
        + _count(task_errors, cells, alone, "GMM n_init=10", as_good),
    ]
    for line in lines:
        print("  " + line)


def print_against_baseline(task_errors, task_aris, cells, pairs=None, by_ari=False):
    """Cell by cell, each compared column against its baseline on the same tasks: the
    cells where it is ahead or behind by more than two paired standard errors, by the
    error where the column has one (else, or with ``by_ari``, by the ARI). ``pairs``
    (column, baseline column) defaults to the checkpoint against the baseline checkpoint."""
    if pairs is None:
        print("\nAgainst the baseline checkpoint (paired over the same tasks; |z| > 2 listed)")
        pairs = [(name, name + BASELINE) for name in COMPARED]
    for name, other in pairs:
        by_error = (*cells[0], name) in task_errors and not by_ari
        table = task_errors if by_error else task_aris
        results = {cell: compare(table[(*cell, name)], table[(*cell, other)])
                   for cell in cells}
        # Lower error is better; higher ARI is better.
        better = "lower" if by_error else "higher"
        ahead = [f"({d}, {k}) z={z:+.1f}" for (d, k), (v, z) in results.items()
                 if v == better and abs(z) > 2]
        behind = [f"({d}, {k}) z={z:+.1f}" for (d, k), (v, z) in results.items()
                  if v not in (better, "tie") and abs(z) > 2]
        metric = "error" if by_error else "ARI"
        print(f"  {name} ({metric}): ahead in {len(ahead)} cells {', '.join(ahead)}; "
              f"behind in {len(behind)} {', '.join(behind)}")


def _get(rows, name, key):
    return next(r[key] for r in rows if r["method"] == name)


def _median_cell(rows, d, k, name):
    row = next(r for r in rows if r["d"] == d and r["K"] == k and r["method"] == name)
    return f"{row['error_median']:.4f} {row['miss_rate']:6.1%}"


def _cell(rows, d, k, name, key):
    row = next(r for r in rows if r["d"] == d and r["K"] == k and r["method"] == name)
    return f"{row[key]:.4f}+-{row[key + '_se']:.4f}"


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    components = sorted({r["K"] for r in rows})
    fig, axes = plt.subplots(1, len(components), figsize=(4 * len(components), 3.5),
                             squeeze=False)
    for ax, k in zip(axes[0], components, strict=True):
        for name in dict.fromkeys(r["method"] for r in rows):
            cell = [r for r in rows if r["K"] == k and r["method"] == name]
            if np.isnan(cell[0]["error"]):
                continue
            ax.errorbar([r["d"] for r in cell], [r["error"] for r in cell],
                        yerr=[r["error_se"] for r in cell], label=name, marker="o", capsize=2)
        dims = sorted({r["d"] for r in rows})
        ax.set(xscale="log", yscale="log", xlabel="d", title=f"K = {k}")
        ax.set_xticks(dims, [str(d) for d in dims])
        ax.minorticks_off()
    axes[0][0].set_ylabel("mean error")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None):
    parser = standard_parser(__doc__, "accuracy", "10 tasks per cell, d in {2, 8}")
    parser.add_argument("--baseline-checkpoint", default=None,
                        help="a second checkpoint, compared with --checkpoint on the same tasks")
    parser.add_argument("--bfloat16", action="store_true",
                        help="add the transformer's columns fitted under "
                             "torch.set_float32_matmul_precision('medium')")
    args = parser.parse_args(argv)
    dims = [2, 8] if args.quick else [2, 8, 32, 128]
    n_tasks = args.tasks or (10 if args.quick else 200)
    with warnings.catch_warnings(), single_threaded():
        # The fallback's warning is reported once below instead of on every fit.
        warnings.simplefilter("ignore", FallbackWarning)
        rows, task_errors, task_aris = run(dims, [2, 3, 4, 5], n_tasks, args.checkpoint,
                                           args.seed, args.baseline_checkpoint, args.bfloat16)
    print_table(rows, task_errors)
    cells = list(dict.fromkeys((r["d"], r["K"]) for r in rows))
    print(f"\nTransformerGMM against {ENGINE} (paired over the same tasks; |z| > 2 listed)")
    for by_ari in (False, True):
        print_against_baseline(task_errors, task_aris, cells, [("TransformerGMM", ENGINE)],
                               by_ari)
    if args.baseline_checkpoint is not None:
        print_against_baseline(task_errors, task_aris, cells)
    if args.bfloat16:
        print("\nbfloat16 products against float32 (paired over the same tasks; |z| > 2 listed)")
        print_against_baseline(task_errors, task_aris, cells,
                               [(name + BF16, name) for name in COMPARED])
    csv_path = write_csv(rows, args.results / f"{args.out}.csv")
    png_path = args.results / f"{args.out}.png"
    plot(rows, png_path)
    print(f"\nwrote {csv_path} and {png_path}")
    return rows


if __name__ == "__main__":
    main()
