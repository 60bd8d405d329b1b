"""Clusters that are not Gaussian, for ``choose_k.py``'s ``shapes`` setting.

Seven families, taken in turn (task i is family i mod 7), each with its number of clusters
drawn from its own range, so that the tasks cover 2 to 10 clusters:

- ``moons``: ``sklearn.datasets.make_moons`` (2 clusters);
- ``circles``: ``sklearn.datasets.make_circles`` (2 nested circles);
- ``anisotropic``: ``make_blobs`` times a random linear map (2 to 10 elongated clusters);
- ``varied``: ``make_blobs`` with cluster standard deviations 0.5 to 2.5 (2 to 10);
- ``rings``: separate annuli at random centres (2 to 6);
- ``spirals``: interleaved spiral arms (2 to 4);
- ``shells``: nested spherical shells in 2 or 3 dimensions (2 to 4).

Every task has ``n`` points; its labels are the cluster of each point.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from sklearn.datasets import make_blobs, make_circles, make_moons

Generator = Callable[[np.random.Generator, int], tuple[np.ndarray, np.ndarray, int]]


def _seed(rng: np.random.Generator) -> int:
    return int(rng.integers(2**31 - 1))


def moons(rng: np.random.Generator, n: int):
    X, y = make_moons(n, noise=rng.uniform(0.04, 0.1), random_state=_seed(rng))
    return X, y, 2


def circles(rng: np.random.Generator, n: int):
    X, y = make_circles(n, noise=rng.uniform(0.03, 0.06), factor=0.5, random_state=_seed(rng))
    return X, y, 2


def _blobs(rng: np.random.Generator, n: int, k: int, std) -> tuple[np.ndarray, np.ndarray]:
    # Centres drawn again until no two are closer than 5 (in units of the blobs' std 1),
    # so that the clusters are there to be counted.
    while True:
        centers = rng.uniform(-10 * np.sqrt(k), 10 * np.sqrt(k), (k, 2)) / 2
        gaps = np.linalg.norm(centers[:, None] - centers[None], axis=-1)
        if gaps[~np.eye(k, dtype=bool)].min() >= 5:
            break
    X, y = make_blobs(n, centers=centers, cluster_std=std, random_state=_seed(rng))
    return X, y


def anisotropic(rng: np.random.Generator, n: int):
    k = int(rng.integers(2, 11))
    X, y = _blobs(rng, n, k, 0.6)
    # A shear and stretch, as in scikit-learn's k-means assumptions example.
    return X @ np.array([[0.6, -0.64], [-0.41, 0.85]]) * 2, y, k


def varied(rng: np.random.Generator, n: int):
    k = int(rng.integers(2, 11))
    std = rng.uniform(0.5, 2.5, k)
    # Wider spacing for wider clusters: the centres' gap is scaled by the largest std.
    X, y = _blobs(rng, n, k, std / std.max() * 1.0)
    return X * std.max(), y, k


def rings(rng: np.random.Generator, n: int):
    k = int(rng.integers(2, 7))
    while True:  # centres at least 3 radii apart: rings that do not touch
        centers = rng.uniform(-3 * np.sqrt(k), 3 * np.sqrt(k), (k, 2))
        gaps = np.linalg.norm(centers[:, None] - centers[None], axis=-1)
        if gaps[~np.eye(k, dtype=bool)].min() >= 3:
            break
    y = np.arange(n) % k
    angle = rng.uniform(0, 2 * np.pi, n)
    radius = 1 + 0.08 * rng.standard_normal(n)
    X = centers[y] + radius[:, None] * np.c_[np.cos(angle), np.sin(angle)]
    return X, y, k


def spirals(rng: np.random.Generator, n: int):
    k = int(rng.integers(2, 5))
    y = np.arange(n) % k
    t = np.sqrt(rng.uniform(0.05, 1, n)) * 2.5 * np.pi  # even density along each arm
    phase = 2 * np.pi * y / k
    X = t[:, None] * np.c_[np.cos(t + phase), np.sin(t + phase)]
    return X + 0.25 * rng.standard_normal((n, 2)), y, k


def shells(rng: np.random.Generator, n: int):
    k = int(rng.integers(2, 5))
    d = int(rng.integers(2, 4))
    y = np.arange(n) % k
    direction = rng.standard_normal((n, d))
    direction /= np.linalg.norm(direction, axis=1, keepdims=True)
    radius = (1 + y) + 0.08 * rng.standard_normal(n)
    return radius[:, None] * direction, y, k


FAMILIES: dict[str, Generator] = {
    "moons": moons,
    "circles": circles,
    "anisotropic": anisotropic,
    "varied": varied,
    "rings": rings,
    "spirals": spirals,
    "shells": shells,
}


def shape_task(rng: np.random.Generator, index: int, n: int):
    """Task ``index``: (family, X, labels, number of clusters)."""
    family = list(FAMILIES)[index % len(FAMILIES)]
    X, y, k = FAMILIES[family](rng, n)
    return family, np.asarray(X, dtype=float), np.asarray(y), k
