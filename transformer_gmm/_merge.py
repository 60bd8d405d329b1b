"""Merging a mixture's components into clusters: the entropy criterion of Baudry, Raftery,
Celeux, Lo & Gottardo (2010), "Combining mixture components for clustering", JCGS 19(2).

A Gaussian mixture describes one curved or elongated cluster with several components,
whose soft assignments overlap: points between two such components are split between
them. Merging the pair whose merge lowers the entropy of the soft assignment most, again
and again, gives a hierarchy of K, K - 1, ..., 1 clusters. Merging two components that
describe one cluster removes much entropy; merging two clusters that stand apart removes
almost none. The number of clusters is read where that drop stops being large.

The rule (``choose_n_clusters``): a merge is taken while its entropy drop per point of the
pair it merges (nats; at most log 2 = 0.69, reached when every point of the pair is split
50/50 between them) is at least ``threshold``. The first merge below it stops the
hierarchy. This is the "normalized entropy difference" of Baudry et al. (their Section
4.2, the drop divided by the number of observations merged), with a fixed threshold
instead of reading the elbow from a plot. Clusters that stand apart share no points and
are never merged; Gaussian clusters that overlap are, as pieces of one curved cluster
are: measured, no threshold told the two apart (docs/choosing_k.md).

Cut at a given number of clusters (``merge_mixture(..., n_clusters)``), the merges follow
the rows' connectivity first (``merge_connected``): two components touch where a row of
one has a row of the other among its nearest neighbours, no farther than ``TOUCHING``
times the data's typical spacing (the median distance of a row to its nearest other row).
Touching pairs merge first, the one whose merge lowers the entropy most per point first;
then the pair whose rows come closest (single linkage), then, for pairs no neighbour
links, the entropy's order. Pieces of one thin ring or of two moons barely share points,
so the entropy alone ranks their merges below those of separate clusters that overlap a
little; their rows touch (docs/choosing_k.md).

Where the rows themselves fall into that many groups that stand apart
(``separated_partition``), the groups are the clusters, row by row: a Gaussian component
can span two nested rings, and no merge of components splits it. The groups are those of
HDBSCAN's tree (Campello, Moulavi & Sander 2013) cut at the number of clusters: single
linkage under the mutual reachability distance, where a split that leaves fewer than
``min_size`` rows on one side sheds those rows rather than founding a cluster. They are
used only where no row's near neighbour (as above) lies in another group.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.cluster.hierarchy import leaves_list, linkage
from scipy.spatial.distance import pdist, squareform
from sklearn.neighbors import NearestNeighbors

from .engine.row_order import canonical_order

# The drop per merged point, in nats, above which two components are one cluster: chosen
# among 0.05 to 0.3 on shapes, separated and Gaussian tasks (docs/choosing_k.md).
DEFAULT_THRESHOLD = 0.1
# Two components touch where their rows come within this many typical spacings (2 to 5
# labelled shapes alike, within 0.02 ARI, on draws apart from the benchmark's) ...
TOUCHING = 3.0
# ... among each row's nearest neighbours, found among at most this many rows (a subset
# fixed by the rows' values alone, so any row order gives the same merges).
NEIGHBOURS = 10
MAX_ROWS = 20_000
# The rows' own partition reads all pairwise distances of at most this many rows (the
# others take the group of their nearest among them), and founds no group of fewer rows
# than this fraction of them (nor fewer than NEIGHBOURS // 2).
PARTITION_ROWS = 2_000
MIN_GROUP = 0.02
# A count raised above the heads' needs groups this many times TOUCHING apart: it overrules
# both heads, and arcs of one curve (two moons) can stand just over TOUCHING apart (chosen
# on draws apart from the benchmark's, docs/choosing_k.md).
RAISE_APART = 2.0


@dataclass(frozen=True)
class Hierarchy:
    """The merges of a K-component mixture, from K clusters down to one."""

    entropy: np.ndarray  # (K,) the entropy of the soft assignment with K, K-1, ..., 1 clusters
    pairs: list[tuple[int, int]]  # (K - 1,) the clusters merged at each step, by their index
    drops: np.ndarray  # (K - 1,) the entropy removed by each merge
    mass: np.ndarray  # (K - 1,) the (weighted) number of points of the pair merged
    groups: list[list[list[int]]]  # groups[j]: the components of each cluster after j merges


def _xlogx(p: np.ndarray) -> np.ndarray:
    # 0 log 0 = 0: a point with no responsibility for a component adds no entropy.
    return np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0)


def entropy(resp: np.ndarray, sample_weight: np.ndarray | None = None) -> float:
    """The entropy of a soft assignment, ``-sum_i w_i sum_k t_ik log t_ik``."""
    per_point = -_xlogx(np.asarray(resp, dtype=float)).sum(axis=1)
    return float(per_point.sum() if sample_weight is None else per_point @ sample_weight)


def _pair_drops(t: np.ndarray, w: np.ndarray) -> np.ndarray:
    """(k, k) the entropy that merging each pair of the columns of ``t`` (n, k) removes,
    for a < b (-inf elsewhere); >= 0, since x log x is superadditive."""
    k = t.shape[1]
    own = w @ _xlogx(t)  # (k,)
    drops = np.full((k, k), -np.inf)
    for a in range(k - 1):
        joined = w @ _xlogx(t[:, a : a + 1] + t[:, a + 1 :])  # (k - a - 1,)
        drops[a, a + 1 :] = joined - own[a] - own[a + 1 :]
    return drops


def _merge_pair(t: np.ndarray, groups: list[list[int]], a: int, b: int) -> np.ndarray:
    """Column ``b`` of ``t`` merged into column ``a`` (a < b), and group ``b`` into group
    ``a`` of ``groups`` (in place); returns the merged columns."""
    t[:, a] += t[:, b]
    groups[a] = groups[a] + groups[b]
    del groups[b]
    return np.delete(t, b, axis=1)


def merge_hierarchy(resp: np.ndarray, sample_weight: np.ndarray | None = None) -> Hierarchy:
    """Merge the columns of ``resp`` (n, K), two at a time, each time the pair whose merge
    lowers the entropy most. Ties go to the pair of lowest indices, so the result is
    deterministic."""
    t = np.array(resp, dtype=float, copy=True)
    if t.ndim != 2 or t.shape[1] < 1:
        raise ValueError(f"resp must be a 2-D array of responsibilities, got shape {t.shape}.")
    w = np.ones(len(t)) if sample_weight is None else np.asarray(sample_weight, dtype=float)
    groups = [[k] for k in range(t.shape[1])]
    history = [[list(g) for g in groups]]
    entropies = [entropy(t, w)]
    pairs, steps, masses = [], [], []
    while t.shape[1] > 1:
        drops = _pair_drops(t, w)
        # The first of the largest in row-major order: the pair of lowest indices on ties.
        a, b = np.unravel_index(int(np.argmax(drops)), drops.shape)
        a, b, best_drop = int(a), int(b), float(drops[a, b])
        masses.append(float(w @ (t[:, a] + t[:, b])))
        t = _merge_pair(t, groups, a, b)
        pairs.append((a, b))
        steps.append(max(best_drop, 0.0))
        entropies.append(entropy(t, w))
        history.append([list(g) for g in groups])
    return Hierarchy(np.array(entropies), pairs, np.array(steps), np.array(masses), history)


def choose_n_clusters(hierarchy: Hierarchy, threshold: float = DEFAULT_THRESHOLD) -> int:
    """The number of clusters: merges are taken while each removes at least ``threshold``
    nats per point of the pair it merges."""
    n_components = len(hierarchy.entropy)
    per_point = hierarchy.drops / np.maximum(hierarchy.mass, np.finfo(float).tiny)
    taken = 0
    while taken < len(per_point) and per_point[taken] >= threshold:
        taken += 1
    return n_components - taken


def component_to_cluster(hierarchy: Hierarchy, n_clusters: int) -> np.ndarray:
    """(K,) the cluster of each component when the hierarchy is cut at ``n_clusters``;
    clusters are numbered by their smallest component."""
    n_components = len(hierarchy.entropy)
    if not 1 <= n_clusters <= n_components:
        raise ValueError(
            f"n_clusters must be between 1 and the mixture's {n_components} components, "
            f"got {n_clusters}."
        )
    mapping = np.empty(n_components, dtype=np.int64)
    groups = sorted(hierarchy.groups[n_components - n_clusters], key=min)
    for cluster, members in enumerate(groups):
        mapping[members] = cluster
    return mapping


@dataclass(frozen=True)
class _Links:
    """Each row's nearest neighbours (itself first, as NearestNeighbors lists them), their
    distances, and the rows' typical spacing (the median distance to the nearest other)."""

    neighbours: np.ndarray  # (m, k + 1)
    distances: np.ndarray  # (m, k + 1)
    spacing: float

    def gaps(self, labels: np.ndarray, n_groups: int) -> np.ndarray:
        """(G, G) the shortest link between rows of two groups (inf where none links them)."""
        gaps = np.full((n_groups, n_groups), np.inf)
        a = np.broadcast_to(labels[:, None], self.neighbours.shape)
        np.minimum.at(gaps, (a.ravel(), labels[self.neighbours].ravel()), self.distances.ravel())
        gaps = np.minimum(gaps, gaps.T)
        np.fill_diagonal(gaps, np.inf)
        return gaps


def _links(X: np.ndarray) -> _Links:
    """The nearest-neighbour links of the rows of ``X`` (at least two)."""
    n_neighbours = min(NEIGHBOURS + 1, len(X))
    distances, neighbours = NearestNeighbors(n_neighbors=n_neighbours).fit(X).kneighbors(X)
    return _Links(neighbours, distances, float(np.median(distances[:, 1])))


def _links_from_distances(distances: np.ndarray) -> _Links:
    """:func:`_links` from the rows' pairwise distances (m, m), already at hand."""
    n_neighbours = min(NEIGHBOURS + 1, len(distances))
    part = np.argpartition(distances, n_neighbours - 1, axis=1)[:, :n_neighbours]
    near = np.take_along_axis(distances, part, axis=1)
    order = np.argsort(near, axis=1, kind="stable")  # nearest first, as kneighbors
    neighbours = np.take_along_axis(part, order, axis=1)
    near = np.take_along_axis(near, order, axis=1)
    return _Links(neighbours, near, float(np.median(near[:, 1])))


def _gaps(X: np.ndarray, labels: np.ndarray, n_components: int) -> tuple[np.ndarray, float]:
    """(K, K) the shortest distance between rows of two components along the rows'
    nearest-neighbour links (inf where none links them), and the rows' typical spacing."""
    if len(X) < 2:
        return np.full((n_components, n_components), np.inf), 0.0
    if len(X) > MAX_ROWS:
        keep = np.sort(canonical_order(X)[:MAX_ROWS])
        X, labels = X[keep], labels[keep]
    links = _links(X)
    return links.gaps(labels, n_components), links.spacing


def merge_connected(
    X: np.ndarray, resp: np.ndarray, n_clusters: int, sample_weight: np.ndarray | None = None
) -> np.ndarray:
    """(K,) the cluster of each column of ``resp`` (n, K) when the components are merged
    down to ``n_clusters``, touching ones first (see the module); clusters are numbered by
    their smallest component."""
    t = np.array(resp, dtype=float, copy=True)
    n_components = t.shape[1]
    if not 1 <= n_clusters <= n_components:
        raise ValueError(
            f"n_clusters must be between 1 and the mixture's {n_components} components, "
            f"got {n_clusters}."
        )
    w = np.ones(len(t)) if sample_weight is None else np.asarray(sample_weight, dtype=float)
    X = np.asarray(X, dtype=float)
    # Rows of no weight link nothing; nor do rows with gaps (NaN), whose distances are
    # not defined (they still count in the entropy).
    linking = (w > 0) & ~np.isnan(X).any(axis=1)
    gaps, spacing = _gaps(X[linking], t[linking].argmax(1), n_components)
    groups = [[k] for k in range(n_components)]
    while len(groups) > n_clusters:
        k = len(groups)
        drops = _pair_drops(t, w)
        best, pair = None, (0, 1)
        for a in range(k - 1):
            for b in range(a + 1, k):
                mass = float(w @ (t[:, a] + t[:, b]))
                drop = drops[a, b] / max(mass, np.finfo(float).tiny)
                gap = min(gaps[i, j] for i in groups[a] for j in groups[b])
                key = (max(gap, TOUCHING * spacing), -drop)  # ties: the lowest indices
                if best is None or key < best:
                    best, pair = key, (a, b)
        t = _merge_pair(t, groups, *pair)
    mapping = np.empty(n_components, dtype=np.int64)
    for cluster, members in enumerate(sorted(groups, key=min)):
        mapping[members] = cluster
    return mapping


def merge_mixture(mixture, X, sample_weight=None, n_clusters=None, threshold=DEFAULT_THRESHOLD):
    """(K,) the cluster of each of ``mixture``'s components, from its soft assignment of
    ``X``: merged down to ``n_clusters``, touching components first
    (:func:`merge_connected`), or, without it, by the entropy until
    :func:`choose_n_clusters` stops."""
    resp = np.asarray(mixture.predict_proba(X))
    if n_clusters is not None:
        return merge_connected(X, resp, int(n_clusters), sample_weight)
    hierarchy = merge_hierarchy(resp, sample_weight)
    return component_to_cluster(hierarchy, choose_n_clusters(hierarchy, threshold))



def separated_partition(
    X: np.ndarray, n_clusters: int, sample_weight: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray] | None:
    """Rows of ``X`` and the group of each, where the rows fall into ``n_clusters`` groups
    no near-neighbour link joins (see the module); None where they do not.

    Returns
    -------
    rows : ndarray of shape (m, n_features)
        At most ``PARTITION_ROWS`` rows of positive weight, chosen by their values alone.
    labels : ndarray of shape (m,)
        Their groups, 0 .. ``n_clusters`` - 1, numbered by their first row in ``rows``.
        Any other row belongs to the group of its nearest row in ``rows``.
    """
    rows = _partition_rows(X, sample_weight)
    if n_clusters < 2 or len(rows) < 2 * n_clusters:
        return None
    labels = _apart(_reachability_tree(rows), n_clusters)
    return None if labels is None else (rows, labels)


@dataclass(frozen=True)
class SeparatedCount:
    """A count of clusters the rows confirm or lower (:func:`separated_count`)."""

    n_clusters: int
    # The rows and their groups at that count where they stand apart (as
    # :func:`separated_partition` returns them), else None.
    partition: tuple[np.ndarray, np.ndarray] | None


def separated_count(
    X: np.ndarray,
    n_clusters: int,
    sample_weight: np.ndarray | None,
    is_one_cluster: Callable[[np.ndarray, int], bool],
    max_clusters: int | None = None,
) -> SeparatedCount | None:
    """``n_clusters``, or another count that the rows show. Smaller: the largest c <
    ``n_clusters`` for which they fall into c groups that stand apart (as
    :func:`separated_partition`'s), provided ``is_one_cluster(rows, c)`` holds for the rows
    of each. Else larger: the largest c, up to ``max_clusters``, for which they fall into
    c groups that stand ``RAISE_APART`` times further apart, all but at most one of them
    one cluster by ``is_one_cluster`` in its own principal axes. None where too few rows
    leave nothing to count.

    A count read off the whole data can overshoot clusters that stand apart (a small blob
    read as two); the groups of a smaller count, each one cluster, show it did. It can also
    fall short of elongated clusters that stand far apart (sheared blobs, read as fewer):
    c - 1 groups far apart that are one cluster each, and one more that holds at least
    one, are at least c clusters, though two of them touch inside the last group; a curve
    broken into pieces far apart leaves more than one piece that is not one cluster.
    Rows that stand apart in ``n_clusters`` groups keep it unless more groups stand far
    apart, and so do clusters that touch (no other partition) or groups of several
    touching clusters (the first smaller partition has a group that is not one cluster).
    """
    rows = _partition_rows(X, sample_weight)
    if len(rows) < 2 * max(n_clusters, 2):
        return None
    tree = _reachability_tree(rows)
    kept = _apart(tree, n_clusters) if n_clusters > 1 else None
    if kept is None:
        for count in range(n_clusters - 1, 1, -1):
            labels = _apart(tree, count)
            if labels is not None:
                if _each_one_cluster(rows, labels, count, is_one_cluster):
                    return SeparatedCount(count, (rows, labels))
                break
    for count in range(min(max_clusters or n_clusters, len(rows) // 2), n_clusters, -1):
        labels = _apart(tree, count, RAISE_APART * TOUCHING)
        if labels is not None and _each_one_cluster(
            rows, labels, count, is_one_cluster, any_orientation=True, exceptions=1
        ):
            return SeparatedCount(count, (rows, labels))
    return SeparatedCount(n_clusters, None if kept is None else (rows, kept))


def _each_one_cluster(
    rows: np.ndarray,
    labels: np.ndarray,
    count: int,
    is_one_cluster: Callable[[np.ndarray, int], bool],
    any_orientation: bool = False,
    exceptions: int = 0,
) -> bool:
    """Whether ``is_one_cluster`` holds for the rows of each of the ``count`` groups but at
    most ``exceptions``, tested the largest first (the likeliest to be several) until more
    fail; with ``any_orientation``, each group read in its own principal axes."""
    by_size = np.argsort(-np.bincount(labels, minlength=count), kind="stable")
    groups = (rows[labels == g] for g in by_size)
    if any_orientation:
        groups = (_principal_axes(group) for group in groups)
    failed = 0
    for group in groups:
        failed += not is_one_cluster(group, count)
        if failed > exceptions:
            return False
    return True


def _principal_axes(rows: np.ndarray) -> np.ndarray:
    """``rows`` centred and turned onto their principal axes: one Gaussian of any
    orientation is then one of diagonal covariance."""
    centred = rows - rows.mean(axis=0)
    _, vectors = np.linalg.eigh(centred.T @ centred)
    return centred @ vectors


def _partition_rows(X: np.ndarray, sample_weight: np.ndarray | None) -> np.ndarray:
    """The rows a partition reads: at most ``PARTITION_ROWS`` of positive weight, chosen by
    their values alone (so any row order gives the same rows)."""
    X = np.asarray(X, dtype=float)
    if sample_weight is not None:
        X = X[np.asarray(sample_weight, dtype=float) > 0]
    return X[canonical_order(X)[:PARTITION_ROWS]]


@dataclass(frozen=True)
class _Tree:
    """The rows' pairwise distances (m, m), their single-linkage tree (m - 1, 4) under the
    mutual reachability distance, and their nearest-neighbour links: what every cut reads."""

    distances: np.ndarray
    linkage: np.ndarray
    links: _Links
    cuts: dict[int, frozenset[int]]  # the groups (tree nodes) of each count
    # The rows in the tree's leaf order (m,), where each node's rows are a run: it starts
    # at first[node] (2m - 1,) and holds the node's size.
    leaves: np.ndarray
    first: np.ndarray


def _reachability_tree(rows: np.ndarray) -> _Tree:
    """:class:`_Tree` of ``rows`` (core distance: to the NEIGHBOURS-th nearest)."""
    m = len(rows)
    distances = squareform(pdist(rows))  # (m, m)
    k = min(NEIGHBOURS, m - 1)
    core = np.partition(distances, k, axis=1)[:, k]  # (m,) the distance to the k-th nearest
    reach = np.maximum(distances, np.maximum(core[:, None], core[None, :]))
    tree = linkage(squareform(reach, checks=False), method="single")
    leaves = leaves_list(tree)
    first = np.empty(2 * m - 1, dtype=np.int64)
    first[leaves] = np.arange(m)
    for j, (a, b) in enumerate(tree[:, :2].astype(np.int64)):  # children before parents
        first[m + j] = min(first[a], first[b])
    return _Tree(
        distances, tree, _links_from_distances(distances), _tree_cuts(tree), leaves, first
    )


def _apart(tree: _Tree, n_clusters: int, spacings: float = TOUCHING) -> np.ndarray | None:
    """(m,) the tree's ``n_clusters`` groups of its rows where no near-neighbour link
    within ``spacings`` typical spacings joins two of them, else None."""
    labels = _tree_groups(tree, n_clusters)
    if labels is None:
        return None
    if np.any(tree.links.gaps(labels, n_clusters) <= spacings * tree.links.spacing):
        return None  # two groups touch: not clusters that stand apart
    return labels


def _tree_cuts(tree: np.ndarray) -> dict[int, frozenset[int]]:
    """The nodes of the tree (m - 1, 4) that are the groups of each count: split from the
    top where both sides keep ``min_size`` rows (a split with one large side sheds the
    small side's rows); the groups of count c are those met before the split to c + 1."""
    m = len(tree) + 1
    size = np.concatenate([np.ones(m), tree[:, 3]])  # rows under each node
    min_size = max(NEIGHBOURS // 2, int(MIN_GROUP * m))
    groups = {2 * m - 2}  # the root
    cuts = {}
    for j in range(m - 2, -1, -1):  # from the highest merge down
        node = m + j
        if node not in groups:
            continue
        large = [int(c) for c in tree[j, :2] if size[int(c)] >= min_size]
        if not large:
            continue  # both sides small: a group's own rows
        if len(large) == 2:
            cuts[len(groups)] = frozenset(groups)
        groups.remove(node)  # one large side: the small one's rows are shed
        groups.update(large)
    cuts[len(groups)] = frozenset(groups)
    return cuts


def _tree_groups(tree: _Tree, n_clusters: int) -> np.ndarray | None:
    """(m,) the ``n_clusters`` groups of the tree's rows (:func:`_tree_cuts`); None where
    the tree holds fewer such groups."""
    groups = tree.cuts.get(n_clusters)
    if groups is None:
        return None
    m, distances = len(tree.distances), tree.distances
    labels = np.full(m, -1, dtype=np.int64)
    for group, node in enumerate(sorted(groups)):
        size = 1 if node < m else int(tree.linkage[node - m, 3])
        labels[tree.leaves[tree.first[node] : tree.first[node] + size]] = group
    shed = labels < 0
    if shed.any():  # a shed row joins the group of its nearest row in a group
        nearest = distances[np.ix_(shed, ~shed)].argmin(axis=1)
        labels[shed] = labels[~shed][nearest]
    _, first = np.unique(labels, return_index=True)
    renumber = np.empty(n_clusters, dtype=np.int64)
    renumber[np.argsort(first)] = np.arange(n_clusters)
    return renumber[labels]
