"""How the clusterer's count of clusters reads the checkpoint's two heads, on draws apart
from ``choose_k.py``'s.

Each task is read as ``TransformerClusterer(n_clusters="auto", random_state=seed)`` reads
it (``engine.k_posterior.read_k_unknown``: one pass under the "K unknown" embedding); the
K-posterior head gives P(K | X), the cluster-count head P(C | X). The count chosen is the
most probable under each rule:

- ``components``: P(K | X) alone (what the clusterer read before the cluster-count head);
- ``clusters``: P(C | X) alone;
- ``clusters x components^t``: P(C | X) P(K | X)^t, for t = 0.25, 0.5 (the clusterer's
  rule, ``_choose_k.COMPONENT_COUNT_POWER``) and 1;
- ``min``: the smaller of the two most probable counts.

Tasks: ``choose_k.py``'s generators under other seeds (``--seed`` s draws its seed
``SEED_OFFSET + s``, 5 by default, where its tables use 0 and 1): the four Gaussian
settings pooled, the two separated ones, the shapes and the real datasets; and three
families of shapes that no training prior draws (``unseen``): parallel sine waves (2 to
4), hollow squares (2 to 6) and crosses (2 to 6).

    python benchmarks/cluster_count.py                  # seeds 5 and 6
    python benchmarks/cluster_count.py --quick          # a few tasks a setting

Prints the exact-count rate per setting and rule and writes
benchmarks/results/cluster_count.csv.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import choose_k as C  # noqa: E402
from common import single_threaded, standard_parser, write_csv  # noqa: E402

from transformer_gmm._fitting import draw_seed  # noqa: E402
from transformer_gmm.engine import model_cache  # noqa: E402
from transformer_gmm.engine.k_posterior import read_k_unknown  # noqa: E402

POWERS = (0.25, 0.5, 1.0)
SEED_OFFSET = 5  # choose_k.py's tables draw seeds 0 and 1


def waves(rng: np.random.Generator, n: int) -> tuple[np.ndarray, int]:
    k = int(rng.integers(2, 5))
    band = np.arange(n) % k
    x = rng.uniform(0, 4 * np.pi, n)
    X = np.c_[x, 1.2 * np.sin(x) + 3.0 * band] + 0.15 * rng.standard_normal((n, 2))
    return X, k


def _apart(rng: np.random.Generator, k: int) -> np.ndarray:
    """k centres (k, 2) at least 3.5 apart."""
    while True:
        centers = rng.uniform(-3 * np.sqrt(k), 3 * np.sqrt(k), (k, 2))
        gaps = np.linalg.norm(centers[:, None] - centers[None], axis=-1)
        if gaps[~np.eye(k, dtype=bool)].min() >= 3.5:
            return centers


def squares(rng: np.random.Generator, n: int) -> tuple[np.ndarray, int]:
    k = int(rng.integers(2, 7))
    centers = _apart(rng, k)
    t = rng.uniform(0, 4, n)
    side, f = np.floor(t).astype(int), t % 1
    corners = np.array([[0, 0], [1, 0], [1, 1], [0, 1], [0, 0]], dtype=float)
    edge = corners[side] + f[:, None] * (corners[side + 1] - corners[side])
    X = centers[np.arange(n) % k] + 2 * (edge - 0.5) + 0.05 * rng.standard_normal((n, 2))
    return X, k


def crosses(rng: np.random.Generator, n: int) -> tuple[np.ndarray, int]:
    k = int(rng.integers(2, 7))
    centers = _apart(rng, k)
    arm = rng.uniform(-1, 1, n)
    vertical = rng.integers(0, 2, n).astype(bool)
    points = np.where(vertical[:, None], np.c_[0 * arm, arm], np.c_[arm, 0 * arm])
    return centers[np.arange(n) % k] + points + 0.06 * rng.standard_normal((n, 2)), k


UNSEEN = (waves, squares, crosses)


def tasks(seed: int, n_tasks: int) -> list[tuple[str, np.ndarray, int, int]]:
    """(setting, X, true count, the estimator's random_state) for every task."""
    problems = (
        C.synthetic_problems(seed, n_tasks)
        + C.separated_problems(seed, n_tasks)
        + C.shape_problems(seed, 3 * n_tasks)
        + C.real_problems(seed, 1)
    )
    out = []
    for p in problems:
        setting = "gaussian (four pooled)" if C.is_pooled(p.setting) else p.setting
        out.append((setting, p.X, p.true_k, p.seed))
    rng = np.random.default_rng([seed, 7])
    for i in range(3 * n_tasks):
        family = UNSEEN[i % len(UNSEEN)]
        X, k = family(rng, C.N_SAMPLES)
        out.append((f"unseen: {family.__name__}", X, k, 1000 * seed + i))
    return out


def rules(p_k: np.ndarray, p_c: np.ndarray) -> dict[str, int]:
    """The count (1-based) each rule chooses from P(K | X) and P(C | X), (k_max,)."""
    chosen = {
        "components": int(p_k.argmax()) + 1,
        "clusters": int(p_c.argmax()) + 1,
    }
    for t in POWERS:  # as the clusterer computes its rule's posterior
        chosen[f"clusters x components^{t:g}"] = int(
            (p_c * p_k.astype(np.float64) ** t).argmax()
        ) + 1
    chosen["min"] = min(chosen["components"], chosen["clusters"])
    return chosen


def main(argv=None) -> list[dict]:
    parser = standard_parser(__doc__, "cluster_count", "8 tasks a setting, one seed")
    parser.add_argument("--seeds", type=int, default=2, help="seeds from --seed on (2)")
    args = parser.parse_args(argv)
    single_threaded()
    n_tasks = args.tasks or (8 if args.quick else 40)
    first = SEED_OFFSET + args.seed
    seeds = range(first, first + (1 if args.quick else args.seeds))
    backbone = model_cache.load_backbone(args.checkpoint)
    if not backbone.has_cluster_count:
        parser.error(f"checkpoint {args.checkpoint!r} has no cluster-count head")
    rows = []
    for seed in seeds:
        for setting, X, true_k, random_state in tasks(seed, n_tasks):
            draw = draw_seed(np.random.RandomState(random_state))
            p_k, _, p_c = read_k_unknown(backbone, [X], seed=draw, clusters=True)
            for rule, k in rules(p_k[0], p_c[0]).items():
                rows.append(dict(seed=seed, setting=setting, rule=rule, true_k=true_k, chosen=k,
                                 exact=k == true_k))
    table = summary(rows)
    write_csv(rows, Path(args.results) / f"{args.out}_tasks.csv")
    write_csv(table, Path(args.results) / f"{args.out}.csv")
    return table


def summary(rows: list[dict]) -> list[dict]:
    settings = list(dict.fromkeys(r["setting"] for r in rows))
    rule_names = list(dict.fromkeys(r["rule"] for r in rows))
    table = []
    print(f"{'setting':24s} " + " ".join(f"{r[:22]:>22s}" for r in rule_names))
    for setting in settings:
        line = {}
        for rule in rule_names:
            hits = [r["exact"] for r in rows if r["setting"] == setting and r["rule"] == rule]
            line[rule] = np.mean(hits)
            table.append(dict(setting=setting, rule=rule, n_tasks=len(hits),
                              exact=float(np.mean(hits))))
        n = len(hits)
        print(f"{setting + f' ({n})':24s} " + " ".join(f"{line[r]:22.2f}" for r in rule_names))
    return table


if __name__ == "__main__":
    main()
