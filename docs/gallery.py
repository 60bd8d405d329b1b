"""The examples gallery: the order a newcomer reads it in, and the time each example may
take in the docs build.

``conf.py`` sorts the gallery with :func:`order`. After a docs build, check the time
sphinx-gallery recorded for each example (on the gallery's "Computation times" page)::

    python docs/gallery.py                 # reads docs/auto_examples/sg_execution_times.rst
    python docs/gallery.py path/to/sg_execution_times.rst

It prints every example's time and exits with status 1 if one took longer than
``BUDGET_S`` or has no recorded time. An example that finishes without running anything
heavy stays far below the budget; one that reaches it should shrink its data or its grid,
as the test suite's quick mode does.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

# The examples in the order of the gallery: the quickstart, the comparison with
# scikit-learn, choosing K, a pipeline, then the rest. tests/test_docs_gallery.py checks
# that every script in examples/ is listed here.
ORDER = [
    "quickstart.py",
    "plot_compare_with_sklearn.py",
    "plot_choose_k.py",
    "plot_model_selection.py",
    "pipeline_wine.py",
    "plot_missing_values.py",
    "fit_many_datasets.py",
    "plot_streaming.py",
    "plot_dask_fit.py",
    "dask_predict.py",
    "hub_offline.py",
    "train_your_own.py",
]

# Seconds of wall time one example may take in the docs build (sphinx-gallery's own
# record of its run), on a 2-core machine.
BUDGET_S = 60.0

DEFAULT_TIMES = Path(__file__).parent / "auto_examples" / "sg_execution_times.rst"

# One row of sphinx-gallery's table: the script's path, then its time as MM:SS.sss.
_ROW = re.compile(r"\(``(?P<path>[^`]+\.py)``\)\s*\n\s*-\s*(?P<min>\d+):(?P<sec>\d+(?:\.\d+)?)")


def order(filename: str) -> tuple[int, str]:
    """Sort key for sphinx-gallery's ``within_subsection_order``: :data:`ORDER`, then any
    other script by name."""
    name = Path(filename).name
    return (ORDER.index(name) if name in ORDER else len(ORDER), name)


def read_times(text: str) -> dict[str, float]:
    """Seconds per example script (file name) from a ``sg_execution_times.rst``."""
    return {
        Path(match["path"]).name: 60 * int(match["min"]) + float(match["sec"])
        for match in _ROW.finditer(text)
    }


def over_budget(
    times: dict[str, float], examples: list[str], budget_s: float = BUDGET_S
) -> list[str]:
    """What is wrong with the recorded times: examples with no time, or over budget."""
    problems = [f"{name}: no recorded time" for name in examples if name not in times]
    problems += [
        f"{name}: {seconds:.1f} s, over the budget of {budget_s:.0f} s"
        for name, seconds in sorted(times.items())
        if seconds > budget_s
    ]
    return problems


def main(argv: list[str]) -> int:
    path = Path(argv[0]) if argv else DEFAULT_TIMES
    times = read_times(path.read_text())
    examples = sorted(p.name for p in (Path(__file__).parents[1] / "examples").glob("*.py"))
    for name in sorted(times, key=order):
        print(f"{times[name]:7.1f} s  {name}")
    problems = over_budget(times, examples)
    for problem in problems:
        print(f"gallery: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
