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


README = (ROOT / "README.md").read_text()


def _readme(pattern: str) -> tuple[str, ...]:
    match = re.search(pattern, " ".join(README.split()))  # the prose, whatever its wrapping
    assert match, f"the README no longer says {pattern!r}: update this test with it"
    return match.groups()


def test_the_readmes_accuracy_figures_are_accuracy_csvs():
    errors = {(r["d"], r["K"], r["method"]): float(r["error"]) for r in _rows("accuracy.csv")}
    cells = sorted({(d, k) for d, k, _ in errors})

    def ratios(method, reference, cells=cells):
        return [errors[c + (method,)] / errors[c + (reference,)] for c in cells]

    (mean,) = _readme(r"\(([\d.]+) times its error on average\)")
    assert _as_quoted(statistics.mean(ratios("TransformerGMM", "GMM n_init=10")), mean) == mean
    low, high = _readme(r"cell with K >= 3 \(error ratio ([\d.]+) to ([\d.]+)\)")
    against_one = ratios("TransformerGMM", "GMM n_init=1", [c for c in cells if int(c[1]) >= 3])
    assert (_as_quoted(min(against_one), low), _as_quoted(max(against_one), high)) == (low, high)
    pairs = _readme(r"beats them at d = 2, K = 3, 4 and 5 \(([\d.]+) against ([\d.]+), "
                    r"([\d.]+) against ([\d.]+), ([\d.]+) against ([\d.]+)\)")
    for K, (alone, restarts) in zip("345", zip(pairs[::2], pairs[1::2], strict=True),
                                    strict=True):
        assert _as_quoted(errors["2", K, "transformer alone"], alone) == alone
        assert _as_quoted(errors["2", K, "GMM n_init=10"], restarts) == restarts


def test_the_readmes_real_data_figures_are_realdata_csvs():
    full = {r["method"]: r for r in _rows("realdata.csv") if r["covariance"] == "full"}
    (as_good,) = _readme(r"`TransformerGMM\(n_init=1\)` ends at least as likely as one EM run "
                         r"in (\d+) % of fits")
    assert f"{100 * float(full['TGMM n_init=1']['as_good']):.0f}" == as_good
    start, restarts, default = _readme(r"more often than ten restarts \((\d+) % against (\d+) %\),"
                                       r" and the default in (\d+) %")
    for quoted, method in ((start, "TGMM n_init=1"), (restarts, "GMM n_init=10"),
                           (default, "TGMM")):
        assert f"{100 * float(full[method]['at_best']):.0f}" == quoted, method
    (gap,) = _readme(r"a median ([\d.]+) nats per point below one EM run")
    assert _as_quoted(-float(full["transformer alone"]["ll_diff_median"]), gap) == gap
