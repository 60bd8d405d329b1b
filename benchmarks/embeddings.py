"""High-dimensional data: embedding-like rows, where EM and Lloyd at full width dominate.

Each dataset has 10,000 rows in d = 256 or 768 dimensions drawn around K = 10 centres on
the unit sphere, with Gaussian noise of standard deviation ``noise`` per coordinate, each
row then scaled to unit length (as sentence embeddings are). Two noise levels: 0.02
(every method separates the clusters) and 0.035 (restarts matter).

Methods, each timed single-threaded in the same loop (interleaved, the median of the
repeats) and quoted as a ratio to scikit-learn's in the same run:

- mixtures, diagonal covariances: ``TransformerGMM()`` (the default), ``TransformerGMM
  (n_init=1)``, ``GaussianMixture(n_init=1)`` and ``GaussianMixture(n_init=3)``; mean
  log-likelihood per row (``score``) and ARI against the drawn clusters;
- clusters: ``TransformerClusterer()`` against ``KMeans(n_init=1)`` and
  ``KMeans(n_init=10)``; inertia per row and ARI.

    python benchmarks/embeddings.py            # 2 widths x 2 noise levels x 2 seeds
    python benchmarks/embeddings.py --quick    # 2,000 rows, d = 256, one seed
    python benchmarks/embeddings.py --widths 1024 --out embeddings_1024   # another width

Prints a table and writes benchmarks/results/embeddings.csv (``--out`` names another).
"""

from __future__ import annotations

import sys
import time
import warnings
from pathlib import Path

import numpy as np
from sklearn.cluster import KMeans
from sklearn.metrics import adjusted_rand_score
from sklearn.mixture import GaussianMixture

sys.path.insert(0, str(Path(__file__).parent))
from common import shared_parser, single_threaded, write_csv  # noqa: E402

from transformer_gmm import TransformerClusterer, TransformerGMM  # noqa: E402

N_COMPONENTS = 10

MIXTURES = {
    "TGMM": lambda seed: TransformerGMM(N_COMPONENTS, covariance_type="diag",
                                        random_state=seed),
    "TGMM n_init=1": lambda seed: TransformerGMM(N_COMPONENTS, covariance_type="diag",
                                                 n_init=1, random_state=seed),
    "GMM n_init=1": lambda seed: GaussianMixture(N_COMPONENTS, covariance_type="diag",
                                                 random_state=seed),
    "GMM n_init=3": lambda seed: GaussianMixture(N_COMPONENTS, covariance_type="diag",
                                                 n_init=3, random_state=seed),
}
CLUSTERERS = {
    "TransformerClusterer": lambda seed: TransformerClusterer(N_COMPONENTS, random_state=seed),
    "KMeans n_init=1": lambda seed: KMeans(N_COMPONENTS, n_init=1, random_state=seed),
    "KMeans n_init=10": lambda seed: KMeans(N_COMPONENTS, n_init=10, random_state=seed),
}
# Each family's ratios are to this method's time.
REFERENCE = {"mixture": "GMM n_init=1", "clusters": "KMeans n_init=1"}


def embeddings(rng, n_rows: int, n_features: int, noise: float):
    """(X float32 (n, d) of unit rows, labels (n,))."""
    centres = rng.normal(size=(N_COMPONENTS, n_features))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    labels = rng.integers(0, N_COMPONENTS, n_rows)
    X = centres[labels] + rng.normal(scale=noise, size=(n_rows, n_features))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    return X.astype(np.float32), labels


def measure(X, labels, seed: int, repeats: int) -> list[dict]:
    """Every method on X: the median time of ``repeats`` interleaved fits, and the quality
    of the last fit."""
    families = {"mixture": MIXTURES, "clusters": CLUSTERERS}
    times = {(family, name): [] for family, methods in families.items() for name in methods}
    fitted = {}
    for methods in families.values():  # warm-up: the checkpoint's load, torch's first calls
        for make in methods.values():
            make(seed).fit(X[:1_000])
    for _ in range(repeats):
        for family, methods in families.items():
            for name, make in methods.items():
                start = time.perf_counter()
                fitted[family, name] = make(seed).fit(X)
                times[family, name].append(time.perf_counter() - start)
    rows = []
    for (family, name), values in times.items():
        model = fitted[family, name]
        quality = (float(model.score(X)) if family == "mixture"
                   else -float(model.inertia_) / len(X))
        rows.append(dict(family=family, method=name, seconds=float(np.median(values)),
                         quality=quality,
                         ari=adjusted_rand_score(labels, model.predict(X))))
    for family, reference in REFERENCE.items():
        base = next(r["seconds"] for r in rows if r["method"] == reference)
        for row in rows:
            if row["family"] == family:
                row["time_ratio"] = row["seconds"] / base
    return rows


def main(argv=None) -> list[dict]:
    parser = shared_parser(__doc__, "2,000 rows, d = 256, one noise level, one seed")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--widths", type=int, nargs="+", default=[256, 768],
                        help="numbers of features d (default 256 768)")
    parser.add_argument("--out", default="embeddings", help="file stem of the CSV")
    args = parser.parse_args(argv)
    n_rows, widths, noises = 10_000, tuple(args.widths), (0.02, 0.035)
    seeds, repeats = range(args.seed, args.seed + args.seeds), args.repeats
    if args.quick:
        n_rows, widths, noises, seeds, repeats = 2_000, (256,), (0.02,), [args.seed], 1
    rows = []
    with warnings.catch_warnings(), single_threaded():
        warnings.simplefilter("ignore")  # convergence warnings are not what is measured
        for width in widths:
            for noise in noises:
                for seed in seeds:
                    rng = np.random.default_rng([seed, width, int(1000 * noise)])
                    X, labels = embeddings(rng, n_rows, width, noise)
                    for row in measure(X, labels, seed, repeats):
                        rows.append(dict(rows=n_rows, features=width, noise=noise,
                                         seed=seed, **row))
                        print(f"d={width:4d} noise={noise:.3f} seed={seed} "
                              f"{row['method']:<22} {row['seconds']:7.2f} s "
                              f"x{row['time_ratio']:5.2f}  quality {row['quality']:10.4f}"
                              f"  ARI {row['ari']:.3f}", flush=True)
    summary(rows)
    path = write_csv(rows, args.results / f"{args.out}.csv")
    print(f"wrote {path}")
    return rows


def summary(rows: list[dict]) -> None:
    """Per width and method: the median time ratio, the mean ARI, and how often the fit is
    at least as good as the reference's (likelihood or inertia, 1e-4 relative)."""
    print(f"\n{'d':>4} {'method':<22} {'time ratio':>10} {'ARI':>6} {'>= reference':>13}")
    for width in sorted({r["features"] for r in rows}):
        for family, reference in REFERENCE.items():
            cell = [r for r in rows if r["features"] == width and r["family"] == family]
            base = {(r["noise"], r["seed"]): r["quality"] for r in cell
                    if r["method"] == reference}
            for method in dict.fromkeys(r["method"] for r in cell):
                mine = [r for r in cell if r["method"] == method]
                at_least = np.mean([r["quality"] >= base[r["noise"], r["seed"]]
                                    - 1e-4 * abs(base[r["noise"], r["seed"]]) for r in mine])
                print(f"{width:>4} {method:<22} "
                      f"{np.median([r['time_ratio'] for r in mine]):>10.2f} "
                      f"{np.mean([r['ari'] for r in mine]):>6.3f} {at_least:>13.0%}")


if __name__ == "__main__":
    main()
