"""Where the time of one small fit goes, stage by stage.

The latency task of ``speed.py`` (N = 128, d = 8, K = 4, spherical), fitted ``--repeats``
times (after one warm-up fit) per configuration, on one thread. Each stage is a function
of the package, wrapped for the run with a wall-clock timer; a stage's time is its mean
per fit, and "other" is the rest of ``fit`` (building the fitted attributes, the
estimator's own bookkeeping). The stages do not overlap: a stage called inside another
counts towards the outer one, except the forward pass, which is taken out of the readout.

It then measures the backbone's forward pass alone (one dataset of 128 points, and a
batch of 64) in FLOP/s, beside a plain float32 matmul of the same width (128 x 512 times
512 x 512) timed in the same run: the fraction of the core's matmul rate that the model
reaches. The "bfloat16" configuration and rows run under
``torch.set_float32_matmul_precision("medium")``, where the backbone multiplies in bfloat16
on a CPU that does so natively (``transformer_gmm.engine.precision``; elsewhere the fits are
float32 ones and the rows emulated bfloat16).

Last, one full-covariance EM iteration: the default's four runs on one dataset
(``em.fit_em``, every component at once and, forced, one component at a time) against one
iteration of ``GaussianMixture(n_init=1)``, at the sizes of the real-data benchmark.

With ``--datasets``, the stages instead of the rest: of ``TransformerGMM()`` and
``TransformerGMM(n_init=1)`` on each named dataset of the real-data benchmark (K its
classes, full and diagonal covariances), beside ``GaussianMixture`` with one and three
restarts timed in the same loop: what a small real fit's time is made of.

    python benchmarks/stages.py                # 200 fits per configuration
    python benchmarks/stages.py --quick        # 20 fits: a quick look
    python benchmarks/stages.py --datasets wine iris --repeats 50   # small real fits

Prints the tables and writes benchmarks/results/stages.csv, stages_flops.csv and
stages_em.csv (with ``--datasets``: stages_real.csv).
"""

from __future__ import annotations

import sys
import time
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.mixture import GaussianMixture

sys.path.insert(0, str(Path(__file__).parent))
import torch  # noqa: E402
from common import (  # noqa: E402
    Bfloat16,
    backbone_flops,
    bfloat16_products,
    sample_tgmm_task,
    single_threaded,
    standard_parser,
    write_csv,
)
from real_datasets import DATASETS, load_dataset  # noqa: E402

from transformer_gmm import TransformerGMM, _base, _fitting  # noqa: E402
from transformer_gmm.engine import em, gaussian, m_step, precision, readout  # noqa: E402
from transformer_gmm.storage import load_checkpoint, load_model  # noqa: E402

# (label, module, attribute): the functions timed, looked up by the package at call time.
STAGES = [
    ("parameter validation", _base.TransformerMixtureBase, "_validate_params"),
    ("input validation", _fitting, "validate_data"),
    ("checkpoint lookup", _fitting, "backbone_or_fallback"),
    ("forward pass", readout, "forward"),
    ("readout (responsibilities, one M-step)", readout, "mixture_inits"),
    ("covariances of the transformer's starts", m_step, "estimate_gaussian_parameters"),
    ("k-means++ starts", m_step, "initialize_kmeans"),
    ("EM", em, "fit_em"),
]
FORWARD, READOUT = STAGES[3][0], STAGES[4][0]

def configurations(checkpoint: str) -> dict[str, Callable[[], object]]:
    """What the stage table times, the transformer's fits reading ``checkpoint``."""
    mixture, sklearn = _makers(checkpoint, 4, "spherical")
    return {
        "TransformerGMM()": lambda: mixture(),
        "TransformerGMM(n_init=1)": lambda: mixture(n_init=1),
        "TransformerGMM(n_init=1, max_iter=0)": lambda: mixture(n_init=1, max_iter=0),
        "TransformerGMM(n_init=1, max_iter=0), bfloat16": lambda: Bfloat16(
            mixture(n_init=1, max_iter=0)
        ),
        "TransformerGMM(checkpoint=None, n_init=1)": lambda: mixture(checkpoint=None, n_init=1),
        "GaussianMixture(n_init=1)": lambda: sklearn(),
    }


def real_configurations(checkpoint: str, K: int, covariance: str) -> dict[str, Callable]:
    """What ``--datasets`` times on a dataset of K classes, with ``covariance``."""
    mixture, sklearn = _makers(checkpoint, K, covariance)
    return {
        "TransformerGMM()": lambda: mixture(),
        "TransformerGMM(n_init=1)": lambda: mixture(n_init=1),
        "GaussianMixture(n_init=1)": lambda: sklearn(),
        "GaussianMixture(n_init=3)": lambda: sklearn(n_init=3),
    }


def _makers(checkpoint: str, K: int, covariance: str) -> tuple[Callable, Callable]:
    """``TransformerGMM`` (reading ``checkpoint``) and ``GaussianMixture`` of K components
    with ``covariance`` and ``random_state=0``, each made from its other parameters."""
    def mixture(**params):
        return TransformerGMM(
            K, covariance_type=covariance, random_state=0, **{"checkpoint": checkpoint, **params}
        )

    def sklearn(**params):
        return GaussianMixture(K, covariance_type=covariance, random_state=0, **params)

    return mixture, sklearn


def real_stages(names: list[str], checkpoint: str, repeats: int) -> list[dict]:
    """Milliseconds per fit, whole and by stage, of :func:`real_configurations` on each
    dataset; one row per (dataset, covariance, configuration)."""
    rows = []
    for name in names:
        dataset = load_dataset(name)
        for covariance in ("full", "diag"):
            found = real_configurations(checkpoint, dataset.n_components, covariance)
            for configuration, make in found.items():
                ms = measure(make, dataset.X, repeats)
                forward = ms.get(FORWARD, 0.0)
                rows.append(dict(dataset=name, n=len(dataset.X), d=dataset.X.shape[1],
                                 K=dataset.n_components, covariance=covariance,
                                 configuration=configuration, fit_ms=ms["fit"],
                                 forward_ms=forward, rest_ms=ms["fit"] - forward,
                                 **{f"{label}_ms": ms.get(label, 0.0) for label, _, _ in STAGES
                                    if label != FORWARD}))
    return rows


def print_real_stages(rows: list[dict]) -> None:
    print(f"\nms per fit: {'dataset':<14} {'cov':<5} {'configuration':<27} {'fit':>7} "
          f"{'forward':>8} {'rest':>7}")
    for row in rows:
        print(f"{'':12}{row['dataset']:<14} {row['covariance']:<5} {row['configuration']:<27} "
              f"{row['fit_ms']:7.2f} {row['forward_ms']:8.2f} {row['rest_ms']:7.2f}")


@contextmanager
def timed_stages(totals: dict[str, float]) -> Iterator[None]:
    """Wrap every stage's function with a timer adding its wall time to ``totals``; a
    call inside another timed stage is not timed on its own, except the forward pass."""
    originals, active = [], []
    for label, owner, name in STAGES:
        function = getattr(owner, name)
        originals.append((owner, name, function))

        def timer(*args, _function=function, _label=label, **kwargs):
            if active and _label != FORWARD:
                return _function(*args, **kwargs)
            active.append(_label)
            start = time.perf_counter()
            try:
                return _function(*args, **kwargs)
            finally:
                totals[_label] += time.perf_counter() - start
                active.pop()

        setattr(owner, name, timer)
    try:
        yield
    finally:
        for owner, name, function in originals:
            setattr(owner, name, function)


def measure(make: Callable[[], object], X: np.ndarray, repeats: int) -> dict[str, float]:
    """Mean milliseconds per fit: the whole fit and each stage."""
    make().fit(X)  # warm-up: loads the checkpoint, fills caches
    totals: dict[str, float] = defaultdict(float)
    with timed_stages(totals):
        start = time.perf_counter()
        for _ in range(repeats):
            make().fit(X)
        totals["fit"] = time.perf_counter() - start
    totals[READOUT] -= totals[FORWARD]  # the forward pass runs inside the readout
    totals["other"] = totals["fit"] - sum(totals[label] for label, _, _ in STAGES)
    return {label: 1000 * seconds / repeats for label, seconds in totals.items()}


def _seconds_per_call(call: Callable[[], object], repeats: int) -> float:
    """The best of five means over ``repeats`` calls, after a warm-up: the least disturbed."""
    call()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(repeats):
            call()
        best = min(best, (time.perf_counter() - start) / repeats)
    return best


def flop_rates(checkpoint: str, repeats: int) -> list[dict]:
    """GFLOP/s of the backbone's forward pass (K = 4, 128 points; one dataset and a batch
    of 64) and of a plain matmul, all on this thread in this run: the model fits read
    (``load_model``: frozen, weights laid out for products of few rows) and a private copy
    (``load_checkpoint``, weights as trained); then the same in bfloat16 (the model's
    bfloat16 copy, under "medium" precision), as fractions of the float32 matmul."""
    model = load_model(checkpoint)
    config = model.config
    generator = torch.Generator().manual_seed(0)
    rows = []
    a, b = torch.randn(128, 512, generator=generator), torch.randn(512, 512, generator=generator)
    matmul = 2 * 128 * 512 * 512 / _seconds_per_call(lambda: a @ b, 10 * repeats) / 1e9
    rows.append(dict(what="matmul 128x512 @ 512x512", gflops=matmul, fraction_of_matmul=1.0))

    def forward_rates(network, suffix=""):
        for batch in (1, 64):
            z = torch.randn(batch, 128, config.d_max, generator=generator)
            with torch.inference_mode():
                seconds = _seconds_per_call(lambda z=z: network(z, 4, None),
                                            max(1, repeats // batch))
            rate = batch * backbone_flops(model, 128, 4) / seconds / 1e9
            rows.append(dict(what=f"forward pass, batch {batch}{suffix}", gflops=rate,
                             fraction_of_matmul=rate / matmul))

    forward_rates(model)
    forward_rates(load_checkpoint(checkpoint), ", weights as trained")
    with bfloat16_products():
        a16, b16 = a.bfloat16(), b.bfloat16()
        rate = 2 * 128 * 512 * 512 / _seconds_per_call(lambda: a16 @ b16, 10 * repeats) / 1e9
        rows.append(dict(what="matmul in bfloat16", gflops=rate, fraction_of_matmul=rate / matmul))
        forward_rates(precision.bfloat16_copy(model), ", bfloat16")
    return rows


# (runs, K, N, d) of one full-covariance EM iteration: the default's four runs on datasets
# of the real-data benchmark's sizes (faithful, crabs, wine, breast_cancer) and a synthetic
# one of choose_k.py's with K = 10.
EM_SHAPES = ((4, 2, 272, 2), (4, 4, 200, 5), (4, 3, 178, 13), (4, 2, 569, 30), (4, 10, 300, 2))
EM_ITERATIONS = 20


def em_iteration_times(repeats: int) -> list[dict]:
    """Microseconds per full-covariance EM iteration: the default's four runs batched
    (every component at once, and one at a time as above ALL_COMPONENTS_AT_ONCE), and one
    run of scikit-learn's; each the difference between EM_ITERATIONS + 1 iterations and 1,
    with tol=0 so that none stops early."""
    rows = []
    for runs, K, N, d in EM_SHAPES:
        rng = np.random.default_rng(0)
        X = rng.standard_normal((N, d)) + 3.0 * rng.integers(0, K, (N, 1))
        x = torch.from_numpy(X)[None]
        init = m_step.initialize_kmeans(x.expand(runs, -1, -1), K, covariance_type="full",
                                        reg_covar=1e-6, generator=torch.Generator().manual_seed(0))

        def ours(iterations, x=x, init=init):
            return em.fit_em(x, init, covariance_type="full", reg_covar=1e-6,
                             max_iter=iterations, tol=0.0)

        def sklearn(iterations, X=X, K=K):
            return GaussianMixture(K, max_iter=iterations, tol=0.0, random_state=0).fit(X)

        def per_iteration(fit):
            calls = max(3, repeats // 20)
            long = _seconds_per_call(lambda: fit(EM_ITERATIONS + 1), calls)
            return 1e6 * (long - _seconds_per_call(lambda: fit(1), calls)) / EM_ITERATIONS

        at_once = per_iteration(ours)
        threshold = gaussian.ALL_COMPONENTS_AT_ONCE
        gaussian.ALL_COMPONENTS_AT_ONCE = 0
        try:
            one_at_a_time = per_iteration(ours)
        finally:
            gaussian.ALL_COMPONENTS_AT_ONCE = threshold
        rows.append(dict(runs=runs, K=K, N=N, d=d, us_all_components=at_once,
                         us_one_component_at_a_time=one_at_a_time,
                         us_sklearn_one_run=per_iteration(sklearn)))
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    parser = standard_parser(__doc__, "stages", "20 fits per configuration", tasks=False)
    parser.add_argument("--repeats", type=int, default=None,
                        help="fits per configuration (default 200; 20 with --quick)")
    parser.add_argument("--datasets", nargs="+", choices=list(DATASETS), default=None,
                        help="time the stages of small real fits on these instead")
    args = parser.parse_args(argv)
    repeats = args.repeats or (20 if args.quick else 200)
    if args.datasets:
        with single_threaded(), warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            real = real_stages(args.datasets, args.checkpoint, repeats)
        print_real_stages(real)
        path = write_csv(real, args.results / f"{args.out}_real.csv")
        print(f"\nwrote {path}")
        return real

    task = sample_tgmm_task(np.random.default_rng(args.seed), 4, 8)  # speed.py's latency task
    labels = ["fit"] + [label for label, _, _ in STAGES] + ["other"]
    rows = []
    with single_threaded():
        for name, make in configurations(args.checkpoint).items():
            ms = measure(make, task.X, repeats)
            rows += [dict(configuration=name, stage=s, ms_per_fit=ms[s]) for s in labels]
            print(f"\n{name}: {ms['fit']:.2f} ms per fit")
            for label in labels[1:]:
                if ms[label] >= 0.005:  # stages this configuration does not run read 0
                    share = 100 * ms[label] / ms["fit"]
                    print(f"  {label:<42} {ms[label]:6.2f} ms  {share:5.1f} %")
        flops = flop_rates(args.checkpoint, repeats)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)  # tol=0 never converges
            em_rows = em_iteration_times(repeats)
    native = "" if precision.native_bfloat16() else "; this CPU has no native bfloat16"
    print(f"\nFLOP rates on one thread ({args.checkpoint!r} checkpoint, K = 4, 128 points"
          f"{native}):")
    for row in flops:
        print(f"  {row['what']:<46} {row['gflops']:7.1f} GFLOP/s  "
              f"{100 * row['fraction_of_matmul']:5.1f} % of the matmul")
    print("\nOne full-covariance EM iteration, us (runs batched; scikit-learn: one run):")
    print(f"  {'runs x K x N x d':<18} {'all components':>15} {'one at a time':>14} {'sklearn':>8}")
    for row in em_rows:
        shape = f"{row['runs']} x {row['K']} x {row['N']} x {row['d']}"
        print(f"  {shape:<18} {row['us_all_components']:15.0f} "
              f"{row['us_one_component_at_a_time']:14.0f} {row['us_sklearn_one_run']:8.0f}")
    path = write_csv(rows, args.results / f"{args.out}.csv")
    write_csv(flops, args.results / f"{args.out}_flops.csv")
    write_csv(em_rows, args.results / f"{args.out}_em.csv")
    print(f"\nwrote {path}, {args.out}_flops.csv and {args.out}_em.csv")
    return rows


if __name__ == "__main__":
    main()
