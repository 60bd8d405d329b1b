"""Train a MixtureTransformer on synthetic mixture tasks (the loop in nanoGPT's manner).

Read top to bottom: the batch function, the learning-rate function, saving, then the loop
(the config and its presets live in ``config.py``, the held-out evaluation and the model
card in ``evaluation.py``). One process on CPU or one GPU::

    python -m transformer_gmm.training --preset tgmm-2d --threads 1
    python -m transformer_gmm.training --preset small --device cuda --compile

Several GPUs, data parallel (each rank draws its own tasks; rank 0 logs, evaluates, saves)::

    torchrun --standalone --nproc_per_node 8 -m transformer_gmm.training --preset base \
        --device cuda

A run writes ``<out_dir>/state.pt`` (resume with ``--resume`` and the same options),
``<out_dir>/log.jsonl`` and ``<out_dir>/checkpoint/``, a checkpoint folder that
``TransformerGMM(checkpoint=...)`` reads.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from ..nn import MixtureTransformer, ModelConfig
from ..storage import load_model, save_checkpoint
from .config import (  # noqa: F401  (re-exported: the loop's public names live here too)
    EVAL_SEED,
    PRESETS,
    TrainConfig,
    k_range,
    model_config,
    parse_args,
    reading_config,
)
from .evaluation import autocast, eval_set, evaluate, format_table, hardware, model_card
from .losses import training_loss
from .prefetch import step_batches
from .task_batch import TaskBatch
from .tasks import PRIORS, sample_batch
from .weights import load_initial_weights, param_groups

# -----------------------------------------------------------------------------
# batches, evaluation, learning rate


def get_batch(cfg: TrainConfig, mc: ModelConfig, step: int, rank: int) -> TaskBatch:
    """The batch of ``step`` on ``rank``: a pure function of (seed, step, rank), so a resumed
    run draws exactly the batches it would have drawn, with no generator state to save.

    Examples
    --------
    >>> from transformer_gmm.training.train import PRESETS, TrainConfig, model_config
    >>> cfg = TrainConfig(**PRESETS["tiny"])
    >>> mc = model_config(cfg)
    >>> import torch
    >>> from transformer_gmm.training.train import get_batch
    >>> batch = get_batch(cfg, mc, step=0, rank=0)
    >>> batch.x.shape[0] == cfg.batch_size, batch.x.shape[2] == mc.d_max
    (True, True)
    >>> torch.equal(batch.x, get_batch(cfg, mc, step=0, rank=0).x)
    True
    """
    step_rng = np.random.default_rng([cfg.seed, step])  # the same on all ranks
    # Drawn only when focusing, so that runs without a focus prior keep their batches.
    prior = cfg.prior
    if cfg.focus_prob > 0:
        # One draw picks the prior: below focus_prob the first focus prior, below twice
        # it the second, ... (one focus prior draws exactly as it always did).
        index = int(step_rng.random() // cfg.focus_prob)
        if index < len(cfg.focus_priors):
            prior = cfg.focus_priors[index]
    low, high = k_range(cfg, mc, prior)
    K = int(step_rng.integers(low, high + 1))
    rng = np.random.default_rng([cfg.seed, step, rank])  # different tasks on each rank
    reading = reading_config(cfg)
    return sample_batch(
        rng,
        PRIORS[prior],
        K,
        cfg.batch_size,
        mc.d_max,
        reading.context_size,
        reading.noise_directions,
    )


def batches(cfg: TrainConfig, mc: ModelConfig, start: int, stop: int, rank: int):
    """The batches of steps ``start .. stop - 1`` in order, drawn ahead by ``cfg.workers``
    processes (a DataLoader) or, with none, one at a time in this process.

    Examples
    --------
    >>> from transformer_gmm.training.train import PRESETS, TrainConfig, model_config
    >>> import dataclasses, torch
    >>> from transformer_gmm.training.train import batches, get_batch
    >>> cfg = TrainConfig(**PRESETS["tiny"])
    >>> mc = model_config(cfg)
    >>> drawn = list(batches(dataclasses.replace(cfg, workers=2), mc, 3, 5, rank=0))
    >>> [torch.equal(b.x, get_batch(cfg, mc, step, 0).x) for b, step in zip(drawn, (3, 4))]
    [True, True]
    """
    draw = functools.partial(get_batch, cfg, mc, rank=rank)
    return step_batches(draw, start, stop, cfg.workers, cfg.device.startswith("cuda"))


def get_lr(step: int, cfg: TrainConfig) -> float:
    """Linear warmup, then cosine decay to min_lr: a function of the step, nothing to save."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps))
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (cfg.lr - cfg.min_lr)


def out_of_time(seconds: float, cfg: TrainConfig, world_size: int) -> bool:
    """Whether ``cfg.time_limit`` has passed, agreed by all ranks (the slowest decides), so
    that every rank stops at the same step.
    """
    late = torch.tensor(float(seconds > 60 * cfg.time_limit))
    if world_size > 1:
        if cfg.device.startswith("cuda"):
            late = late.cuda()
        dist.all_reduce(late, op=dist.ReduceOp.MAX)
    return bool(late.item())


def check_teacher(teacher: MixtureTransformer, mc: ModelConfig) -> None:
    """A ``distill_from`` model must read and answer what the student does."""
    tc = teacher.config
    reads = (tc.d_max, tc.k_min, tc.k_max, tc.scale_type)
    if reads != (mc.d_max, mc.k_min, mc.k_max, mc.scale_type):
        raise ValueError(
            f"distill_from's model (d_max={tc.d_max}, K {tc.k_min}..{tc.k_max}, "
            f"scale_type={tc.scale_type!r}) must have this run's d_max, K range and "
            f"scale_type (d_max={mc.d_max}, K {mc.k_min}..{mc.k_max}, {mc.scale_type!r})."
        )


# -----------------------------------------------------------------------------
# saving


def save_state(path: Path, state: dict) -> None:
    """``torch.save`` ``state`` to ``path`` through a temporary file, then rename it."""
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)  # a crash mid-save leaves the previous state.pt whole


# -----------------------------------------------------------------------------
# the loop


def train(cfg: TrainConfig) -> Path:
    """Run (or resume) training; return the output folder.

    Parameters
    ----------
    cfg : TrainConfig

    Returns
    -------
    out_dir : pathlib.Path
        Holds ``state.pt``, ``log.jsonl`` and the checkpoint folder ``checkpoint/``.

    Examples
    --------
    Two steps of the "tiny" preset (the evaluation table goes to stdout, hidden here):

    >>> import contextlib, io, tempfile
    >>> from pathlib import Path
    >>> from transformer_gmm import TransformerGMM
    >>> from transformer_gmm.training.train import parse_args, train
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     cfg = parse_args(["--preset", "tiny", "--max-steps", "2", "--out-dir", tmp])
    ...     with contextlib.redirect_stdout(io.StringIO()):
    ...         out_dir = train(cfg)
    ...     print(sorted(path.name for path in out_dir.iterdir()))
    ...     gmm = TransformerGMM.from_pretrained(out_dir / "checkpoint", n_components=2)
    ['checkpoint', 'log.jsonl', 'state.pt']
    """
    from tqdm import tqdm  # the `train` extra; not needed to use the package

    if cfg.compile and not cfg.device.startswith("cuda"):
        # torch.compile's CPU backend stops on the model's dynamic shapes (per K, per batch).
        raise ValueError("compile=True needs a CUDA device: train on the CPU without --compile.")
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank, device = 0, cfg.device
    if world_size > 1:  # launched by torchrun
        dist.init_process_group(backend="nccl" if device.startswith("cuda") else "gloo")
        rank = dist.get_rank()
        if device.startswith("cuda"):
            device = f"cuda:{int(os.environ['LOCAL_RANK'])}"
            torch.cuda.set_device(device)
    master = rank == 0
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    out_dir = Path(cfg.out_dir or f"runs/{cfg.preset or 'custom'}")
    out_dir.mkdir(parents=True, exist_ok=True)

    mc = model_config(cfg)
    for prior in [cfg.prior, *cfg.focus_priors] if cfg.focus_prob > 0 else [cfg.prior]:
        k_range(cfg, mc, prior)  # before any work: a K the model or a prior lacks is an error
    torch.manual_seed(cfg.seed)  # same init on every rank (DDP also broadcasts rank 0's)
    model = MixtureTransformer(mc, reading_config(cfg)).to(device)
    optimizer = torch.optim.AdamW(
        param_groups(model, cfg), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay
    )
    step, wall_before, rows, eval_step = 0, 0.0, None, 0
    # --resume with no saved state starts the run, so one command both starts and resumes.
    resuming = cfg.resume and (out_dir / "state.pt").exists()
    if cfg.init_from and not resuming:
        # Fine-tuning: only the weights; the optimizer and the schedule start afresh.
        load_initial_weights(model, load_model(cfg.init_from))
    if resuming:
        # weights_only: tensors and plain types only, never arbitrary objects.
        state = torch.load(out_dir / "state.pt", map_location=device, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step, wall_before = state["step"], state["wall_time"]
        rows, eval_step = state["eval_rows"] or None, state["eval_step"]
        torch.set_rng_state(state["torch_rng"])
        if device.startswith("cuda") and state["cuda_rng"] is not None:
            torch.cuda.set_rng_state(state["cuda_rng"])
    teacher = None
    if cfg.distill_from:
        teacher = load_model(cfg.distill_from).to(device).eval().requires_grad_(False)
        check_teacher(teacher, mc)
    raw_model = model
    if cfg.compile:
        model = torch.compile(model, dynamic=True)
    if world_size > 1:
        from torch.nn.parallel import DistributedDataParallel

        # Each step uses one K's head; the other heads get no gradient.
        model = DistributedDataParallel(model, find_unused_parameters=True)
    held_out = eval_set(cfg, mc) if master else []
    hw = hardware(device, world_size)

    def save() -> None:
        wall = wall_before + time.time() - t0
        cuda_rng = torch.cuda.get_rng_state() if device.startswith("cuda") else None
        save_state(
            out_dir / "state.pt",
            dict(
                model=raw_model.state_dict(),
                optimizer=optimizer.state_dict(),
                step=step,
                wall_time=wall,
                torch_rng=torch.get_rng_state(),
                cuda_rng=cuda_rng,
                eval_rows=rows or [],
                eval_step=eval_step,
                config=dataclasses.asdict(cfg),
            ),
        )
        card = model_card(cfg, mc, step, world_size, wall, hw, rows, eval_step)
        save_checkpoint(raw_model, out_dir / "checkpoint", model_card=card)

    stop = min(cfg.stop_at or cfg.max_steps, cfg.max_steps)
    bar = tqdm(total=cfg.max_steps, initial=step, disable=not master, dynamic_ncols=True)
    if master and resuming and (out_dir / "log.jsonl").exists():
        # Drop what was logged after the saved step: those steps are about to be redone.
        lines = (out_dir / "log.jsonl").read_text().splitlines(keepends=True)
        kept = [line for line in lines if json.loads(line)["step"] <= step]
        (out_dir / "log.jsonl").write_text("".join(kept))
    log = open(out_dir / "log.jsonl", "a") if master else None
    t0 = time.time()
    for batch in batches(cfg, mc, step, stop, rank):
        lr = get_lr(step, cfg)
        for group in optimizer.param_groups:
            group["lr"] = lr
        batch = batch.to(device)
        with autocast(device):
            out = model(batch.x, batch.n_components, batch.mask, batch.gaps_read_by(mc))
            if teacher is not None:
                with torch.no_grad():
                    taught = teacher(
                        batch.x, batch.n_components, batch.mask,
                        batch.gaps_read_by(teacher.config),
                    )
        loss, parts = training_loss(
            out,
            batch,
            cfg.parameter_loss,
            cfg.point_weight,
            cfg.m_step_weight,
            cfg.m_step_nll_weight,
            cfg.em_steps,
            teacher=taught if teacher is not None else None,
            distill_weight=cfg.distill_weight if teacher is not None else 0.0,
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        step += 1
        if cfg.time_limit and step % 10 == 0 and out_of_time(time.time() - t0, cfg, world_size):
            stop = step  # evaluate, save and leave; --resume goes on from here

        if master:
            bar.update()
            bar.set_postfix(loss=f"{loss.item():.3f}", K=batch.n_components, lr=f"{lr:.1e}")
            record = dict(
                step=step,
                loss=loss.item(),
                K=batch.n_components,
                lr=lr,
                **parts,
                time=wall_before + time.time() - t0,
            )
            if step % cfg.eval_every == 0 or step == stop:
                rows, eval_step = evaluate(raw_model, held_out, device), step
                bar.write(f"step {step}: held-out evaluation\n{format_table(rows)}")
                record["eval"] = rows
            log.write(json.dumps(record) + "\n")
            if step % cfg.save_every == 0 or step == stop:
                log.flush()
                save()
        if step == stop:
            break
    bar.close()
    if log is not None:
        log.close()
    if world_size > 1:
        # Wait for rank 0's evaluation and save: a rank that tears gloo down while its peer
        # is still connected can abort ("terminate called without an active exception").
        dist.barrier()
        dist.destroy_process_group()
    return out_dir


def main(argv: list[str] | None = None) -> None:
    """``python -m transformer_gmm.training``: parse the arguments and train.

    Parameters
    ----------
    argv : list of str, optional
        The arguments; by default ``sys.argv[1:]``.

    Examples
    --------
    >>> import contextlib, io, tempfile
    >>> from pathlib import Path
    >>> from transformer_gmm.training.train import main
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     with contextlib.redirect_stdout(io.StringIO()):
    ...         main(["--preset", "tiny", "--max-steps", "1", "--out-dir", tmp])
    ...     print((Path(tmp) / "checkpoint" / "config.json").is_file())
    True
    """
    train(parse_args(argv))
