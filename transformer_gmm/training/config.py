"""The training run's configuration: the dataclass, its presets, and the command line.

Every option of ``python -m transformer_gmm.training`` is a field of :class:`TrainConfig`;
a preset fills the fields it names and the command line overrides them.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from dataclasses import dataclass

from ..nn import PRESETS as MODEL_PRESETS
from ..nn import ModelConfig, ReadingConfig, config_from_preset, reading_from_preset
from ..nn.config import SCALE_TYPES
from .losses import PARAMETER_LOSSES
from .tasks import PRIORS

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
        A model preset of :data:`transformer_gmm.nn.PRESETS`, with the model fields below
        replaced when they are not None.
    d_max, k_max, n_layer, d_model, n_head, context_size : int or None, default=None
        Model fields to replace.
    noise_directions : int or None, default=None
        Model field to replace: principal directions read beyond the K - 1 the means span.
    scale_type : {"spherical", "diag", "full"} or None, default=None
        Model field to replace: the covariance the heads output. From a spherical
        ``init_from``, a wider one starts out as that model's spherical scales.
    reads_gaps : int or None, default=None
        Model field to replace: 1 reads each point's share of each coordinate that was
        missing (train it on a prior with ``missing_prob`` > 0). From an ``init_from``
        without it, the new weights start at zero.
    prior : str, default="broad"
        A task prior of :data:`transformer_gmm.training.PRIORS`.
    focus_prior : str, default=""
        Other priors, comma-separated, each drawn instead of ``prior`` for a fraction
        ``focus_prob`` of the steps (with its own K range): fine-tuning toward some
        regimes while the rest of ``prior`` keeps being seen. The held-out evaluation
        stays on ``prior``.
    focus_prob : float, default=0.0
        That fraction for each focus prior; together at most 1. 0 draws every batch
        from ``prior``.
    parameter_loss : {"hungarian", "nll"}, default="hungarian"
        Match then regress, or the mixture NLL (no matching).
    point_weight : float, default=1.0
        Weight of the per-point cross-entropy.
    m_step_weight : float, default=0.0
        Weight of the squared error of the means one M-step on the model's own
        responsibilities gives (what ``TransformerGMM(max_iter=0)`` returns); 0 for none.
    m_step_nll_weight : float, default=0.0
        Weight of the negative log-likelihood of the data under the full-covariance
        mixture one M-step on the model's responsibilities gives (no labels needed);
        0 for none.
    em_steps : int, default=1
        EM steps from the model's responsibilities before the likelihood that
        ``m_step_nll_weight`` weighs: 1 scores the one-M-step estimate
        (``max_iter=0``); 2 to 5 train the start for the EM that follows it.
    distill_from : str, default=""
        A checkpoint (folder, bundled name or Hub id) that teaches: each step also runs it,
        frozen, on the batch, and the loss adds ``distill_weight`` times the distance of
        this model's outputs from its (``losses.distillation_loss``). Its model must have
        this run's d_max and K range; start the student from it (``init_from`` the same
        checkpoint, with fewer blocks) so that their slots agree.
    distill_weight : float, default=1.0
        That term's weight, where ``distill_from`` is given.
    only_k : int, default=0
        Fine-tune one K alone: every batch has ``only_k`` components, and only that K's
        own weights train (its readout head and its row of the K embedding), so what
        the model does for every other K stays bit for bit as ``init_from`` has it.
        Needs ``init_from``; 0 trains every weight on every K of the priors.
    train_k_from : int, default=0
        Fine-tune the heads from this K up alone: every batch has one of those K, and only
        their readout heads and rows of the K embedding train. With ``init_from`` a model
        with fewer heads (a smaller ``k_max``), it trains the heads grown onto it while the
        backbone and the source's heads stay bit for bit. Needs ``init_from``; 0 for none.
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
        Resume from ``<out_dir>/state.pt``; when there is none yet, start the run (so one
        command both starts a run and resumes it after an interruption).
    init_from : str, default=""
        A checkpoint (folder, bundled name or Hub id) whose weights start a new run, for
        fine-tuning; its model must have the same shapes, but for more blocks and a wider
        ``scale_type``. Ignored when resuming.
    time_limit : float, default=0.0
        Stop (and save) after this many minutes of this process's training; 0 for none.
    workers : int, default=0
        Processes that draw batches ahead of the loop (a batch is a pure function of the
        step, so the batches are the same whatever this is); 0 draws them in the loop.
    out_dir : str, default=""
        The output folder; by default ``runs/<preset>``.
    device : str, default="cpu"
        ``"cpu"``, ``"cuda"`` (bfloat16 autocast) or ``"cuda:N"``.
    compile : bool, default=False
        ``torch.compile`` the model (CUDA only: the CPU backend stops on its dynamic
        shapes).
    threads : int, default=0
        torch CPU threads; 0 for torch's default.
    preset : str, default=""
        The preset this config started from, for the model card.

    Examples
    --------
    >>> from transformer_gmm.training.config import PRESETS, TrainConfig
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
    context_size: int | None = None
    noise_directions: int | None = None
    scale_type: str | None = None
    reads_gaps: int | None = None
    prior: str = "broad"  # a task prior of transformer_gmm.training.tasks.PRIORS
    focus_prior: str = ""  # comma-separated; each drawn instead of prior for focus_prob of steps
    focus_prob: float = 0.0
    parameter_loss: str = "hungarian"  # "hungarian" (match, then regress) or "nll" (no matching)
    point_weight: float = 1.0  # weight of the per-point cross-entropy
    m_step_weight: float = 0.0  # weight of the error of the means one M-step reads out
    m_step_nll_weight: float = 0.0  # weight of the data's NLL under that one-M-step mixture
    em_steps: int = 1  # EM steps from the model's responsibilities before that NLL
    distill_from: str = ""  # a frozen teacher checkpoint; "" for none
    distill_weight: float = 1.0  # weight of the distance from the teacher's outputs
    only_k: int = 0  # train only this K's head and embedding, on tasks of this K; 0: all
    train_k_from: int = 0  # train only the heads (and embeddings) of K >= this; 0: all
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
    init_from: str = ""  # a checkpoint whose weights start a new run (fine-tuning)
    time_limit: float = 0.0  # minutes: stop (and save) after this long; 0 for no limit
    workers: int = 0  # processes drawing batches ahead of the loop; 0: in the loop
    out_dir: str = ""  # default: runs/<preset>
    device: str = "cpu"  # "cpu", "cuda" (bf16 autocast) or "cuda:N"
    compile: bool = False  # torch.compile the model (CUDA; recompiles per K and batch shape)
    threads: int = 0  # torch CPU threads, 0 for torch's default
    preset: str = ""  # the preset this config started from, for the model card

    def __post_init__(self) -> None:
        if self.only_k and not self.init_from:
            raise ValueError(
                f"only_k={self.only_k} fine-tunes one K of a trained model: name that model "
                "with init_from."
            )
        if self.train_k_from and not self.init_from:
            raise ValueError(
                f"train_k_from={self.train_k_from} fine-tunes some heads of a trained model: "
                "name that model with init_from."
            )
        if self.distill_from and self.distill_weight <= 0:
            raise ValueError(
                f"distill_weight must be > 0 with distill_from, got {self.distill_weight}."
            )
        if self.only_k and self.train_k_from:
            raise ValueError("Give only_k or train_k_from, not both.")
        if self.em_steps < 1:
            raise ValueError(f"em_steps must be >= 1, got {self.em_steps}.")
        for name in ("m_step_weight", "m_step_nll_weight"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}.")
        if not 0.0 <= self.focus_prob * max(1, len(self.focus_priors)) <= 1.0:
            raise ValueError(
                f"focus_prob times the number of focus priors must be in [0, 1], got "
                f"{self.focus_prob} for {len(self.focus_priors)}."
            )
        if self.focus_prob > 0 and (
            not self.focus_priors or any(name not in PRIORS for name in self.focus_priors)
        ):
            raise ValueError(
                f"focus_prob={self.focus_prob} needs focus priors among {sorted(PRIORS)}, "
                f"got {self.focus_prior!r}."
            )

    @property
    def focus_priors(self) -> list[str]:
        """The focus priors named by ``focus_prior``, in order."""
        return [name for name in self.focus_prior.split(",") if name]


# fmt: off
PRESETS: dict[str, dict[str, typing.Any]] = {
    # For tests: seconds on a CPU, learns only that the loss can go down.
    "tiny": dict(model="tiny", prior="tiny", batch_size=8, max_steps=30, lr=3e-3, min_lr=3e-4,
                 warmup_steps=5, eval_every=10, eval_tasks=4, save_every=10),
    # TGMM's prior at d = 2, the overlapping regime: heads for K = 2..5 only.
    "tgmm-2d": dict(model="small", k_max=5, prior="tgmm-2d", max_steps=3000, warmup_steps=100,
                    eval_every=250, eval_tasks=50, save_every=250),
    # The generalist: K to 10, d to 128. d_max = 9 keeps the K - 1 = 9 directions the means
    # of 10 components span; with 8, even the true labels' means, computed in the projection,
    # err by 11.5 instead of 4.2 (K = 10, d = 32): measured, not assumed.
    "small": dict(model="small", d_max=9, prior="broad", max_steps=100_000),
    # The bundled default, trained on one CPU core: the "small" model with a context of 128
    # points, which halves the cost of a step (fit subsamples larger datasets for the
    # backbone; EM still reads every point).
    "small-cpu": dict(model="small", d_max=9, context_size=128, prior="broad", max_steps=4000,
                      threads=1, eval_every=1000, eval_tasks=32, save_every=250),
    "base": dict(model="base", k_max=10, prior="broad", batch_size=128, max_steps=200_000,
                 lr=3e-4, warmup_steps=2000, eval_every=2000, save_every=2000),
}
# fmt: on

EVAL_SEED = 20_251_122  # the held-out tasks do not depend on --seed


def model_config(cfg: TrainConfig) -> ModelConfig:
    """The model's config: the preset ``cfg.model`` with the fields ``cfg`` sets replaced."""
    names = ("d_max", "k_max", "n_layer", "d_model", "n_head", "scale_type", "reads_gaps")
    overrides = {name: getattr(cfg, name) for name in names if getattr(cfg, name) is not None}
    return config_from_preset(cfg.model, **overrides)


def reading_config(cfg: TrainConfig) -> ReadingConfig:
    """How the model reads a dataset, in training as in a fit: the preset ``cfg.model``'s,
    with the fields ``cfg`` sets replaced."""
    names = ("context_size", "noise_directions")
    overrides = {name: getattr(cfg, name) for name in names if getattr(cfg, name) is not None}
    return reading_from_preset(cfg.model, **overrides)


def k_range(cfg: TrainConfig, mc: ModelConfig, prior: str | None = None) -> tuple[int, int]:
    """The K the prior (``cfg.prior`` unless named) asks for that the model has a head for."""
    name = cfg.prior if prior is None else prior
    low, high = max(PRIORS[name].k_range[0], mc.k_min), min(PRIORS[name].k_range[1], mc.k_max)
    if low > high:
        raise ValueError(f"Prior {name!r} and model heads {mc.k_min}..{mc.k_max} share no K.")
    # One K (only_k), or the K from train_k_from up: the heads that train.
    option, first = ("only_k", cfg.only_k) if cfg.only_k else ("train_k_from", cfg.train_k_from)
    if not first:
        return low, high
    if not low <= first <= high:
        raise ValueError(
            f"{option}={first} is outside the K that prior {name!r} and the model's heads "
            f"share ({low}..{high})."
        )
    return first, first if cfg.only_k else high


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
    >>> from transformer_gmm.training.config import parse_args
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
        model=sorted(MODEL_PRESETS),
        prior=sorted(PRIORS),
        scale_type=list(SCALE_TYPES),
        parameter_loss=sorted(PARAMETER_LOSSES),
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
