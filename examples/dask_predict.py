"""
Scoring an out-of-core array with Dask
======================================

A fitted ``TransformerGMM`` holds numpy arrays only (weights, means, precisions), so it
pickles to other processes and machines in a few kilobytes. Fit it on a sample, then let
``dask.array.map_blocks`` label and score a large array chunk by chunk on a
``dask.distributed`` cluster: the task graph carries the estimator to the workers, and
each task needs the memory of one chunk only. The labels and scores are the same as
``predict`` and ``score_samples`` give in memory. The figure shows a sample of the rows
coloured by the labels the workers computed, and the scores of all the rows.

    pip install "dask[array,distributed]"
    python examples/dask_predict.py
"""

import os

import dask
import dask.array as da
import matplotlib.pyplot as plt
import numpy as np
from dask.distributed import Client, LocalCluster

from transformer_gmm import TransformerGMM


def main() -> None:
    # Three Gaussians in 4 dimensions. The dask array stands for data read from disk, such
    # as da.from_zarr(...) or da.from_array(h5py_dataset, chunks=...).
    rng = np.random.default_rng(0)
    centers = rng.uniform(-6, 6, (3, 4))
    X = centers[rng.integers(0, 3, 100_000)] + rng.standard_normal((100_000, 4))
    X_dask = da.from_array(X, chunks=(25_000, -1))  # 4 chunks of rows, all the columns
    print(f"{X_dask.shape[0]:,} rows in {X_dask.numblocks[0]} chunks")

    # Fit on a sample that fits in memory; checkpoint=None runs EM from k-means++.
    sample = X[rng.choice(len(X), 2_000, replace=False)]
    gmm = TransformerGMM(3, checkpoint=None, random_state=0).fit(sample)

    # Two worker processes: the estimator really is pickled to another process (the test
    # suite's quick run starts worker threads instead, in a fraction of the time).
    processes = not os.environ.get("TRANSFORMER_GMM_EXAMPLES_QUICK")
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=processes, dashboard_address=None
        ) as cluster,
        Client(cluster),
    ):
        # meta= tells dask the type of each block, so it need not call gmm on empty input.
        labels = X_dask.map_blocks(gmm.predict, drop_axis=1, meta=np.array((), np.intp))
        scores = X_dask.map_blocks(gmm.score_samples, drop_axis=1, meta=np.array(()))
        labels, scores = dask.compute(labels, scores)

    same_labels = np.array_equal(labels, gmm.predict(X))
    same_scores = np.array_equal(scores, gmm.score_samples(X))
    print(f"labels identical to in-memory predict:       {same_labels}")
    print(f"scores identical to in-memory score_samples: {same_scores}")
    print(f"mean log-likelihood per sample: {scores.mean():.4f}")
    if not (same_labels and same_scores):
        raise SystemExit("the chunked results differ from the in-memory ones")

    fig, (data_ax, score_ax) = plt.subplots(1, 2, figsize=(11, 4))
    data_ax.scatter(X[::50, 0], X[::50, 1], c=labels[::50], s=4, cmap="viridis")
    data_ax.set(title="Labels computed on the workers (every 50th row)",
                xlabel="x0", ylabel="x1")
    score_ax.hist(scores, bins=100)
    score_ax.set(title=f"Log-likelihood of all {len(scores):,} rows",
                 xlabel="score_samples", ylabel="rows")
    fig.tight_layout()
    plt.show()


# Dask starts worker processes by importing this file again: the guard keeps them from
# running the example themselves.
if __name__ == "__main__":
    main()
