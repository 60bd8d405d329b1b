"""The benchmark scripts run (in quick mode) and report sane figures."""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest
from benchmark_scripts import load_benchmark as _load


def test_tgmm_tasks_follow_the_protocol():
    common = _load("common")
    rng = np.random.default_rng(0)
    for d, k in [(2, 5), (8, 3), (128, 4)]:
        task = common.sample_tgmm_task(rng, k, d)
        assert task.X.shape == (128, d) and task.means.shape == (k, d)
        assert np.all(np.abs(task.means) <= 5)
        unit = task.means / np.linalg.norm(task.means, axis=1, keepdims=True)
        assert (unit @ unit.T)[np.triu_indices(k, 1)].max() < 0.8
        assert task.weights.sum() == pytest.approx(1.0)


def test_mean_error_is_permutation_invariant():
    common = _load("common")
    true = np.array([[0.0, 0.0], [4.0, 0.0], [0.0, 4.0]])
    estimate = true[[2, 0, 1]] + 0.1
    assert common.mean_error(estimate, true) == pytest.approx(0.01)


def test_accuracy_quick_runs(tmp_path):
    rows = _load("accuracy").main(["--quick", "--tasks", "3", "--results", str(tmp_path)])
    assert (tmp_path / "accuracy.png").stat().st_size > 0
    with (tmp_path / "accuracy.csv").open() as file:
        assert len(list(csv.DictReader(file))) == len(rows) == 2 * 4 * 13  # d, K, methods
    for row in rows:
        assert -1 <= row["ari"] <= 1
        assert math.isnan(row["error"]) or row["error"] >= 0
    oracle = [r for r in rows if r["method"] == "oracle"]
    assert min(r["ari"] for r in oracle) > 0.5


def test_accuracy_seed_draws_fresh_tasks(tmp_path, monkeypatch):
    accuracy = _load("accuracy")
    monkeypatch.setattr(accuracy, "plot", lambda rows, path: None)  # the figure: above

    def oracle_errors(seed):
        main_args = ["--quick", "--tasks", "1", "--results", str(tmp_path), "--seed", str(seed)]
        rows = accuracy.main(main_args)
        return [r["error"] for r in rows if r["method"] == "oracle"]

    published = oracle_errors(0)
    assert oracle_errors(0) == published  # the same tasks again
    assert all(a != b for a, b in zip(oracle_errors(1), published, strict=True))


def test_accuracy_baseline_checkpoint_is_paired(tmp_path, capsys):
    # The bundled checkpoint against itself: every compared column ties, cell by cell.
    accuracy = _load("accuracy")
    rows = accuracy.main(["--quick", "--tasks", "2", "--results", str(tmp_path),
                          "--baseline-checkpoint", "default"])
    for name in accuracy.COMPARED:
        ours = [r for r in rows if r["method"] == name]
        theirs = [r for r in rows if r["method"] == name + accuracy.BASELINE]
        assert len(ours) == len(theirs) == 8
        for a, b in zip(ours, theirs, strict=True):
            assert (a["ari"], a["error"]) == pytest.approx((b["ari"], b["error"]), nan_ok=True)
    printed = capsys.readouterr().out.split("Against the baseline checkpoint")[1]
    assert printed.count("ahead in 0 cells ; behind in 0") == len(accuracy.COMPARED)


def test_accuracy_targets_tell_ties_from_wins():
    accuracy = _load("accuracy")
    errors = np.array([0.010, 0.020, 0.030, 0.040])
    # Equal to rounding on every task: a tie, whatever the last digit says.
    assert accuracy.compare(errors, errors * (1 + 1e-12)) == ("tie", 0.0)
    verdict, z = accuracy.compare(errors - 0.001, errors)
    assert verdict == "lower" and z < -1e6  # the same gap on every task
    verdict, z = accuracy.compare(errors + [0.002, -0.001, 0.002, 0.001], errors)
    assert verdict == "higher" and 0 < z < 3
    cells = [(2, 2), (8, 2), (32, 2)]
    task_errors = {
        (2, 2, "a"): errors - 0.001, (2, 2, "b"): errors,
        (8, 2, "a"): errors + [0.002, -0.001, 0.002, 0.001], (8, 2, "b"): errors,
        (32, 2, "a"): errors, (32, 2, "b"): errors.copy(),
    }
    strict = accuracy._count(task_errors, cells, "a", "b", {"lower"})
    assert strict.startswith("1/3 cells") and "tied to rounding in (32, 2)" in strict
    assert "missed in (8, 2) z=+" in strict
    assert accuracy._count(task_errors, cells, "a", "b", {"lower", "tie"}).startswith("2/3")


def _check_speed_rows(rows, tmp_path):
    # The script's figures are finite and its errors small; the timings themselves are
    # reported by the script, never asserted here.
    assert (tmp_path / "speed.csv").is_file()
    assert all(math.isfinite(row["value"]) and row["value"] > 0 for row in rows)
    errors = [row["error"] for row in rows if not math.isnan(row["error"])]
    assert errors and max(errors) < 0.1


def test_speed_quick_runs(tmp_path):
    # The quick run's first two measurements, with the smaller of its two batches; the
    # third, large_n, runs each method in a fresh process: the slow test below.
    rows = _load("speed").main(["--quick", "--only", "latency", "throughput",
                                "--batches", "10", "--results", str(tmp_path)])
    assert {row["measure"] for row in rows} == {
        "latency N=128 d=8 K=4", "fit_many batch=10", "loop of fits"}
    _check_speed_rows(rows, tmp_path)


def test_speed_quick_predictions_run(tmp_path):
    rows = _load("speed").main(["--quick", "--only", "predictions", "--results", str(tmp_path)])
    mixture, clustering = ("predict", "predict_proba", "score_samples"), ("predict", "transform")
    assert {(row["method"], row["measure"]) for row in rows} == {
        (method, f"{name}, {n_rows:,} rows")
        for n_rows in (1, 100, 10_000)
        for methods, names in (
            (("TransformerGMM", "GMM n_init=1"), mixture),
            (("TransformerClusterer", "KMeans n_init=1"), clustering),
        )
        for method in methods
        for name in names
    }
    assert all(math.isfinite(row["value"]) and row["value"] > 0 for row in rows)


@pytest.mark.slow  # four fresh interpreters that import torch or scikit-learn: 15 s
def test_speed_quick_first_fit_runs(tmp_path):
    rows = _load("speed").main(["--quick", "--only", "first_fit", "--results", str(tmp_path)])
    assert {(row["method"], row["measure"]) for row in rows} == {
        (method, f"fresh process: {measure}")
        for method in ("TransformerGMM", "GMM n_init=1", "TransformerClusterer", "KMeans n_init=1")
        for measure in ("import", "first fit", "second fit")
    }
    assert all(math.isfinite(row["value"]) and row["value"] > 0 for row in rows)
    assert (tmp_path / "speed.csv").is_file()


@pytest.mark.slow  # four fresh processes that import torch and fit 100,000 points: 20 s
def test_speed_quick_large_n_runs(tmp_path):
    rows = _load("speed").main(["--quick", "--only", "large_n", "--results", str(tmp_path)])
    assert len(rows) == 2 * 4  # time and memory of each method
    _check_speed_rows(rows, tmp_path)
