"""Real data: our estimators against scikit-learn on classic datasets with known classes.

Datasets: the eleven of ``real_datasets.py`` (all offline, from pip packages; K = the
number of classes).

Every dataset is standardized (zero mean and unit variance per feature).

Methods, on the same data and seeds, interleaved per (dataset, covariance, seed) so that
load on the machine hits them alike: ``GaussianMixture`` with ``n_init`` 1, 3 and 10;
``TransformerGMM`` by default ("TGMM"), with ``n_init=1`` (the transformer's start alone,
then EM), with ``max_iter=0`` ("transformer alone": its own estimate, no EM), with
``checkpoint=None`` (the bundled EM from one k-means++ start) and with ``checkpoint=None,
n_init=4`` (the default's engine, its four starts all k-means++'s: the default against it
measures what the transformer adds); per (dataset, seed), not per
covariance type, ``KMeans(n_init=10)`` and ``TransformerClusterer``. Covariance types
``full`` and ``diag``. Seeds ``1000 * --seed + i`` for i < ``--seeds`` (10), so ``--seed 1``
draws fresh ones; each method gets the seed as ``random_state``.

Metrics per fit: the mean log-likelihood per point on the data (LL, ``score``), BIC, the
adjusted Rand index of ``predict`` against the classes, the wall time of ``fit``
(``time.perf_counter``; one BLAS, OpenMP and torch thread) as a ratio to
``GaussianMixture(n_init=1)`` on the same (dataset, covariance, seed), and "at best": an LL
within 0.01 nats per point of the best LL any method reached on that (dataset, covariance)
with any seed.

    python benchmarks/realdata.py                 # 11 datasets, full and diag, 10 seeds
    python benchmarks/realdata.py --quick         # iris, faithful, crabs; full; 2 seeds
    python benchmarks/realdata.py --seed 1 --results /tmp/fresh   # fresh seeds
    python benchmarks/realdata.py --checkpoint new/ --baseline-checkpoint default
    python benchmarks/realdata.py --em-steps 1 2 5   # how much EM the transformer's start needs
    python benchmarks/realdata.py --bfloat16         # the backbone's products in bfloat16
    python benchmarks/realdata.py --n-init 2 3       # fewer starts than the default's four

``--baseline-checkpoint`` adds TGMM, TGMM n_init=1 and the transformer alone with a second
checkpoint (marked "[baseline]"), on the same seeds, and prints the paired differences.
``--bfloat16`` adds the same three and the clusterer fitted under
``torch.set_float32_matmul_precision("medium")`` (marked "[bf16]"; on a CPU without native
bfloat16 they are float32 fits), and prints their paired differences from float32.

Prints the tables and writes realdata_fits.csv (one row per fit), realdata.csv (the summary
per covariance type and method), realdata_datasets.csv (per dataset and method),
realdata_oracle.csv (the mixture one M-step gives with the classes as responsibilities:
how far a readout that got every class right would be from EM's optimum) and
realdata.png under benchmarks/results/.
"""

from __future__ import annotations

import sys
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
from sklearn.cluster import KMeans
from sklearn.exceptions import ConvergenceWarning
from sklearn.metrics import adjusted_rand_score
from sklearn.mixture import GaussianMixture

sys.path.insert(0, str(Path(__file__).parent))
from common import (  # noqa: E402
    Bfloat16,
    print_table,
    save_figure,
    single_threaded,
    standard_parser,
    summarise,
    timed,
    write_csv,
)
from real_datasets import DATASETS, Dataset, load_dataset  # noqa: E402

from transformer_gmm import FallbackWarning, TransformerClusterer, TransformerGMM  # noqa: E402
from transformer_gmm._collapsed import collapsed_components  # noqa: E402

AT_BEST = 0.01  # nats per point: an LL this close to the best found reaches it
AS_GOOD = 0.01  # nats per point: "as good as GMM n_init=1" allows this much below it
AS_LIKELY = 1e-3  # nats per point: a paired fit likelier or less likely by more than this
GMM1, GMM3, GMM10 = "GMM n_init=1", "GMM n_init=3", "GMM n_init=10"
TGMM, TGMM1, ALONE, NO_CKPT = ("TGMM", "TGMM n_init=1", "transformer alone",
                               "TGMM checkpoint=None")
# The default's engine with its four starts all k-means++'s: what the default gains from
# the transformer, beside what it gains from the engine (starts that compete, its EM).
ENGINE = "TGMM checkpoint=None n_init=4"
KMEANS, CLUSTERER = "KMeans n_init=10", "TransformerClusterer"
CLUSTERERS = (KMEANS, CLUSTERER)
BASELINE = " [baseline]"
BF16 = " [bf16]"
QUICK_DATASETS = ("iris", "faithful", "crabs")


# --- methods -------------------------------------------------------------------------------


def in_bfloat16(methods: dict) -> dict:
    """``methods`` (name: (make, silenced)) fitted under :class:`Bfloat16`, marked BF16."""
    def wrapped(make):
        return lambda *args: Bfloat16(make(*args))

    return {name + BF16: (wrapped(make), silenced) for name, (make, silenced) in methods.items()}


def mixture_methods(checkpoint, baseline=None, em_steps=(), bfloat16=False, n_inits=()) -> dict:
    """name: (make(K, covariance, seed) -> unfitted estimator, warnings to silence).
    ``em_steps`` adds the transformer's start followed by that many EM steps, each;
    ``n_inits`` the default with that many starts, each (the transformer's two first)."""

    def gaussian_mixture(n_init):
        return lambda k, cov, seed: GaussianMixture(k, covariance_type=cov, n_init=n_init,
                                                    random_state=seed)

    def transformer_gmm(ckpt, **params):
        return lambda k, cov, seed: TransformerGMM(k, covariance_type=cov, checkpoint=ckpt,
                                                   random_state=seed, **params)

    def transformer_methods(ckpt, suffix=""):
        return {
            TGMM + suffix: (transformer_gmm(ckpt), ()),
            TGMM1 + suffix: (transformer_gmm(ckpt, n_init=1), ()),
            # No EM: converged_ is False by design, and the package says so.
            ALONE + suffix: (transformer_gmm(ckpt, max_iter=0),
                             (ConvergenceWarning, FallbackWarning)),
        }

    return {
        GMM1: (gaussian_mixture(1), ()),
        GMM3: (gaussian_mixture(3), ()),
        GMM10: (gaussian_mixture(10), ()),
        **transformer_methods(checkpoint),
        NO_CKPT: (transformer_gmm(None), (FallbackWarning,)),
        ENGINE: (transformer_gmm(None, n_init=4), (FallbackWarning,)),
        **(transformer_methods(baseline, BASELINE) if baseline is not None else {}),
        **(in_bfloat16(transformer_methods(checkpoint)) if bfloat16 else {}),
        **{f"{TGMM1} max_iter={steps}": (transformer_gmm(checkpoint, n_init=1, max_iter=steps),
                                         (ConvergenceWarning,))
           for steps in em_steps},
        **{f"{TGMM} n_init={n}": (transformer_gmm(checkpoint, n_init=n), ()) for n in n_inits},
    }


def clustering_methods(checkpoint, bfloat16=False) -> dict:
    clusterer = {CLUSTERER: (lambda k, seed: TransformerClusterer(k, checkpoint=checkpoint,
                                                                  random_state=seed), ())}
    return {
        KMEANS: (lambda k, seed: KMeans(k, n_init=10, random_state=seed), ()),
        **clusterer,
        **(in_bfloat16(clusterer) if bfloat16 else {}),
    }


def fit_one(model, X: np.ndarray, silenced: tuple) -> tuple[object, float, list[str], str]:
    """(the fitted model or None, ms, the warnings it raised, the error or "")."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for category in silenced:
            warnings.simplefilter("ignore", category)
        try:
            fitted, ms = timed(lambda: model.fit(X))
            error = ""
        except Exception as exc:  # a failed fit is a result: recorded, not fatal
            fitted, ms, error = None, np.nan, f"{type(exc).__name__}: {exc}"
    return fitted, ms, sorted({w.category.__name__ for w in caught}), error


def _row(dataset: Dataset, held_out: np.ndarray | None, covariance: str, seed: int,
         method: str, model, ms: float, caught: list[str], error: str) -> dict:
    X, mixture = dataset.X, covariance != "-"
    ok = model is not None
    labels = (model.predict(X) if mixture else model.labels_) if ok else None
    ari = (adjusted_rand_score(dataset.labels, labels)
           if ok and dataset.labels is not None else np.nan)
    return dict(
        dataset=dataset.name, n=X.shape[0], d=X.shape[1], K=dataset.n_components,
        covariance=covariance, seed=seed, method=method,
        ll=float(model.score(X)) if ok and mixture else np.nan,
        heldout_ll=(float(model.score(held_out)) if ok and mixture and held_out is not None
                    else np.nan),
        collapsed=int(collapsed_components(
            model.weights_, model.means_, model.covariances_, covariance, len(X),
            model.reg_covar
        ).sum()) if ok and mixture else 0,
        bic=float(model.bic(X)) if ok and mixture else np.nan,
        ari=float(ari), ms=ms,
        init=getattr(model, "init_method_", ""),
        converged=getattr(model, "converged_", ""),
        warnings=" ".join(caught), error=error,
    )


def warm_up(checkpoint, baseline, em_steps=(), bfloat16=False, n_inits=()) -> None:
    """Load the checkpoints and let torch set itself up before anything is timed. Not
    guarded: a checkpoint that cannot be loaded stops the run here."""
    X = np.random.default_rng(0).standard_normal((64, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        methods = mixture_methods(checkpoint, baseline, em_steps, bfloat16, n_inits)
        for make, _ in methods.values():
            make(2, "full", 0).fit(X)
        for make, _ in clustering_methods(checkpoint, bfloat16).values():
            make(2, 0).fit(X)


def split(dataset: Dataset, seed: int, held_out: float) -> tuple[Dataset, np.ndarray | None]:
    """The rows to fit and the rows held out (a uniform draw of that fraction, by seed), or
    the whole dataset and None."""
    if held_out == 0:
        return dataset, None
    rng = np.random.default_rng([seed, len(dataset.X)])
    out = np.zeros(len(dataset.X), dtype=bool)
    out[rng.choice(len(dataset.X), round(held_out * len(dataset.X)), replace=False)] = True
    labels = None if dataset.labels is None else dataset.labels[~out]
    kept = Dataset(dataset.name, dataset.X[~out], labels, dataset.n_components)
    return kept, dataset.X[out]


def run(datasets: list[Dataset], covariances, seeds, checkpoint, baseline=None,
        em_steps=(), bfloat16=False, held_out: float = 0.0, n_inits=()) -> list[dict]:
    """One row per fit, with the derived columns (time ratio, gap to the best, at best).
    With ``held_out``, every method fits the same rows of each (dataset, seed) and is also
    scored on the rest."""
    mixtures = mixture_methods(checkpoint, baseline, em_steps, bfloat16, n_inits)
    clusterers = clustering_methods(checkpoint, bfloat16)
    rows = []
    for whole in datasets:
        k = whole.n_components
        for seed in seeds:
            dataset, held = split(whole, seed, held_out)
            for method, (make, silenced) in clusterers.items():
                rows.append(_row(dataset, held, "-", seed, method,
                                 *fit_one(make(k, seed), dataset.X, silenced)))
            for covariance in covariances:
                for method, (make, silenced) in mixtures.items():
                    rows.append(_row(dataset, held, covariance, seed, method,
                                     *fit_one(make(k, covariance, seed), dataset.X, silenced)))
        done = [r for r in rows if r["dataset"] == whole.name]
        print(f"{whole.name}: {len(done)} fits, {np.nansum([r['ms'] for r in done]) / 1000:.1f}"
              " s fitting", flush=True)
    add_derived(rows)
    return rows


def add_derived(rows: list[dict]) -> None:
    """time_ratio (to GMM n_init=1 on the same dataset, covariance and seed; for the
    clusterers, to KMeans n_init=10 on the same dataset and seed), ll_gap (to the best LL
    of the (dataset, covariance), and seed where rows are held out) and at_best."""
    reference = {(r["dataset"], r["covariance"], r["seed"]): r["ms"] for r in rows
                 if r["method"] == (KMEANS if r["covariance"] == "-" else GMM1)}
    # With rows held out, each seed fits other rows: the best is the seed's own.
    by_seed = any(np.isfinite(r["heldout_ll"]) for r in rows)

    def setting(r):
        return (r["dataset"], r["covariance"]) + ((r["seed"],) if by_seed else ())

    best: dict[tuple, float] = {}
    for r in rows:
        if np.isfinite(r["ll"]):
            best[setting(r)] = max(best.get(setting(r), -np.inf), r["ll"])
    for r in rows:
        r["time_ratio"] = r["ms"] / reference[r["dataset"], r["covariance"], r["seed"]]
        top = best.get(setting(r), np.nan)
        r["ll_gap"] = top - r["ll"]
        r["at_best"] = float(r["ll_gap"] <= AT_BEST) if np.isfinite(r["ll"]) else np.nan


# --- the oracle ----------------------------------------------------------------------------


def class_mixture(dataset: Dataset, covariance: str) -> GaussianMixture:
    """The mixture one M-step gives with the classes as responsibilities: what the
    transformer's readout (responsibilities, then one M-step) would return if it
    assigned every point to its class. Deterministic; ``reg_covar`` as GaussianMixture's."""
    X, labels, k = dataset.X, dataset.labels, dataset.n_components
    model = GaussianMixture(k, covariance_type=covariance)
    resp = np.eye(k)[labels]  # (n, K)
    counts = resp.sum(axis=0)
    model.weights_ = counts / len(X)
    model.means_ = resp.T @ X / counts[:, None]
    if covariance == "full":
        diffs = X[None] - model.means_[:, None]  # (K, n, d)
        model.covariances_ = (np.einsum("nk,kni,knj->kij", resp, diffs, diffs)
                              / counts[:, None, None] + 1e-6 * np.eye(X.shape[1]))
        chol = np.linalg.cholesky(model.covariances_)
        model.precisions_cholesky_ = np.linalg.inv(chol).transpose(0, 2, 1)
    elif covariance == "diag":
        model.covariances_ = (resp.T @ X**2 / counts[:, None] - model.means_**2) + 1e-6
        model.precisions_cholesky_ = 1.0 / np.sqrt(model.covariances_)
    else:
        raise ValueError(f"the class mixture is written for full and diag, not {covariance!r}")
    return model


def oracle_rows(datasets: list[Dataset], covariances, rows: list[dict]) -> list[dict]:
    """Per dataset with classes: the class mixture's LL and ARI beside one EM run's
    (GaussianMixture n_init=1, mean over seeds) and the best LL any method found."""
    out = []
    for dataset in (d for d in datasets if d.labels is not None):
        for covariance in [c for c in covariances if c in ("full", "diag")]:
            model = class_mixture(dataset, covariance)
            gmm1 = [r for r in rows if (r["dataset"], r["covariance"], r["method"])
                    == (dataset.name, covariance, GMM1)]
            out.append(dict(
                dataset=dataset.name, covariance=covariance,
                ll=float(model.score(dataset.X)),
                ari=float(adjusted_rand_score(dataset.labels, model.predict(dataset.X))),
                gmm1_ll=_mean([r["ll"] for r in gmm1]), gmm1_ari=_mean([r["ari"] for r in gmm1]),
                best_ll=max(r["ll"] for r in rows if (r["dataset"], r["covariance"])
                            == (dataset.name, covariance)),
            ))
    return out


def print_oracle(table: list[dict]) -> None:
    print("\nThe classes as responsibilities, one M-step (what a readout that assigned every "
          "point to its class would return), against one EM run and the best LL found:")
    print(f"{'dataset':<14} {'cov':>4} {'LL':>9} {'GMM1 LL':>9} {'best LL':>9} {'ARI':>6} "
          f"{'GMM1 ARI':>9}")
    for r in table:
        print(f"{r['dataset']:<14} {r['covariance']:>4} {r['ll']:9.3f} {r['gmm1_ll']:9.3f} "
              f"{r['best_ll']:9.3f} {r['ari']:6.3f} {r['gmm1_ari']:9.3f}")


# --- summaries ------------------------------------------------------------------------------


def paired(rows: list[dict], method: str, other: str, key: str,
           ratio: bool = False) -> np.ndarray:
    """``method``'s ``key`` minus (or over) ``other``'s on the same (dataset, covariance,
    seed), over the fits where both are finite."""
    values = {(r["dataset"], r["covariance"], r["seed"]): r[key] for r in rows
              if r["method"] == other}
    compare = np.divide if ratio else np.subtract
    diffs = [compare(r[key], values[r["dataset"], r["covariance"], r["seed"]]) for r in rows
             if r["method"] == method]
    diffs = np.asarray(diffs, dtype=float)
    return diffs[np.isfinite(diffs)]


def _covariances(rows: list[dict]) -> list[str]:
    """The covariance types of the rows in their order, then "-" (the clusterers)."""
    found = list(dict.fromkeys(r["covariance"] for r in rows))
    return [c for c in found if c != "-"] + [c for c in found if c == "-"]


def _mean(values) -> float:
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    return float(values.mean()) if len(values) else np.nan


def _median(values) -> float:
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    return float(np.median(values)) if len(values) else np.nan


def _mean_se(values) -> tuple[float, float]:
    return summarise(values) if len(values) else (np.nan, np.nan)


def summary(rows: list[dict]) -> list[dict]:
    """One row per (covariance, method); differences are paired against ``reference``
    (GMM n_init=1, or KMeans n_init=10 for the clusterers)."""
    out = []
    for covariance in _covariances(rows):
        part = [r for r in rows if r["covariance"] == covariance]
        reference = KMEANS if covariance == "-" else GMM1
        for method in dict.fromkeys(r["method"] for r in part):
            mine = [r for r in part if r["method"] == method]
            ll_diff = paired(part, method, reference, "ll")
            ari_diff = paired(part, method, reference, "ari")
            out.append(dict(
                covariance=covariance, method=method, reference=reference,
                n_fits=len(mine), failed=sum(bool(r["error"]) for r in mine),
                warned=sum(bool(r["warnings"]) for r in mine),
                ari=_mean([r["ari"] for r in mine]),
                ari_diff=_mean_se(ari_diff)[0], ari_diff_se=_mean_se(ari_diff)[1],
                ll=_mean([r["ll"] for r in mine]),
                ll_diff_median=_median(ll_diff),
                ll_diff=_mean_se(ll_diff)[0], ll_diff_se=_mean_se(ll_diff)[1],
                as_good=_mean(ll_diff >= -AS_GOOD) if len(ll_diff) else np.nan,
                at_best=_mean([r["at_best"] for r in mine]),
                time_ratio=_median([r["time_ratio"] for r in mine]),
                ms=_median([r["ms"] for r in mine]),
            ))
    return out


def per_dataset(rows: list[dict]) -> list[dict]:
    """One row per (dataset, covariance, method): means and standard errors over seeds."""
    out = []
    order = {c: i for i, c in enumerate(_covariances(rows))}
    keys = dict.fromkeys((r["dataset"], r["covariance"], r["method"]) for r in rows)
    for key in sorted(keys, key=lambda key: order[key[1]]):
        mine = [r for r in rows if (r["dataset"], r["covariance"], r["method"]) == key]
        row = dict(dataset=key[0], covariance=key[1], method=key[2], n_fits=len(mine))
        for metric in ("ll", "heldout_ll", "ari", "ll_gap", "at_best"):
            values = [r[metric] for r in mine if np.isfinite(r[metric])]
            row[metric], row[metric + "_se"] = _mean_se(values)
        row["ms"] = _median([r["ms"] for r in mine])
        # The optima reached over the seeds: LLs more than AT_BEST apart count apart.
        lls = sorted(r["ll"] for r in mine if np.isfinite(r["ll"]))
        steps = zip([-np.inf, *lls], lls, strict=False)
        row["distinct_optima"] = sum(1 for a, b in steps if b - a > AT_BEST)
        row["collapsed_fits"] = sum(r["collapsed"] > 0 for r in mine)
        out.append(row)
    return out


def _short(name: str) -> str:
    return (name.replace("TransformerClusterer", "TC").replace("transformer alone", "alone")
            .replace("checkpoint=None", "ckpt=None").replace(" n_init=", " n"))


def _f(value: float, spec: str) -> str:
    return "n/a" if not np.isfinite(value) else format(value, spec)


def print_summary(table: list[dict]) -> None:
    print("\nSummary per covariance type and method (paired differences against the "
          "reference on the same dataset and seed):")
    print("  ARI: mean ARI over the datasets with classes; dARI: minus the reference's, "
          "+- paired standard error")
    print("  dLL: LL minus the reference's, nats/point, median and mean +- paired standard "
          f"error; >=ref: LL >= reference - {AS_GOOD}; best: within {AT_BEST} of the best LL "
          "found; time: median ratio to the reference's fit time")
    header = (f"{'cov':>4} {'method':<30} {'ARI':>6} {'dARI':>16} {'dLL med':>8} "
              f"{'dLL mean':>17} {'>=ref':>6} {'best':>6} {'time':>6} {'ms':>7}")
    print(header)
    for r in table:
        print(f"{r['covariance']:>4} {r['method']:<30} {_f(r['ari'], '.3f'):>6} "
              f"{_f(r['ari_diff'], '+.3f') + '+-' + _f(r['ari_diff_se'], '.3f'):>16} "
              f"{_f(r['ll_diff_median'], '+.3f'):>8} "
              f"{_f(r['ll_diff'], '+.3f') + '+-' + _f(r['ll_diff_se'], '.3f'):>17} "
              f"{_f(r['as_good'], '.0%'):>6} {_f(r['at_best'], '.0%'):>6} "
              f"{_f(r['time_ratio'], '.2f'):>6} {_f(r['ms'], '.1f'):>7}")
    print("  (covariance '-': the clusterers, against KMeans n_init=10)")


def print_targets(rows: list[dict], table: list[dict], baseline: bool, bfloat16: bool) -> None:
    def get(covariance, method, key):
        return next((r[key] for r in table
                     if (r["covariance"], r["method"]) == (covariance, method)), np.nan)

    print("\nTargets")
    for cov in [c for c in dict.fromkeys(r["covariance"] for r in rows) if c != "-"]:
        part = [r for r in rows if r["covariance"] == cov]
        ratio3 = _median(paired(part, TGMM, GMM3, "ms", ratio=True))
        ari_se = get(cov, ALONE, "ari_diff_se")
        print(f"  [{cov}] transformer alone: mean ARI {get(cov, ALONE, 'ari'):.3f} vs "
              f"GMM n_init=1 {get(cov, GMM1, 'ari'):.3f} (paired SE {ari_se:.3f}); "
              f"median LL gap to GMM n_init=1 {get(cov, ALONE, 'll_diff_median'):+.3f} "
              f"nats/point; at best {get(cov, ALONE, 'at_best'):.0%}")
        print(f"  [{cov}] TGMM n_init=1 >= GMM n_init=1 - {AS_GOOD} in "
              f"{get(cov, TGMM1, 'as_good'):.0%} of fits; at best "
              f"{get(cov, TGMM1, 'at_best'):.0%} vs GMM n_init=1 {get(cov, GMM1, 'at_best'):.0%}"
              f", GMM n_init=10 {get(cov, GMM10, 'at_best'):.0%}")
        print(f"  [{cov}] TGMM default at best {get(cov, TGMM, 'at_best'):.0%} vs GMM "
              f"n_init=10 {get(cov, GMM10, 'at_best'):.0%}; mean ARI "
              f"{get(cov, TGMM, 'ari'):.3f} vs {get(cov, GMM10, 'ari'):.3f}; median time "
              f"ratio to GMM n_init=1 {get(cov, TGMM, 'time_ratio'):.2f}, to GMM n_init=3 "
              f"{ratio3:.2f}")
    if any(r["method"] == CLUSTERER for r in rows):
        print(f"  TransformerClusterer mean ARI {get('-', CLUSTERER, 'ari'):.3f} vs KMeans "
              f"n_init=10 {get('-', KMEANS, 'ari'):.3f} (paired SE "
              f"{get('-', CLUSTERER, 'ari_diff_se'):.3f}); median time ratio "
              f"{get('-', CLUSTERER, 'time_ratio'):.2f}")
    print("  The default against its engine with four k-means++ starts (paired on the same "
          "fits; likelier / less likely by more than 0.001 nats per point):")
    print_paired(rows, get, [(TGMM, ENGINE)])
    methods = dict.fromkeys(r["method"] for r in rows)
    n_inits = [m for m in methods if m.startswith(TGMM + " n_init=") and m[-1].isdigit()
               and " max_iter=" not in m]
    if n_inits:
        print("  The default against the same checkpoint with other numbers of starts (paired):")
        print_paired(rows, get, [(TGMM, m) for m in n_inits])
    if baseline:
        print("  Checkpoint against the baseline (paired on the same fits):")
        print_paired(rows, get, [(m, m + BASELINE) for m in (TGMM, TGMM1, ALONE)])
    if bfloat16:
        print("  bfloat16 products against float32 (paired on the same fits):")
        print_paired(rows, get, [(m + BF16, m) for m in (TGMM, TGMM1, ALONE, CLUSTERER)])


def print_paired(rows: list[dict], get, pairs: list[tuple[str, str]]) -> None:
    """For each (method, other) and covariance type: LL, ARI and time, paired."""
    for cov in dict.fromkeys(r["covariance"] for r in rows):
        part = [r for r in rows if r["covariance"] == cov]
        for method, other in pairs:
            if not any(r["method"] == method for r in part):
                continue
            ll_diffs = paired(part, method, other, "ll")
            ll, ll_se = _mean_se(ll_diffs)
            ari, ari_se = _mean_se(paired(part, method, other, "ari"))
            ms = _median(paired(part, method, other, "ms", ratio=True))
            # The median too: a few fits on digits move the mean LL by nats.
            likelihood = (f"LL {ll:+.4f}+-{ll_se:.4f} (median {_median(ll_diffs):+.4f}; "
                          f"{np.sum(ll_diffs > AS_LIKELY)} / {np.sum(ll_diffs < -AS_LIKELY)}), "
                          f"at best {get(cov, method, 'at_best'):.0%} vs "
                          f"{get(cov, other, 'at_best'):.0%}; " if len(ll_diffs) else "")
            print(f"    [{cov}] {method} vs {other}: {likelihood}ARI {ari:+.3f}+-{ari_se:.3f}; "
                  f"median time ratio {ms:.2f}")


def print_spread(by_dataset: list[dict]) -> None:
    """How many distinct optima each method reached over the seeds, per dataset."""
    for covariance in [c for c in _covariances(by_dataset) if c != "-"]:
        part = [r for r in by_dataset if r["covariance"] == covariance]
        methods = list(dict.fromkeys(r["method"] for r in part))
        print(f"\nDistinct optima over the seeds ({covariance}; LLs more than {AT_BEST} "
              "nats per point apart):")
        print(f"{'dataset':>14} " + " ".join(f"{_short(m)[:12]:>12}" for m in methods))
        for name in dict.fromkeys(r["dataset"] for r in part):
            counts = {r["method"]: r["distinct_optima"] for r in part if r["dataset"] == name}
            print(f"{name:>14} " + " ".join(f"{counts.get(m, 0):>12}" for m in methods))


def print_collapsed(rows: list[dict]) -> None:
    """Fits with a collapsed component, and whether each of ours warned."""
    mixtures = [r for r in rows if r["covariance"] != "-" and np.isfinite(r["ll"])]
    counts = Counter(r["method"] for r in mixtures if r["collapsed"])
    silent = [r for r in mixtures if r["collapsed"] and r["method"].startswith("TGMM")
              and r["init"] and "CollapsedComponentWarning" not in r["warnings"]]
    print("\nFits with a collapsed component: " + (", ".join(
        f"{m} {c} of {sum(r['method'] == m for r in mixtures)}" for m, c in counts.items())
        or "none"))
    print(f"  of ours, returned without CollapsedComponentWarning: {len(silent)}")


def print_held_out(rows: list[dict]) -> None:
    """The held-out LL of each mixture method, paired against GMM n_init=10 and 1."""
    for covariance in [c for c in _covariances(rows) if c != "-"]:
        print(f"\nHeld-out LL per point ({covariance}), paired on the same fits:")
        for method in dict.fromkeys(r["method"] for r in rows if r["covariance"] == covariance):
            mine = [r for r in rows if r["covariance"] == covariance]
            line = f"  {method:<28}"
            for other in (GMM10, GMM1):
                diffs = paired(mine, method, other, "heldout_ll")
                if len(diffs):
                    mean, se = _mean_se(list(diffs))
                    line += f" vs {_short(other)}: {mean:+.4f} +- {se:.4f}"
            mean, _ = _mean_se([r["heldout_ll"] for r in mine if r["method"] == method
                                and np.isfinite(r["heldout_ll"])])
            print(f"{line}   mean {mean:.4f}")


def print_problems(rows: list[dict]) -> None:
    failed = [r for r in rows if r["error"]]
    warned = Counter((r["method"], w) for r in rows for w in r["warnings"].split())
    if not failed and not warned:
        print("\nNo fit failed or warned (silenced by design: the transformer alone's "
              "convergence warning, the fallback's warning for checkpoint=None).")
        return
    print("\nFits that failed or warned:")
    for r in failed:
        print(f"  failed: {r['dataset']} {r['covariance']} seed {r['seed']} {r['method']}: "
              f"{r['error']}")
    for (method, warning), count in warned.items():
        print(f"  {method}: {warning} in {count} fits")


def plot(datasets: list[dict], path: Path) -> Path:
    """Per dataset: the mean LL gap to the best and the mean ARI of each method, for the
    first covariance type of the run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    covariance = next(r["covariance"] for r in datasets if r["covariance"] != "-")
    mixture = [r for r in datasets if r["covariance"] == covariance]
    clustering = [r for r in datasets if r["covariance"] == "-"]
    names = list(dict.fromkeys(r["dataset"] for r in mixture))
    fig, axes = plt.subplots(2, 1, figsize=(max(8.0, 0.9 * len(names) + 3), 7.5), sharex=True)
    x = np.arange(len(names))
    panels = ((axes[0], mixture, "ll_gap", "LL gap to the best found\n(nats/point)"),
              (axes[1], mixture + clustering, "ari", "adjusted Rand index"))
    for ax, part, key, label in panels:
        methods = list(dict.fromkeys(r["method"] for r in part))
        width = 0.8 / len(methods)
        for index, method in enumerate(methods):
            values = [next((r[key] for r in part
                            if (r["dataset"], r["method"]) == (name, method)), np.nan)
                      for name in names]
            errors = [next((r[key + "_se"] for r in part
                            if (r["dataset"], r["method"]) == (name, method)), np.nan)
                      for name in names]
            ax.bar(x - 0.4 + (index + 0.5) * width, values, width, yerr=np.nan_to_num(errors),
                   label=method, color=f"C{index % 10}", capsize=1, error_kw=dict(lw=0.6))
        ax.set_ylabel(label)
        ax.grid(alpha=0.3, axis="y")
    axes[0].set_yscale("symlog", linthresh=AT_BEST)
    axes[0].axhline(AT_BEST, color="k", lw=0.6, ls="--")
    axes[1].set_xticks(x, names, rotation=30, ha="right")
    axes[1].legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.35))
    fig.suptitle(f"Real data, {covariance} covariance: mean and standard error over seeds "
                 "(the dashed line: 'at best')", fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path)


def main(argv=None):
    parser = standard_parser(__doc__, "realdata", "iris, faithful and crabs; full covariance; "
                                                  "2 seeds")
    parser.add_argument("--seeds", type=int, default=None, help="seeds per dataset (10)")
    parser.add_argument("--datasets", nargs="+", choices=list(DATASETS), default=None)
    parser.add_argument("--covariance", nargs="+", choices=["full", "diag", "tied",
                                                            "spherical"], default=None,
                        help="covariance types (full and diag)")
    parser.add_argument("--baseline-checkpoint", default=None,
                        help="a second checkpoint for the transformer methods, compared "
                             "with --checkpoint on the same seeds")
    parser.add_argument("--em-steps", nargs="+", type=int, default=(),
                        help="add TGMM n_init=1 stopped after this many EM steps (each)")
    parser.add_argument("--n-init", nargs="+", type=int, default=(),
                        help="add TGMM with this many starts (each; the transformer's two "
                             "first, then k-means++'s), against the default's four")
    parser.add_argument("--held-out", type=float, default=0.0,
                        help="a fraction of each dataset's rows (drawn by seed) that every "
                             "method leaves out of its fit and is scored on (0: none)")
    parser.add_argument("--bfloat16", action="store_true",
                        help="add the transformer's methods fitted under "
                             "torch.set_float32_matmul_precision('medium')")
    args = parser.parse_args(argv)
    if args.tasks is not None:
        parser.error("--tasks does not apply to real data: use --seeds")
    names = args.datasets or (QUICK_DATASETS if args.quick else list(DATASETS))
    covariances = args.covariance or (["full"] if args.quick else ["full", "diag"])
    n_seeds = args.seeds or (2 if args.quick else 10)
    seeds = [1000 * args.seed + i for i in range(n_seeds)]
    datasets = [load_dataset(name) for name in names]
    print("datasets: " + ", ".join(f"{d.name} ({d.X.shape[0]} x {d.X.shape[1]}, "
                                   f"K = {d.n_components})" for d in datasets))
    print(f"covariance {', '.join(covariances)}; seeds {seeds}; checkpoint "
          f"{args.checkpoint!r}" + (f", baseline {args.baseline_checkpoint!r}"
                                    if args.baseline_checkpoint else "")
          + "; one BLAS, OpenMP and torch thread")

    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with single_threaded():
            warm_up(args.checkpoint, args.baseline_checkpoint, args.em_steps, args.bfloat16,
                    args.n_init)
            rows = run(datasets, covariances, seeds, args.checkpoint,
                       args.baseline_checkpoint, args.em_steps, args.bfloat16, args.held_out,
                       args.n_init)
    finally:
        torch.set_num_threads(threads)

    table = summary(rows)
    by_dataset = per_dataset(rows)
    print_summary(table)
    for covariance in _covariances(by_dataset):
        part = [r for r in by_dataset if r["covariance"] == covariance]
        what = "clusterers" if covariance == "-" else f"{covariance} covariance"
        if covariance != "-":
            print_table(part, ["dataset"], "ll", f"Mean LL per point, {what}, mean+-se over "
                        "seeds (higher is better)", short=_short)
        print_table(part, ["dataset"], "ari", f"Mean ARI, {what}", short=_short)
    oracle = oracle_rows(datasets, covariances, rows)
    print_oracle(oracle)
    print_targets(rows, table, args.baseline_checkpoint is not None, args.bfloat16)
    print_collapsed(rows)
    if args.held_out:  # each seed fits other rows: their optima are not comparable
        print_held_out(rows)
    else:
        print_spread(by_dataset)
    print_problems(rows)

    fits_path = write_csv(rows, args.results / f"{args.out}_fits.csv")
    csv_path = write_csv(table, args.results / f"{args.out}.csv")
    datasets_path = write_csv(by_dataset, args.results / f"{args.out}_datasets.csv")
    if oracle:
        write_csv(oracle, args.results / f"{args.out}_oracle.csv")
    png_path = plot(by_dataset, args.results / f"{args.out}.png")
    print(f"\nwrote {fits_path}, {csv_path}, {datasets_path} and {png_path}")
    return rows, table


if __name__ == "__main__":
    main()
