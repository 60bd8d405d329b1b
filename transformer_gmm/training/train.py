"""Train a MixtureTransformer on synthetic mixture tasks (the loop in nanoGPT's manner).

Read top to bottom: the config and its presets, the batch function, the evaluation
function, the learning-rate function, then the loop. One process on CPU or one GPU::

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

import argparse
import contextlib
import dataclasses
import json
import math
import os
import platform
import time
import typing
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from ..checkpoints import save_checkpoint
from ..nn import PRESETS as MODEL_PRESETS
from ..nn import MixtureOutput, MixtureTransformer, ModelConfig, config_from_preset
from .losses import PARAMETER_LOSSES, matched_mean_error, mixture_nll, oracle_nll, training_loss
from .tasks import PRIORS, TaskBatch, sample_batch

# -----------------------------------------------------------------------------
# config


@dataclass(frozen=True)
class TrainConfig:
    """Every option of a training run; ``PRESETS`` holds named sets of them.

    Each field is also a command-line option (``--field-name``) of
    ``python -m transformer_gmm.training``.

    Parameters
    ----------
    model : str, default="small"
        A model preset of :data:`transformer_gmm.nn.PRESETS`, with ``d_max``, ``k_max``,
        ``n_layer``, ``d_model`` and ``n_head`` replaced when they are not None.
    d_max, k_max, n_layer, d_model, n_head : int or None, default=None
        Model fields to replace.
    prior : str, default="broad"
        A task prior of :data:`transformer_gmm.training.PRIORS`.
    parameter_loss : {"hungarian", "nll"}, default="hungarian"
        Match then regress, or the mixture NLL (no matching).
    point_weight : float, default=1.0
        Weight of the per-point cross-entropy.
    batch_size : int, default=64
        Tasks per step and per process, all with one K.
    max_steps : int, default=20000
        Training steps.
    lr, min_lr : float, default=5e-4, 5e-5
        Peak learning rate after a linear warmup, and the floor of the cosine decay.
    warmup_steps : int, default=200
    weight_decay : float, default=0.01
    grad_clip : float, default=1.0
    seed : int, default=0
        Seeds the model's initialisation and every batch.
    eval_every : int, default=500
    eval_tasks : int, default=64
        Held-out tasks per K (a fixed set, the same for every seed).
    save_every : int, default=1000
    stop_at : int or None, default=None
        Stop (and save) at this step, to be resumed later.
    resume : bool, default=False
        Resume from ``<out_dir>/state.pt``.
    out_dir : str, default=""
        The output folder; by default ``runs/<preset>``.
    device : str, default="cpu"
        ``"cpu"``, ``"cuda"`` (bfloat16 autocast) or ``"cuda:N"``.
    compile : bool, default=False
        ``torch.compile`` the model.
    threads : int, default=0
        torch CPU threads; 0 for torch's default.
    preset : str, default=""
        The preset this config started from, for the model card.

    Examples
    --------
    >>> from transformer_gmm.training.train import PRESETS, TrainConfig
    >>> cfg = TrainConfig(**PRESETS["tiny"])
    >>> cfg.model, cfg.prior, cfg.max_steps
    ('tiny', 'tiny', 30)
    """

    model: str = "small"  # a model preset of transformer_gmm.nn.PRESETS ...
    d_max: int | None = None  # ... with these fields replaced when not None
    k_max: int | None = None
    n_layer: int | None = None
    d_model: int | None = None
    n_head: int | None = None
    prior: str = "broad"  # a task prior of transformer_gmm.training.tasks.PRIORS
    parameter_loss: str = "hungarian"  # "hungarian" (match, then regress) or "nll" (no matching)
    point_weight: float = 1.0  # weight of the per-point cross-entropy
    batch_size: int = 64  # tasks per step and per process, all with one K
    max_steps: int = 20_000
    lr: float = 5e-4  # peak, after a linear warmup; cosine decay to min_lr at max_steps
    min_lr: float = 5e-5
    warmup_steps: int = 200
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    seed: int = 0  # model init and every batch: batch s is a function of (seed, s, rank)
    eval_every: int = 500
    eval_tasks: int = 64  # held-out tasks per K (a fixed set, the same for every seed)
    save_every: int = 1000
    stop_at: int | None = None  # stop (and save) at this step, to be resumed later
    resume: bool = False
    out_dir: str = ""  # default: runs/<preset>
    device: str = "cpu"  # "cpu", "cuda" (bf16 autocast) or "cuda:N"
    compile: bool = False  # torch.compile the model (CUDA; recompiles per K and batch shape)
    threads: int = 0  # torch CPU threads, 0 for torch's default
    preset: str = ""  # the preset this config started from, for the model card


# fmt: off
PRESETS: dict[str, dict[str, typing.Any]] = {
    # For tests: seconds on a CPU, learns only that the loss can go down.
    "tiny": dict(model="tiny", prior="tiny", batch_size=8, max_steps=30, lr=3e-3, min_lr=3e-4,
                 warmup_steps=5, eval_every=10, eval_tasks=4, save_every=10),
    # TGMM's prior at d = 2 (FACTS.md's first experiment): heads for K = 2..5 only.
    "tgmm-2d": dict(model="small", k_max=5, prior="tgmm-2d", max_steps=3000, warmup_steps=100,
                    eval_every=250, eval_tasks=50, save_every=250),
    # The generalist: K to 10, d to 128. d_max = 9 keeps the K - 1 = 9 directions the means
    # of 10 components span; with 8, even the true labels' means, computed in the projection,
    # err by 11.5 instead of 4.2 (K = 10, d = 32): measured, not assumed.
    "small": dict(model="small", d_max=9, prior="broad", max_steps=100_000),
    "base": dict(model="base", k_max=10, prior="broad", batch_size=128, max_steps=200_000,
                 lr=3e-4, warmup_steps=2000, eval_every=2000, save_every=2000),
}
# fmt: on

EVAL_SEED = 20_251_122  # the held-out tasks do not depend on --seed


def model_config(cfg: TrainConfig) -> ModelConfig:
    """The model's config: the preset ``cfg.model`` with the fields ``cfg`` sets replaced.

    Examples
    --------
    >>> from transformer_gmm.training.train import PRESETS, TrainConfig, model_config
    >>> cfg = TrainConfig(**PRESETS["tiny"])
    >>> mc = model_config(cfg)
    >>> mc.d_model, mc.k_max
    (16, 4)
    >>> model_config(TrainConfig(model="tiny", k_max=6)).k_max
    6
    """
    names = ("d_max", "k_max", "n_layer", "d_model", "n_head")
    overrides = {name: getattr(cfg, name) for name in names if getattr(cfg, name) is not None}
    return config_from_preset(cfg.model, **overrides)


def k_range(cfg: TrainConfig, mc: ModelConfig) -> tuple[int, int]:
    """The K the prior asks for that the model has a head for.

    Examples
    --------
    >>> from transformer_gmm.training.train import PRESETS, TrainConfig, model_config
    >>> cfg = TrainConfig(**PRESETS["tiny"])
    >>> mc = model_config(cfg)
    >>> from transformer_gmm.training.train import k_range
    >>> k_range(cfg, mc)
    (2, 4)
    """
    prior = PRIORS[cfg.prior]
    low, high = max(prior.k_range[0], mc.k_min), min(prior.k_range[1], mc.k_max)
    if low > high:
        raise ValueError(f"Prior {cfg.prior!r} and model heads {mc.k_min}..{mc.k_max} share no K.")
    return low, high


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
    low, high = k_range(cfg, mc)
    K = int(np.random.default_rng([cfg.seed, step]).integers(low, high + 1))  # same on all ranks
    rng = np.random.default_rng([cfg.seed, step, rank])  # different tasks on each rank
    return sample_batch(rng, PRIORS[cfg.prior], K, cfg.batch_size, mc.d_max, mc.context_size)


def eval_set(cfg: TrainConfig, mc: ModelConfig) -> list[TaskBatch]:
    """The fixed held-out tasks: ``eval_tasks`` per K.

    Examples
    --------
    >>> from transformer_gmm.training.train import PRESETS, TrainConfig, model_config
    >>> cfg = TrainConfig(**PRESETS["tiny"])
    >>> mc = model_config(cfg)
    >>> from transformer_gmm.training.train import eval_set
    >>> [(b.n_components, len(b.tasks)) for b in eval_set(cfg, mc)]
    [(2, 4), (3, 4), (4, 4)]
    """
    low, high = k_range(cfg, mc)
    return [
        sample_batch(
            np.random.default_rng([EVAL_SEED, K]),
            PRIORS[cfg.prior],
            K,
            cfg.eval_tasks,
            mc.d_max,
            mc.context_size,
        )
        for K in range(low, high + 1)
    ]


def autocast(device: str):
    """The autocast context for ``device``: bfloat16 on CUDA, none (float32) on CPU.

    Examples
    --------
    >>> import torch
    >>> from transformer_gmm.training.train import autocast
    >>> with autocast("cpu"):
    ...     y = torch.ones(2, 2) @ torch.ones(2, 2)
    >>> y.dtype
    torch.float32
    """
    # bf16 on CUDA: fp32 range, so no loss scaling; CPU runs in fp32.
    if device.startswith("cuda"):
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


@torch.no_grad()
def evaluate(model: MixtureTransformer, batches: list[TaskBatch], device: str) -> list[dict]:
    """Per K: the mean error of the model's means (TGMM's metric, in the original space)
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
        Per K: ``K``, ``model``, ``oracle``, ``nll`` and ``oracle_nll``.

    Examples
    --------
    >>> from transformer_gmm.training.train import PRESETS, TrainConfig, model_config
    >>> cfg = TrainConfig(**PRESETS["tiny"])
    >>> mc = model_config(cfg)
    >>> from transformer_gmm.nn import MixtureTransformer
    >>> from transformer_gmm.training.train import eval_set, evaluate
    >>> rows = evaluate(MixtureTransformer(mc), eval_set(cfg, mc), "cpu")
    >>> [row["K"] for row in rows], sorted(rows[0])
    ([2, 3, 4], ['K', 'model', 'nll', 'oracle', 'oracle_nll'])
    """
    model.eval()
    rows = []
    for batch in batches:
        b = batch.to(device)
        with autocast(device):
            out = model(b.x, b.n_components, b.mask)
        out = MixtureOutput(*(t.float() for t in out))
        means = out.means.cpu().numpy()  # (B, K, d_max)
        errors = [
            matched_mean_error(t.standardization.inverse_transform_means(m), t.means)
            for t, m in zip(batch.tasks, means, strict=True)
        ]
        oracle = [matched_mean_error(t.oracle_means(), t.means) for t in batch.tasks]
        rows.append(
            dict(
                K=b.n_components,
                model=float(np.mean(errors)),
                oracle=float(np.mean(oracle)),
                nll=mixture_nll(out, b).item(),
                oracle_nll=oracle_nll(b).item(),
            )
        )
    model.train()
    return rows


def format_table(rows: list[dict]) -> str:
    """The rows of :func:`evaluate` as a Markdown table.

    Examples
    --------
    >>> from transformer_gmm.training.train import format_table
    >>> row = dict(K=2, model=0.5, oracle=0.25, nll=1.5, oracle_nll=1.25)
    >>> print(format_table([row]))
    | K | model | oracle | NLL | oracle NLL |
    |---|---|---|---|---|
    | 2 | 0.500 | 0.250 | 1.500 | 1.250 |
    """
    lines = ["| K | model | oracle | NLL | oracle NLL |", "|---|---|---|---|---|"]
    lines += [
        f"| {r['K']} | {r['model']:.3f} | {r['oracle']:.3f} | {r['nll']:.3f} | "
        f"{r['oracle_nll']:.3f} |"
        for r in rows
    ]
    return "\n".join(lines)


def get_lr(step: int, cfg: TrainConfig) -> float:
    """Linear warmup, then cosine decay to min_lr: a function of the step, nothing to save.

    Examples
    --------
    >>> from transformer_gmm.training.train import PRESETS, TrainConfig, model_config
    >>> cfg = TrainConfig(**PRESETS["tiny"])
    >>> mc = model_config(cfg)
    >>> from transformer_gmm.training.train import get_lr
    >>> [round(get_lr(step, cfg), 6) for step in (0, cfg.warmup_steps, cfg.max_steps)]
    [0.0006, 0.003, 0.0003]
    """
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps))
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (cfg.lr - cfg.min_lr)


# -----------------------------------------------------------------------------
# saving


def hardware(device: str, world_size: int) -> str:
    """What the run ran on, for the model card: the GPU name, or the CPU and its threads.

    Examples
    --------
    >>> from transformer_gmm.training.train import hardware
    >>> hardware("cpu", 1).startswith("1 x CPU")
    True
    """
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
    """The model card of a training run: its data, its evaluation and both configs.

    Examples
    --------
    >>> from transformer_gmm.training.train import PRESETS, TrainConfig, model_config
    >>> cfg = TrainConfig(**PRESETS["tiny"])
    >>> mc = model_config(cfg)
    >>> from transformer_gmm.training.train import model_card
    >>> card = model_card(cfg, mc, 30, 1, 60.0, "1 x CPU", None, 0)
    >>> card.splitlines()[5]
    '# transformer_gmm checkpoint (preset `custom`)'
    >>> "Not evaluated yet." in card
    True
    """
    low, high = k_range(cfg, mc)
    table = format_table(rows) if rows else "Not evaluated yet."
    return (
        "---\nlibrary_name: transformer_gmm\ntags: [gaussian-mixture, clustering]\n---\n\n"
        f"# transformer_gmm checkpoint (preset `{cfg.preset or 'custom'}`)\n\n"
        f"Trained on prior `{cfg.prior}` (K = {low}..{high}) with the "
        f"`{cfg.parameter_loss}` parameter loss.\n\n"
        "| preset | steps | tasks seen | hardware | wall time |\n|---|---|---|---|---|\n"
        f"| {cfg.preset or 'custom'} | {step} | {step * cfg.batch_size * world_size} | {hw} | "
        f"{wall / 60:.1f} min |\n\n"
        f"## Held-out evaluation at step {eval_step}\n\n{cfg.eval_tasks} fixed tasks per K. "
        "model / oracle: sqrt of the summed squared distance between Hungarian-matched means "
        "and the true means, in the original space, averaged over tasks; the oracle uses the "
        "means of the true clusters. NLL: per point and coordinate, in model space.\n\n"
        f"{table}\n\n## Training config\n\n```json\n{json.dumps(dataclasses.asdict(cfg), indent=2)}"
        f"\n```\n\n## Model config\n\n```json\n{json.dumps(mc.to_dict(), indent=2)}\n```\n\n"
        "```python\nfrom transformer_gmm import TransformerGMM\n\n"
        'gmm = TransformerGMM(n_components=3, checkpoint="<this folder>").fit(X)\n```\n'
    )


def save_state(path: Path, state: dict) -> None:
    """``torch.save`` ``state`` to ``path`` through a temporary file, then rename it.

    Examples
    --------
    >>> import contextlib, io, tempfile
    >>> from pathlib import Path
    >>> import torch
    >>> from transformer_gmm.training.train import save_state
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     save_state(Path(tmp) / "state.pt", {"step": 3})
    ...     print(torch.load(Path(tmp) / "state.pt", weights_only=True))
    {'step': 3}
    """
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
    torch.manual_seed(cfg.seed)  # same init on every rank (DDP also broadcasts rank 0's)
    model = MixtureTransformer(mc).to(device)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay
    )
    step, wall_before, rows, eval_step = 0, 0.0, None, 0
    if cfg.resume:
        # weights_only: tensors and plain types only, never arbitrary objects.
        state = torch.load(out_dir / "state.pt", map_location=device, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step, wall_before = state["step"], state["wall_time"]
        rows, eval_step = state["eval_rows"] or None, state["eval_step"]
        torch.set_rng_state(state["torch_rng"])
        if device.startswith("cuda") and state["cuda_rng"] is not None:
            torch.cuda.set_rng_state(state["cuda_rng"])
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
    if master and cfg.resume and (out_dir / "log.jsonl").exists():
        # Drop what was logged after the saved step: those steps are about to be redone.
        lines = (out_dir / "log.jsonl").read_text().splitlines(keepends=True)
        kept = [line for line in lines if json.loads(line)["step"] <= step]
        (out_dir / "log.jsonl").write_text("".join(kept))
    log = open(out_dir / "log.jsonl", "a") if master else None
    t0 = time.time()
    while step < stop:
        lr = get_lr(step, cfg)
        for group in optimizer.param_groups:
            group["lr"] = lr
        batch = get_batch(cfg, mc, step, rank).to(device)
        with autocast(device):
            out = model(batch.x, batch.n_components, batch.mask)
        loss, parts = training_loss(out, batch, cfg.parameter_loss, cfg.point_weight)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        step += 1

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
    bar.close()
    if log is not None:
        log.close()
    if world_size > 1:
        dist.destroy_process_group()
    return out_dir


# -----------------------------------------------------------------------------
# command line


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    """The TrainConfig the command line asks for: the preset, then the options given.

    Parameters
    ----------
    argv : list of str, optional
        The arguments; by default ``sys.argv[1:]``.

    Returns
    -------
    TrainConfig

    Examples
    --------
    >>> from transformer_gmm.training.train import parse_args
    >>> cfg = parse_args(["--preset", "tiny", "--max-steps", "5", "--no-compile"])
    >>> cfg.preset, cfg.model, cfg.max_steps, cfg.batch_size, cfg.compile
    ('tiny', 'tiny', 5, 8, False)
    """
    parser = argparse.ArgumentParser(
        prog="python -m transformer_gmm.training",
        description="Train a MixtureTransformer on synthetic Gaussian-mixture tasks. Options "
        "left out take the preset's value, then TrainConfig's default.",
        epilog="presets: "
        + "; ".join(
            f"{name}: " + ", ".join(f"{k}={v}" for k, v in p.items()) for name, p in PRESETS.items()
        ),
    )
    choices = dict(
        model=sorted(MODEL_PRESETS), prior=sorted(PRIORS), parameter_loss=sorted(PARAMETER_LOSSES)
    )
    parser.add_argument("--preset", default="small", choices=sorted(PRESETS))
    hints = typing.get_type_hints(TrainConfig)
    for field in dataclasses.fields(TrainConfig):
        if field.name == "preset":
            continue
        flag = "--" + field.name.replace("_", "-")
        kind = hints[field.name]
        if kind is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None)
            continue
        kind = typing.get_args(kind)[0] if typing.get_args(kind) else kind  # int | None: int
        help = f"TrainConfig default: {field.default!r}"
        parser.add_argument(
            flag,
            type=kind,
            choices=choices.get(field.name),
            default=None,
            metavar=kind.__name__ if field.name not in choices else None,
            help=help,
        )
    args = vars(parser.parse_args(argv))
    preset = args.pop("preset")
    given = {name: value for name, value in args.items() if value is not None}
    return TrainConfig(**{**PRESETS[preset], **given, "preset": preset})


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
