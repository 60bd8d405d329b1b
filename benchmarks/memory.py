"""Peak memory of one fit: ours against scikit-learn's, each fit in a fresh process.

Two shapes of data:

- **long**: 2,000,000 x 10 float32 (76 MiB), five Gaussian blobs, fitted by
  ``TransformerGMM``, ``TransformerClusterer``, ``GaussianMixture`` and ``KMeans``;
- **wide**: 50 x 2,000 float64, fitted by ``TransformerGMM`` with its defaults, with
  ``n_init=1`` and with ``checkpoint=None``, and by ``GaussianMixture``.

Every estimator has its defaults but the number of components, ``--n-components`` (5:
with one, the default of the mixtures, there is nothing for the transformer to start and
EM runs once).

Each fit runs in a process of its own (in one process, a fit reuses memory that the previous
one freed and malloc kept). That process makes the data, runs a warm-up fit of the same
estimator on a few rows of another shape (which loads the checkpoint and torch's kernels,
once per process), then measures the fit: the growth of the address space's high-water mark
(``VmHWM``, reset through ``/proc/self/clear_refs`` just before the fit) over the memory
resident then. Not ``ru_maxrss``: Linux carries it across ``fork`` and ``exec``, so a child
reports its parent's size whenever that is larger than its own peak.

    python benchmarks/memory.py --quick     # 200,000 x 10 and 50 x 200: seconds
    nice -n 10 python benchmarks/memory.py  # the sizes above: a few minutes

Prints a table and writes benchmarks/results/memory.csv (MiB: 2^20 bytes). Linux only.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from common import MiB, peak_memory_growth, shared_parser, write_csv  # noqa: E402

SHAPES = {  # (rows, columns, dtype) in full and in --quick mode
    "long": ((2_000_000, 10, "float32"), (200_000, 10, "float32")),
    "wide": ((50, 2_000, "float64"), (50, 200, "float64")),
}
# Each case: its data, the estimator's class and its parameters.
CASES = {
    "long TransformerGMM()": ("long", "TransformerGMM", {}),
    "long TransformerClusterer()": ("long", "TransformerClusterer", {}),
    "long GaussianMixture()": ("long", "GaussianMixture", {}),
    "long KMeans()": ("long", "KMeans", {}),
    "wide TransformerGMM()": ("wide", "TransformerGMM", {}),
    "wide TransformerGMM(n_init=1)": ("wide", "TransformerGMM", {"n_init": 1}),
    "wide TransformerGMM(checkpoint=None)": ("wide", "TransformerGMM", {"checkpoint": None}),
    "wide GaussianMixture()": ("wide", "GaussianMixture", {}),
}
# Whom each of ours is held against, and the factor it should stay within.
TARGETS = {
    "long TransformerGMM()": ("long GaussianMixture()", 1.0),
    "long TransformerClusterer()": ("long KMeans()", 2.0),
    "wide TransformerGMM()": ("wide GaussianMixture()", 1.0),
}


# --- one case, in its own process ----------------------------------------------------------


def make_data(rows: int, columns: int, dtype: str, seed: int) -> np.ndarray:
    """Five Gaussian blobs, unit noise, means uniform in [-5, 5]; made block by block in
    ``dtype``, so that no float64 copy of the whole array is ever resident."""
    rng = np.random.default_rng([seed, rows, columns])
    means = rng.uniform(-5, 5, (5, columns))
    X = np.empty((rows, columns), dtype=dtype)
    block = max(1, 2**20 // columns)
    for start in range(0, rows, block):
        n = min(block, rows - start)
        X[start : start + n] = means[rng.integers(0, 5, n)] + rng.standard_normal((n, columns))
    return X


def measure(case: str, quick: bool, seed: int, n_components: int) -> dict:
    """One case's figures, measured in this process."""
    from sklearn.cluster import KMeans
    from sklearn.mixture import GaussianMixture

    from transformer_gmm import TransformerClusterer, TransformerGMM

    classes = [TransformerGMM, TransformerClusterer, GaussianMixture, KMeans]
    shape, name, params = CASES[case]
    cls = next(cls for cls in classes if cls.__name__ == name)

    def make(**params):
        return cls(n_components, **params)
    rows, columns, dtype = SHAPES[shape][1 if quick else 0]
    X = make_data(rows, columns, dtype, seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fallbacks and convergence: not what is measured
        warm = make_data(64, 3, dtype, seed + 1)
        make(**params).fit(warm)  # loads the checkpoint and torch's kernels
        _, grown, seconds = peak_memory_growth(lambda: make(**params).fit(X))
    return dict(case=case, n_components=n_components, rows=rows, columns=columns, dtype=dtype,
                data_mib=round(X.nbytes / MiB, 1), peak_growth_mib=round(grown, 1),
                seconds=round(seconds, 2))


def measure_in_fresh_process(case: str, quick: bool, seed: int, n_components: int) -> dict:
    command = [sys.executable, __file__, "--case", case, "--seed", str(seed),
               "--n-components", str(n_components)]
    done = subprocess.run(command + (["--quick"] if quick else []), capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the measurement of {case!r} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# --- the table ------------------------------------------------------------------------------


def with_targets(rows: list[dict]) -> list[dict]:
    """Each of ours against the figure it should stay within (the baseline's, times the
    factor), as ``target_mib`` and ``within_target``."""
    growth = {row["case"]: row["peak_growth_mib"] for row in rows}
    for row in rows:
        baseline, factor = TARGETS.get(row["case"], (None, None))
        if baseline in growth:
            row["target_mib"] = round(factor * growth[baseline], 1)
            row["within_target"] = row["peak_growth_mib"] <= row["target_mib"]
    return rows


def print_table(rows: list[dict]) -> None:
    print(f"{'case':<40} {'K':>3} {'data':>14} {'MiB data':>9} {'peak +MiB':>10} {'target':>8} "
          f"{'time s':>7}")
    for row in rows:
        data = f"{row['rows']:,} x {row['columns']:,}"
        target = f"{row['target_mib']:.0f}" if "target_mib" in row else ""
        print(f"{row['case']:<40} {row['n_components']:>3} {data:>14} {row['data_mib']:>9.1f} "
              f"{row['peak_growth_mib']:>10.1f} {target:>8} {row['seconds']:>7.2f}")


def main(argv=None) -> list[dict]:
    parser = shared_parser(__doc__, "200,000 x 10 and 50 x 200 instead of 2,000,000 x 10 and "
                                    "50 x 2,000")
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES),
                        help="measure only these cases")
    parser.add_argument("--n-components", type=int, default=5,
                        help="components (clusters) of every fit (default 5)")
    parser.add_argument("--out", default="memory", help="file stem of the CSV")
    parser.add_argument("--case", choices=list(CASES), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.case is not None:  # the measuring process
        print(json.dumps(measure(args.case, args.quick, args.seed, args.n_components)))
        return []
    rows = with_targets([
        measure_in_fresh_process(case, args.quick, args.seed, args.n_components)
        for case in args.cases
    ])
    print_table(rows)
    path = write_csv(rows, args.results / f"{args.out}.csv")
    print(f"wrote {path}")
    return rows


if __name__ == "__main__":
    main()
