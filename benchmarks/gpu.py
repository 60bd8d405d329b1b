"""On a GPU: the CUDA tests, fit_many's throughput and one large fit against scikit-learn
on the same GPU, the backbone's FLOP rate as a fraction of the card's peak, and a short
training run. One command, made for a machine lent for a few minutes:

    python benchmarks/gpu.py                    # on a CUDA machine: about 5 minutes (an H200)
    python benchmarks/gpu.py --dry-run          # every section at toy sizes, CPU allowed
    python benchmarks/gpu.py --only mfu large   # some sections

scikit-learn's side runs its array-API ``GaussianMixture`` on torch CUDA tensors
(``array_api_dispatch``, which needs ``SCIPY_ARRAY_API=1``: the script sets it and starts
again where it is not set),
where only ``init_params="random"`` or ``"random_from_data"`` is implemented; and a loop
of ``GaussianMixture`` over the machine's CPU cores (one thread a fit, k-means start).
Each section writes its CSV as soon as it ends (``gpu_tests.csv``, ``gpu_mfu.csv``,
``gpu_throughput.csv``, ``gpu_large.csv``, ``gpu_compiled.csv``), and the training run its folder
(``gpu_run/``: ``log.jsonl``, ``checkpoint/``), so a run cut short keeps what it measured.
"""

from __future__ import annotations

import os
import pstats
import sys

if __name__ == "__main__" and os.environ.get("SCIPY_ARRAY_API") != "1":
    # scikit-learn's array API needs it set before scipy loads: start again with it set.
    # (Not when imported, as the tests do: it would change the rest of their session.)
    os.environ["SCIPY_ARRAY_API"] = "1"
    os.execv(sys.executable, [sys.executable, *sys.argv])

import copy  # noqa: E402
import cProfile  # noqa: E402
import math  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from common import backbone_flops, shared_parser, write_csv  # noqa: E402

from transformer_gmm import TransformerGMM, fit_many  # noqa: E402
from transformer_gmm.storage import load_model  # noqa: E402

ROOT = Path(__file__).parents[1]
SECTIONS = ("tests", "train", "mfu", "large", "throughput", "compiled")

# Dense peak TFLOP/s by the vendor's datasheets (SXM parts): the MFU's denominators.
PEAK_TFLOPS = {
    "H100": {"float32": 66.9, "tf32": 494.7, "bfloat16": 989.4},
    "H200": {"float32": 66.9, "tf32": 494.7, "bfloat16": 989.4},
}

# fit_many's cells: (rows per dataset, features, components).
CELLS = ((128, 2, 2), (128, 8, 5), (128, 16, 10), (1000, 2, 2), (1000, 16, 10))

# fit_many's settings: (label, options, torch's float32 matmul precision). "high" lets the
# backbone's products run in TF32 on a GPU.
FIT_MANY_SETTINGS = (
    ("fit_many, max_iter=0", dict(max_iter=0), "highest"),
    ("fit_many, max_iter=0, n_init=1", dict(max_iter=0, n_init=1), "highest"),
    ("fit_many, max_iter=0, n_init=1, TF32", dict(max_iter=0, n_init=1), "high"),
    ("fit_many, default", {}, "highest"),
)

# The recipe of the short training run: the shipped checkpoint's last run (its model card,
# run 9), with the data's likelihood after --train-em-steps EM steps from the model's start.
TRAIN_RECIPE = [
    "--preset", "small-cpu", "--init-from", "default", "--n-layer", "6",
    "--noise-directions", "1", "--prior", "broad", "--focus-prior", "real,real,tgmm-2d",
    "--focus-prob", "0.3", "--m-step-weight", "1.0", "--m-step-nll-weight", "0.5",
    "--lr", "2e-4", "--min-lr", "1e-5", "--warmup-steps", "100",
    "--seed", "131",
]


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(call, device: str) -> tuple[object, float]:
    """(result, seconds) of ``call()``, the device's queue drained before and after."""
    synchronize(device)
    start = time.perf_counter()
    result = call()
    synchronize(device)
    return result, time.perf_counter() - start


def card_peaks(device: str) -> tuple[str, dict]:
    """The card's name and its dense peaks (empty where unknown, as on a CPU)."""
    if not device.startswith("cuda"):
        return "cpu", {}
    name = torch.cuda.get_device_name(device)
    return name, next((peaks for key, peaks in PEAK_TFLOPS.items() if key in name), {})


def mixture_batch(rng, n_datasets: int, n_rows: int, n_features: int, n_components: int):
    """float32 (n_datasets, n_rows, n_features): in each dataset, unit-variance clusters
    around means drawn uniformly in [-5, 5]^d, rows given to clusters uniformly."""
    means = rng.uniform(-5, 5, (n_datasets, n_components, n_features)).astype(np.float32)
    labels = rng.integers(0, n_components, (n_datasets, n_rows))
    X = np.take_along_axis(means, labels[..., None], axis=1)
    X += rng.standard_normal(X.shape, dtype=np.float32)
    return X


def mean_log_likelihood(X: torch.Tensor, weights, means, covariances) -> float:
    """Mean log-likelihood per row of a full-covariance mixture, in float64 on X's device,
    in chunks of rows: one yardstick for every method's fit."""
    device = X.device
    w, mu, cov = (torch.as_tensor(np.asarray(a, dtype=np.float64) if not torch.is_tensor(a)
                                  else a.double(), device=device).double()
                  for a in (weights, means, covariances))
    chol = torch.linalg.cholesky(cov)  # (K, d, d)
    half_log_det = chol.diagonal(dim1=-2, dim2=-1).log().sum(-1)  # (K,)
    total = 0.0
    for start in range(0, X.shape[0], 1 << 20):
        x = X[start:start + (1 << 20)].double()  # (n, d)
        diff = (x[None] - mu[:, None]).unsqueeze(-1)  # (K, n, d, 1)
        white = torch.linalg.solve_triangular(chol[:, None], diff, upper=False).squeeze(-1)
        log_gauss = -0.5 * white.pow(2).sum(-1) - half_log_det[:, None]  # (K, n)
        log_gauss = log_gauss - 0.5 * X.shape[1] * math.log(2 * math.pi)
        total += torch.logsumexp(log_gauss + w.log()[:, None], dim=0).sum().item()
    return total / X.shape[0]


# --- sections --------------------------------------------------------------------------


def run_tests(args) -> list[dict]:
    """The CUDA tests (tests/test_cuda.py, which skip without a GPU) in a subprocess."""
    command = [sys.executable, "-m", "pytest", "tests/test_cuda.py", "-q", "-p",
               "no:cacheprovider"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    print(done.stdout[-3000:], done.stderr[-2000:], sep="\n")
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|error)",
                                                     summary)}
    return [dict(command=" ".join(command[2:]), returncode=done.returncode,
                 passed=counts.get("passed", 0), failed=counts.get("failed", 0),
                 skipped=counts.get("skipped", 0), errors=counts.get("error", 0))]


def run_training(args) -> list[dict]:
    """The training recipe for ``args.train_minutes`` (a step budget and a time limit)."""
    out_dir = args.results / "gpu_run"
    if args.dry_run:
        sizes = ["--max-steps", "2", "--batch-size", "8", "--eval-tasks", "2",
                 "--device", args.device, "--workers", "0"]
    else:
        sizes = ["--max-steps", str(args.train_steps), "--batch-size", "256",
                 "--time-limit", str(args.train_minutes), "--save-every", "250",
                 "--eval-every", "100000", "--device", args.device, "--workers", "12"]
    command = [sys.executable, "-m", "transformer_gmm.training", *TRAIN_RECIPE, *sizes,
               "--em-steps", str(args.train_em_steps), "--out-dir", str(out_dir)]
    print(" ".join(command[1:]))
    done, seconds = timed(lambda: subprocess.run(command, cwd=ROOT, capture_output=True,
                                                 text=True), args.device)
    print(done.stdout[-4000:], done.stderr[-1500:], sep="\n")
    steps = 0
    if (out_dir / "log.jsonl").exists():
        steps = len((out_dir / "log.jsonl").read_text().splitlines())
    return [dict(returncode=done.returncode, steps=steps, seconds=round(seconds, 1),
                 command=" ".join(command[1:]))]


class ForwardPass:
    """The shipped backbone on the device and a batch of datasets of 128 rows (K = 4), and
    the rate of each way of running it: FLOPs from the model's config
    (benchmarks/common.py), as a fraction of the card's dense peak."""

    def __init__(self, args) -> None:
        self.device = args.device
        self.card, self.peaks = card_peaks(self.device)
        # A private copy: load_model's model is shared by every fit in this process.
        self.model = copy.deepcopy(load_model("default")).to(self.device)
        self.batch = 8 if args.dry_run else args.mfu_batch
        self.x = torch.randn(self.batch, 128, self.model.config.d_max, device=self.device)
        self.repeats = 2 if args.dry_run else 20

    def row(self, label: str, precision: str, flops: float, seconds: float) -> dict:
        """The row of ``flops`` done in ``seconds``, printed."""
        tflops, peak = flops / seconds / 1e12, self.peaks.get(precision)
        print(f"  {label:<34} {1e3 * seconds:8.2f} ms  {tflops:8.2f} TFLOP/s"
              + (f"  MFU {tflops / peak:.3f}" if peak else ""))
        return dict(what=label, batch=self.batch, ms=1e3 * seconds, tflops=tflops,
                    peak_tflops=peak or "", mfu=tflops / peak if peak else "",
                    device=self.card)

    def measure(self, label: str, precision: str, network, inputs,
                autocast: bool = False) -> dict:
        """One forward pass of ``network`` on ``inputs``, after three warm-ups (and any
        compilation), averaged over the repeats."""
        def call():
            with torch.inference_mode(), torch.autocast(
                device_type=self.device.split(":")[0], dtype=torch.bfloat16, enabled=autocast
            ):
                return network(inputs, 4, None)

        for _ in range(3):
            call()
        _, seconds = timed(lambda: [call() for _ in range(self.repeats)], self.device)
        flops = self.batch * backbone_flops(self.model, 128, 4)
        return self.row(label, precision, flops, seconds / self.repeats)

    def bfloat16(self):
        """The model with bfloat16 weights, and the batch in bfloat16."""
        return copy.deepcopy(self.model).to(torch.bfloat16), self.x.bfloat16()


def run_mfu(args) -> list[dict]:
    """The forward pass in float32, TF32, bfloat16 autocast and bfloat16 weights, and the
    rate the backbone's largest product reaches alone: its ceiling on this card."""
    forward = ForwardPass(args)
    model, x = forward.model, forward.x
    previous = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        rows = [forward.measure("forward, float32", "float32", model, x)]
        torch.set_float32_matmul_precision("high")
        rows.append(forward.measure("forward, TF32", "tf32", model, x))
        torch.set_float32_matmul_precision("highest")
        rows.append(forward.measure("forward, bfloat16 autocast", "bfloat16", model, x,
                                    autocast=True))
        rows.append(forward.measure("forward, bfloat16 weights", "bfloat16",
                                    *forward.bfloat16()))
    finally:
        torch.set_float32_matmul_precision(previous)
    width, calls = model.config.d_model, 10 * forward.repeats
    a = torch.randn(forward.batch * 128, width, device=args.device, dtype=torch.bfloat16)
    b = torch.randn(width, 4 * width, device=args.device, dtype=torch.bfloat16)
    _, seconds = timed(lambda: [a @ b for _ in range(calls)], args.device)
    rows.append(forward.row(f"matmul ({a.shape[0]} x {width}) @ ({width} x {4 * width}), "
                            "bfloat16", "bfloat16", 2 * a.shape[0] * width * 4 * width,
                            seconds / calls))
    return rows


def _sklearn_array_api_fit(X: torch.Tensor, n_components: int, seed: int):
    """scikit-learn's GaussianMixture on a torch tensor where it lives (array API)."""
    import sklearn
    from sklearn.mixture import GaussianMixture

    with sklearn.config_context(array_api_dispatch=True), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return GaussianMixture(n_components, covariance_type="full",
                               init_params="random_from_data", random_state=seed).fit(X)


def _sklearn_cpu_loop(datasets: np.ndarray, n_components: int) -> int:
    """GaussianMixture(n_init=1) on each dataset, over every CPU core, one thread a fit;
    returns how many fits failed (a collapsed component in float32, say)."""
    from joblib import Parallel, delayed
    from sklearn.mixture import GaussianMixture
    from threadpoolctl import threadpool_limits

    def fit_chunk(chunk, offset):
        failed = 0
        with threadpool_limits(1), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for i, X in enumerate(chunk):
                try:
                    GaussianMixture(n_components, random_state=offset + i).fit(X)
                except ValueError:
                    failed += 1
        return failed

    jobs = os.cpu_count() or 1
    chunks = np.array_split(np.arange(len(datasets)), jobs)
    return sum(Parallel(n_jobs=jobs)(delayed(fit_chunk)(datasets[c], int(c[0]))
                                     for c in chunks if len(c)))


def run_throughput(args) -> list[dict]:
    """Datasets per second: fit_many (max_iter=0 and the defaults) on the device, a loop of
    scikit-learn over the CPU cores, and scikit-learn's array API on the device, looped."""
    n_datasets = 16 if args.dry_run else args.n_datasets
    warm = mixture_batch(np.random.default_rng(0), 64, 128, 2, 2)
    fit_many(warm, 2, device=args.device, random_state=0, output="arrays")  # CUDA's first call
    _sklearn_cpu_loop(warm, 2)  # starts the worker processes
    rows = []
    for n_rows, n_features, n_components in CELLS:
        rng = np.random.default_rng([args.seed, n_rows, n_features, n_components])
        n_rows = min(n_rows, 64) if args.dry_run else n_rows
        X = mixture_batch(rng, n_datasets, n_rows, n_features, n_components)
        rows += throughput_cell(args, X, n_components)
    return rows


def throughput_cell(args, X: np.ndarray, n_components: int) -> list[dict]:
    """The rows of one cell: every method on the datasets X (n_datasets, n_rows, d)."""
    device = args.device
    n_datasets, n_rows, n_features = X.shape
    cell = dict(rows=n_rows, features=n_features, components=n_components,
                device=card_peaks(device)[0])
    rows = []

    def add(method, count, seconds, **extra):
        rate = count / seconds if seconds > 0 else float("nan")
        rows.append(dict(cell, method=method, datasets=count, seconds=seconds,
                         datasets_per_s=rate, **extra))
        print(f"  n={n_rows:5d} d={n_features:2d} K={n_components:2d}  {method:<36}"
              f" {count:6d} datasets {seconds:8.3f} s {rate:12.1f} /s", flush=True)

    for label, options, precision in FIT_MANY_SETTINGS:
        previous = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision(precision)
        try:
            fits, seconds = timed(lambda options=options: fit_many(
                X, n_components, device=device, random_state=0, output="arrays", **options),
                device)
            add(label, n_datasets, seconds, converged=float(np.mean(fits.converged)))
        except Exception as error:  # out of memory, say: recorded, the rest goes on
            print(f"  {label}: {type(error).__name__}: {error}"[:300])
            rows.append(dict(cell, method=label, error=type(error).__name__))
        finally:
            torch.set_float32_matmul_precision(previous)
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    count = min(n_datasets, 4 if args.dry_run else 32 * (os.cpu_count() or 1))
    failed, seconds = timed(lambda: _sklearn_cpu_loop(X[:count], n_components), "cpu")
    add(f"sklearn loop, {os.cpu_count()} CPU cores", count, seconds, failed=failed)

    count = 2 if args.dry_run else args.array_api_datasets
    tensors = [torch.from_numpy(X[i]).to(device) for i in range(count)]

    def array_api_loop(tensors=tensors):
        failed = 0
        for i, t in enumerate(tensors):
            try:
                _sklearn_array_api_fit(t, n_components, i)
            except Exception:  # a collapsed float32 covariance, say: counted
                failed += 1
        return failed

    array_api_loop(tensors[:1])  # warm-up
    failed, seconds = timed(array_api_loop, device)
    add("sklearn array API loop, same device", count, seconds, failed=failed)
    return rows


def run_large(args) -> list[dict]:
    """One fit of 10^7 rows (d = 16, K = 8, full): ours against scikit-learn's array API on
    the same device; both scored by one yardstick on the same rows."""
    device = args.device
    name, _ = card_peaks(device)
    n_rows = 20_000 if args.dry_run else args.large_rows
    X = mixture_batch(np.random.default_rng(args.seed), 1, n_rows, 16, 8)[0]
    X_device = torch.from_numpy(X).to(device)
    rows = []

    def add(method, seconds, ll, n_iter, converged):
        rows.append(dict(method=method, rows=n_rows, features=16, components=8,
                         seconds=seconds, log_likelihood=ll, n_iter=n_iter,
                         converged=converged, device=name))
        print(f"  {method:<44} {seconds:8.2f} s  LL {ll:.5f}  iterations {n_iter}")

    gmm = TransformerGMM(8, device=device, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the warm-up's two iterations do not converge
        TransformerGMM(8, device=device, random_state=0, max_iter=2).fit(X[:10_000])
    profile = cProfile.Profile()
    gmm, seconds = timed(lambda: profile.runcall(gmm.fit, X), device)
    # Where the time went: the host's share (hashing, copies) against the device's.
    pstats.Stats(profile).sort_stats("cumulative").print_stats(18)
    ll = mean_log_likelihood(X_device, gmm.weights_, gmm.means_, gmm.covariances_)
    add("TransformerGMM() (numpy in, fitted on the device)", seconds, ll, gmm.n_iter_,
        gmm.converged_)
    try:
        _sklearn_array_api_fit(X_device[:10_000], 8, 0)  # warm-up
        theirs, seconds = timed(lambda: _sklearn_array_api_fit(X_device, 8, 0), device)
        ll = mean_log_likelihood(X_device, theirs.weights_, theirs.means_,
                                 theirs.covariances_)
        add("sklearn GaussianMixture, array API, same device", seconds, ll, theirs.n_iter_,
            theirs.converged_)
    except Exception as error:
        print(f"  sklearn array API: {type(error).__name__}: {error}"[:300])
        rows.append(dict(method="sklearn GaussianMixture, array API, same device",
                         rows=n_rows, error=type(error).__name__, device=name))
    return rows


def run_compiled(args) -> list[dict]:
    """The bfloat16 forward pass compiled (torch.compile): last, since compiling takes a
    minute. Not on a CPU, whose backend is not what is measured."""
    if not args.device.startswith("cuda"):
        return []
    forward = ForwardPass(args)
    model, x = forward.bfloat16()
    return [forward.measure("forward, bfloat16 weights, compiled", "bfloat16",
                            torch.compile(model), x)]


RUNNERS = {"tests": run_tests, "train": run_training, "mfu": run_mfu, "large": run_large,
           "throughput": run_throughput, "compiled": run_compiled}


def main(argv: list[str] | None = None) -> dict[str, list[dict]]:
    parser = shared_parser(__doc__, "the same as --dry-run")
    parser.add_argument("--dry-run", action="store_true",
                        help="every section at toy sizes; runs on a CPU")
    parser.add_argument("--device", default=None,
                        help="default: cuda, or cpu in a dry run without a GPU")
    parser.add_argument("--only", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument("--n-datasets", type=int, default=10_000,
                        help="datasets per throughput cell")
    parser.add_argument("--array-api-datasets", type=int, default=20,
                        help="datasets per cell for scikit-learn's array-API loop")
    parser.add_argument("--large-rows", type=int, default=10_000_000)
    parser.add_argument("--mfu-batch", type=int, default=1024)
    parser.add_argument("--train-minutes", type=float, default=3.5)
    parser.add_argument("--train-steps", type=int, default=2200,
                        help="the cosine schedule's length; the time limit may stop it first")
    parser.add_argument("--train-em-steps", type=int, default=3,
                        help="EM steps before the likelihood the training loss weighs (1: the "
                             "one-M-step estimate, the control)")
    args = parser.parse_args(argv)
    args.dry_run = args.dry_run or args.quick
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() or not args.dry_run else "cpu"
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("no CUDA device here: run on a GPU machine, or add --dry-run.")
    args.results.mkdir(parents=True, exist_ok=True)
    print(f"device {card_peaks(args.device)[0]}, torch {torch.__version__}, "
          f"dry run {args.dry_run}")
    results = {}
    for section in SECTIONS:
        if section not in args.only:
            continue
        print(f"\n== {section}", flush=True)
        start = time.perf_counter()
        try:
            rows = RUNNERS[section](args)
        except Exception:  # one section's failure must not cost the others' figures
            traceback.print_exc()
            rows = []
        if rows:
            write_csv(rows, args.results / f"gpu_{section}.csv")
        print(f"({section}: {time.perf_counter() - start:.1f} s)", flush=True)
        results[section] = rows
    return results


if __name__ == "__main__":
    main()
