"""Tasks whose clusters are not Gaussian: what a count of clusters is trained on.

A Gaussian mixture needs several components for one curved or ring-shaped cluster, so a
posterior trained on mixtures counts components, not clusters. Here each of K clusters is
a shape drawn at random: an arc, an annulus, a uniform disc or box, a skewed blob, an
elongated Gaussian or a round one; now and then a task is a set of nested rings (or
shells) or of interleaved spiral arms. Clusters are placed apart by a random multiple of
their extents, so that a person would count K, and each holds enough of the rows that a
reading of the context sees it; a share of the tasks of separate shapes can then be
sheared alike, by one linear map of their plane. The plane of the shapes is rotated into
``d`` dimensions with a little noise in the others.

:func:`sample_shapes` returns the rows and K; the caller standardizes them as a fit would.
"""

from __future__ import annotations

import numpy as np

# The share of tasks (of 2 to 4 clusters) of one structure whose clusters wrap around or
# hook into each other: nested rings or shells, interleaved arcs, spiral arms. The rest are
# K separate shapes.
NESTED_PROB = 0.2
INTERLEAVED_PROB = 0.15
SPIRAL_PROB = 0.1
# A shear's smaller stretch against its larger (``sample_shapes``'s ``sheared``):
# log-uniform in this range.
SHEAR_RATIO = (0.1, 1.0)
_SHAPES = ("arc", "annulus", "disc", "box", "skewed", "elongated", "round")


def _unit_circle(rng: np.random.Generator, n: int, low: float = 0.0, high: float = 2 * np.pi):
    angle = rng.uniform(low, high, n)
    return np.c_[np.cos(angle), np.sin(angle)]


def _rotation(rng: np.random.Generator, d: int) -> np.ndarray:
    q, r = np.linalg.qr(rng.standard_normal((d, d)))
    return q * np.sign(np.diag(r))


def _shape(rng: np.random.Generator, kind: str, n: int) -> np.ndarray:
    """``n`` points (n, 2) of one cluster of extent about 1, centred near the origin."""
    if kind == "arc":  # part of a circle, of 60 to 270 degrees, thin to thick
        span = rng.uniform(np.pi / 3, 1.5 * np.pi)
        points = _unit_circle(rng, n, 0.0, span)
        points = points + rng.uniform(0.03, 0.12) * rng.standard_normal((n, 2))
        points = points - points.mean(0)
    elif kind == "annulus":
        radius = 1 + rng.uniform(0.03, 0.15) * rng.standard_normal(n)
        points = radius[:, None] * _unit_circle(rng, n)
    elif kind == "disc":
        points = np.sqrt(rng.uniform(0, 1, n))[:, None] * _unit_circle(rng, n)
    elif kind == "box":
        points = rng.uniform(-1, 1, (n, 2)) * [1.0, rng.uniform(0.2, 1.0)]
    elif kind == "skewed":  # log-normal along each axis: a long tail on one side
        points = np.exp(rng.uniform(0.3, 0.8) * rng.standard_normal((n, 2)))
        points = (points - np.median(points, 0)) / 2
    elif kind == "elongated":
        points = rng.standard_normal((n, 2)) * [0.5, 0.5 * rng.uniform(0.08, 0.4)]
    else:  # round
        points = 0.4 * rng.standard_normal((n, 2))
    return points @ _rotation(rng, 2)


def _counts(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    """Rows of each of k clusters (k,): at least a quarter of an even share, and 8."""
    floor = max(8, n // (4 * k))
    free = n - floor * k
    shares = rng.dirichlet(np.full(k, 2.0))
    counts = floor + np.floor(shares * free).astype(int)
    counts[0] += n - counts.sum()
    return counts


def _separate(rng: np.random.Generator, k: int, sizes: np.ndarray) -> np.ndarray:
    """Centres (k, 2) no two closer than a random 1.1 to 1.8 times the sum of their sizes."""
    factor = rng.uniform(1.1, 1.8)
    box = 2.5 * np.sqrt(k) * sizes.mean() * factor
    while True:
        centers = rng.uniform(-box, box, (k, 2))
        gaps = np.linalg.norm(centers[:, None] - centers[None], axis=-1)
        needed = factor * (sizes[:, None] + sizes[None])
        np.fill_diagonal(gaps, np.inf)
        if (gaps >= needed).all():
            return centers
        box *= 1.05


def _separate_shapes(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    counts = _counts(rng, n, k)
    sizes = np.exp(rng.uniform(np.log(0.5), np.log(2.0), k))
    centers = _separate(rng, k, sizes)
    kinds = rng.choice(len(_SHAPES), k)
    parts = [
        centers[j] + sizes[j] * _shape(rng, _SHAPES[kinds[j]], counts[j]) for j in range(k)
    ]
    return np.concatenate(parts)


def _sheared(rng: np.random.Generator, X: np.ndarray) -> np.ndarray:
    """``X`` (n, 2) under one random linear map: a rotation, the axes stretched by 1 and
    by ``SHEAR_RATIO``'s draw, another rotation."""
    ratio = np.exp(rng.uniform(*np.log(SHEAR_RATIO)))
    return X @ _rotation(rng, 2) @ np.diag([1.0, ratio]) @ _rotation(rng, 2)


def _nested(rng: np.random.Generator, n: int, k: int, d: int) -> np.ndarray:
    """k concentric rings (shells where d > 2), the innermost sometimes a filled blob."""
    counts = _counts(rng, n, k)
    dims = 3 if d >= 3 and rng.uniform() < 0.5 else 2
    parts = []
    for j in range(k):
        direction = rng.standard_normal((counts[j], dims))
        direction /= np.linalg.norm(direction, axis=1, keepdims=True)
        radius = (1 + j) + rng.uniform(0.04, 0.12) * rng.standard_normal(counts[j])
        if j == 0 and rng.uniform() < 0.3:
            radius = 0.5 * rng.uniform(0, 1, counts[j]) ** (1 / dims)
        parts.append(radius[:, None] * direction)
    return np.concatenate(parts)


def _interleaved(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    """k half-circles in a chain, each hooked into the next, as two moons are."""
    counts = _counts(rng, n, k)
    noise = rng.uniform(0.04, 0.15)
    gap = rng.uniform(-0.1, 0.3)  # how far each arc's tips reach past the next one's
    parts = []
    for j in range(k):
        flip = 1 if j % 2 == 0 else -1
        arc = _unit_circle(rng, counts[j], 0.0, np.pi) * [1, flip]
        arc = arc + [j * 1.0, 0.0 if j % 2 == 0 else 0.5 - gap]
        parts.append(arc + noise * rng.standard_normal((counts[j], 2)))
    return np.concatenate(parts) @ _rotation(rng, 2)


def _spirals(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    counts = _counts(rng, n, k)
    turns = rng.uniform(1.5, 2.5) * np.pi
    parts = []
    for j in range(k):
        t = np.sqrt(rng.uniform(0.05, 1, counts[j])) * turns
        phase = 2 * np.pi * j / k
        arm = t[:, None] * np.c_[np.cos(t + phase), np.sin(t + phase)]
        parts.append(arm + rng.uniform(0.1, 0.3) * rng.standard_normal((counts[j], 2)))
    return np.concatenate(parts)


def sample_shapes(
    rng: np.random.Generator, k: int, d: int, n: int, sheared: float = 0.0
) -> np.ndarray:
    """``n`` rows (n, d) of ``k`` clusters that are shapes (see the module), in random order;
    a share ``sheared`` of the tasks of separate shapes sheared by one linear map of their
    plane (features correlated across the data, as in scikit-learn's anisotropic
    example): every cluster is stretched alike, and so are the gaps between them, which
    keep their size against the clusters' own extent in each direction, so a person still
    counts ``k``. With ``sheared=0`` no draw is spent on it (the bundled head's tasks)."""
    u = rng.uniform()
    if 2 <= k <= 4 and u < NESTED_PROB:
        X = _nested(rng, n, k, d)
    elif 2 <= k <= 4 and u < NESTED_PROB + INTERLEAVED_PROB:
        X = _interleaved(rng, n, k)
    elif 2 <= k <= 4 and u < NESTED_PROB + INTERLEAVED_PROB + SPIRAL_PROB:
        X = _spirals(rng, n, k)
    else:
        X = _separate_shapes(rng, n, k)
        if sheared > 0 and rng.uniform() < sheared:
            X = _sheared(rng, X)
    if d > X.shape[1]:  # the shapes' plane (or space) rotated into d dimensions
        scale = X.std()
        noise = rng.uniform(0.0, 0.05) * scale * rng.standard_normal((n, d - X.shape[1]))
        X = np.concatenate([X, noise], axis=1) @ _rotation(rng, d)
    elif d < X.shape[1]:
        X = X[:, :d]
    return X[rng.permutation(n)]
