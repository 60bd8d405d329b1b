"""The clusterer's stream against ``MiniBatchKMeans``, paired over many seeds.

``streaming.py`` reads one seed: which k-means basin a stream ends in is decided early
(``TransformerClusterer`` by its first batch's fit, ``MiniBatchKMeans`` by its first
steps and its reassignments), so one seed's inertia says little about which method ends
lower. Here each seed draws its own stream (``streaming.make_stream``) and seeds both
methods; per seed and batch size:

- the final mean inertia per row, on the table's own rows for a real stream (flights:
  its 100,000 distinct rows) or on 10^5 rows the stream never shows (synthetic);
- the seconds of the first call and of all the later ones, apart, for both methods
  (making the batches left out).

Printed: the paired mean difference of inertia (ours minus ``MiniBatchKMeans``) with its
standard error, the seeds where ours is at most theirs, and the ratios of seconds (all
calls, and the later steps alone). With ``--views-against V``, ours streams each seed a
second time with ``n_views=V``, and the paired difference of inertia (ours minus that)
and the first calls' seconds are printed too. One thread, on CPU.

    python benchmarks/streaming_seeds.py --quick                   # 2 seeds, 10^5 rows (CI)
    python benchmarks/streaming_seeds.py --datasets synthetic flights --seeds 10  # docs
    python benchmarks/streaming_seeds.py --views-against 4 --seeds 20 --out streaming_views

Writes benchmarks/results/streaming_seeds.csv.
"""

from __future__ import annotations

import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from common import shared_parser, single_threaded, summarise, write_csv  # noqa: E402
from streaming import BLOCK, Resampled, Stream, make_stream, warm_up  # noqa: E402


def scored_rows(source: Stream) -> np.ndarray:
    """The rows the final inertia is read on: a real table's own, or unseen draws."""
    return source.X if isinstance(source, Resampled) else source.unseen(10**5)


def timed_stream(estimator, source: Stream, n_rows: int, size: int) -> tuple[float, float]:
    """Stream ``n_rows`` through ``partial_fit``; the seconds of the first call and of the
    rest."""
    first = rest = 0.0
    for i, batch in enumerate(source.stream(n_rows, size)):
        start = time.perf_counter()
        estimator.partial_fit(batch)
        if i == 0:
            first = time.perf_counter() - start
        else:
            rest += time.perf_counter() - start
    return first, rest


def run_seed(name: str, seed: int, n_rows: int, sizes: list[int], checkpoint,
             views: int | None = None) -> list[dict]:
    """Both methods (and ours with ``n_views=views``, where given) on one seed's stream."""
    from sklearn.cluster import MiniBatchKMeans

    from transformer_gmm import TransformerClusterer

    source = make_stream(name, seed)
    table, k = scored_rows(source), source.n_components
    rows = []
    for size in sizes:
        row = dict(dataset=name, seed=seed, n_rows=n_rows, batch_size=size)
        methods = [
            ("ours", TransformerClusterer(k, checkpoint=checkpoint, random_state=seed,
                                          device="cpu")),
            ("minibatch", MiniBatchKMeans(k, random_state=seed, n_init=1)),
        ]
        if views is not None:
            methods.append(("views", TransformerClusterer(
                k, checkpoint=checkpoint, random_state=seed, device="cpu", n_views=views)))
        for label, estimator in methods:
            first, rest = timed_stream(estimator, source, n_rows, size)
            row[f"{label}_inertia"] = -float(estimator.score(table)) / len(table)
            row[f"{label}_first_seconds"], row[f"{label}_step_seconds"] = first, rest
        rows.append(row)
        print(f"  {name} seed {seed} {size:,}: inertia {row['ours_inertia']:.5f} / "
              f"{row['minibatch_inertia']:.5f}, seconds {row['ours_first_seconds']:.2f} + "
              f"{row['ours_step_seconds']:.2f} / {row['minibatch_first_seconds']:.2f} + "
              f"{row['minibatch_step_seconds']:.2f}", flush=True)
    return rows


def summarize(rows: list[dict]) -> list[dict]:
    """Per stream and batch size: the paired inertia difference and the time ratios."""
    summary = []
    for key in sorted({(r["dataset"], r["batch_size"]) for r in rows}):
        part = [r for r in rows if (r["dataset"], r["batch_size"]) == key]
        diff = _differences(part, "minibatch")
        mean, se = summarise(diff)
        relative = diff / np.array([r["minibatch_inertia"] for r in part])

        def total(label, which=("first", "step"), part=part):
            return sum(r[f"{label}_{w}_seconds"] for r in part for w in which)

        summary.append(dict(
            dataset=key[0], batch_size=key[1], n_seeds=len(part),
            inertia_difference=mean, inertia_difference_se=se,
            relative_difference=relative.mean(),
            seeds_at_most_theirs=int((relative <= 1e-9).sum()),  # equal but for rounding
            seconds_ratio=total("ours") / total("minibatch"),
            step_seconds_ratio=total("ours", ("step",)) / total("minibatch", ("step",)),
        ))
        if "views_inertia" in part[0]:
            views_mean, views_se = summarise(_differences(part, "views"))
            summary[-1].update(
                views_difference=views_mean, views_difference_se=views_se,
                views_first_seconds_ratio=total("ours", ("first",)) / total("views", ("first",)),
            )
    return summary


def _differences(part: list[dict], other: str) -> np.ndarray:
    """Ours minus ``other``'s final inertia, seed by seed."""
    return np.array([r["ours_inertia"] - r[f"{other}_inertia"] for r in part])


def print_summary(summary: list[dict]) -> None:
    print("\nours - MiniBatchKMeans, paired over seeds (inertia per row: lower is better)")
    print(f"{'stream':<10} {'batch':>8} {'seeds':>5} {'inertia diff':>20} {'relative':>9} "
          f"{'ours <= theirs':>14} {'seconds':>8} {'steps':>6}")
    for s in summary:
        print(f"{s['dataset']:<10} {s['batch_size']:>8,} {s['n_seeds']:>5} "
              f"{s['inertia_difference']:>+10.5f} ± {s['inertia_difference_se']:<7.5f} "
              f"{s['relative_difference']:>+9.4%} {s['seeds_at_most_theirs']:>8} of "
              f"{s['n_seeds']:<3} {s['seconds_ratio']:>8.2f} {s['step_seconds_ratio']:>6.2f}")
    if "views_difference" not in summary[0]:
        return
    print("\nours - ours with --views-against's n_views, paired over seeds")
    print(f"{'stream':<10} {'batch':>8} {'seeds':>5} {'inertia diff':>20} {'first call':>11}")
    for s in summary:
        print(f"{s['dataset']:<10} {s['batch_size']:>8,} {s['n_seeds']:>5} "
              f"{s['views_difference']:>+10.5f} ± {s['views_difference_se']:<7.5f} "
              f"{s['views_first_seconds_ratio']:>11.2f}")


def main(argv=None) -> list[dict]:
    parser = shared_parser(__doc__, "2 seeds, 10^5 rows in batches of 10^3 and 10^4")
    parser.add_argument("--seeds", type=int, default=10, help="streams (seeds from --seed)")
    parser.add_argument("--n-rows", type=int, help="rows a stream (default 10^6)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[10**3, 10**4])
    parser.add_argument("--datasets", nargs="+", default=["synthetic", "flights"],
                        choices=["synthetic", "diamonds", "flights", "cps", "mpls_stops",
                                 "county_murders"])
    parser.add_argument("--checkpoint", default="default",
                        help="the transformer that starts our streams ('none': k-means++)")
    parser.add_argument("--views-against", type=int, default=None, metavar="V",
                        help="also stream ours with n_views=V, paired with ours")
    parser.add_argument("--out", default="streaming_seeds", help="file stem of the CSV")
    args = parser.parse_args(argv)
    n_rows = args.n_rows or (10**5 if args.quick else 10**6)
    n_seeds = 2 if args.quick else args.seeds
    if any(size % BLOCK or n_rows % size for size in args.batch_sizes):
        parser.error(f"batch sizes must be multiples of {BLOCK} that divide --n-rows")
    checkpoint = None if args.checkpoint == "none" else args.checkpoint
    import torch

    torch.set_num_threads(1)
    rows = []
    with single_threaded(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        warm_up(checkpoint, args.seed)
        for name in args.datasets:
            for seed in range(args.seed, args.seed + n_seeds):
                rows.extend(run_seed(name, seed, n_rows, args.batch_sizes, checkpoint,
                                     args.views_against))
                write_csv(rows, args.results / f"{args.out}.csv")  # what is done so far
    summary = summarize(rows)
    print_summary(summary)
    write_csv(summary, args.results / f"{args.out}_summary.csv")
    return summary


if __name__ == "__main__":
    main()
