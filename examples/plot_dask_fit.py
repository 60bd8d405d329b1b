"""
Fitting a mixture on a Dask array
=================================

``TransformerGMM().fit`` takes a ``dask.array.Array`` chunked by rows and fits it where
the chunks live, on the active ``dask.distributed`` cluster, without gathering the array:
one pass draws a sample for the transformer's starts, then every EM iteration is one
pass that adds up each chunk's sufficient statistics (a few kilobytes a chunk). Here the
cluster is a ``LocalCluster`` of two workers (threads of this process, so that the example
starts in seconds; ``processes=True`` runs the same on worker processes); on a real
cluster, connect with ``Client("tcp://scheduler:8786")`` and nothing else changes.
``predict`` and ``score_samples`` on the array stay lazy. The figure shows the fitted
components over a sample of the rows.

    pip install "dask[array,distributed]"
    python examples/plot_dask_fit.py
"""

import os
import time

import dask.array as da
import matplotlib.pyplot as plt
import numpy as np
from dask.distributed import Client, LocalCluster
from matplotlib.patches import Ellipse

from transformer_gmm import TransformerGMM


def make_array(n_chunks: int, rows_per_chunk: int) -> da.Array:
    """Three elongated Gaussians in 2-D, each chunk made on the worker that holds it (a
    stand-in for ``da.from_zarr`` or ``da.from_array(h5py_dataset, chunks=...)``)."""
    means = np.array([[-4.0, 0.0], [3.0, 3.0], [2.0, -4.0]])
    shapes = np.array(  # each component's x = mean + shape @ standard normal
        [[[1.5, 0.6], [0.0, 0.5]], [[0.7, 0.0], [0.5, 1.0]], [[1.0, -0.6], [0.0, 0.4]]]
    )

    def chunk(block_info=None):
        (start, stop), _ = block_info[None]["array-location"]
        rng = np.random.default_rng(start)  # the same rows whichever worker makes them
        labels = rng.choice(3, stop - start, p=[0.5, 0.3, 0.2])
        noise = rng.standard_normal((stop - start, 2))
        return means[labels] + np.einsum("nij,nj->ni", shapes[labels], noise)

    chunks = ((rows_per_chunk,) * n_chunks, (2,))
    return da.map_blocks(chunk, chunks=chunks, dtype=float, meta=np.empty((0, 0)))


def draw_ellipses(ax, gmm):
    for mean, covariance, weight in zip(gmm.means_, gmm.covariances_, gmm.weights_, strict=True):
        values, vectors = np.linalg.eigh(covariance)
        angle = np.degrees(np.arctan2(vectors[1, 1], vectors[0, 1]))
        for scale in (1.0, 2.0):  # one and two standard deviations
            width, height = 2 * scale * np.sqrt(values[::-1])
            ax.add_patch(Ellipse(mean, width, height, angle=angle, fill=False, lw=2,
                                 alpha=0.4 + weight, color="black"))


def main() -> None:
    rows_per_chunk = 5_000 if os.environ.get("TRANSFORMER_GMM_EXAMPLES_QUICK") else 100_000
    X = make_array(6, rows_per_chunk)  # 6 chunks of rows, both columns in each
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None)
        as cluster,
        Client(cluster),
    ):
        start = time.perf_counter()
        gmm = TransformerGMM(3, random_state=0).fit(X)
        print(f"fitted {X.shape[0]:,} rows in {X.numblocks[0]} chunks in "
              f"{time.perf_counter() - start:.1f} s: {gmm.n_iter_} EM iterations, "
              f"start from {gmm.init_method_}, mean log-likelihood {gmm.lower_bound_:.4f}")
        labels = gmm.predict(X)  # lazy: a dask array, nothing computed yet
        print(f"predict gives a lazy {type(labels).__module__.split('.')[0]} array of "
              f"{labels.numblocks[0]} chunks")
        counts = np.bincount(labels.compute(), minlength=3)  # computed chunk by chunk
        print(f"rows per component: {counts.tolist()}, weights {gmm.weights_.round(3).tolist()}")
        print(f"score on the array: {gmm.score(X):.4f}")
        sample = X[:: X.shape[0] // 2_000].compute()  # 2,000 rows to draw

    fig, ax = plt.subplots(figsize=(6, 5))
    ax.scatter(*sample.T, s=4, c=gmm.predict(sample), cmap="viridis", alpha=0.5)
    draw_ellipses(ax, gmm)
    ax.set(title=f"TransformerGMM fitted on a Dask array of {X.shape[0]:,} rows",
           xlabel="x0", ylabel="x1", aspect="equal")
    fig.tight_layout()
    plt.show()


# With processes=True, Dask starts worker processes by importing this file again: the
# guard keeps them from running the example themselves.
if __name__ == "__main__":
    main()
