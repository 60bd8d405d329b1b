"""Train the head that reads P(K | X) onto a trained checkpoint, its backbone frozen.

The backbone and every per-K head stay as they are, so every fit with a given K is
unchanged; only the "K unknown" task embedding and the K-posterior head learn. Tasks draw
K uniformly from 1..k_max and are projected exactly as a fit with ``n_components="auto"``
projects them (the directions the K = k_max head reads). The loss is the cross-entropy of
the true K: its minimiser is the posterior of K under the training prior.

``--head clusters`` trains the cluster-count head instead (``cluster_count_seeds``), on
the same "K unknown" tokens, everything else frozen, from the K-posterior head's weights:
its tasks are, in the share ``shapes`` of ``--prior-weights``, clusters of any shape
(:mod:`transformer_gmm.training.shapes`), and the target their number of clusters::

    python -m transformer_gmm.training.k_posterior --head clusters --out runs/clusters \
        --minutes 35 --lr 5e-4 --warmup 50 --save-every 50 --seed 3 \
        --prior-weights shapes=0.5,unit=0.175,broad=0.1,real=0.1,separated=0.075,wide=0.05

The learning rate follows a cosine over ``--minutes`` of training time (counted across
resumes), so a run of any length ends annealed. Step ``s`` draws its batch from the seed
``(--seed, s)`` alone, so ``--workers`` processes can draw ahead and a resumed run draws
what it would have drawn. Run it in the background; it saves its state every
``--save-every`` steps and resumes::

    python -m transformer_gmm.training.k_posterior --out runs/k_posterior --minutes 90
    python -m transformer_gmm.training.k_posterior --out runs/k_posterior --minutes 90 --resume
    python -m transformer_gmm.training.k_posterior --out runs/k_gpu --minutes 5 \
        --device cuda --workers 8 --batch-size 256

It writes the checkpoint (the source's weights plus the new head) to ``OUT/checkpoint``.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import time
from pathlib import Path

import numpy as np
import torch

from ..engine.standardize import fit_standardization
from ..nn import ModelConfig, ReadingConfig
from ..nn.model import K_POSTERIOR_WEIGHTS, MixtureTransformer
from ..storage import load_checkpoint, save_checkpoint
from .prefetch import step_batches
from .shapes import sample_shapes
from .tasks import PRIORS, Prior, draw_d, sample_task
from .weights import without_k_posterior

# What the head is trained on: the package's own priors with K from 1 (one Gaussian) to
# k_max, unit-noise tasks with means in boxes from crowded to far apart, ("wide") boxes so
# wide that most clusters stand apart, and ("separated") means at least six noise standard
# deviations apart, where a count must be exact.
K_PRIORS: dict[str, tuple[float, Prior]] = {
    "unit": (0.5, Prior(d_range=(1, 16), n_range=(64, 512), half_width=(1.5, 10.0))),
    "wide": (0.0, Prior(d_range=(1, 16), n_range=(64, 512), half_width=(8.0, 16.0))),
    "separated": (
        0.0,
        Prior(d_range=(2, 16), n_range=(64, 512), half_width=(6.0, 12.0), min_separation=6.0),
    ),
    "broad": (0.3, dataclasses.replace(PRIORS["broad"], n_range=(64, 512))),
    "real": (0.2, dataclasses.replace(PRIORS["real"], n_range=(64, 512))),
}
# Clusters of any shape (training.shapes), for the cluster-count head: their dimensions
# (mostly the plane of the shapes, sometimes rotated into more), and n from 64 to 512.
SHAPES = "shapes"
SHAPE_DIMENSIONS = (2, 2, 2, 2, 3, 3, 4, 5, 6, 8)


def k_unknown_inputs(x: torch.Tensor, config: ModelConfig, reading: ReadingConfig) -> torch.Tensor:
    """Points (1, n, d) float64 in the space the "K unknown" pass reads: (1, n, d_max)."""
    st = fit_standardization(x, None, config.d_max, config.k_max, reading.noise_directions)
    return st.transform(x)


def sample_k_batch(
    rng: np.random.Generator,
    config: ModelConfig,
    reading: ReadingConfig,
    batch_size: int,
    prior_weights: dict[str, float] | None = None,
    sheared: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(x, mask, k)``: B tasks of K uniform in 1..k_max, each subsampled to the context
    the model (``config``, ``reading``) reads; each task's prior drawn by ``prior_weights``
    (by default those of ``K_PRIORS``); ``sheared``, the share of separate shapes sheared
    alike (:func:`~transformer_gmm.training.shapes.sample_shapes`)."""
    weights = prior_weights or {name: weight for name, (weight, _) in K_PRIORS.items()}
    names = list(weights)
    probs = np.array([weights[name] for name in names])
    xs, ks = [], []
    for _ in range(batch_size):
        name = names[rng.choice(len(names), p=probs / probs.sum())]
        K = int(rng.integers(1, config.k_max + 1))
        if name == SHAPES:  # at least 16 rows a cluster, for a reading to see each
            n = max(int(rng.integers(64, 513)), 16 * K)
            X = sample_shapes(rng, K, int(rng.choice(SHAPE_DIMENSIONS)), n, sheared)
        else:
            prior = K_PRIORS[name][1]
            n = max(int(rng.integers(prior.n_range[0], prior.n_range[1] + 1)), K)
            d = draw_d(rng, prior.d_range)
            X = sample_task(rng, prior, K, d, n, config.d_max).X
        if len(X) > reading.context_size:  # a fit reads a uniform draw of the rows
            X = X[np.sort(rng.choice(len(X), reading.context_size, replace=False))]
        X = torch.from_numpy(np.ascontiguousarray(X))[None]
        xs.append(k_unknown_inputs(X, config, reading)[0])
        ks.append(K)
    N = max(len(x) for x in xs)
    x = torch.zeros(batch_size, N, config.d_max)
    mask = torch.zeros(batch_size, N, dtype=torch.bool)
    for i, xi in enumerate(xs):
        x[i, : len(xi)] = xi
        mask[i, : len(xi)] = True
    return x, mask, torch.tensor(ks) - 1


def k_batch_of_step(
    step: int,
    config: ModelConfig,
    reading: ReadingConfig,
    batch_size: int,
    seed: int,
    prior_weights: dict[str, float] | None = None,
    sheared: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Step ``step``'s batch: :func:`sample_k_batch` from the seed ``(seed, step)`` alone."""
    rng = np.random.default_rng([seed, step])
    return sample_k_batch(rng, config, reading, batch_size, prior_weights, sheared)


def with_k_posterior_head(
    source: MixtureTransformer, seeds: int, new_head: bool = False
) -> MixtureTransformer:
    """A copy of ``source`` with a K-posterior head of ``seeds`` pooling seeds: the source's
    own where it has one of that many seeds and ``new_head`` is False (training goes on
    from it), else a new one. Either way "K unknown" starts as the mean of the K
    embeddings."""
    config = dataclasses.replace(source.config, k_posterior_seeds=seeds)
    model = MixtureTransformer(config, source.reading_config)
    state = source.state_dict()
    if new_head or source.config.k_posterior_seeds != seeds:
        state = without_k_posterior(state)
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all(n.startswith(K_POSTERIOR_WEIGHTS) for n in missing)
    with torch.no_grad():
        model.k_unknown.copy_(source.k_embedding.weight.mean(dim=0))
    return model


def with_cluster_count_head(source: MixtureTransformer) -> MixtureTransformer:
    """``source`` (which reads P(K | X)) with a cluster-count head: ``source`` itself where
    it has one (training goes on from it), else a copy whose new head starts as its
    K-posterior head, the count of Gaussian components being where a count of clusters
    starts."""
    if not source.has_k_posterior:
        raise ValueError("The cluster-count head reads the K-posterior head's tokens: the "
                         "source checkpoint has none (train it first, --head components).")
    if source.has_cluster_count:
        return source
    seeds = source.config.k_posterior_seeds
    config = dataclasses.replace(source.config, cluster_count_seeds=seeds)
    model = MixtureTransformer(config, source.reading_config)
    missing, unexpected = model.load_state_dict(source.state_dict(), strict=False)
    assert not unexpected and all(n.startswith("cluster_count_head") for n in missing)
    model.cluster_count_head.load_state_dict(source.k_posterior_head.state_dict())
    return model


def trainable(
    model: MixtureTransformer, k_unknown: bool = True, head: str = "k_posterior_head"
) -> list[torch.nn.Parameter]:
    """Freeze everything but ``head`` and (``k_unknown``) the "K unknown" embedding."""
    names = ("k_unknown", head) if k_unknown else (head,)
    for name, p in model.named_parameters():
        p.requires_grad_(name.startswith(names))
    return [p for p in model.parameters() if p.requires_grad]


def k_log_posterior(
    model: MixtureTransformer, x, mask, k_unknown: bool, head: str = "k_posterior_head"
) -> torch.Tensor:
    """``head``'s log-probabilities (B, k_max); without ``k_unknown`` training, the frozen
    backbone runs without autograd (a CPU step in about two thirds of the time)."""
    if k_unknown:
        tokens, mask = model.k_unknown_tokens(x, mask)
    else:
        with torch.no_grad():
            tokens, mask = model.k_unknown_tokens(x, mask)
    return getattr(model, head)(tokens, mask)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default="default", help="checkpoint to add the head to")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--head",
        choices=["components", "clusters"],
        default="components",
        help="the head trained: P(K | X) of Gaussian components, or the number of clusters "
        "of any shape (needs a source that reads P(K | X); trains the head alone)",
    )
    parser.add_argument(
        "--seeds", type=int, default=4,
        help="pooling seeds of the K-posterior head (a cluster-count head takes its shape)",
    )
    parser.add_argument(
        "--new-head",
        action="store_true",
        help="start the head from new weights, not from the source's (where it has one)",
    )
    parser.add_argument(
        "--freeze-k-unknown",
        action="store_true",
        help="train the head alone, the \"K unknown\" embedding as it starts; the backbone "
        "then runs without autograd",
    )
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=10**9, help="stop after this many")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--minutes", type=float, default=60.0, help="training time, all runs")
    parser.add_argument("--warmup", type=int, default=100, help="steps of linear warm-up")
    parser.add_argument("--save-every", type=int, default=25)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--prior-weights",
        default=None,
        help="the share of each prior of K_PRIORS, e.g. unit=0.4,broad=0.2,real=0.4",
    )
    parser.add_argument(
        "--sheared-shapes", type=float, default=0.0,
        help="the share of the shapes prior's separate shapes sheared alike by one linear map",
    )
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    parser.add_argument("--workers", type=int, default=0, help="processes drawing batches")
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args(argv)
    if not 0.0 <= args.sheared_shapes <= 1.0:
        parser.error(f"--sheared-shapes is a share in [0, 1], got {args.sheared_shapes}")

    args.out.mkdir(parents=True, exist_ok=True)
    prior_weights = None
    if args.prior_weights:
        pairs = (item.split("=") for item in args.prior_weights.split(","))
        prior_weights = {name: float(weight) for name, weight in pairs}
        unknown = set(prior_weights) - set(K_PRIORS) - {SHAPES}
        if unknown:
            parser.error(
                f"unknown priors {sorted(unknown)}; the priors are {[*K_PRIORS, SHAPES]}"
            )
    state_path = args.out / "state.pt"
    if args.head == "clusters":
        head, k_unknown = "cluster_count_head", False
        model = with_cluster_count_head(load_checkpoint(args.source))
    else:
        head, k_unknown = "k_posterior_head", not args.freeze_k_unknown
        model = with_k_posterior_head(load_checkpoint(args.source), args.seeds, args.new_head)
    model.to(args.device)
    params = trainable(model, k_unknown=k_unknown, head=head)
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.01)
    step, elapsed = 0, 0.0
    if args.resume and state_path.exists():
        state = torch.load(state_path, map_location=args.device, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step, elapsed = state["step"], state["elapsed"]
    draw = functools.partial(
        k_batch_of_step,
        config=model.config,
        reading=model.reading_config,
        batch_size=args.batch_size,
        seed=args.seed,
        prior_weights=prior_weights,
        sheared=args.sheared_shapes,
    )
    draws = step_batches(draw, step, args.steps, args.workers)
    model.train()
    start, losses, hits = time.time() - elapsed, [], []
    log = (args.out / "log.txt").open("a")

    def save() -> None:
        tmp = state_path.with_suffix(".tmp")
        torch.save(
            {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "step": step,
                "elapsed": time.time() - start,
                "args": json.dumps(vars(args), default=str),
            },
            tmp,
        )
        tmp.replace(state_path)
        save_checkpoint(model.eval(), args.out / "checkpoint")
        model.train()

    while step < args.steps and time.time() - start < 60 * args.minutes:
        progress = (time.time() - start) / (60 * args.minutes)
        lr = args.lr * min(1.0, (step + 1) / args.warmup) * 0.5 * (1 + math.cos(math.pi * progress))
        for group in optimizer.param_groups:
            group["lr"] = lr
        x, mask, k = (t.to(args.device) for t in next(draws))
        log_p = k_log_posterior(model, x, mask, k_unknown, head)  # (B, k_max)
        loss = torch.nn.functional.nll_loss(log_p, k)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        step += 1
        losses.append(loss.item())
        hits.append((log_p.argmax(-1) == k).float().mean().item())
        if step % args.save_every == 0:
            save()
            line = (
                f"step {step} loss {np.mean(losses):.4f} exact {np.mean(hits):.3f} "
                f"lr {lr:.2e} {time.time() - start:.0f}s"
            )
            print(line, flush=True)
            log.write(line + "\n")
            log.flush()
            losses, hits = [], []
    save()


if __name__ == "__main__":
    main()
