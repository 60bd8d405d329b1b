"""Where the time of one small fit goes, stage by stage.

The latency task of ``speed.py`` (N = 128, d = 8, K = 4, spherical), fitted ``--repeats``
times (after one warm-up fit) per configuration, on one thread. Each stage is a function
of the package, wrapped for the run with a wall-clock timer; a stage's time is its mean
per fit, and "other" is the rest of ``fit`` (building the fitted attributes, the
estimator's own bookkeeping). The stages do not overlap: a stage called inside another
counts towards the outer one, except the forward pass, which is taken out of the readout.

    python benchmarks/stages.py                # 200 fits per configuration
    python benchmarks/stages.py --repeats 20   # a quick look

Prints a table and writes benchmarks/results/stages.csv.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from sklearn.mixture import GaussianMixture

sys.path.insert(0, str(Path(__file__).parent))
from common import RESULTS, sample_tgmm_task, single_threaded, write_csv  # noqa: E402

from transformer_gmm import TransformerGMM, _base, em, readout  # noqa: E402

# (label, module, attribute): the functions timed, looked up by the package at call time.
STAGES = [
    ("parameter validation", _base._TransformerMixtureBase, "_validate_params"),
    ("input validation", _base, "validate_data"),
    ("checkpoint lookup", _base._TransformerMixtureBase, "_load_backbone"),
    ("forward pass", readout, "forward"),
    ("readout (responsibilities, one M-step)", readout, "mixture_inits"),
    ("covariances of the transformer's starts", em, "estimate_gaussian_parameters"),
    ("k-means++ starts", em, "initialize_kmeans"),
    ("EM", em, "fit_em"),
]
FORWARD, READOUT = STAGES[3][0], STAGES[4][0]

CONFIGURATIONS: dict[str, Callable[[], object]] = {
    "TransformerGMM()": lambda: TransformerGMM(4, covariance_type="spherical", random_state=0),
    "TransformerGMM(n_init=1)": lambda: TransformerGMM(
        4, covariance_type="spherical", n_init=1, random_state=0
    ),
    "TransformerGMM(n_init=1, max_iter=0)": lambda: TransformerGMM(
        4, covariance_type="spherical", n_init=1, max_iter=0, random_state=0
    ),
    "TransformerGMM(checkpoint=None, n_init=1)": lambda: TransformerGMM(
        4, covariance_type="spherical", checkpoint=None, n_init=1, random_state=0
    ),
    "GaussianMixture(n_init=1)": lambda: GaussianMixture(
        4, covariance_type="spherical", random_state=0
    ),
}


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


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200, help="fits per configuration")
    parser.add_argument("--results", type=Path, default=RESULTS, help="folder for the CSV")
    args = parser.parse_args(argv)

    task = sample_tgmm_task(np.random.default_rng(0), 4, 8)  # speed.py's latency task
    labels = ["fit"] + [label for label, _, _ in STAGES] + ["other"]
    rows = []
    with single_threaded():
        for name, make in CONFIGURATIONS.items():
            ms = measure(make, task.X, args.repeats)
            rows += [dict(configuration=name, stage=s, ms_per_fit=ms[s]) for s in labels]
            print(f"\n{name}: {ms['fit']:.2f} ms per fit")
            for label in labels[1:]:
                if ms[label] >= 0.005:  # stages this configuration does not run read 0
                    share = 100 * ms[label] / ms["fit"]
                    print(f"  {label:<42} {ms[label]:6.2f} ms  {share:5.1f} %")
    path = write_csv(rows, args.results / "stages.csv")
    print(f"\nwrote {path}")
    return rows


if __name__ == "__main__":
    main()
