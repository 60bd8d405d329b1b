"""tgmm.py, clustering.py and realdata.py run in quick mode, stages.py accounts for a whole
fit, every script takes the shared options, and the helpers the scripts share hold."""

from __future__ import annotations

import argparse
import csv
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from benchmark_scripts import BENCHMARKS
from benchmark_scripts import load_benchmark as _load
from conftest import TINY_CHECKPOINT
from scipy.stats import multivariate_normal

from transformer_gmm.storage.checkpoints import bundled_checkpoints


def _csv(path: Path) -> list[dict]:
    with path.open() as file:
        return list(csv.DictReader(file))


def test_tgmm_quick_runs(tmp_path):
    rows = _load("tgmm").main(["--quick", "--experiment", "k_gt_d", "--tasks", "2",
                               "--results", str(tmp_path)])
    assert (tmp_path / "tgmm_k_gt_d.png").stat().st_size > 0
    assert len(_csv(tmp_path / "tgmm_k_gt_d.csv")) == len(rows) == 4 * 9
    for row in rows:
        applies = row["method"] != "spectral"  # K > d everywhere here
        assert math.isnan(row["error"]) != applies
        if applies:
            assert 0 <= row["accuracy"] <= 1 and row["error"] >= 0
    oracle = [r for r in rows if r["method"] == "oracle"]
    assert all(r["heldout_gap"] == 0 for r in oracle)


def test_clustering_quick_runs(tmp_path):
    rows = _load("clustering").main(["--quick", "--experiment", "imbalance", "--tasks", "2",
                                     "--results", str(tmp_path)])
    assert (tmp_path / "clustering.png").stat().st_size > 0
    assert len(_csv(tmp_path / "clustering.csv")) == len(rows) == 3 * 7
    for row in rows:
        assert -1 <= row["ari"] <= 1 and 0 <= row["nmi"] <= 1
    assert min(r["ari"] for r in rows if r["method"] == "oracle (Bayes)") > 0.5


def test_realdata_quick_runs(tmp_path):
    realdata = _load("realdata")
    realdata.main(["--quick", "--results", str(tmp_path)])
    assert (tmp_path / "realdata.png").stat().st_size > 0
    fits = _csv(tmp_path / "realdata_fits.csv")
    summary = _csv(tmp_path / "realdata.csv")
    datasets = {r["dataset"] for r in fits}
    mixtures = [n for n in realdata.mixture_methods("default") if "[" not in n]
    n_methods = len(mixtures) + len(realdata.CLUSTERERS)
    assert datasets == set(realdata.QUICK_DATASETS)
    assert len(fits) == 3 * 2 * n_methods  # datasets x seeds x methods, full covariance only
    assert len(summary) == n_methods
    assert len(_csv(tmp_path / "realdata_datasets.csv")) == 3 * n_methods
    assert not any(r["error"] for r in fits)
    for row in fits:
        ari = float(row["ari"])
        if row["dataset"] == "faithful":  # no classes
            assert math.isnan(ari)
        else:
            assert -1 <= ari <= 1
        if row["method"] in mixtures:
            assert math.isfinite(float(row["ll"])) and math.isfinite(float(row["bic"]))
            assert float(row["ll_gap"]) >= 0
    for row in summary:
        if row["method"] in mixtures:
            assert 0 <= float(row["at_best"]) <= 1 and 0 <= float(row["as_good"]) <= 1
    # The best LL of each dataset is reached by some fit, by definition.
    for dataset in datasets:
        assert any(r["at_best"] == "1.0" for r in fits if r["dataset"] == dataset)
    # Ten restarts keep the best lower bound, and the first restart is the single run.
    ll = {(r["dataset"], r["seed"], r["method"]): float(r["ll"]) for r in fits}
    for dataset in datasets:
        for seed in ("0", "1"):
            one, ten = ll[dataset, seed, "GMM n_init=1"], ll[dataset, seed, "GMM n_init=10"]
            assert ten >= one - 1e-6, (dataset, seed)
    # The classes as responsibilities: every point's class is its likeliest component on
    # iris and crabs, and one M-step from them is no likelier than EM's optimum on iris.
    oracle = {r["dataset"]: r for r in _csv(tmp_path / "realdata_oracle.csv")}
    assert set(oracle) == {"iris", "crabs"}
    assert all(float(r["ari"]) > 0.85 for r in oracle.values())
    assert float(oracle["iris"]["ll"]) <= float(oracle["iris"]["best_ll"]) + 1e-9


def test_missing_quick_runs_and_its_gaps_hit_their_rates(tmp_path):
    missing = _load("missing")
    rows, table, pairs = missing.main(["--quick", "--datasets", "iris",
                                       "--results", str(tmp_path)])
    assert (tmp_path / "missing.png").stat().st_size > 0
    n_methods = 2 + 2 * len(missing.IMPUTERS) + 1  # ours x 2, pipelines, complete-case
    assert len(_csv(tmp_path / "missing_fits.csv")) == len(rows) == 2 * n_methods
    assert {r["method"] for r in table} >= {missing.TGMM, missing.CLUSTERER}
    assert all(np.isfinite(r["ari"]) for r in rows if not r["error"])
    assert len(pairs) == 2 * 3  # patterns x (two metrics of TGMM, one of the clusterer)
    X = np.random.default_rng(0).normal(size=(4000, 5))
    for pattern in missing.PATTERNS:
        gaps = np.isnan(missing.with_gaps(np.random.default_rng(1), X, pattern, 0.3))
        assert abs(gaps.mean() - 0.3) < 0.02
        assert not gaps.all(axis=1).any()
    driver_observed = ~np.isnan(missing.with_gaps(np.random.default_rng(1), X, "MAR", 0.3))
    assert driver_observed.all(axis=0).sum() == 1  # MAR: one feature always observed


def test_missing_reads_a_large_table_as_a_draw_of_its_rows():
    missing = _load("missing")
    data = missing.load("cps")
    assert data.X.shape == (missing.LARGE_ROWS, 3) and len(data.labels) == missing.LARGE_ROWS
    np.testing.assert_array_equal(missing.load("cps").X, data.X)  # the same draw each time


def test_missing_reading_quick_pairs_each_reading_with_the_imputed_one(tmp_path):
    rows, table = _load("missing_reading").main(
        ["--quick", "--results", str(tmp_path), "--checkpoint", f"tiny={TINY_CHECKPOINT}"])
    assert {row["reading"] for row in rows} == {"imputed", "complete", "tiny"}
    assert len(rows) == 2 * 2 * 3  # two datasets, two patterns at 30 %, three readings
    assert all(np.isfinite(row["ari"]) and row["n_iter"] >= 1 for row in rows)
    # The default fit is of the data with NaN: read by "imputed" and "tiny", not "complete".
    assert all(np.isfinite(row["fit_ari"]) == (row["reading"] != "complete") for row in rows)
    assert [t["reading"] for t in table] == ["complete", "tiny"] * 2
    assert all(t["pairs"] == 2 and np.isfinite(t["difference_ari"]) for t in table)


def test_missing_acceleration_quick_runs_both_from_one_start(tmp_path):
    rows, table = _load("missing_acceleration").main(["--quick", "--results", str(tmp_path)])
    assert len(rows) == 2 * 2 * 3  # two datasets, two patterns, three rates
    assert all(row["plain_iter"] >= 1 and row["squarem_iter"] >= 1 for row in rows)
    # From one start, both end near one likelihood in most fits. Not in every one: where
    # half the entries are missing the likelihood is flat for hundreds of iterations (iris,
    # MAR 50 %: still rising after 2,000), and the stopping rule halts each where its own
    # steps become small (0.15 nats per point apart there).
    gaps = [abs(row["squarem_ll"] - row["plain_ll"]) for row in rows]
    assert np.median(gaps) < 0.01
    assert [t["fits"] for t in table] == [2] * 6
    assert (tmp_path / "missing_acceleration.csv").stat().st_size > 0


def test_missing_start_quick_pairs_both_starts_on_the_same_gaps(tmp_path):
    rows, table = _load("missing_start").main(["--quick", "--results", str(tmp_path)])
    assert len(rows) == 2 * 2 * 3  # two datasets, two patterns, three rates
    for row in rows:
        for name in ("reading", "imputed EM"):
            assert row[f"{name}_iter"] >= 1 and row[f"{name}_time_ratio"] > 0
            assert np.isfinite(row[f"{name}_ll"]) and np.isfinite(row[f"{name}_held_ll"])
    assert [t["fits"] for t in table] == [2] * 6
    assert (tmp_path / "missing_start.csv").stat().st_size > 0


def test_class_mixture_is_one_m_step_on_the_classes():
    realdata = _load("realdata")
    dataset = realdata.load_dataset("iris")
    X, labels = dataset.X, dataset.labels
    for covariance in ("full", "diag"):
        density = np.zeros(len(X))
        for k in range(3):
            members = X[labels == k]
            cov = np.cov(members.T, bias=True) + 1e-6 * np.eye(X.shape[1])
            if covariance == "diag":
                cov = np.diag(np.diag(cov))
            weight = len(members) / len(X)
            density += weight * multivariate_normal(members.mean(0), cov).pdf(X)
        oracle = realdata.class_mixture(dataset, covariance)
        assert oracle.score(X) == pytest.approx(np.log(density).mean(), rel=1e-9)


def test_realdata_em_steps_climb_from_the_transformers_start(tmp_path):
    realdata = _load("realdata")
    rows, _ = realdata.main(["--datasets", "iris", "crabs", "--covariance", "full",
                             "--seeds", "2", "--em-steps", "1", "3", "--results",
                             str(tmp_path)])
    ll = {(r["dataset"], r["seed"], r["method"]): r["ll"] for r in rows}
    for dataset in ("iris", "crabs"):
        for seed in (0, 1):
            one, three = (ll[dataset, seed, f"TGMM n_init=1 max_iter={s}"] for s in (1, 3))
            converged = ll[dataset, seed, "TGMM n_init=1"]
            # EM from one start never lowers the likelihood (up to reg_covar's nudge).
            assert one <= three + 1e-6 <= converged + 2e-6, (dataset, seed)


def test_realdata_baseline_checkpoint_is_paired(tmp_path):
    """The same checkpoint as its own baseline: every paired difference is zero."""
    realdata = _load("realdata")
    rows, table = realdata.main(["--datasets", "iris", "--covariance", "full", "--seeds", "1",
                                 "--baseline-checkpoint", "default",
                                 "--results", str(tmp_path)])
    for method in ("TGMM", "TGMM n_init=1", "transformer alone"):
        for key in ("ll", "ari"):
            diffs = realdata.paired(rows, method, method + realdata.BASELINE, key)
            assert len(diffs) == 1 and diffs[0] == pytest.approx(0.0, abs=1e-9)
    assert {r["method"] for r in table} >= {"TGMM [baseline]", "transformer alone [baseline]"}


def test_realdata_bfloat16_columns_are_paired_and_restore_the_precision(tmp_path):
    """--bfloat16 adds the transformer's methods and the clusterer fitted under "medium"
    precision, on the same fits; the precision is torch's default again after."""
    import torch

    realdata = _load("realdata")
    rows, table = realdata.main(["--datasets", "iris", "--covariance", "full", "--seeds", "1",
                                 "--bfloat16", "--results", str(tmp_path)])
    assert torch.get_float32_matmul_precision() == "highest"
    for method in ("TGMM", "TGMM n_init=1", "transformer alone", "TransformerClusterer"):
        assert len(realdata.paired(rows, method + realdata.BF16, method, "ari")) == 1
    bf16 = next(r for r in rows if r["method"] == "transformer alone" + realdata.BF16)
    assert np.isfinite(bf16["ll"]) and bf16["ms"] > 0


def test_many_components_quick_runs_and_the_default_falls_back_there(tmp_path):
    """The bundled default has no head for K = 12: its fits are the fallback's, bit for bit."""
    many = _load("many_components")
    rows, table = many.main(["--quick", "--tasks", "1", "--seeds", "1",
                             "--results", str(tmp_path)])
    assert (tmp_path / "many_components.png").stat().st_size > 0
    assert len(_csv(tmp_path / "many_components_fits.csv")) == len(rows) == 6 * (2 + 3)
    fits = {}
    for r in rows:
        fits.setdefault((r["kind"], r["setting"], r["seed"]), {})[r["method"]] = r
    for methods in fits.values():
        assert not any(r["error"] for r in methods.values())
        assert methods[many.TGMM]["ll"] == methods[many.FALLBACK]["ll"]
        assert "FallbackWarning" in methods[many.TGMM]["warnings"]
        assert max(r["at_best"] for r in methods.values()) == 1.0  # one seed: each its best
    assert all(r["time_ratio"] > 0 for r in rows)
    assert {r["method"] for r in table} == set(many.methods("default", "full"))


def test_spectral_column_applies_when_d_at_least_k():
    tgmm = _load("tgmm")
    rows = tgmm.run("dims", [dict(d=8, K=3, N=128, shift=0.0)], 2, None)
    spectral = next(r for r in rows if r["method"] == "spectral")
    assert spectral["n_tasks"] == 2 and spectral["error"] < 1


def test_clustering_accuracy_ignores_label_names():
    common = _load("common")
    truth = np.array([0, 0, 1, 1, 2, 2])
    assert common.clustering_accuracy(truth, np.array([2, 2, 0, 0, 1, 1])) == 1.0
    assert common.clustering_accuracy(truth, np.array([2, 2, 0, 0, 1, 0])) == pytest.approx(5 / 6)


def test_weight_error_uses_the_means_matching():
    common = _load("common")
    means = np.array([[0.0, 0.0], [5.0, 0.0]])
    error = common.weight_error(np.array([0.7, 0.3]), means[::-1], np.array([0.3, 0.7]), means)
    assert error == pytest.approx(0.0)


def test_weighted_log_prob_matches_scipy():
    common = _load("common")
    rng = np.random.default_rng(0)
    X, means = rng.standard_normal((5, 3)), rng.standard_normal((2, 3))
    variances = rng.uniform(0.5, 2, (2, 3))
    weights = np.array([0.4, 0.6])
    expected = np.stack([np.log(w) + multivariate_normal(m, np.diag(v)).logpdf(X)
                         for w, m, v in zip(weights, means, variances, strict=True)], axis=1)
    np.testing.assert_allclose(common.weighted_log_prob(X, weights, means, variances), expected)
    spherical = common.weighted_log_prob(X, weights, means, np.array([0.5, 2.0]))
    np.testing.assert_allclose(
        spherical, common.weighted_log_prob(X, weights, means, np.array([[0.5] * 3, [2.0] * 3])))


def test_anisotropic_tasks_and_held_out_samples_follow_the_truth():
    common = _load("common")
    rng = np.random.default_rng(0)
    task = common.sample_anisotropic_task(rng, 3, 4, n_samples=50)
    assert task.scales.shape == (3, 4) and np.all((task.scales >= 0.5) & (task.scales <= 2))
    heldout = common.sample_like(task, rng, 20_000)
    expected_mean = task.weights @ task.means
    np.testing.assert_allclose(heldout.mean(axis=0), expected_mean, atol=0.1)


@pytest.mark.slow  # 200-fit stage timings and FLOP rates in a fresh process: about 20 s
def test_stages_account_for_the_whole_fit(tmp_path):
    stages = _load("stages")
    from transformer_gmm.engine import readout

    forward = readout.forward
    rows = stages.main(["--repeats", "2", "--results", str(tmp_path)])
    assert readout.forward is forward  # every wrapped function is put back
    per_configuration = len(stages.STAGES) + 2  # the stages, "fit" and "other"
    n_rows = len(stages.configurations("default")) * per_configuration
    assert len(_csv(tmp_path / "stages.csv")) == len(rows) == n_rows
    by_config: dict[str, dict[str, float]] = {}
    for row in rows:
        by_config.setdefault(row["configuration"], {})[row["stage"]] = row["ms_per_fit"]
    for config, ms in by_config.items():
        # Structure, not timings: "other" is the fit less its stages, which the machine's
        # load may push either way.
        assert all(math.isfinite(value) for value in ms.values()), (config, ms)
        parts = sum(value for stage, value in ms.items() if stage != "fit")
        assert parts == pytest.approx(ms["fit"]), config
    assert by_config["TransformerGMM(n_init=1, max_iter=0)"]["forward pass"] > 0
    assert by_config["TransformerGMM(n_init=1, max_iter=0)"]["k-means++ starts"] == 0
    assert by_config["TransformerGMM(n_init=1, max_iter=0), bfloat16"]["forward pass"] > 0
    assert by_config["TransformerGMM(checkpoint=None, n_init=1)"]["forward pass"] == 0
    sklearn_fit = by_config["GaussianMixture(n_init=1)"]
    assert sklearn_fit["other"] == sklearn_fit["fit"]  # none of our stages runs there
    flops = _csv(tmp_path / "stages_flops.csv")
    assert [row["what"] for row in flops] == [
        "matmul 128x512 @ 512x512",
        "forward pass, batch 1",
        "forward pass, batch 64",
        "forward pass, batch 1, weights as trained",
        "forward pass, batch 64, weights as trained",
        "matmul in bfloat16",
        "forward pass, batch 1, bfloat16",
        "forward pass, batch 64, bfloat16",
    ]
    # Rates are a count over a time, so positive; how large depends on the machine's load.
    assert all(float(row["fraction_of_matmul"]) > 0 for row in flops)
    em_rows = _csv(tmp_path / "stages_em.csv")
    assert len(em_rows) == len(stages.EM_SHAPES)
    for row in em_rows:  # every path timed (a difference of two timings: any sign under load)
        timed = [key for key in row if key.startswith("us_")]
        assert timed and all(math.isfinite(float(row[key])) for key in timed), row
    # ... and the threshold put back
    from transformer_gmm.engine import gaussian

    assert gaussian.ALL_COMPONENTS_AT_ONCE == 2**18


# --- the options every script takes --------------------------------------------------------

SCRIPTS = sorted(path.stem for path in BENCHMARKS.glob("*.py")
                 if 'if __name__ == "__main__":' in path.read_text())
HELPERS = {"common", "spectral", "real_datasets", "large_datasets", "shapes"}  # imported, never run


def test_every_benchmark_file_is_a_script_or_a_helper():
    assert set(SCRIPTS) == {path.stem for path in BENCHMARKS.glob("*.py")} - HELPERS
    assert set(SCRIPTS) >= {"accuracy", "clustering", "dask_fit", "realdata", "speed",
                            "stages", "tgmm"}


class _Parsed(Exception):
    """Raised with a script's parser and the options it parsed, before it runs anything."""


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_script_takes_the_shared_options(name, tmp_path, monkeypatch):
    """--quick, --seed and --results, from common.shared_parser; an option a script does
    not take would end the parse with SystemExit (argparse's usage error)."""
    main = _load(name).main
    parse_args = argparse.ArgumentParser.parse_args

    def parse_then_stop(parser, args=None, namespace=None):
        raise _Parsed(parser, parse_args(parser, args, namespace))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    with pytest.raises(_Parsed) as parsed:
        main(["--quick", "--seed", "7", "--results", str(tmp_path)])
    parser, options = parsed.value.args
    assert options.quick and options.seed == 7 and options.results == tmp_path
    quick = next(action for action in parser._actions if "--quick" in action.option_strings)
    assert quick.help  # what the quick mode runs
    with pytest.raises(_Parsed) as parsed:
        main([])
    _, defaults = parsed.value.args
    assert not defaults.quick and defaults.seed == 0
    assert defaults.results == BENCHMARKS / "results"


def test_choose_k_quick_runs(tmp_path):
    choose_k = _load("choose_k")
    choose_k.main(["--quick", "--tasks", "2", "--shape-tasks", "2", "--no-real", "--methods",
                   "bic1", "tgmm", "silhouette", "hdbscan", "--results", str(tmp_path)])
    assert (tmp_path / "choose_k.png").stat().st_size > 0
    rows = _csv(tmp_path / "choose_k.csv")
    # settings (four, two well separated, shapes) x tasks x methods
    assert len(rows) == 7 * 2 * 4
    assert not any(r["error"] for r in rows)
    for row in rows:
        assert 0 <= int(row["chosen_k"]) <= 10 and 1 <= int(row["true_k"]) <= 10
        assert -1 <= float(row["ari"]) <= 1
    assert {r["dataset"] for r in rows if r["setting"] == "shapes"} == {"moons", "circles"}
    # The same task for every method: the same true K.
    truths = {(r["setting"], r["task"], r["true_k"]) for r in rows}
    assert len(truths) == 7 * 2
    summary = _csv(tmp_path / "choose_k_summary.csv")
    assert {r["method"] for r in summary} == {
        "BIC loop GMM(n_init=1)", "TGMM posterior", "KMeans silhouette", "HDBSCAN"
    }
    assert {"ari", "median_abs_error"} <= set(summary[0])


def test_choose_k_pairs_a_baseline_checkpoint(tmp_path):
    # The same checkpoint as its own baseline: every choice the same, a paired difference of 0.
    choose_k = _load("choose_k")
    choose_k.main(["--quick", "--tasks", "2", "--shape-tasks", "1", "--no-real", "--methods",
                   "tgmm", "--baseline-checkpoint", "default", "--results", str(tmp_path)])
    rows = _csv(tmp_path / "choose_k.csv")
    by_method = {}
    for row in rows:
        by_method.setdefault(row["method"], []).append(row["chosen_k"])
    assert set(by_method) == {"TGMM posterior", "TGMM posterior [baseline]"}
    assert by_method["TGMM posterior"] == by_method["TGMM posterior [baseline]"]
    summary = _csv(tmp_path / "choose_k_summary.csv")
    baseline = [r for r in summary if r["method"] == "TGMM posterior [baseline]"]
    assert baseline and all(float(r["exact_vs_tgmm"]) == 0 for r in baseline)


def test_auto_fits_pairs_the_two_fits_of_each_chosen_k(tmp_path):
    auto_fits = _load("auto_fits")
    auto_fits.main(["--quick", "--tasks", "2", "--no-real", "--results", str(tmp_path)])
    rows = _csv(tmp_path / "auto_fits.csv")
    assert {r["estimator"] for r in rows} == {"TransformerGMM", "TransformerClusterer"}
    for row in rows:
        assert 2 <= int(row["chosen_k"]) <= 10  # K = 1 is left out: no transformer reads it
        assert -1 <= float(row["ari_auto"]) <= 1 and -1 <= float(row["ari_own_pass"]) <= 1
        assert float(row["time_auto_s"]) > 0 and float(row["time_own_pass_s"]) > 0
    summary = _csv(tmp_path / "auto_fits_summary.csv")
    assert sum(int(r["problems"]) for r in summary) == len(rows)
    for r in summary:
        cell = [row for row in rows
                if (row["estimator"], row["setting"]) == (r["estimator"], r["setting"])]
        ari = sum(float(row["ari_auto"]) - float(row["ari_own_pass"]) for row in cell)
        assert abs(float(r["ari_difference"]) - ari / len(cell)) < 1e-12


@pytest.mark.slow
def test_gpu_dry_run_runs_every_section_on_the_cpu(tmp_path):
    """benchmarks/gpu.py is run on a lent GPU for a few minutes: every section but the
    nested test run is checked here at toy sizes, so that the GPU's minutes go to figures."""
    results = _load("gpu").main(["--dry-run", "--device", "cpu", "--results", str(tmp_path),
                                 "--only", "train", "mfu", "large", "throughput"])
    assert [row["returncode"] for row in results["train"]] == [0]
    assert (tmp_path / "gpu_run" / "checkpoint" / "model.safetensors").is_file()
    assert {row["what"].split(",")[0] for row in results["mfu"]} >= {"forward"}
    assert all(row["tflops"] > 0 for row in results["mfu"])
    large = {row["method"].split(" ")[0]: row for row in results["large"]}
    assert np.isfinite(large["TransformerGMM()"]["log_likelihood"])
    methods = {row["method"] for row in results["throughput"]}
    assert {"fit_many, max_iter=0", "fit_many, default"} <= methods
    assert all(row["datasets_per_s"] > 0 for row in results["throughput"]
               if "datasets_per_s" in row)
    for section in ("train", "mfu", "large", "throughput"):
        assert _csv(tmp_path / f"gpu_{section}.csv")


def test_cluster_count_quick_runs(tmp_path):
    rows = _load("cluster_count").main(["--quick", "--results", str(tmp_path)])
    rules = {row["rule"] for row in rows}
    assert {"components", "clusters", "clusters x components^0.5", "min"} <= rules
    settings = {row["setting"] for row in rows}
    assert {"shapes", "real", "unseen: waves"} <= settings
    assert all(0 <= row["exact"] <= 1 and row["n_tasks"] > 0 for row in rows)
    assert len(_csv(tmp_path / "cluster_count.csv")) == len(rows)


def test_embeddings_quick_runs(tmp_path):
    rows = _load("embeddings").main(["--quick", "--results", str(tmp_path)])
    methods = {row["method"] for row in rows}
    assert {"TGMM", "GMM n_init=3", "TransformerClusterer", "KMeans n_init=10"} <= methods
    for row in rows:
        assert row["features"] == 256 and row["seconds"] > 0 and -1 <= row["ari"] <= 1
        # Each family's times are ratios to its reference's, measured in the same loop.
        if row["method"] in ("GMM n_init=1", "KMeans n_init=1"):
            assert row["time_ratio"] == 1.0
    mixtures = [row["quality"] for row in rows if row["family"] == "mixture"]
    assert all(np.isfinite(mixtures))
    assert len(_csv(tmp_path / "embeddings.csv")) == len(rows)


def test_wide_rows_quick_runs(tmp_path):
    from transformer_gmm.engine import screening

    rule = screening.SCREEN_FROM_FEATURES, screening.SCREEN_DIAG_FROM_VALUES
    rows = _load("wide_rows").main(["--quick", "--results", str(tmp_path)])
    assert (screening.SCREEN_FROM_FEATURES, screening.SCREEN_DIAG_FROM_VALUES) == rule
    assert [row["estimator"] for row in rows] == ["diag", "spherical", "clusterer"] * 2
    for row in rows:
        assert row["features"] >= 200 and row["rows"] >= 40
        for way in ("full_width", "screened"):
            assert np.isfinite(row[f"{way}_quality"]) and row[f"{way}_ms"] > 0
            assert -1 <= row[f"{way}_ari"] <= 1
    assert len(_csv(tmp_path / "wide_rows.csv")) == len(rows)


def test_wide_rows_starts_alone_quick_runs(tmp_path):
    module = _load("wide_rows")
    rows = module.main(["--quick", "--starts-alone", "--results", str(tmp_path)])
    assert len(rows) == 2
    for row in rows:
        assert row["rows"] * row["features"] < module.ALONE_BELOW_VALUES
        for way in ("default", "alone"):
            assert np.isfinite(row[f"{way}_quality"]) and row[f"{way}_ms"] > 0
    assert len(_csv(tmp_path / "wide_rows_alone.csv")) == len(rows)


def test_realdata_large_quick_runs(tmp_path):
    rows = _load("realdata_large").main(["--quick", "--reads", "2", "--results", str(tmp_path)])
    methods = {row["method"] for row in rows}
    assert {"GMM n_init=1", "TGMM n_init=1", "TGMM checkpoint=None n_init=1",
            "TGMM checkpoint=None n_init=4", "TGMM best of 2 reads",
            "k-means++ best of 2"} <= methods
    by_method = {row["method"]: row for row in rows}
    # The default's engine without the transformer: every start is k-means++'s.
    assert by_method["TGMM checkpoint=None n_init=4"]["init"] == "k-means++"
    # The best of two reads is at least as likely as its first, which is seed 0's n_init=1.
    assert by_method["TGMM best of 2 reads"]["ll"] >= by_method["TGMM n_init=1"]["ll"] - 1e-9
    assert all(row["n"] == 20_000 and row["n_iter"] >= 1 for row in rows)
    assert all(np.isfinite(row["ll"]) and -1 <= row["ari"] <= 1 for row in rows)
    table = _csv(tmp_path / "realdata_large.csv")
    transformer = next(r for r in table if r["method"] == "TGMM n_init=1")
    assert 0 <= float(transformer["vs_kmeans_pp_as_likely"]) <= 1
    assert transformer["vs_kmeans_pp_median_iterations"] != ""


def test_realdata_large_reads_a_mid_size_draw_and_pairs_methods(tmp_path, capsys):
    # A copy of the bundled checkpoint under another name: its fits equal the bundled ones,
    # so the paired print reads no fit likelier or less likely.
    script = _load("realdata_large")
    copy = tmp_path / "copy"
    shutil.copytree(bundled_checkpoints()["default"], copy)
    rows = script.main(["--quick", "--rows", "600", "--seed", "3", "--checkpoint", str(copy),
                        "--n-init", "4", "--results", str(tmp_path)])
    assert all(row["n"] == 600 for row in rows)
    drawn = script._draw(script.LARGE_DATASETS["cps"](), 600, 3, standardize=True)
    np.testing.assert_allclose(drawn.X.mean(axis=0), 0.0, atol=1e-12)
    np.testing.assert_allclose(drawn.X.std(axis=0), 1.0)
    by_method = {row["method"]: row for row in rows}
    assert by_method["TGMM [copy]"]["ll"] == by_method["TGMM"]["ll"]
    printed = capsys.readouterr().out
    assert "TGMM n_init=1 [copy] against TGMM n_init=1" in printed
    assert "full: 0 / 0 of 1" in printed
    assert "TGMM against TGMM n_init=4" in printed


def test_merged_reads_quick_runs_and_merging_undoes_relabelling(tmp_path):
    script = _load("merged_reads")
    resp = np.random.default_rng(0).dirichlet(np.ones(3), size=50)  # (50, 3)
    np.testing.assert_allclose(script.merge([resp, resp[:, [2, 0, 1]], resp[:, [1, 2, 0]]]),
                               resp)
    rows = script.main(["--quick", "--reads", "2", "--results", str(tmp_path)])
    assert {"TGMM n_init=1", "TGMM checkpoint=None n_init=1", "TGMM merged of 2 reads",
            "TGMM likeliest of 2 reads"} <= {row["method"] for row in rows}
    assert all(np.isfinite(row["ll"]) and row["n_iter"] >= 1 for row in rows)
    rows = script.main(["--quick", "--ways", "summary", "--results", str(tmp_path)])
    summary = [row for row in rows if row["method"] == "TGMM a weighted summary"]
    assert len(summary) == 1 and np.isfinite(summary[0]["ll"]) and summary[0]["n_iter"] >= 1


@pytest.mark.slow  # eight fresh processes that import torch: about 15 s
def test_memory_quick_runs_each_case_in_a_fresh_process(tmp_path):
    memory = _load("memory")
    cases = ["wide TransformerGMM()", "wide GaussianMixture()"]
    rows = memory.main(["--quick", "--cases", *cases, "--results", str(tmp_path)])
    assert [r["case"] for r in rows] == cases == [r["case"] for r in _csv(tmp_path / "memory.csv")]
    for row in rows:
        assert (row["rows"], row["columns"]) == (50, 200) and row["n_components"] == 5
        assert 0 <= row["peak_growth_mib"] < 2000 and row["seconds"] > 0
    # Ours is held against scikit-learn's figure, which has no target of its own.
    assert rows[0]["target_mib"] == rows[1]["peak_growth_mib"] and "target_mib" not in rows[1]


def test_stages_of_small_real_fits(tmp_path):
    stages = _load("stages")
    rows = stages.main(["--datasets", "faithful", "--repeats", "1", "--results", str(tmp_path)])
    assert len(_csv(tmp_path / "stages_real.csv")) == len(rows) == 2 * 4  # covariances x fits
    for row in rows:
        # Structure, not timings: the forward pass and the rest make the fit.
        assert row["forward_ms"] + row["rest_ms"] == pytest.approx(row["fit_ms"]), row
        transformer = row["configuration"].startswith("TransformerGMM")
        assert (row["forward_ms"] > 0) == transformer, row
