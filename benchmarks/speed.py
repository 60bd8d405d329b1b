"""Speed: one small fit, many datasets at once, and a million points, against scikit-learn.

Three measurements, each a median over repeats, each quoted as a ratio against
scikit-learn measured in the same run (machines here are noisy; ratios travel better):

1. latency of one fit, N = 128, d = 8, K = 4 (spherical): ``TransformerGMM`` against
   ``GaussianMixture(n_init=1)`` and ``n_init=10``, with the mean error of each;
2. ``fit_many`` throughput (datasets per second) for batches of datasets of that size,
   against a loop of ``GaussianMixture(n_init=1)`` fits;
3. one fit of 1,000,000 points (d = 16, K = 5, full covariances) against
   ``GaussianMixture(n_init=1)``: time and mean error, and our peak memory growth.

    python benchmarks/speed.py --quick      # small batches, 100,000 points: about a minute
    python benchmarks/speed.py --device cuda
    python benchmarks/speed.py --only throughput --batches 1000 10000 --checkpoint none

Prints a table and writes benchmarks/results/speed.csv.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
import warnings
from pathlib import Path

import numpy as np
from sklearn.mixture import GaussianMixture

sys.path.insert(0, str(Path(__file__).parent))
from common import RESULTS, mean_error, sample_tgmm_task, single_threaded, write_csv  # noqa: E402

from transformer_gmm import FallbackWarning, TransformerGMM, fit_many  # noqa: E402


def median_ms(fit, repeats: int) -> float:
    fit()  # warm-up: loads the checkpoint, fills caches
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fit()
        times.append(time.perf_counter() - start)
    return 1000 * float(np.median(times))


def latency(checkpoint, device, repeats):
    task = sample_tgmm_task(np.random.default_rng(0), 4, 8)
    candidates = {
        "TransformerGMM": lambda: TransformerGMM(
            4, covariance_type="spherical", checkpoint=checkpoint, device=device, random_state=0
        ),
        "GMM n_init=1": lambda: GaussianMixture(4, covariance_type="spherical", random_state=0),
        "GMM n_init=10": lambda: GaussianMixture(
            4, covariance_type="spherical", n_init=10, random_state=0
        ),
    }
    rows = []
    for name, make in candidates.items():
        ms = median_ms(lambda make=make: make().fit(task.X), repeats)
        error = mean_error(make().fit(task.X).means_, task.means)
        rows.append(dict(measure="latency N=128 d=8 K=4", method=name, value=ms, unit="ms",
                         error=error))
    return rows


def throughput(checkpoint, device, batch_sizes):
    rng = np.random.default_rng(1)
    rows = []
    for batch in batch_sizes:
        datasets = [sample_tgmm_task(rng, 4, 8).X for _ in range(batch)]
        seconds = median_ms(lambda datasets=datasets: fit_many(
            datasets, 4, covariance_type="spherical", checkpoint=checkpoint, device=device,
            random_state=0), 3) / 1000
        rows.append(dict(measure=f"fit_many batch={batch}", method="fit_many",
                         value=batch / seconds, unit="datasets/s", error=np.nan))
    loop = datasets[: min(200, batch_sizes[-1])]
    seconds = median_ms(lambda: [GaussianMixture(4, covariance_type="spherical",
                                                 random_state=0).fit(X) for X in loop], 1) / 1000
    rows.append(dict(measure="loop of fits", method="GMM n_init=1", value=len(loop) / seconds,
                     unit="datasets/s", error=np.nan))
    return rows


def large_n(checkpoint, device, n_samples):
    rng = np.random.default_rng(2)
    means = rng.uniform(-5, 5, (5, 16))
    X = means[rng.choice(5, n_samples)] + rng.standard_normal((n_samples, 16))
    rows = []
    for name, make in {
        "TransformerGMM": lambda: TransformerGMM(5, checkpoint=checkpoint, device=device,
                                                 random_state=0),
        "GMM n_init=1": lambda: GaussianMixture(5, random_state=0),
    }.items():
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        start = time.perf_counter()
        gmm = make().fit(X)
        seconds = time.perf_counter() - start
        grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1e3
        rows.append(dict(measure=f"fit N={n_samples} d=16 K=5", method=name, value=seconds,
                         unit="s", error=mean_error(gmm.means_, means)))
        if name == "TransformerGMM":  # runs first: the process's peak is its own
            rows.append(dict(measure=f"peak RSS growth N={n_samples}", method=name,
                             value=grown, unit="MB", error=np.nan))
    return rows


MEASUREMENTS = ("latency", "throughput", "large_n")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--checkpoint", default="default",
                        help="a checkpoint name, or 'none' for the EM fallback")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--only", nargs="+", choices=MEASUREMENTS, default=MEASUREMENTS,
                        help="run only these measurements")
    parser.add_argument("--batches", nargs="+", type=int,
                        help="fit_many batch sizes (default: 100 1000 10000; --quick: 10 100)")
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    checkpoint = None if args.checkpoint.lower() == "none" else args.checkpoint
    batches = args.batches or ([10, 100] if args.quick else [100, 1_000, 10_000])
    rows = []
    # One thread, as scikit-learn is timed: more would only oversubscribe shared cores.
    with warnings.catch_warnings(), single_threaded():
        warnings.simplefilter("ignore", FallbackWarning)
        if "latency" in args.only:
            rows += latency(checkpoint, args.device, 5 if args.quick else 30)
        if "throughput" in args.only:
            rows += throughput(checkpoint, args.device, batches)
        if "large_n" in args.only:
            rows += large_n(checkpoint, args.device, 100_000 if args.quick else 1_000_000)
    reference = {r["measure"]: r["value"] for r in rows if r["method"] == "GMM n_init=1"}
    print(f"{'measure':<34} {'method':<16} {'value':>12} {'unit':<11} {'error':>8}")
    for row in rows:
        print(f"{row['measure']:<34} {row['method']:<16} {row['value']:>12.2f} "
              f"{row['unit']:<11} {row['error']:>8.4f}")
    ours = {r["measure"]: r["value"] for r in rows if r["method"] == "TransformerGMM"}
    for measure in ours.keys() & reference.keys():
        print(f"ratio TransformerGMM / GMM n_init=1, {measure}: "
              f"{ours[measure] / reference[measure]:.2f}")
    path = write_csv(rows, args.results / "speed.csv")
    print(f"wrote {path}")
    return rows


if __name__ == "__main__":
    main()
