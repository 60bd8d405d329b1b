"""What the benchmark scripts share: the TGMM task protocol, the metrics, the baselines
that are not in scikit-learn, and the writing of tables, CSV and figures."""

from __future__ import annotations

import argparse
import csv
import gc
import time
import zlib
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.optimize import linear_sum_assignment
from scipy.special import logsumexp

RESULTS = Path(__file__).parent / "results"


# --- tasks -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Task:
    X: np.ndarray  # (n, d)
    labels: np.ndarray  # (n,) the component each point came from
    means: np.ndarray  # (K, d)
    weights: np.ndarray  # (K,)
    noise: float  # the isotropic standard deviation
    scales: np.ndarray | None = None  # (K, d) diagonal standard deviations; None: isotropic


def sample_means(rng: np.random.Generator, n_components: int, n_features: int,
                 half_width: float = 5.0, max_cosine: float = 0.8) -> np.ndarray:
    """Means uniform in [-w, w]^d whose pairwise cosine similarity is below ``max_cosine``
    (the TGMM protocol), by rejection."""
    for _ in range(10_000):
        means = rng.uniform(-half_width, half_width, (n_components, n_features))
        if n_features == 1 or n_components == 1:
            return means
        unit = means / np.linalg.norm(means, axis=1, keepdims=True)
        cosine = unit @ unit.T
        if cosine[np.triu_indices(n_components, 1)].max() < max_cosine:
            return means
    raise RuntimeError(f"no {n_components} means in d={n_features} meet the cosine bound")


def sample_tgmm_task(rng: np.random.Generator, n_components: int, n_features: int,
                     n_samples: int = 128, means: np.ndarray | None = None) -> Task:
    """One task of Chen, Wu & Fang 2025: weights U[0.2, 0.8] normalised, unit noise."""
    if means is None:
        means = sample_means(rng, n_components, n_features)
    weights = rng.uniform(0.2, 0.8, n_components)
    weights /= weights.sum()
    labels = rng.choice(n_components, n_samples, p=weights)
    X = means[labels] + rng.standard_normal((n_samples, n_features))
    return Task(X, labels, means, weights, 1.0)


def task_rng(seed: int, *setting: object) -> np.random.Generator:
    """A generator fixed by the seed and a cell's setting, so every method sees the same
    tasks and a cell's tasks do not change when the grid around it does."""
    return np.random.default_rng([seed, zlib.crc32(repr(setting).encode())])


def task_variances(task: Task) -> np.ndarray:
    """The true per-component, per-coordinate variances, shape (K, d)."""
    if task.scales is not None:
        return task.scales**2
    return np.full(task.means.shape, task.noise**2)


def sample_anisotropic_task(rng: np.random.Generator, n_components: int, n_features: int,
                            n_samples: int = 128, scale_range: tuple = (0.5, 2.0)) -> Task:
    """A TGMM task whose components have diagonal covariances: each standard deviation is
    log-uniform in ``scale_range`` (independently per component and coordinate)."""
    means = sample_means(rng, n_components, n_features)
    weights = rng.uniform(0.2, 0.8, n_components)
    weights /= weights.sum()
    low, high = np.log(scale_range)
    scales = np.exp(rng.uniform(low, high, (n_components, n_features)))
    labels = rng.choice(n_components, n_samples, p=weights)
    X = means[labels] + scales[labels] * rng.standard_normal((n_samples, n_features))
    return Task(X, labels, means, weights, 1.0, scales)


def sample_like(task: Task, rng: np.random.Generator, n_samples: int) -> np.ndarray:
    """Fresh samples from the task's true mixture (held-out data)."""
    labels = rng.choice(len(task.weights), n_samples, p=task.weights)
    noise = np.sqrt(task_variances(task))[labels] * rng.standard_normal(
        (n_samples, task.means.shape[1]))
    return task.means[labels] + noise


# --- metrics -----------------------------------------------------------------------------


def mean_error(estimated: np.ndarray, true: np.ndarray) -> float:
    """TGMM's permutation-invariant error: Hungarian matching on the per-coordinate squared
    distance, then the squared error averaged over components and coordinates."""
    cost = _matching_cost(estimated, true)
    rows, cols = linear_sum_assignment(cost)
    return float(cost[rows, cols].mean())


def _matching_cost(estimated: np.ndarray, true: np.ndarray) -> np.ndarray:
    """Per-coordinate squared distance between every estimated and true mean, (K, K)."""
    return ((estimated[:, None, :] - true[None, :, :]) ** 2).mean(axis=2)


def match_components(estimated: np.ndarray, true: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The Hungarian matching of ``mean_error``: estimated[rows[i]] goes with true[cols[i]]."""
    return linear_sum_assignment(_matching_cost(estimated, true))


def weight_error(estimated_weights: np.ndarray, estimated_means: np.ndarray,
                 true_weights: np.ndarray, true_means: np.ndarray) -> float:
    """Mean absolute error of the weights, matched as the means are (``match_components``).
    Absolute rather than squared so that 0.05 reads as five percentage points."""
    rows, cols = match_components(estimated_means, true_means)
    return float(np.abs(estimated_weights[rows] - true_weights[cols]).mean())


def clustering_accuracy(true_labels: np.ndarray, labels: np.ndarray) -> float:
    """The fraction of points labelled right under the best matching of label names."""
    _, true_index = np.unique(true_labels, return_inverse=True)
    _, index = np.unique(labels, return_inverse=True)
    counts = np.zeros((index.max() + 1, true_index.max() + 1))
    np.add.at(counts, (index, true_index), 1)
    rows, cols = linear_sum_assignment(-counts)
    return float(counts[rows, cols].sum() / len(labels))


def weighted_log_prob(X: np.ndarray, weights: np.ndarray, means: np.ndarray,
                      variances: np.ndarray | float) -> np.ndarray:
    """log w_k + log N(x | mu_k, diag(variances_k)) of shape (n, K); ``variances`` is a
    scalar, one per component (K,) or one per component and coordinate (K, d)."""
    variances = np.asarray(variances, dtype=float)
    if variances.ndim == 1:
        variances = variances[:, None]
    variances = np.broadcast_to(variances, means.shape)
    squared = ((X[:, None, :] - means[None]) ** 2 / variances[None]).sum(axis=2)
    log_det = np.log(2 * np.pi * variances).sum(axis=1)
    with np.errstate(divide="ignore"):  # a zero weight is a component that never fires
        return np.log(weights) - 0.5 * (squared + log_det)


def oracle_means(task: Task) -> np.ndarray:
    """The means of the true clusters (an empty cluster keeps its true mean)."""
    return np.array([
        task.X[task.labels == k].mean(axis=0) if (task.labels == k).any() else task.means[k]
        for k in range(len(task.means))
    ])


def bayes_labels(task: Task) -> np.ndarray:
    """The Bayes classifier with the true parameters (isotropic noise)."""
    distances = ((task.X[:, None, :] - task.means[None]) ** 2).sum(axis=2)
    return np.argmax(np.log(task.weights) - distances / (2 * task.noise**2), axis=1)


# --- baselines not in scikit-learn ---------------------------------------------------------


def paper_em(X: np.ndarray, n_components: int, rng: np.random.Generator,
             max_iter: int = 100) -> tuple[np.ndarray, np.ndarray]:
    """The EM the TGMM paper reports: unit isotropic covariance known, means initialised
    N(0, I), uniform weights, one run. Returns (means, labels)."""
    means, _, labels = paper_em_mixture(X, n_components, rng, max_iter)
    return means, labels


def paper_em_mixture(X: np.ndarray, n_components: int, rng: np.random.Generator,
                     max_iter: int = 100) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``paper_em`` that also returns the weights: (means, weights, labels of the last
    E-step)."""
    means = rng.standard_normal((n_components, X.shape[1]))
    log_weights = np.full(n_components, -np.log(n_components))
    for _ in range(max_iter):
        log_prob = log_weights - 0.5 * ((X[:, None, :] - means[None]) ** 2).sum(axis=2)
        resp = np.exp(log_prob - logsumexp(log_prob, axis=1, keepdims=True))  # (n, K)
        nk = resp.sum(axis=0) + 10 * np.finfo(float).eps
        means = resp.T @ X / nk[:, None]
        log_weights = np.log(nk / nk.sum())
    return means, np.exp(log_weights), log_prob.argmax(axis=1)


# --- cost --------------------------------------------------------------------------------


def backbone_flops(model, n_samples: int, n_components: int) -> float:
    """FLOPs (2 per multiply-add) of one forward pass of ``model`` over one dataset of
    n_samples.

    The backbone reads T = min(n, context_size) tokens. Per block: the q, kv and output
    projections (4 D^2 per token), the MLP (2 r D^2), and attention's scores and
    weighted sum (2 T D per token). Then the read-in and the K-slot readout head.
    """
    config = model.config
    tokens, d, k = min(n_samples, model.reading_config.context_size), config.d_model, n_components
    per_block = tokens * (4 + 2 * config.mlp_ratio) * d * d + 2 * tokens * tokens * d
    read_in = tokens * config.d_max * d
    # Head: keys and values and point projections of every token, attention of K seeds,
    # and per slot q, output projection, MLP, slot projection, raw outputs; point logits.
    head = 3 * tokens * d * d + 2 * k * tokens * d + 4 * k * d * d + k * tokens * d
    head += k * d * (config.d_max + 2)
    return 2.0 * (config.n_layer * per_block + read_in + head)


# --- running and reporting ---------------------------------------------------------------


@contextmanager
def bfloat16_products():
    """torch's float32 matmul precision at "medium", which lets the backbone multiply in
    bfloat16 (transformer_gmm.engine.precision), restored after."""
    import torch

    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


class Bfloat16:
    """An estimator whose ``fit`` runs under :func:`bfloat16_products` and returns the
    fitted estimator."""

    def __init__(self, estimator):
        self.estimator = estimator

    def fit(self, X):
        with bfloat16_products():
            return self.estimator.fit(X)


def timed(fit: Callable[[], object]) -> tuple[object, float]:
    start = time.perf_counter()
    result = fit()
    return result, 1000 * (time.perf_counter() - start)


def summarise(values: list[float]) -> tuple[float, float]:
    """Mean and standard error."""
    array = np.asarray(values, dtype=float)
    se = array.std(ddof=1) / np.sqrt(len(array)) if len(array) > 1 else float("nan")
    return float(array.mean()), float(se)


def write_csv(rows: list[dict], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as file:
        # Every key any row has, in order of appearance (a failed method's row has fewer).
        fields = list(dict.fromkeys(key for row in rows for key in row))
        writer = csv.DictWriter(file, fieldnames=fields, restval="")
        writer.writeheader()
        writer.writerows(rows)
    return path


def shared_parser(doc: str, quick_help: str) -> argparse.ArgumentParser:
    """The options every benchmark script takes: ``--quick``, ``--seed`` and ``--results``
    (tests/test_benchmark_scripts.py checks that each script accepts them)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--results", type=Path, default=RESULTS, help="folder for CSV and PNG")
    parser.add_argument(
        "--seed", type=int, default=0,
        help="draws the data (default 0, the published tables); another seed draws fresh "
             "data, to check that a difference is not an accident of one draw")
    return parser


def standard_parser(doc: str, out: str, quick_help: str,
                    tasks: bool = True) -> argparse.ArgumentParser:
    """``shared_parser`` and the options of the scripts that evaluate a checkpoint (see
    accuracy.py): ``--checkpoint``, ``--out`` and, where a script draws tasks, ``--tasks``."""
    parser = shared_parser(doc, quick_help)
    if tasks:
        parser.add_argument("--tasks", type=int, default=None,
                            help="tasks per cell (default 200)")
    parser.add_argument("--checkpoint", default="default", help="the transformer to evaluate")
    parser.add_argument("--out", default=out, help="file stem of the CSV and PNG files")
    return parser


def single_threaded():
    """A context in which BLAS and OpenMP use one thread. The tasks are small, so one
    thread is the fastest setting for every method, and on shared cores more threads
    oversubscribe them (scikit-learn's OpenMP Lloyd then runs ten times slower or worse)."""
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=1)


def run_methods(tasks: Sequence, fits: dict[str, Callable], score: Callable,
                keys: Sequence[str], setting: dict) -> list[dict]:
    """One row per method for one cell of a grid.

    ``fits[name](task, seed)`` returns a result, or None where the method does not apply;
    ``score(task, result)`` returns a dict of per-task figures (NaN where undefined), each
    reported as its mean over tasks and standard error (``key`` and ``key_se``), with the
    median time per fit in milliseconds.
    """
    rows = []
    for name, fit in fits.items():
        scores, times = [], []
        for seed, task in enumerate(tasks):
            result, ms = timed(lambda: fit(task, seed))  # noqa: B023
            if result is not None:
                scores.append(score(task, result))
                times.append(ms)
        row = dict(setting, method=name, n_tasks=len(scores))
        for key in keys:
            values = [s[key] for s in scores if not np.isnan(s[key])]
            row[key], row[key + "_se"] = summarise(values) if values else (np.nan, np.nan)
        row["ms_per_fit"] = float(np.median(times)) if times else np.nan
        rows.append(row)
    return rows


def format_cell(mean: float, se: float) -> str:
    """mean+-se with three decimals; scientific notation for blow-ups (heavy tails)."""
    if np.isnan(mean):
        return "n/a"
    return f"{mean:.3f}+-{se:.3f}" if abs(mean) < 1e4 else f"{mean:.2e}+-{se:.1e}"


def print_table(rows: list[dict], setting_keys: Sequence[str], metric: str, title: str,
                short: Callable[[str], str] = str) -> None:
    """Rows: the settings; columns: the methods; cells: mean+-standard error."""
    names = list(dict.fromkeys(r["method"] for r in rows))
    width = max(15, *(len(short(n)) for n in names))
    key_widths = [max(6, len(k)) for k in setting_keys]
    print(f"\n{title}")
    print(" ".join(f"{k:>{w}}" for k, w in zip(setting_keys, key_widths, strict=True)) + " "
          + " ".join(f"{short(n):>{width}}" for n in names))
    for setting in dict.fromkeys(tuple(r[k] for k in setting_keys) for r in rows):
        cells = [format_cell(r[metric], r[metric + "_se"]) for n in names for r in rows
                 if r["method"] == n and tuple(r[k] for k in setting_keys) == setting]
        print(" ".join(f"{v:>{w}}" for v, w in zip(setting, key_widths, strict=True)) + " "
              + " ".join(f"{c:>{width}}" for c in cells))


@dataclass(frozen=True)
class Panel:
    """One column of a figure: the rows of one sweep, plotted against ``x``."""
    title: str
    rows: list
    x: str
    xlabel: str
    xlog: bool = False


def plot_panels(panels: Sequence[Panel], metrics: Sequence[tuple[str, str, bool]],
                path: Path, title: str = "") -> Path:
    """A grid of line plots: one column per panel, one row per (key, label, ylog) metric;
    one line per method with standard-error bars. Methods with no value are left out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    fig, axes = plt.subplots(len(metrics), len(panels), squeeze=False,
                             # at least 8 inches wide: the title and legend must fit
                             figsize=(max(3.4 * len(panels) + 0.8, 8.0),
                                      2.6 * len(metrics) + 1.0))
    # One colour per method in every panel, even where a method does not apply.
    names = list(dict.fromkeys(r["method"] for panel in panels for r in panel.rows))
    for column, panel in enumerate(panels):
        for (key, label, ylog), ax in zip(metrics, axes[:, column], strict=True):
            for index, name in enumerate(names):
                line = [r for r in panel.rows if r["method"] == name and not np.isnan(r[key])]
                if line:
                    y = np.array([r[key] for r in line])
                    se = np.nan_to_num([r[key + "_se"] for r in line])
                    # On a log axis a bar below zero would run off the panel: clip it.
                    lower = np.minimum(se, 0.9 * y) if ylog else se
                    ax.errorbar([r[panel.x] for r in line], y, yerr=[lower, se], label=name,
                                color=f"C{index % 10}", marker="o", markersize=3, capsize=2)
            xs = sorted({r[panel.x] for r in panel.rows})
            if panel.xlog:
                ax.set_xscale("log")
            ax.set_xticks(xs, [f"{x:g}" for x in xs])
            ax.minorticks_off()
            ax.set(yscale="log" if ylog else "linear", xlabel=panel.xlabel)
            if ylog:  # ticks at 1, 2, 5 x 10^k read better than 6 x 10^-1 minor labels
                ax.yaxis.set_major_locator(LogLocator(subs=(1, 2, 5), numticks=8))
                ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
                ax.yaxis.set_minor_formatter(NullFormatter())
            ax.grid(alpha=0.3)
            if column == 0:
                ax.set_ylabel(label)
        axes[0, column].set_title(panel.title)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    for ax in axes.flat:  # the first panel may lack a method that applies elsewhere
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            if label not in labels:
                handles.append(handle)
                labels.append(label)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 4), fontsize=8)
    rows_of_legend = -(-len(labels) // 4)
    fig.tight_layout(rect=(0, (0.25 * rows_of_legend + 0.1) / fig.get_figheight(), 1, 1))
    return save_figure(fig, path)


def save_figure(fig, path: Path) -> Path:
    """Write ``fig`` to ``path`` (its folder made if need be) and close it."""
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# --- peak memory (Linux: /proc/self) ---------------------------------------------------------

MiB = 2**20


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024  # kB
    raise OSError(f"no {field} in /proc/self/status (not Linux?)")


def peak_memory_growth(fit: Callable[[], object]) -> tuple[object, float, float]:
    """``fit()``'s result, its peak memory growth over what was resident before it (MiB),
    and its seconds. Not ``ru_maxrss``: Linux carries it across ``fork`` and ``exec``."""
    gc.collect()
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")  # the peak (VmHWM) restarts from the memory resident now
    before = _status_bytes("VmRSS")
    start = time.perf_counter()
    result = fit()
    seconds = time.perf_counter() - start
    return result, (_status_bytes("VmHWM") - before) / MiB, seconds
