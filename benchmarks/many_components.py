"""Many components (K = 11 to 16): a checkpoint's heads there against EM alone.

The bundled default has heads for K = 2..10; above, every estimator falls back to the
bundled EM from k-means++ (with a FallbackWarning). This measures what a checkpoint with
heads for more components brings there, on the same fits:

- synthetic: the TGMM protocol (means uniform in [-5, 5]^d, unit noise, weights U[0.2, 0.8]
  normalised) with K in {12, 16}, d in {2, 8}, N = 512; at d = 2 the means' cosine bound is
  lifted (sixteen directions in the plane cannot keep it), so components overlap;
- real: the datasets of ``real_datasets.py`` with at least 250 rows (standardized), with
  K = 12 and 16 whatever their classes.

Methods: ``GaussianMixture`` with ``n_init`` 1 and 10; ``TransformerGMM`` with the
checkpoint: by default ("TGMM"), ``n_init=1`` and ``max_iter=0`` ("transformer alone");
and ``TransformerGMM(checkpoint=None)``, the EM the default falls back to. Full covariances
on real data, spherical on synthetic (the protocol's model). Metrics: LL per point, "at
best" (within 0.01 nats per point of the best any method reached on that task, or on that
dataset and K with any seed), ARI against the true components (synthetic), and time as a
ratio to ``GaussianMixture(n_init=1)`` on the same fit.

    python benchmarks/many_components.py --checkpoint runs/k16/checkpoint
    python benchmarks/many_components.py --quick --checkpoint runs/k16/checkpoint

Prints the tables and writes many_components_fits.csv, many_components.csv and
many_components.png under benchmarks/results/.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.metrics import adjusted_rand_score
from sklearn.mixture import GaussianMixture

sys.path.insert(0, str(Path(__file__).parent))
from common import (  # noqa: E402
    sample_means,
    sample_tgmm_task,
    save_figure,
    single_threaded,
    standard_parser,
    summarise,
    write_csv,
)
from real_datasets import DATASETS, Dataset, load_dataset  # noqa: E402
from realdata import AT_BEST, fit_one  # noqa: E402

from transformer_gmm import FallbackWarning, TransformerGMM  # noqa: E402

GMM1, GMM10 = "GMM n_init=1", "GMM n_init=10"
TGMM, TGMM1, ALONE, FALLBACK = ("TGMM", "TGMM n_init=1", "transformer alone",
                                "TGMM checkpoint=None")
REAL = ("digits", "breast_cancer", "penguins", "faithful", "biopsy", "pima", "synth")


def methods(checkpoint, covariance: str) -> dict:
    """name: (make(K, seed) -> unfitted estimator, warnings to silence)."""

    def gmm(n_init):
        return lambda k, seed: GaussianMixture(k, covariance_type=covariance, n_init=n_init,
                                               random_state=seed)

    def tgmm(ckpt, **params):
        return lambda k, seed: TransformerGMM(k, covariance_type=covariance, checkpoint=ckpt,
                                              random_state=seed, **params)

    return {
        GMM1: (gmm(1), ()),
        GMM10: (gmm(10), ()),
        TGMM: (tgmm(checkpoint), ()),
        TGMM1: (tgmm(checkpoint, n_init=1), ()),
        ALONE: (tgmm(checkpoint, max_iter=0), (ConvergenceWarning,)),
        FALLBACK: (tgmm(None), (FallbackWarning,)),
    }


def warm_up(checkpoint, components) -> None:
    """Load the checkpoint and let torch set itself up before anything is timed."""
    X = np.random.default_rng(0).standard_normal((200, 3))
    for covariance in ("spherical", "full"):
        for make, _ in methods(checkpoint, covariance).values():
            for k in components:
                make(k, 0).fit(X)


def synthetic(K: int, d: int, index: int, seed: int) -> Dataset:
    rng = np.random.default_rng([seed, K, d, index])
    means = sample_means(rng, K, d, max_cosine=0.8 if d > 2 else 1.0)
    task = sample_tgmm_task(rng, K, d, n_samples=512, means=means)
    return Dataset(f"d={d}", task.X, task.labels, K)


def fit_all(dataset: Dataset, covariance: str, seed: int, checkpoint, setting: dict) -> list:
    rows = []
    for name, (make, silenced) in methods(checkpoint, covariance).items():
        model, ms, caught, error = fit_one(make(dataset.n_components, seed), dataset.X, silenced)
        ok = model is not None
        ari = np.nan
        if ok and dataset.labels is not None:
            ari = adjusted_rand_score(dataset.labels, model.predict(dataset.X))
        rows.append(dict(**setting, K=dataset.n_components, covariance=covariance, seed=seed,
                         method=name, ll=float(model.score(dataset.X)) if ok else np.nan,
                         ari=float(ari), ms=ms, init=getattr(model, "init_method_", ""),
                         warnings=" ".join(caught), error=error))
    return rows


def add_derived(rows: list[dict], group: tuple[str, ...]) -> None:
    """time_ratio (to GMM n_init=1 on the same fit) and at_best (within AT_BEST of the
    best LL of the ``group`` the row belongs to)."""
    def key(r, fields):
        return tuple(r[f] for f in fields)

    fit = ("kind", "setting", "K", "covariance", "seed")
    reference = {key(r, fit): r["ms"] for r in rows if r["method"] == GMM1}
    best: dict[tuple, float] = {}
    for r in rows:
        if np.isfinite(r["ll"]):
            best[key(r, group)] = max(best.get(key(r, group), -np.inf), r["ll"])
    for r in rows:
        r["time_ratio"] = r["ms"] / reference[key(r, fit)]
        r["at_best"] = float(r["ll"] >= best[key(r, group)] - AT_BEST)


def summary(rows: list[dict]) -> list[dict]:
    """Per (kind, setting, K, method): means, and LL and ARI paired against the fallback."""
    out = []
    cells = dict.fromkeys((r["kind"], r["setting"], r["K"]) for r in rows)
    for kind, setting, K in cells:
        part = [r for r in rows if (r["kind"], r["setting"], r["K"]) == (kind, setting, K)]
        fallback = {r["seed"]: r for r in part if r["method"] == FALLBACK}
        for method in dict.fromkeys(r["method"] for r in part):
            mine = [r for r in part if r["method"] == method]
            ll_diff = [r["ll"] - fallback[r["seed"]]["ll"] for r in mine]
            ari_diff = [r["ari"] - fallback[r["seed"]]["ari"] for r in mine]
            ll_mean, ll_se = summarise(ll_diff)
            labelled = kind == "synthetic"
            ari_mean, ari_se = summarise(ari_diff) if labelled else (np.nan, np.nan)
            out.append(dict(
                kind=kind, setting=setting, K=K, method=method, n_fits=len(mine),
                failed=sum(bool(r["error"]) for r in mine),
                ll=float(np.nanmean([r["ll"] for r in mine])), ll_vs_fallback=ll_mean,
                ll_vs_fallback_se=ll_se, ll_vs_fallback_median=float(np.nanmedian(ll_diff)),
                ari=float(np.mean([r["ari"] for r in mine])) if labelled else np.nan,
                ari_vs_fallback=ari_mean,
                ari_vs_fallback_se=ari_se,
                at_best=float(np.mean([r["at_best"] for r in mine])),
                time_ratio=float(np.median([r["time_ratio"] for r in mine])),
            ))
    return out


def print_summary(table: list[dict]) -> None:
    print("\nPer cell and method: mean LL, LL minus the fallback's (mean +- paired SE, median),"
          " ARI (synthetic) and its paired difference, at best, median time / GMM n_init=1")
    for r in table:
        ari = (f"ARI {r['ari']:.3f} ({r['ari_vs_fallback']:+.3f}+-{r['ari_vs_fallback_se']:.3f})"
               if r["kind"] == "synthetic" else "")
        print(f"  {r['kind']:9s} {r['setting']:14s} K={r['K']:2d} {r['method']:21s} "
              f"LL {r['ll']:8.3f} ({r['ll_vs_fallback']:+.3f}+-{r['ll_vs_fallback_se']:.3f}, "
              f"median {r['ll_vs_fallback_median']:+.3f}) {ari} at best {r['at_best']:.0%} "
              f"time {r['time_ratio']:.2f}" + (f" FAILED {r['failed']}" if r["failed"] else ""))


def plot(table: list[dict], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = list(dict.fromkeys((r["kind"], r["setting"], r["K"]) for r in table))
    methods_ = list(dict.fromkeys(r["method"] for r in table))
    fig, axes = plt.subplots(2, 1, figsize=(max(8.0, 0.8 * len(cells) + 3), 7), sharex=True)
    x = np.arange(len(cells))
    width = 0.8 / len(methods_)
    for index, method in enumerate(methods_):
        rows = [next(r for r in table if (r["kind"], r["setting"], r["K"]) == cell
                     and r["method"] == method) for cell in cells]
        offset = x - 0.4 + (index + 0.5) * width
        axes[0].bar(offset, [r["ll_vs_fallback"] for r in rows], width,
                    yerr=[np.nan_to_num(r["ll_vs_fallback_se"]) for r in rows], label=method,
                    color=f"C{index}", capsize=1)
        axes[1].bar(offset, [r["at_best"] for r in rows], width, color=f"C{index}")
    axes[0].set_ylabel("LL minus the fallback's\n(nats/point, mean +- SE)")
    axes[0].axhline(0, color="k", lw=0.6)
    axes[1].set_ylabel("share at the best LL found")
    axes[1].set_xticks(x, [f"{k} {s}\nK={K}" for k, s, K in cells], fontsize=7)
    axes[0].legend(fontsize=7, ncol=3)
    fig.tight_layout()
    return save_figure(fig, path)


def main(argv=None):
    parser = standard_parser(__doc__, "many_components",
                             "2 synthetic tasks a cell, 2 seeds on 3 datasets, K = 12 only")
    parser.add_argument("--seeds", type=int, default=None, help="seeds per real dataset (10)")
    args = parser.parse_args(argv)
    components = (12,) if args.quick else (12, 16)
    n_tasks = args.tasks or (2 if args.quick else 50)
    n_seeds = args.seeds or (2 if args.quick else 10)
    names = REAL[3:6] if args.quick else REAL
    assert set(names) <= set(DATASETS)
    seeds = [1000 * args.seed + i for i in range(n_seeds)]
    rows = []
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with single_threaded(), warnings.catch_warnings():
            warnings.simplefilter("ignore", FallbackWarning)
            warnings.simplefilter("ignore", ConvergenceWarning)
            warm_up(args.checkpoint, components)
            for K in components:
                for d in (2, 8):
                    for i in range(n_tasks):
                        task = synthetic(K, d, i, args.seed)
                        rows += fit_all(task, "spherical", i, args.checkpoint,
                                        dict(kind="synthetic", setting=f"d={d}"))
                    print(f"synthetic K={K} d={d}: {n_tasks} tasks", flush=True)
                for name in names:
                    dataset = load_dataset(name)
                    dataset = Dataset(name, dataset.X, None, K)
                    for seed in seeds:
                        rows += fit_all(dataset, "full", seed, args.checkpoint,
                                        dict(kind="real", setting=name))
                    print(f"real K={K} {name}: {n_seeds} seeds", flush=True)
    finally:
        torch.set_num_threads(threads)
    # At best: per synthetic task (its seed), per real dataset and K over every seed.
    synthetic_rows = [r for r in rows if r["kind"] == "synthetic"]
    add_derived(synthetic_rows, ("kind", "setting", "K", "covariance", "seed"))
    add_derived([r for r in rows if r["kind"] == "real"], ("kind", "setting", "K", "covariance"))
    table = summary(rows)
    print_summary(table)
    fits_path = write_csv(rows, args.results / f"{args.out}_fits.csv")
    csv_path = write_csv(table, args.results / f"{args.out}.csv")
    png_path = plot(table, args.results / f"{args.out}.png")
    print(f"\nwrote {fits_path}, {csv_path} and {png_path}")
    return rows, table


if __name__ == "__main__":
    main()
