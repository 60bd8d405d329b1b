"""Held-out evaluation (the model beside the oracle) and the model card a run writes."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import platform

import numpy as np
import torch
from torch import Tensor

from ..engine.readout import model_space_responsibilities, weights_and_means_from_responsibilities
from ..nn import MixtureOutput, MixtureTransformer, ModelConfig
from .config import EVAL_SEED, TrainConfig, k_range, reading_config
from .losses import matched_mean_error, mixture_nll, oracle_nll
from .task_batch import TaskBatch
from .tasks import PRIORS, Task, sample_batch


def eval_set(cfg: TrainConfig, mc: ModelConfig) -> list[TaskBatch]:
    """The fixed held-out tasks: ``eval_tasks`` per K."""
    low, high = k_range(cfg, mc)
    reading = reading_config(cfg)
    return [
        sample_batch(
            np.random.default_rng([EVAL_SEED, K]),
            PRIORS[cfg.prior],
            K,
            cfg.eval_tasks,
            mc.d_max,
            reading.context_size,
            reading.noise_directions,
        )
        for K in range(low, high + 1)
    ]


def autocast(device: str):
    """The autocast context for ``device``: bfloat16 on CUDA, none (float32) on CPU."""
    # bf16 on CUDA: fp32 range, so no loss scaling; CPU runs in fp32.
    if device.startswith("cuda"):
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


@torch.no_grad()
def evaluate(model: MixtureTransformer, batches: list[TaskBatch], device: str) -> list[dict]:
    """Per K: the mean error of the model's means (TGMM's metric, in the original space)
    and of the means the estimators read out (one M-step on the model's responsibilities),
    beside the oracle's (true-cluster means), and the mixture NLL beside the truth's.

    Parameters
    ----------
    model : MixtureTransformer
    batches : list of TaskBatch
        The held-out tasks, as :func:`eval_set` draws them.
    device : str

    Returns
    -------
    rows : list of dict
        Per K: ``K``, ``model`` (the regressed means), ``readout`` (the M-step readout),
        ``oracle``, ``nll`` and ``oracle_nll``.

    Examples
    --------
    >>> from transformer_gmm.training.config import PRESETS, TrainConfig, model_config
    >>> cfg = TrainConfig(**PRESETS["tiny"])
    >>> mc = model_config(cfg)
    >>> from transformer_gmm.nn import MixtureTransformer
    >>> from transformer_gmm.training.evaluation import eval_set, evaluate
    >>> rows = evaluate(MixtureTransformer(mc), eval_set(cfg, mc), "cpu")
    >>> [row["K"] for row in rows], sorted(rows[0])
    ([2, 3, 4], ['K', 'model', 'nll', 'oracle', 'oracle_nll', 'readout'])
    """
    model.eval()
    rows = []
    for batch in batches:
        b = batch.to(device)
        with autocast(device):
            out = model(b.x, b.n_components, b.mask, b.gaps_read_by(model.config))
        out = MixtureOutput(*(t.float() for t in out))
        means = out.means.cpu().numpy()  # (B, K, d_max)
        errors = [
            matched_mean_error(t.from_model_space(m), t.means)
            for t, m in zip(batch.tasks, means, strict=True)
        ]
        resp = model_space_responsibilities(b.x, b.dim_mask, out, b.mask).cpu()  # (B, N, K)
        readout = [
            matched_mean_error(readout_means(t, r[: len(t.X)], out.weights[i].cpu(), m), t.means)
            for i, (t, r, m) in enumerate(zip(batch.tasks, resp, means, strict=True))
        ]
        oracle = [matched_mean_error(t.oracle_means(), t.means) for t in batch.tasks]
        rows.append(
            dict(
                K=b.n_components,
                model=float(np.mean(errors)),
                readout=float(np.mean(readout)),
                oracle=float(np.mean(oracle)),
                nll=mixture_nll(out, b).item(),
                oracle_nll=oracle_nll(b).item(),
            )
        )
    model.train()
    return rows


def readout_means(
    task: Task, resp: Tensor, head_weights: Tensor, head_means: np.ndarray
) -> np.ndarray:
    """(K, d): the means the estimators read out of the responsibilities ``resp`` (N, K)
    of ``task``'s points, with the head's estimate for a component that gets none."""
    fallback_means = task.from_model_space(head_means)  # (K, d)
    _, readout = weights_and_means_from_responsibilities(
        torch.as_tensor(task.X, dtype=torch.float64)[None],
        resp.to(torch.float64)[None],
        None,
        fallback_weights=head_weights[None] / head_weights.sum(),
        fallback_means=torch.as_tensor(fallback_means, dtype=torch.float64)[None],
    )
    return readout[0].numpy()


def format_table(rows: list[dict]) -> str:
    """The rows of :func:`evaluate` as a Markdown table.

    Examples
    --------
    >>> from transformer_gmm.training.evaluation import format_table
    >>> row = dict(K=2, model=0.5, readout=0.375, oracle=0.25, nll=1.5, oracle_nll=1.25)
    >>> print(format_table([row]))
    | K | model | readout | oracle | NLL | oracle NLL |
    |---|---|---|---|---|---|
    | 2 | 0.500 | 0.375 | 0.250 | 1.500 | 1.250 |
    """
    lines = ["| K | model | readout | oracle | NLL | oracle NLL |", "|---|---|---|---|---|---|"]
    lines += [
        f"| {r['K']} | {r['model']:.3f} | {r.get('readout', float('nan')):.3f} | "
        f"{r['oracle']:.3f} | {r['nll']:.3f} | {r['oracle_nll']:.3f} |"
        for r in rows
    ]
    return "\n".join(lines)


def hardware(device: str, world_size: int) -> str:
    """What the run ran on, for the model card: the GPU name, or the CPU and its threads."""
    if device.startswith("cuda"):
        return f"{world_size} x {torch.cuda.get_device_name(device)}"
    cpu = platform.processor() or platform.machine()
    return f"{world_size} x CPU {cpu} ({os.cpu_count()} cores, {torch.get_num_threads()} threads)"


def model_card(
    cfg: TrainConfig,
    mc: ModelConfig,
    step: int,
    world_size: int,
    wall: float,
    hw: str,
    rows: list[dict] | None,
    eval_step: int,
) -> str:
    """The model card of a training run: its data, its evaluation and both configs."""
    low, high = k_range(cfg, mc)
    focus = ""
    if cfg.focus_prob > 0:
        names = " and ".join(f"`{name}`" for name in cfg.focus_priors)
        each = " each" if len(cfg.focus_priors) > 1 else ""
        focus = f" Prior {names} replaced it for {cfg.focus_prob:.0%} of the steps{each}."
    if cfg.m_step_weight > 0:
        focus += (
            f" The means one M-step reads out of the model's responsibilities added their "
            f"error with weight {cfg.m_step_weight:g}."
        )
    if cfg.m_step_nll_weight > 0:
        focus += (
            f" The data's negative log-likelihood under the full-covariance mixture that "
            f"{_em_steps_words(cfg.em_steps)} added with weight {cfg.m_step_nll_weight:g}."
        )
    if cfg.only_k:
        focus += (
            f" Only K = {cfg.only_k}'s head and task embedding trained, from "
            f"`{cfg.init_from}`; every other weight is that checkpoint's."
        )
    if cfg.train_k_from:
        focus += (
            f" Only the heads and task embeddings of K >= {cfg.train_k_from} trained, from "
            f"`{cfg.init_from}`; every other weight is that checkpoint's."
        )
    table = format_table(rows) if rows else "Not evaluated yet."
    return (
        "---\nlibrary_name: transformer_gmm\ntags: [gaussian-mixture, clustering]\n---\n\n"
        f"# transformer_gmm checkpoint (preset `{cfg.preset or 'custom'}`)\n\n"
        f"Trained on prior `{cfg.prior}` (K = {low}..{high}) with the "
        f"`{cfg.parameter_loss}` parameter loss.{focus}\n\n"
        "| preset | steps | tasks seen | hardware | wall time |\n|---|---|---|---|---|\n"
        f"| {cfg.preset or 'custom'} | {step} | {step * cfg.batch_size * world_size} | {hw} | "
        f"{wall / 60:.1f} min |\n\n"
        f"## Held-out evaluation at step {eval_step}\n\n{cfg.eval_tasks} fixed tasks per K. "
        "model / readout / oracle: sqrt of the summed squared distance between "
        "Hungarian-matched means and the true means, in the original space, averaged over "
        "tasks. model: the heads' regressed means; readout: one M-step on the model's "
        "responsibilities under its own mixture (the first of the two starts that the "
        "estimators compare with max_iter=0); oracle: the means of "
        "the true clusters. NLL: per point and coordinate, in model space.\n\n"
        f"{table}\n\n## Training config\n\n```json\n{json.dumps(dataclasses.asdict(cfg), indent=2)}"
        f"\n```\n\n## Model config\n\n```json\n{json.dumps(mc.to_dict(), indent=2)}\n```\n\n"
        "## How it reads a dataset\n\n"
        f"```json\n{json.dumps(reading_config(cfg).to_dict(), indent=2)}\n```\n\n"
        "```python\nfrom transformer_gmm import TransformerGMM\n\n"
        'gmm = TransformerGMM(n_components=3, checkpoint="<this folder>").fit(X)\n```\n'
    )


def _em_steps_words(em_steps: int) -> str:
    """What the likelihood in the loss followed, for the model card."""
    if em_steps == 1:
        return "one M-step on them gives"
    return f"{em_steps} EM steps from them (the first an M-step) give"
