"""A few tasks of ``choose_k.py``'s shapes setting, coloured by the partition each method
returns, with the number of clusters it chose.

    python benchmarks/choose_k_shapes_figure.py     # writes results/choose_k_shapes_examples.png
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from choose_k import METHODS, shape_problems  # noqa: E402
from common import save_figure, standard_parser  # noqa: E402

SHOWN = ("bic1", "hdbscan", "clusterer", "clusterer-merge")
TASKS = (0, 2, 4, 5)  # moons, anisotropic, rings, spirals


def main(argv=None) -> Path:
    parser = standard_parser(__doc__, "choose_k_shapes_examples", "the same four tasks", False)
    args = parser.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    problems = [shape_problems(args.seed, max(TASKS) + 1)[i] for i in TASKS]
    methods = [m for key in SHOWN for m in METHODS if m.key == key]
    fig, axes = plt.subplots(len(problems), len(methods) + 1, figsize=(11, 2.4 * len(problems)))
    for row, problem in enumerate(problems):
        columns = [("truth", problem.true_k, problem.labels)]
        for method in methods:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                k, _, labels = method.choose(problem.X, problem.seed, args.checkpoint)
            columns.append((method.name, k, labels))
        for ax, (name, k, labels) in zip(axes[row], columns, strict=True):
            ax.scatter(*problem.X[:, :2].T, c=np.asarray(labels) % 10, cmap="tab10", s=4)
            ax.set_title(f"{name}: K = {k}", fontsize=8)
            ax.set_xticks([])
            ax.set_yticks([])
        axes[row, 0].set_ylabel(problem.name, fontsize=9)
    fig.tight_layout()
    return save_figure(fig, args.results / f"{args.out}.png")


if __name__ == "__main__":
    print(main())
