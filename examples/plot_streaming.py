"""
Learning from a stream, batch by batch
======================================

``partial_fit`` takes one batch at a time, so a mixture can learn from data that never
fits in memory at once: rows read from files, a database cursor or a socket, here a
generator. The first call starts the mixture as ``fit`` does (the transformer reads the
first batch); each later call is one step of stepwise EM (Cappe and Moulines, 2009), a
running average of the batches' sufficient statistics whose step size
``(t + learning_offset) ** -learning_decay`` shrinks as batches arrive. Memory stays that
of one batch. ``TransformerClusterer.partial_fit`` does the same for k-means, as
``MiniBatchKMeans.partial_fit`` does.

The figure follows, as batches arrive, how far the mean log-likelihood of rows the stream
never shows is below that of the mixture that drew the data (the best any fit can do),
beside ``GaussianMixture`` fitted on the first batch alone (what fits in the same memory;
one k-means start, which here merges the small component), and the clusterers' inertia
on the same rows.

    python examples/plot_streaming.py
"""

import os
from collections.abc import Iterator

import matplotlib.pyplot as plt
import numpy as np
from scipy.special import logsumexp
from scipy.stats import multivariate_normal
from sklearn.cluster import MiniBatchKMeans
from sklearn.mixture import GaussianMixture

from transformer_gmm import TransformerClusterer, TransformerGMM

WEIGHTS = np.array([0.5, 0.3, 0.15, 0.05])  # a small component, which a batch barely shows
MEANS = np.array([[0.0, 0.0, 0.0], [3.0, 3.0, 0.0], [-3.0, 2.0, 2.0], [0.0, -4.0, 3.0]])
COVARIANCE = 0.5 * np.eye(3) + 0.5  # correlated features


def draw(rng: np.random.Generator, n: int) -> np.ndarray:
    labels = rng.choice(len(WEIGHTS), n, p=WEIGHTS)
    return MEANS[labels] + rng.multivariate_normal(np.zeros(3), COVARIANCE, n)


def stream(n_batches: int, batch_size: int, seed: int = 0) -> Iterator[np.ndarray]:
    """The batches, made one at a time (a stand-in for reading them from storage)."""
    rng = np.random.default_rng(seed)
    for _ in range(n_batches):
        yield draw(rng, batch_size)


def true_log_likelihood(X: np.ndarray) -> float:
    densities = [multivariate_normal(m, COVARIANCE).logpdf(X) for m in MEANS]
    return float(logsumexp(np.log(WEIGHTS)[:, None] + np.array(densities), axis=0).mean())


def main() -> None:
    quick = bool(os.environ.get("TRANSFORMER_GMM_EXAMPLES_QUICK"))
    n_batches, batch_size = (20, 2_000) if quick else (200, 5_000)
    held_out = draw(np.random.default_rng(1), 20_000)  # rows the stream never shows

    gmm = TransformerGMM(4, random_state=0)
    clusterer = TransformerClusterer(4, random_state=0)
    minibatch = MiniBatchKMeans(4, random_state=0, n_init=1)
    rows, log_likelihood, inertia, inertia_mbk = [], [], [], []
    for t, batch in enumerate(stream(n_batches, batch_size)):
        gmm.partial_fit(batch)
        clusterer.partial_fit(batch)
        minibatch.partial_fit(batch)
        if t == 0:  # the same memory, one fit
            first_batch = GaussianMixture(4, random_state=0).fit(batch).score(held_out)
        rows.append((t + 1) * batch_size)
        log_likelihood.append(gmm.score(held_out))
        inertia.append(-clusterer.score(held_out) / len(held_out))
        inertia_mbk.append(-minibatch.score(held_out) / len(held_out))

    best = true_log_likelihood(held_out)
    print(f"{gmm.n_steps_} batches, {gmm.n_samples_seen_:,} rows: held-out log-likelihood "
          f"{log_likelihood[-1]:.4f} (the drawing mixture: {best:.4f}; GaussianMixture on "
          f"the first batch: {first_batch:.4f})")
    print(f"held-out inertia per row: TransformerClusterer {inertia[-1]:.4f}, "
          f"MiniBatchKMeans {inertia_mbk[-1]:.4f}")

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    # How far each is below the mixture that drew the data, in nats per held-out row.
    gap = np.maximum(best - np.array(log_likelihood), 1e-5)
    left.plot(rows, gap, label="TransformerGMM.partial_fit")
    left.axhline(best - first_batch, color="gray", ls=":", label="GaussianMixture, first batch")
    left.set(xscale="log", yscale="log", xlabel="rows seen",
             ylabel="held-out log-likelihood per row,\nbelow the drawing mixture's",
             title="A mixture learns from the stream")
    left.legend(loc="lower left")
    right.plot(rows, inertia, label="TransformerClusterer.partial_fit")
    right.plot(rows, inertia_mbk, label="MiniBatchKMeans.partial_fit", ls="--")
    right.set(xscale="log", xlabel="rows seen", ylabel="held-out inertia per row",
              title="k-means on the same batches")
    right.legend(loc="upper right")
    fig.tight_layout()
    plt.show()


if __name__ == "__main__":
    main()
