"""Speed: one small fit, many datasets at once, and a million points, against scikit-learn.

Three measurements, each a median over repeats, each quoted as a ratio against
scikit-learn measured in the same run (machines here are noisy; ratios travel better):

1. latency of one fit, N = 128, d = 8, K = 4 (spherical): ``TransformerGMM`` (the
   default, four starts, and ``n_init=1``, the transformer's start alone) against
   ``GaussianMixture(n_init=1)`` and ``n_init=10``, with the mean error of each;
2. ``fit_many`` throughput (datasets per second) for batches of datasets of that size
   (one 3-D array, ``output="arrays"``; the default ``n_init`` and ``n_init=1``),
   against a loop of ``GaussianMixture(n_init=1)``
   fits, with the backbone's model FLOPs utilisation (MFU): the forward pass's FLOPs per
   dataset (from the model config) times datasets/s, over ``--peak-tflops``;
3. one fit of 1,000,000 points (d = 16, K = 5, full covariances) against
   ``GaussianMixture(n_init=1)``, and ``TransformerClusterer`` against
   ``KMeans(n_init=1)`` on the same points: time, mean error, and peak memory growth
   over the memory resident before the fit, each method in a fresh process.

Four more: ``wide`` (50 rows of 2,000 features, diagonal and full covariances; in the
default set), ``first_fit`` (the import and the first two fits of each estimator in a fresh
interpreter, on the latency task; in the default set), ``predictions`` (a fitted
estimator's methods on 1 to 10,000 new rows; in the default set) and ``threads`` (asked for by name:
fits at the threads the process starts with rather than one, in a row and right after
scikit-learn's; see :func:`default_threads`).

    python benchmarks/speed.py --quick      # small batches, 100,000 points: about a minute
    python benchmarks/speed.py --device cuda --only throughput --batches 1000 10000 100000
    python benchmarks/speed.py --only throughput --batches 1000 10000 --checkpoint none
    python benchmarks/speed.py --only wide       # n = 50, d = 2,000: diag and full
    python benchmarks/speed.py --only threads    # fits at the process's own threads
    python benchmarks/speed.py --only first_fit  # a script's one fit: fresh interpreters
    python benchmarks/speed.py --only predictions   # predict & co. on new rows

Prints a table and writes benchmarks/results/speed.csv.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
from sklearn.cluster import KMeans
from sklearn.mixture import GaussianMixture

sys.path.insert(0, str(Path(__file__).parent))
from common import (  # noqa: E402
    backbone_flops,
    mean_error,
    sample_tgmm_task,
    shared_parser,
    single_threaded,
    write_csv,
)

from transformer_gmm import (  # noqa: E402
    FallbackWarning,
    TransformerClusterer,
    TransformerGMM,
    fit_many,
)


def median_ms(fit, repeats: int) -> float:
    fit()  # warm-up: loads the checkpoint, fills caches
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fit()
        times.append(time.perf_counter() - start)
    return 1000 * float(np.median(times))


def latency(checkpoint, device, repeats, seed=0):
    task = sample_tgmm_task(np.random.default_rng(seed), 4, 8)  # stages.py's task too
    candidates = {
        "TransformerGMM": lambda: TransformerGMM(
            4, covariance_type="spherical", checkpoint=checkpoint, device=device, random_state=0
        ),
        # One start (the transformer's mixture): the least a fit can run.
        "TransformerGMM n_init=1": lambda: TransformerGMM(
            4, covariance_type="spherical", checkpoint=checkpoint, device=device,
            random_state=0, n_init=1,
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
                         error=error, mfu=np.nan))
    return rows


def wide(checkpoint, device, repeats, seed=0):
    """Fewer rows than features (n = 50, d = 2,000, K = 2, two separated halves): the fit
    costs what the rows' rank costs, not d^3, for diagonal and full covariances; the
    median of ``repeats`` fits against GaussianMixture's, interleaved (five times as many
    with diagonal ones, which take milliseconds: their ratio moves by a fifth between
    medians of three). With diagonal ones, also one start (``n_init=1``: the transformer's
    reading and one EM run) and the fallback (``checkpoint=None``: one k-means++ start),
    which say what the transformer's reading costs."""
    rng = np.random.default_rng(seed + 3)
    X = rng.normal(size=(50, 2000))
    X[:25] += 3.0
    rows = []
    for covariance in ("diag", "full"):
        candidates = {
            "TransformerGMM": lambda cov=covariance: TransformerGMM(
                2, covariance_type=cov, checkpoint=checkpoint, device=device, random_state=0),
            "GMM n_init=1": lambda cov=covariance: GaussianMixture(
                2, covariance_type=cov, random_state=0),
        }
        if covariance == "diag":
            candidates["TransformerGMM n_init=1"] = lambda: TransformerGMM(
                2, covariance_type="diag", checkpoint=checkpoint, device=device,
                random_state=0, n_init=1)
            candidates["TransformerGMM checkpoint=None"] = lambda: TransformerGMM(
                2, covariance_type="diag", checkpoint=None, device=device, random_state=0)
        times = {name: [] for name in candidates}
        for _ in range(5 * repeats if covariance == "diag" else repeats):
            for name, make in candidates.items():
                start = time.perf_counter()
                make().fit(X)
                times[name].append(1e3 * (time.perf_counter() - start))
        for name, values in times.items():
            rows.append(dict(measure=f"wide n=50 d=2000 K=2 {covariance}", method=name,
                             value=float(np.median(values)), unit="ms", error=np.nan,
                             mfu=np.nan))
    return rows


def predictions(checkpoint, device, repeats, seed=0):
    """Each fitted estimator's methods on new rows (1, 100 and 10,000 of the latency
    task's mixture), against scikit-learn's on the same rows: the median over ``repeats``
    of the mean time of a call (each timed over enough calls to last about 20 ms). What a
    service that labels rows as they come pays per call."""
    task = sample_tgmm_task(np.random.default_rng(seed), 4, 8)
    fitted = {
        "TransformerGMM": TransformerGMM(4, covariance_type="spherical", checkpoint=checkpoint,
                                         device=device, random_state=0).fit(task.X),
        "GMM n_init=1": GaussianMixture(4, covariance_type="spherical",
                                        random_state=0).fit(task.X),
        "TransformerClusterer": TransformerClusterer(4, checkpoint=checkpoint, device=device,
                                                     random_state=0).fit(task.X),
        "KMeans n_init=1": KMeans(4, n_init=1, random_state=0).fit(task.X),
    }
    methods = {"TransformerGMM": ("predict", "predict_proba", "score_samples"),
               "TransformerClusterer": ("predict", "transform")}
    methods["GMM n_init=1"], methods["KMeans n_init=1"] = (
        methods["TransformerGMM"], methods["TransformerClusterer"])
    rng = np.random.default_rng(seed + 5)
    rows = []
    for n_rows in (1, 100, 10_000):
        X = rng.normal(scale=3.0, size=(n_rows, task.X.shape[1]))
        times = {(name, method): [] for name in fitted for method in methods[name]}
        for _ in range(repeats):  # interleaved, so that load on the machine hits all alike
            for name, method in times:
                call = getattr(fitted[name], method)
                calls = max(1, int(0.02 / _seconds_per_call(call, X)))
                start = time.perf_counter()
                for _ in range(calls):
                    call(X)
                times[name, method].append(1e6 * (time.perf_counter() - start) / calls)
        for (name, method), values in times.items():
            rows.append(dict(measure=f"{method}, {n_rows:,} rows", method=name,
                             value=float(np.median(values)), unit="us", error=np.nan,
                             mfu=np.nan))
    return rows


def _seconds_per_call(call, X) -> float:
    """One call's time after a warm-up call: how many calls fill a timing."""
    call(X)
    start = time.perf_counter()
    call(X)
    return max(time.perf_counter() - start, 1e-6)


# A fresh interpreter that imports one estimator, fits the latency task twice and prints
# the seconds of the import and of each fit: what a script that fits once pays.
_FIRST_FIT = """
import json, sys, time, warnings
warnings.simplefilter("ignore")
start = time.perf_counter()
import numpy as np
from {module} import {name}
imported = time.perf_counter()
X = np.load(sys.argv[1])
seconds = []
for _ in range(2):
    begin = time.perf_counter()
    {name}({arguments}).fit(X)
    seconds.append(time.perf_counter() - begin)
print(json.dumps([imported - start, *seconds]))
"""


def first_fit(checkpoint, device, repeats, seed=0):
    """The import, the first fit and the second of each estimator in a fresh interpreter
    (one BLAS and OpenMP thread), ``repeats`` interpreters each, on the latency task: a
    process's first fit loads the checkpoint and runs torch's first operations, which
    every other measurement here leaves to a warm-up. Each interpreter reads compiled
    bytecode, as an installed package does (pip compiles it at install time): an untimed
    interpreter per estimator writes it first (Python's own ``__pycache__``), where the
    environment would forbid it (``PYTHONDONTWRITEBYTECODE``) too."""
    import tempfile

    task = sample_tgmm_task(np.random.default_rng(seed), 4, 8)
    ours = f"checkpoint={None if checkpoint is None else str(checkpoint)!r}, device={device!r}, "
    estimators = {
        "TransformerGMM": ("transformer_gmm", "TransformerGMM",
                           f"4, covariance_type='spherical', {ours}random_state=0"),
        "GMM n_init=1": ("sklearn.mixture", "GaussianMixture",
                         "4, covariance_type='spherical', random_state=0"),
        "TransformerClusterer": ("transformer_gmm", "TransformerClusterer",
                                 f"4, {ours}random_state=0"),
        "KMeans n_init=1": ("sklearn.cluster", "KMeans", "4, n_init=1, random_state=0"),
    }
    environment = {**os.environ, **{name: "1" for name in (
        "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}}
    environment.pop("PYTHONDONTWRITEBYTECODE", None)
    times = {name: [] for name in estimators}
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "X.npy"
        np.save(data, task.X)
        for warm_up in (True, *[False] * repeats):  # interleaved: load hits all alike
            for name, (module, cls, arguments) in estimators.items():
                code = _FIRST_FIT.format(module=module, name=cls, arguments=arguments)
                done = subprocess.run([sys.executable, "-c", code, str(data)], env=environment,
                                      capture_output=True, text=True, check=False)
                if done.returncode != 0:
                    raise RuntimeError(f"the first fit of {name} failed:\n{done.stderr}")
                if not warm_up:
                    times[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
    rows = []
    for name, values in times.items():
        medians = 1000 * np.median(np.array(values), axis=0)
        for measure, value in zip(("import", "first fit", "second fit"), medians, strict=True):
            rows.append(dict(measure=f"fresh process: {measure}", method=name,
                             value=float(value), unit="ms", error=np.nan, mfu=np.nan))
    return rows


def default_threads(checkpoint, device, repeats, seed=0):
    """Fits one after another with the threads the process starts with (torch's, and
    numpy's BLAS), not one: what a user's loop of fits gets. 200 and 2,000 rows of 100
    features in three clusters, K = 3, full and diagonal covariances: the median of
    ``repeats`` fits of ours in a row, of as many GaussianMixture fits in a row, and of
    ours each right after a GaussianMixture fit. A BLAS call of many threads leaves them
    spinning for milliseconds, against torch's threads (``transformer_gmm/_blas.py``);
    and the pairs again with numpy's BLAS limited to one thread."""
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(seed + 4)
    rows = []
    for n_rows in (200, 2000):
        centres = rng.normal(scale=0.5, size=(3, 100))
        X = centres[rng.integers(3, size=n_rows)] + rng.normal(size=(n_rows, 100))
        for covariance in ("full", "diag"):
            def ours(cov=covariance, X=X):
                return TransformerGMM(3, covariance_type=cov, checkpoint=checkpoint,
                                      device=device, random_state=0).fit(X)

            def theirs(cov=covariance, X=X):
                return GaussianMixture(3, covariance_type=cov, random_state=0).fit(X)

            def timed_ms(fit):
                start = time.perf_counter()
                fit()
                return 1e3 * (time.perf_counter() - start)

            ours(), theirs()  # warm-up
            times = {
                "TransformerGMM": [timed_ms(ours) for _ in range(repeats)],
                "GMM n_init=1": [timed_ms(theirs) for _ in range(repeats)],
                "TransformerGMM after GMM": [(theirs(), timed_ms(ours))[1]
                                             for _ in range(repeats)],
            }
            # The remedy for a loop that mixes them: numpy's BLAS on one thread.
            with threadpool_limits(limits=1, user_api="blas"):
                pairs = [(timed_ms(theirs), timed_ms(ours)) for _ in range(repeats)]
            times["GMM, one BLAS thread"] = [gmm for gmm, _ in pairs]
            times["TransformerGMM after GMM, one BLAS thread"] = [tgmm for _, tgmm in pairs]
            for name, values in times.items():
                rows.append(dict(
                    measure=f"threads n={n_rows} d=100 K=3 {covariance}", method=name,
                    value=float(np.median(values)), unit="ms", error=np.nan, mfu=np.nan))
    return rows


def throughput(checkpoint, device, batch_sizes, peak_tflops, seed=0):
    rng = np.random.default_rng(seed + 1)
    flops = np.nan
    if checkpoint is not None:
        from transformer_gmm.storage import load_model

        flops = backbone_flops(load_model(checkpoint), 128, 4)
    rows = []
    for batch in batch_sizes:
        datasets = np.stack([sample_tgmm_task(rng, 4, 8).X for _ in range(batch)])
        for method, n_init in (("fit_many", "auto"), ("fit_many n_init=1", 1)):
            seconds = median_ms(lambda datasets=datasets, n_init=n_init: fit_many(
                datasets, 4, covariance_type="spherical", checkpoint=checkpoint, device=device,
                random_state=0, output="arrays", n_init=n_init), 3) / 1000
            rate = batch / seconds
            rows.append(dict(measure=f"fit_many batch={batch}", method=method, value=rate,
                             unit="datasets/s", error=np.nan,
                             mfu=rate * flops / peak_tflops / 1e12))
    loop = datasets[: min(200, batch_sizes[-1])]
    seconds = median_ms(lambda: [GaussianMixture(4, covariance_type="spherical",
                                                 random_state=0).fit(X) for X in loop], 1) / 1000
    rows.append(dict(measure="loop of fits", method="GMM n_init=1", value=len(loop) / seconds,
                     unit="datasets/s", error=np.nan, mfu=np.nan))
    return rows


def reset_peak_resident() -> None:
    """Start the peak below from the memory resident now (Linux 4.0+; elsewhere a no-op,
    and the peak is then the process's own so far)."""
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
    except OSError:
        pass


def peak_resident_mb() -> float:
    """The peak resident memory of this process's address space (VmHWM), in MB.

    Not ru_maxrss: Linux carries it across fork and exec, so a child process started
    by a parent larger than the child's own peak reports the parent's size (which is
    what once read 1.3 GB of growth for a fit that grows by 0.4 GB)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1e3  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3  # KB on Linux


def resident_mb() -> float:
    """The process's resident memory now. Measured from here, not from the peak so far:
    building X peaks above the X it leaves behind, which would hide the fit's own peak."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6
    except OSError:  # not Linux: the peak so far, which can only understate the growth
        return peak_resident_mb()


def large_n_estimators(checkpoint, device) -> dict:
    """The large-N methods by name, each a function that makes a fresh estimator."""
    ours = dict(checkpoint=checkpoint, device=device, random_state=0)
    return {
        "TransformerGMM": lambda: TransformerGMM(5, **ours),
        "GMM n_init=1": lambda: GaussianMixture(5, random_state=0),
        "TransformerClusterer": lambda: TransformerClusterer(5, **ours),
        "KMeans n_init=1": lambda: KMeans(5, n_init=1, random_state=0),
    }


def large_n(checkpoint, device, n_samples, method, seed=0):
    """One fit of ``method`` on the large data: its time, error and peak memory growth."""
    rng = np.random.default_rng(seed + 2)
    means = rng.uniform(-5, 5, (5, 16))
    X = means[rng.choice(5, n_samples)] + rng.standard_normal((n_samples, 16))
    make = large_n_estimators(checkpoint, device)[method]
    # Warm-up on a few points (loads the checkpoint), so the time below is the fit's alone.
    make().fit(X[:1000])
    before = resident_mb()
    reset_peak_resident()
    start = time.perf_counter()
    model = make().fit(X)
    seconds = time.perf_counter() - start
    grown = peak_resident_mb() - before
    clustering = hasattr(model, "cluster_centers_")
    estimated = model.cluster_centers_ if clustering else model.means_
    task = "cluster" if clustering else "fit"
    return [dict(measure=f"{task} N={n_samples} d=16 K=5", method=method, value=seconds,
                 unit="s", error=mean_error(estimated, means), mfu=np.nan),
            dict(measure=f"peak RSS growth, {task} N={n_samples}", method=method, value=grown,
                 unit="MB", error=np.nan, mfu=np.nan)]


def large_n_in_fresh_processes(checkpoint, device, n_samples, seed=0):
    """large_n, each method in a process of its own: memory that an earlier fit (or the
    throughput batches) freed stays resident for the next one to reuse, which would hide
    part of that one's growth."""
    rows = []
    for method in large_n_estimators(checkpoint, device):
        command = [sys.executable, __file__, "--large-n-worker", str(n_samples), method,
                   "--checkpoint", "none" if checkpoint is None else str(checkpoint),
                   "--device", device, "--seed", str(seed)]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"the large_n measurement of {method} failed:\n{done.stderr}")
        rows += json.loads(done.stdout.strip().splitlines()[-1])
    return rows


MEASUREMENTS = ("latency", "throughput", "large_n", "wide", "first_fit", "predictions")
# Asked for by name (--only threads): the others run on one thread.
DEFAULT_THREADS = "threads"


def main(argv=None):
    # --seed draws the data: the three measurements use seeds seed, seed + 1 and seed + 2.
    parser = shared_parser(__doc__, "5 repeats, batches of 10 and 100, 100,000 points")
    parser.add_argument("--checkpoint", default="default",
                        help="a checkpoint name, or 'none' for the EM fallback")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--only", nargs="+", choices=(*MEASUREMENTS, DEFAULT_THREADS),
                        default=MEASUREMENTS,
                        help="run only these measurements")
    parser.add_argument("--batches", nargs="+", type=int,
                        help="fit_many batch sizes (default: 100 1000 10000; --quick: 10 100)")
    parser.add_argument("--peak-tflops", type=float, default=989.0,
                        help="the device's peak, for the MFU column (default: 989, an "
                             "H100 SXM's dense bf16 tensor-core TFLOP/s)")
    parser.add_argument("--large-n-worker", nargs=2, metavar=("N", "METHOD"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    checkpoint = None if args.checkpoint.lower() == "none" else args.checkpoint
    batches = args.batches or ([10, 100] if args.quick else [100, 1_000, 10_000])
    rows = []
    # One thread, as scikit-learn is timed: more would only oversubscribe shared cores.
    with warnings.catch_warnings(), single_threaded():
        warnings.simplefilter("ignore", FallbackWarning)
        if args.large_n_worker:
            n_samples, method = args.large_n_worker
            rows = large_n(checkpoint, args.device, int(n_samples), method, args.seed)
            print(json.dumps(rows))
            return rows
        if "latency" in args.only:
            rows += latency(checkpoint, args.device, 5 if args.quick else 30, args.seed)
        if "throughput" in args.only:
            rows += throughput(checkpoint, args.device, batches, args.peak_tflops, args.seed)
        if "wide" in args.only:
            rows += wide(checkpoint, args.device, 1 if args.quick else 3, args.seed)
        if "predictions" in args.only:
            rows += predictions(checkpoint, args.device, 3 if args.quick else 15, args.seed)
        if "first_fit" in args.only:
            rows += first_fit(checkpoint, args.device, 1 if args.quick else 5, args.seed)
        if "large_n" in args.only:
            n_samples = 100_000 if args.quick else 1_000_000
            rows += large_n_in_fresh_processes(checkpoint, args.device, n_samples, args.seed)
    if DEFAULT_THREADS in args.only:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # convergence: not what is measured
            rows += default_threads(checkpoint, args.device, 5 if args.quick else 21, args.seed)
    print(f"{'measure':<34} {'method':<42} {'value':>12} {'unit':<11} {'error':>8} {'MFU':>8}")
    for row in rows:
        mfu = "" if np.isnan(row["mfu"]) else f"{100 * row['mfu']:.3f}%"
        print(f"{row['measure']:<34} {row['method']:<42} {row['value']:>12.2f} "
              f"{row['unit']:<11} {row['error']:>8.4f} {mfu:>8}")
    for ours, theirs in [("TransformerGMM", "GMM n_init=1"),
                         ("TransformerGMM n_init=1", "GMM n_init=1"),
                         ("TransformerGMM checkpoint=None", "GMM n_init=1"),
                         ("TransformerGMM after GMM", "GMM n_init=1"),
                         ("TransformerGMM after GMM, one BLAS thread", "GMM, one BLAS thread"),
                         ("TransformerClusterer", "KMeans n_init=1")]:
        ours_by = {r["measure"]: r["value"] for r in rows if r["method"] == ours}
        theirs_by = {r["measure"]: r["value"] for r in rows if r["method"] == theirs}
        for measure in sorted(ours_by.keys() & theirs_by.keys()):
            print(f"ratio {ours} / {theirs}, {measure}: "
                  f"{ours_by[measure] / theirs_by[measure]:.2f}")
    path = write_csv(rows, args.results / "speed.csv")
    print(f"wrote {path}")
    return rows


if __name__ == "__main__":
    main()
