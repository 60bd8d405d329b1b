"""Fitting on a Dask array: time, memory per worker and graph overhead, against memory.

Writes N rows of a Gaussian mixture (d = 16, K = 5, unit noise, means uniform in
[-5, 5]) to a .npy file, reads it back as a Dask array in chunks of ``--chunk-rows`` rows
and fits ``TransformerGMM(5)`` and ``TransformerClusterer(5)`` (defaults otherwise) on a
``LocalCluster`` of two worker processes with one thread each. For each fit:

- the time, the EM or Lloyd iterations and the passes over the data;
- the graph overhead per pass: a pass's wall time less the compute of the busiest worker
  in it (from the task stream; reading the chunks from disk counts as compute);
- the peak memory growth of each worker over its resident memory before the fit, after
  the imports and a warm-up fit (``VmHWM`` reset before the fit, as speed.py measures),
  beside the target of two chunks and 50 MB, and the growth of this process;
- the in-memory fit of the same rows (``np.load`` of the file, one thread), in a process
  of its own: time and peak growth over the loaded array;
- the agreement from the same start: EM (or Lloyd) in memory on every row, from the start
  that the Dask fit chose on its sample, against the Dask fit's parameters;
- for the clusterer, dask-ml's ``KMeans`` (k-means||, the anchor of distributed k-means)
  on the same array and cluster: time and inertia (skipped when dask-ml is missing).

Each chunk is read by a task that opens the file, copies its rows out and closes it, so
that no worker keeps pages of the file mapped (a kept memory map would count every page it
has read in the worker's resident memory).

    python benchmarks/dask_fit.py --quick            # 200,000 rows: about a minute
    nice -n 10 python benchmarks/dask_fit.py         # 10^7 rows, 1.3 GB on disk: minutes

Prints a table and writes benchmarks/results/dask_fit.csv. Needs
``pip install "dask[array,distributed]" dask-ml`` (the ``benchmarks`` extra).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from contextlib import contextmanager
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from common import mean_error, standard_parser, write_csv  # noqa: E402

N_FEATURES, N_COMPONENTS = 16, 5
METHODS = ("TransformerGMM", "TransformerClusterer")


# --- memory ------------------------------------------------------------------------------
# Both figures from /proc/self/status, in the same unit: the resident memory now (VmRSS)
# and its peak since the last reset (VmHWM; Linux 4.0+ resets it through clear_refs).


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024 / 1e6  # kB
    raise OSError(f"no {field} in /proc/self/status (not Linux?)")


def reset_peak() -> float:
    """Restart the peak from the resident memory now, and return that (MB)."""
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")
    return _status_mb("VmRSS")


def peak() -> float:
    return _status_mb("VmHWM")


# --- the data --------------------------------------------------------------------------


def true_means(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-5, 5, (N_COMPONENTS, N_FEATURES))


def write_data(path: Path, n_samples: int, seed: int, block: int = 1_000_000) -> None:
    """The rows, written block by block into a .npy file (never all in memory)."""
    rng = np.random.default_rng([seed, 1])
    means = true_means(seed)
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float64,
                                    shape=(n_samples, N_FEATURES))
    for start in range(0, n_samples, block):
        rows = min(block, n_samples - start)
        out[start : start + rows] = means[rng.integers(0, N_COMPONENTS, rows)]
        out[start : start + rows] += rng.standard_normal((rows, N_FEATURES))
    out.flush()
    del out


class NpyRows:
    """Rows of a .npy file for ``da.from_array``, read straight into a fresh array: no
    memory map, whose pages would count in the worker's resident memory. Pickles as its
    path."""

    def __init__(self, path: Path) -> None:
        array = np.load(path, mmap_mode="r")
        self.path, self.shape, self.dtype, self.ndim = str(path), array.shape, array.dtype, 2
        self.row_bytes = array.strides[0]
        self.header_bytes = array.offset
        del array

    def __getitem__(self, index) -> np.ndarray:
        rows, columns = index if isinstance(index, tuple) else (index, slice(None))
        if not isinstance(rows, slice) or rows.step not in (None, 1):  # not a run of rows
            return np.array(np.load(self.path, mmap_mode="r")[index])
        start, stop, _ = rows.indices(self.shape[0])
        out = np.empty((stop - start, self.shape[1]), self.dtype)
        with open(self.path, "rb") as file:
            file.seek(self.header_bytes + start * self.row_bytes)
            file.readinto(memoryview(out).cast("B"))
        return out[:, columns]


def make_estimator(method: str, checkpoint):
    from transformer_gmm import TransformerClusterer, TransformerGMM

    cls = TransformerGMM if method == "TransformerGMM" else TransformerClusterer
    return cls(N_COMPONENTS, checkpoint=checkpoint, random_state=0)


def estimate(model) -> np.ndarray:
    return model.cluster_centers_ if hasattr(model, "cluster_centers_") else model.means_


# --- the same start, in memory ----------------------------------------------------------


def chosen_start(method: str, X_dask, checkpoint) -> dict:
    """The start the Dask fit of ``method`` goes on from over every row, rebuilt from its
    sample (one more pass over the array) as the fit builds it."""
    import dataclasses

    from sklearn.utils import check_random_state

    from transformer_gmm import _dask
    from transformer_gmm._fitting import draw_seed
    from transformer_gmm.engine import fit

    model = make_estimator(method, checkpoint)
    seed = draw_seed(check_random_state(model.random_state))
    sample = _dask._summarize(X_dask, seed, method).sample
    # The estimator's own plan, with the Dask fit's seed: the same starts on the sample.
    plan = model._plan(sample, None, check_random_state(model.random_state))
    plan = dataclasses.replace(plan, seed=seed)
    if plan.n_runs == 1 or len(sample) == X_dask.shape[0]:
        raise SystemExit("the same-start check needs several starts and more rows than the "
                         "sample: raise --n-samples")
    if method == "TransformerGMM":
        fits = fit.fit(plan, [sample])
        return dict(weights=fits.weights, means=fits.means, covariances=fits.covariances,
                    n_iter=fits.n_iter)
    kmeans_fit = fit.fit(plan, [sample])
    return dict(centers=kmeans_fit.centers[None], n_iter=np.array([kmeans_fit.n_iter]))


def same_start_difference(X: np.ndarray, method: str, start: dict, fitted: dict) -> dict:
    """EM (Lloyd) in memory on every row from ``start``: its largest difference from the
    Dask fit's parameters, and whether the iterations agree."""
    import torch

    from transformer_gmm.engine import em, gaussian, kmeans, m_step

    x = torch.from_numpy(X)[None]
    if method == "TransformerGMM":
        covariances = torch.from_numpy(start["covariances"])
        params = m_step.MixtureParams(
            torch.from_numpy(start["weights"]), torch.from_numpy(start["means"]), covariances,
            gaussian.compute_precision_cholesky(covariances, "full"))
        result = em.fit_em(x, params, covariance_type="full", reg_covar=1e-6, max_iter=100,
                           tol=1e-3)
        ours = dict(weights=result.params.weights[0], means=result.params.means[0],
                    covariances=result.params.covariances[0])
    else:
        lloyd = kmeans.lloyd(x, torch.from_numpy(start["centers"]), max_iter=300, tol=1e-4)
        result, n_iter = None, lloyd.n_iter
        ours = dict(cluster_centers=lloyd.centers[0])
    difference = max(float(np.abs(value.numpy() - np.asarray(fitted[name])).max())
                     for name, value in ours.items())
    n_iter = (result.n_iter if result is not None else n_iter)[0] + int(start["n_iter"][0])
    return dict(same_start_max_difference=difference,
                same_start_same_n_iter=int(n_iter) == int(fitted["n_iter"]))


# --- the in-memory fit, in a process of its own -----------------------------------------


def _release_freed_memory() -> None:
    """Hand memory that malloc keeps after a fit back to the system, so that the next fit
    in the process grows from the same floor instead of reusing it (glibc only)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def in_memory_worker(path: str, check_folder: str, checkpoint) -> dict:
    """Each method's in-memory fit of the rows, then EM (Lloyd) from the Dask fit's start,
    whose start and parameters ``check_folder`` holds as ``<method>.npz``."""
    X = np.load(path)
    rows = {}
    for method in METHODS:
        make_estimator(method, checkpoint).fit(X[:2_000])  # warm-up: loads the checkpoint
        _release_freed_memory()
        before = reset_peak()
        start = time.perf_counter()
        model = make_estimator(method, checkpoint).fit(X)
        seconds = time.perf_counter() - start
        rows[method] = dict(seconds=seconds, memory_mb=peak() - before,
                            n_iter=int(model.n_iter_), estimate=estimate(model).tolist())
        del model
    for method in METHODS:
        check = dict(np.load(Path(check_folder) / f"{method}.npz"))
        start_arrays = {k[6:]: v for k, v in check.items() if k.startswith("start_")}
        fitted = {k[7:]: v for k, v in check.items() if k.startswith("fitted_")}
        rows[method].update(same_start_difference(X, method, start_arrays, fitted))
    return rows


def in_memory(path: Path, check_folder: Path, checkpoint) -> dict:
    """:func:`in_memory_worker` in a process of its own, away from the cluster's client."""
    command = [sys.executable, __file__, "--in-memory-worker", str(path), str(check_folder),
               "--checkpoint", "none" if checkpoint is None else str(checkpoint)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the in-memory fits failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# --- measuring on the cluster -----------------------------------------------------------


@contextmanager
def worker_memory(client, growth: dict):
    """The peak growth of each worker's resident memory (MB) and of this process's, over
    their memory when the block starts, into ``growth``."""
    before = client.run(reset_peak)
    here = reset_peak()
    yield
    peaks = client.run(peak)
    growth["workers"] = [peaks[w] - before[w] for w in sorted(before)]
    growth["client"] = peak() - here


@contextmanager
def counted_passes(passes: list):
    """Times every pass of a Dask fit over the array (the first pass, then one per
    iteration), as (start, stop) pairs, by wrapping the functions that run them."""
    from transformer_gmm import _dask

    passes_by = ("_summarize", "_sum_over_blocks", "_stack_blocks")
    originals = {name: getattr(_dask, name) for name in passes_by}

    def timed(function):
        def wrapper(*args, **kwargs):
            start = time.time()
            try:
                return function(*args, **kwargs)
            finally:
                passes.append((start, time.time()))
        return wrapper

    for name, function in originals.items():
        setattr(_dask, name, timed(function))
    try:
        yield
    finally:
        for name, function in originals.items():
            setattr(_dask, name, function)


def overhead_per_pass(passes: list, tasks: list) -> float:
    """Mean over passes of (wall time - the busiest worker's compute in it), in ms."""
    overheads = []
    for start, stop in passes:
        busy: dict = {}  # compute seconds per worker
        for task in tasks:
            for part in task["startstops"]:
                if part["action"] == "compute" and start <= part["start"] <= stop:
                    seconds = part["stop"] - part["start"]
                    busy[task["worker"]] = busy.get(task["worker"], 0.0) + seconds
        overheads.append((stop - start) - max(busy.values(), default=0.0))
    return 1000 * float(np.mean(overheads))


def dask_fit(client, X_dask, method: str, checkpoint) -> tuple[object, dict]:
    from dask.distributed import get_task_stream

    growth, passes = {}, []
    with worker_memory(client, growth), counted_passes(passes), \
            get_task_stream(client) as stream:
        start = time.perf_counter()
        model = make_estimator(method, checkpoint).fit(X_dask)
        seconds = time.perf_counter() - start
    row = dict(seconds=seconds, n_iter=int(model.n_iter_), passes=len(passes),
               overhead_ms=overhead_per_pass(passes, stream.data),
               worker_memory_mb=max(growth["workers"]), client_memory_mb=growth["client"])
    return model, row


def dask_ml_kmeans(client, X_dask) -> dict:
    try:
        from dask_ml.cluster import KMeans
    except ImportError:
        return {}
    growth = {}
    with worker_memory(client, growth):
        start = time.perf_counter()
        model = KMeans(n_clusters=N_COMPONENTS, init="k-means||", random_state=0).fit(X_dask)
        seconds = time.perf_counter() - start
    return dict(seconds=seconds, n_iter=int(model.n_iter_), inertia=float(model.inertia_),
                worker_memory_mb=max(growth["workers"]), client_memory_mb=growth["client"],
                estimate=model.cluster_centers_)


# --- the run ------------------------------------------------------------------------------


def run(path: Path, n_samples: int, chunk_rows: int, checkpoint, seed: int,
        anchor: bool = True) -> list[dict]:
    import dask.array as da
    from dask.distributed import Client, LocalCluster

    means = true_means(seed)
    chunk_mb = chunk_rows * N_FEATURES * 8 / 1e6
    rows, checks = [], Path(tempfile.mkdtemp())
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        X_dask = da.from_array(NpyRows(path), chunks=(chunk_rows, -1))
        # Imports on the workers and the checkpoint here, before anything is measured.
        warm = X_dask[: min(n_samples, 3 * chunk_rows)]
        for method in METHODS:
            make_estimator(method, checkpoint).fit(warm)
        for method in METHODS:
            model, row = dask_fit(client, X_dask, method, checkpoint)
            start = chosen_start(method, X_dask, checkpoint)
            fitted = (dict(cluster_centers=model.cluster_centers_) if method != "TransformerGMM"
                      else dict(weights=model.weights_, means=model.means_,
                                covariances=model.covariances_))
            np.savez(checks / f"{method}.npz", **{f"start_{k}": v for k, v in start.items()},
                     **{f"fitted_{k}": v for k, v in fitted.items()},
                     fitted_n_iter=np.array(model.n_iter_))
            quality = ("inertia", float(model.inertia_)) if method != "TransformerGMM" else (
                "lower_bound", float(model.lower_bound_))
            rows.append(dict(method=f"{method} (Dask)", **row, **dict([quality]),
                             mean_error=mean_error(estimate(model), means)))
        anchor = dask_ml_kmeans(client, X_dask) if anchor else {}
    memory = in_memory(path, checks, checkpoint)
    shutil.rmtree(checks)
    by_chunks, rows = rows, []
    for row, method in zip(by_chunks, METHODS, strict=True):
        ours = memory[method]
        row.update(same_start_max_difference=ours["same_start_max_difference"],
                   same_start_same_n_iter=ours["same_start_same_n_iter"])
        rows += [row, dict(method=f"{method} (in memory)", seconds=ours["seconds"],
                           n_iter=ours["n_iter"], client_memory_mb=ours["memory_mb"],
                           mean_error=mean_error(np.array(ours["estimate"]), means))]
    if anchor:
        rows.append(dict(method="dask-ml KMeans (k-means||)",
                         **{k: v for k, v in anchor.items() if k != "estimate"},
                         mean_error=mean_error(anchor["estimate"], means)))
    # One set of columns for the CSV, NaN where a method has no value.
    names = list(dict.fromkeys(name for row in rows for name in row))
    return [dict({name: row.get(name, np.nan) for name in names}, n_samples=n_samples,
                 chunk_rows=chunk_rows, chunk_mb=chunk_mb) for row in rows]


COLUMNS = [("method", "{:<32}"), ("seconds", "{:>9.2f}"), ("n_iter", "{:>6}"),
           ("passes", "{:>6}"), ("overhead_ms", "{:>11.1f}"), ("worker_memory_mb", "{:>13.1f}"),
           ("client_memory_mb", "{:>13.1f}"), ("mean_error", "{:>10.2e}")]


def print_table(rows: list[dict]) -> None:
    print(" ".join(f"{name:>{len(fmt.format(0)) if name != 'method' else 32}}"
                   for name, fmt in COLUMNS))
    for row in rows:
        cells = []
        for name, fmt in COLUMNS:
            value = row.get(name, np.nan)
            width = 32 if name == "method" else len(fmt.format(0))
            missing = value is None or (isinstance(value, float) and np.isnan(value))
            cells.append(f"{'n/a':>{width}}" if missing else fmt.format(value))
        print(" ".join(cells))


def print_targets(rows: list[dict]) -> None:
    by_method = {row["method"]: row for row in rows}
    chunk_mb = rows[0]["chunk_mb"]
    limit = 2 * chunk_mb + 50
    print(f"\nTargets (chunks of {rows[0]['chunk_rows']:,} rows, {chunk_mb:.1f} MB):")
    for method in METHODS:
        ours, memory = by_method[f"{method} (Dask)"], by_method[f"{method} (in memory)"]
        difference = ours["same_start_max_difference"]
        print(f"  {method}: same start, largest parameter difference {difference:.1e} "
              f"({'met' if difference <= 1e-6 else 'missed'}: 1e-6); iterations "
              f"{'equal' if ours['same_start_same_n_iter'] else 'differ'}")
        memory_mb = ours["worker_memory_mb"]
        print(f"  {method}: peak growth per worker {memory_mb:.1f} MB "
              f"({'met' if memory_mb <= limit else 'missed'}: 2 chunks + 50 MB = {limit:.1f} MB)")
        ratio = ours["seconds"] / memory["seconds"]
        print(f"  {method}: time {ratio:.2f} x the in-memory fit "
              f"({'met' if ratio <= 2 else 'missed'}: 2)")
    anchor = by_method.get("dask-ml KMeans (k-means||)")
    if anchor is None:
        print("  no dask-ml KMeans (not installed, or --no-dask-ml): no anchor for the inertia")
    else:
        ratio = by_method["TransformerClusterer (Dask)"]["inertia"] / anchor["inertia"]
        print(f"  TransformerClusterer: inertia {ratio:.6f} x dask-ml's "
              f"({'met' if ratio <= 1 + 1e-9 else 'missed'}: at most 1)")


def main(argv=None) -> list[dict]:
    parser = standard_parser(__doc__, "dask_fit", "200,000 rows in chunks of 25,000",
                             tasks=False)
    parser.add_argument("--n-samples", type=int, help="rows (default 10^7; --quick 200,000)")
    parser.add_argument("--chunk-rows", type=int,
                        help="rows per chunk (default 250,000; --quick 25,000)")
    parser.add_argument("--data", type=Path, help="the .npy file to use or write (default: a "
                        "temporary file, removed at the end)")
    parser.add_argument("--no-dask-ml", action="store_true",
                        help="leave out dask-ml's KMeans (its first fit compiles with numba)")
    parser.add_argument("--in-memory-worker", nargs=2, metavar=("PATH", "CHECK_FOLDER"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    checkpoint = None if args.checkpoint.lower() == "none" else args.checkpoint
    warnings.simplefilter("ignore", UserWarning)  # FallbackWarning, dask's large-graph notes
    if args.in_memory_worker:
        rows = in_memory_worker(*args.in_memory_worker, checkpoint)
        print(json.dumps(rows))
        return [rows]
    n_samples = args.n_samples or (200_000 if args.quick else 10_000_000)
    chunk_rows = args.chunk_rows or (25_000 if args.quick else 250_000)
    args.results.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        path = args.data or Path(tmp) / "mixture.npy"
        if not path.exists() or np.load(path, mmap_mode="r").shape != (n_samples, N_FEATURES):
            start = time.perf_counter()
            write_data(path, n_samples, args.seed)
            print(f"wrote {n_samples:,} x {N_FEATURES} rows to {path} "
                  f"in {time.perf_counter() - start:.1f} s")
        rows = run(path, n_samples, chunk_rows, checkpoint, args.seed,
                   anchor=not args.no_dask_ml)
    print(f"\nN = {n_samples:,}, d = {N_FEATURES}, K = {N_COMPONENTS}; 2 workers x 1 thread "
          f"({os.cpu_count()} cores here)")
    print_table(rows)
    print_targets(rows)
    path = write_csv(rows, args.results / f"{args.out}.csv")
    print(f"wrote {path}")
    return rows


# The workers of the LocalCluster import this file again: the guard keeps them from
# running the benchmark themselves.
if __name__ == "__main__":
    main()
