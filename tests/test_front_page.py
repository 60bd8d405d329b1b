"""The figures the docs' front page quotes are those of the committed benchmark results:
recomputed here from the CSVs, so the two cannot drift apart."""

from __future__ import annotations

import csv
import re
import statistics
from pathlib import Path

ROOT = Path(__file__).parents[1]
RESULTS = ROOT / "benchmarks" / "results"
FRONT_PAGE = (ROOT / "docs" / "index.md").read_text()


def _rows(name: str) -> list[dict]:
    with (RESULTS / name).open() as file:
        return list(csv.DictReader(file))


def _quoted(pattern: str) -> tuple[str, ...]:
    match = re.search(pattern, FRONT_PAGE)
    assert match, f"the front page no longer says {pattern!r}: update this test with it"
    return match.groups()


def _as_quoted(value: float, quoted: str) -> str:
    """``value`` with as many decimals as ``quoted`` has."""
    decimals = len(quoted.split(".")[1]) if "." in quoted else 0
    return f"{value:.{decimals}f}"


def test_the_time_against_ten_restarts_and_one_is_accuracy_csvs():
    ten, one = _quoted(r"a median ([\d.]+) times the time of those ten restarts and ([\d.]+) "
                       r"times that of one")
    ms = {(r["d"], r["K"], r["method"]): float(r["ms_per_fit"])
          for r in _rows("accuracy.csv")}
    cells = sorted({(d, k) for d, k, _ in ms})
    for quoted, reference in ((ten, "GMM n_init=10"), (one, "GMM n_init=1")):
        ratios = [ms[cell + ("TransformerGMM",)] / ms[cell + (reference,)] for cell in cells]
        assert len(ratios) == 16
        assert _as_quoted(statistics.median(ratios), quoted) == quoted, reference


def test_fit_many_against_a_loop_is_speed_csvs():
    (quoted,) = _quoted(r"on a CPU, ([\d.]+) times the datasets per second of a loop")
    rows = _rows("speed.csv")
    loop = next(float(r["value"]) for r in rows if r["measure"] == "loop of fits")
    batched = [float(r["value"]) for r in rows if r["method"] == "fit_many"]
    assert batched and _as_quoted(max(batched) / loop, quoted) == quoted
