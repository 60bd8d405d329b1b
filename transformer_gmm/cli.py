"""The ``transformer-gmm`` command: list, inspect, download and export checkpoints.

::

    transformer-gmm list                          bundled and cached checkpoints
    transformer-gmm info default                  a checkpoint's summary and model card
    transformer-gmm download org/name [--to DIR]  into the Hugging Face cache, or a folder
    transformer-gmm export SOURCE --to DIR        a checkpoint, as a folder ready to upload
    transformer-gmm export --preset small --to DIR  an untrained model, to train yourself

Also ``python -m transformer_gmm``. PyTorch and huggingface_hub are imported only by the
commands that need them, so ``--help`` and usage errors answer at once.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import textwrap
from pathlib import Path

DOWNLOAD_HINT = "transformer-gmm download org/name"


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 1 error, 2 usage).

    Parameters
    ----------
    argv : list of str, optional
        The arguments after the program name; by default ``sys.argv[1:]``.

    Returns
    -------
    status : int
        0 on success, 1 on an error (printed to stderr), 2 on a usage error.

    Examples
    --------
    >>> main(["list", "--help"])  # doctest: +ELLIPSIS
    usage: transformer-gmm list ...
    0

    Write an untrained model from the "tiny" preset to a folder:

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     main(["export", "--preset", "tiny", "--to", tmp + "/tiny"])  # doctest: +ELLIPSIS
    Exported an untrained model from preset 'tiny' (seed 0) to .../tiny
    ...
    0
    """
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # --help and usage errors: return the code, don't exit
        return int(exit_.code or 0)
    from .storage.format import CheckpointError

    try:
        return args.run(args)
    except BrokenPipeError:  # `transformer-gmm info x | head` stopped reading: not an error
        # As the Python docs advise: point stdout at devnull so the exit flush stays quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (CheckpointError, ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1


def _parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(
        prog="transformer-gmm",
        description="Checkpoints for transformer_gmm: list, inspect, download and export them.",
        epilog="Hub checkpoints go to the Hugging Face cache; HF_HOME, HF_HUB_CACHE, "
        "HF_HUB_OFFLINE, HF_ENDPOINT and HF_TOKEN apply as for any Hugging Face library.",
    )
    parser.add_argument("--version", action="version", version=f"transformer_gmm {__version__}")
    commands = parser.add_subparsers(title="commands", required=True, metavar="COMMAND")

    list_ = commands.add_parser(
        "list", help="bundled and cached checkpoints, with their K range, d_max, size, source"
    )
    list_.add_argument("--cache-dir", help="Hugging Face cache to list (default: HF_HUB_CACHE)")
    list_.set_defaults(run=_list)

    info = commands.add_parser("info", help="a checkpoint's summary (--full: its model card)")
    info.add_argument("checkpoint", help="bundled name, local folder, or Hub id org/name[@rev]")
    info.add_argument("--full", action="store_true", help="print the whole model card")
    info.set_defaults(run=_info)

    download = commands.add_parser(
        "download", help="download a Hub checkpoint into the cache, or into a folder (--to)"
    )
    download.add_argument("repo_id", help="Hub id org/name or org/name@revision")
    download.add_argument("--revision", help="branch, tag or commit hash (or use org/name@rev)")
    download.add_argument("--to", metavar="FOLDER", help="download into FOLDER, not the cache")
    download.add_argument("--force", action="store_true", help="download again even if cached")
    download.add_argument("--token", help="Hugging Face token (default: HF_TOKEN or login)")
    download.set_defaults(run=_download)

    export = commands.add_parser(
        "export",
        help="write a checkpoint folder ready for the Hub: a copy of SOURCE, or an untrained "
        "model from a preset",
        description="Write config.json, model.safetensors and README.md to FOLDER. The folder "
        "loads through checkpoint='FOLDER' and uploads with `hf upload org/name FOLDER`.",
    )
    export.add_argument(
        "source", nargs="?", help="checkpoint to copy: bundled name, local folder, or Hub id"
    )
    export.add_argument("--to", metavar="FOLDER", required=True, help="folder to write")
    export.add_argument(
        "--preset", help="instead of SOURCE: a freshly initialised model (tiny, small, base)"
    )
    export.add_argument(
        "--set",
        metavar="FIELD=VALUE",
        action="append",
        default=[],
        help="with --preset: change a config field, e.g. --set k_max=16 (repeatable)",
    )
    export.add_argument("--seed", type=int, default=0, help="with --preset: the init seed")
    export.add_argument("--card", metavar="FILE", help="use FILE as the model card (README.md)")
    export.add_argument("--force", action="store_true", help="write into a non-empty FOLDER")
    export.set_defaults(run=_export)
    return parser


# --- list ----------------------------------------------------------------------------------


def _list(args: argparse.Namespace) -> int:
    from . import __version__
    from .storage import hub
    from .storage.cache import cached_checkpoints
    from .storage.checkpoints import bundled_checkpoints

    rows = []
    for name, folder in bundled_checkpoints().items():
        rows.append([name, *_describe(folder), _folder_size(folder), "bundled"])
    cache = Path(args.cache_dir) if args.cache_dir else hub.cache_dir()
    for cached in cached_checkpoints(cache):
        source = f"Hub cache, revision {cached.commit_hash[:12]}"
        if not (cached.folder / "model.safetensors").is_file():  # only `info` fetched it
            source += " (weights not downloaded yet)"
        rows.append([cached.name, *_describe(cached.folder), cached.size, source])
    if rows:
        header = ["CHECKPOINT", "K", "D_MAX", "SIZE", "SOURCE"]
        table = [header] + [[*row[:3], _human_size(row[3]), row[4]] for row in rows]
        widths = [max(len(str(row[i])) for row in table) for i in range(len(header))]
        for row in table:
            cells = (str(cell).ljust(width) for cell, width in zip(row, widths, strict=True))
            print("  ".join(cells).rstrip())
        print()
    if not bundled_checkpoints():
        print(
            _wrap(
                f"No checkpoint is bundled with transformer_gmm {__version__}: "
                "checkpoint='default' falls back to EM (see `transformer-gmm info default`)."
            ).lstrip()
        )
    if not any(row[4] != "bundled" for row in rows):
        print(
            _wrap(
                f"No transformer_gmm checkpoint in the Hugging Face cache ({cache}). Fetch one "
                f"with `{DOWNLOAD_HINT}`, or use checkpoint='org/name' in an estimator."
            ).lstrip()
        )
    else:
        print(f"Cache: {cache}. Pass the CHECKPOINT column as checkpoint=.")
    return 0


def _describe(folder: Path) -> list[str]:
    """[K range, d_max] of a checkpoint, or '?' for a config this version cannot read."""
    from .storage.format import CheckpointError, read_config

    try:
        config = read_config(folder)
    except CheckpointError:
        return ["?", "?"]
    return [f"{config.k_min}..{config.k_max}", str(config.d_max)]


def _folder_size(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.iterdir() if path.is_file())


def _human_size(size: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    raise AssertionError("unreachable")


# --- info ----------------------------------------------------------------------------------


def _info(args: argparse.Namespace) -> int:
    from .storage import hub
    from .storage.checkpoints import DEFAULT_CHECKPOINT, bundled_checkpoints, parse_hub_id
    from .storage.format import CARD_FILE, CONFIG_FILE, WEIGHTS_FILE

    name = args.checkpoint
    bundled = bundled_checkpoints()
    if name == DEFAULT_CHECKPOINT and name not in bundled:
        print(_no_default_message())
        return 0
    if name in bundled:
        folder, source = bundled[name], "bundled with transformer_gmm"
    elif Path(name).expanduser().is_dir():
        folder, source = Path(name).expanduser(), "local folder"
    elif parse_hub_id(name) is not None:
        repo_id, revision = parse_hub_id(name)
        # Only the config and the card: no need to download the weights to describe them.
        folder = hub.download(repo_id, revision, files=(CONFIG_FILE, CARD_FILE))
        source = f"Hugging Face Hub, {hub.spec(repo_id, revision)}"
    else:
        from .storage.checkpoints import resolve_checkpoint

        resolve_checkpoint(name)  # raises the error that lists what checkpoint= accepts
        return 1
    print(_summary(name, folder, source))
    if source == "local folder" and not (folder / WEIGHTS_FILE).is_file():
        # A Hub checkpoint gets its weights at first use; a folder never will.
        print(
            "\n"
            + _wrap(
                f"This folder cannot be used: it has no {WEIGHTS_FILE}, so fitting with "
                f"checkpoint={name!r} raises CheckpointError. Copy the weights file beside "
                f"{CONFIG_FILE}, or name a bundled checkpoint or a Hub id."
            ),
            file=sys.stderr,
        )
        return 1
    card = folder / CARD_FILE
    print()
    if not card.is_file():
        print(f"(no model card: {card} is missing)")
    elif args.full:
        print(card.read_text(encoding="utf-8").rstrip())
    else:
        text = card.read_text(encoding="utf-8")
        print(_card_summary(text))
        print(f"\nThe whole model card ({len(text.splitlines())} lines): {card}, or "
              f"`transformer-gmm info {name} --full`.")
    return 0


def _card_summary(card: str, sentences: int = 2) -> str:
    """A model card's title and the first sentences of its first paragraph, wrapped."""
    lines = card.splitlines()
    if lines and lines[0].strip() == "---":  # YAML front matter, for the Hub
        end = next((i for i, line in enumerate(lines[1:], 1) if line.strip() == "---"), 0)
        lines = lines[end + 1 :]
    paragraphs = [p.strip() for p in "\n".join(lines).split("\n\n") if p.strip()]
    title = next((p for p in paragraphs if p.startswith("#")), "")
    prose = next((p for p in paragraphs if not p.startswith(("#", "|", "```"))), "")
    first = " ".join(re.split(r"(?<=[.!?])\s+", " ".join(prose.split()))[:sentences])
    return "\n".join(part for part in (title, _wrap(first) if first else "") if part)


def _summary(name: str, folder: Path, source: str) -> str:
    from .storage.format import WEIGHTS_FILE, read_config, read_reading_config

    config, reading = read_config(folder), read_reading_config(folder)
    weights = folder / WEIGHTS_FILE
    if weights.is_file():
        size = f"{_human_size(weights.stat().st_size)} of weights"
    elif source == "local folder":
        size = f"no weights ({WEIGHTS_FILE} is missing)"
    else:
        size = "weights not downloaded yet (they come with the first use)"
    both = {**config.to_dict(), **reading.to_dict()}
    fields = ", ".join(f"{key}={value}" for key, value in both.items())
    return "\n".join(
        [
            f"Checkpoint:  {name}",
            f"Source:      {source}",
            f"Folder:      {folder}",
            f"Components:  K = {config.k_min}..{config.k_max} (a readout head for each)",
            f"Input:       up to {config.d_max} features (more are projected), "
            f"{reading.context_size} points per forward pass (more are subsampled)",
            f"Parameters:  {_n_parameters(config):,}; {size}",
            f"Config:      {fields}",
        ]
    )


def _n_parameters(config) -> int:
    import torch

    from .nn import MixtureTransformer

    with torch.device("meta"):  # shapes only: nothing is allocated or initialised
        return sum(p.numel() for p in MixtureTransformer(config).parameters())


def _no_default_message() -> str:
    from . import __version__

    paragraphs = [
        f"No default checkpoint is bundled with transformer_gmm {__version__}.",
        "TransformerGMM and TransformerClusterer with checkpoint='default' (the default) fall "
        "back to EM from k-means++ initialisation, as scikit-learn's GaussianMixture does, "
        "and say so with a FallbackWarning; checkpoint=None chooses that fallback silently.",
        "To use a transformer:",
        f"- a checkpoint on the Hugging Face Hub: `{DOWNLOAD_HINT}`, then checkpoint='org/name' "
        "(or pass the id directly: it is downloaded on first use and cached);",
        "- a checkpoint folder you have: checkpoint='path/to/folder';",
        "- your own: `transformer-gmm export --preset small --to my-model` writes an untrained "
        "model to train (see docs/checkpoints.md).",
        "`transformer-gmm list` shows the checkpoints on this machine.",
    ]
    return "\n".join(_wrap(paragraph) for paragraph in paragraphs).lstrip()


def _wrap(paragraph: str) -> str:
    """Fill to 88 columns: prose after a blank line, a '- ' item with a hanging indent.

    A `command` is never split across lines, so it can be copied as it is.
    """
    glued = re.sub(r"`[^`]*`", lambda m: m[0].replace(" ", "\0"), paragraph)
    if paragraph.startswith("- "):
        text = textwrap.fill(glued, width=88, subsequent_indent="  ", break_on_hyphens=False)
    else:
        text = "\n" + textwrap.fill(glued, width=88, break_on_hyphens=False)
    return text.replace("\0", " ")


# --- download ------------------------------------------------------------------------------


def _download(args: argparse.Namespace) -> int:
    from .storage import hub
    from .storage.checkpoints import parse_hub_id
    from .storage.format import CheckpointError, read_checkpoint

    parsed = parse_hub_id(args.repo_id)
    if parsed is None:
        raise CheckpointError(f"{args.repo_id!r} is not a Hub id: expected org/name[@revision].")
    repo_id, revision = parsed
    if revision and args.revision and revision != args.revision:
        raise CheckpointError(f"Two revisions given: @{revision} and --revision {args.revision}.")
    revision = revision or args.revision
    folder = hub.download(
        repo_id, revision, local_dir=args.to, force_download=args.force, token=args.token
    )
    read_checkpoint(folder)  # strict: a download that would not load is reported now
    name = hub.spec(repo_id, revision)
    where = "the Hugging Face cache" if args.to is None else "a folder"
    print(f"Downloaded {name} to {where}: {folder}")
    print(_summary(name, folder, f"Hugging Face Hub, {name}"))
    use = name if args.to is None else args.to
    print(f"\nUse it with: TransformerGMM(n_components=..., checkpoint={use!r})")
    if args.to is None:
        print("It now loads offline too (HF_HUB_OFFLINE=1).")
    return 0


# --- export --------------------------------------------------------------------------------


def _export(args: argparse.Namespace) -> int:
    from .storage.checkpoints import export_checkpoint
    from .storage.format import CheckpointError

    if (args.source is None) == (args.preset is None):
        raise CheckpointError(
            "export needs exactly one source: a checkpoint to copy (transformer-gmm export "
            "org/name --to FOLDER) or a preset (transformer-gmm export --preset small --to FOLDER)."
        )
    if args.set and args.preset is None:
        raise CheckpointError("--set changes a preset's config: use it with --preset.")
    folder = Path(args.to)
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())) and not args.force:
        raise CheckpointError(
            f"{folder} exists and is not empty: choose a new folder, or pass --force to "
            "overwrite its checkpoint files."
        )
    card = Path(args.card).read_text(encoding="utf-8") if args.card else None
    if args.preset is not None:
        model = _preset_model(args.preset, args.set, args.seed)
        folder = _save_untrained(model, folder, args.preset, args.seed, card)
        what = f"an untrained model from preset {args.preset!r} (seed {args.seed})"
    else:
        folder = export_checkpoint(args.source, folder, model_card=card)
        what = f"checkpoint {args.source!r}"
    print(f"Exported {what} to {folder}")
    print(f"Load it with:   TransformerGMM(n_components=..., checkpoint={str(folder)!r})")
    print(f"Upload it with: hf upload <org>/<name> {folder}   (after `hf auth login`)")
    return 0


def _preset_model(preset: str, assignments: list[str], seed: int):
    import torch

    from .nn import MixtureTransformer, ReadingConfig, config_from_preset, reading_from_preset

    overrides = {}
    for assignment in assignments:
        field, sep, value = assignment.partition("=")
        if not sep:
            raise ValueError(f"--set expects FIELD=VALUE, got {assignment!r}.")
        overrides[field.strip()] = int(value) if value.strip().isdigit() else value.strip()
    # --set takes the fields of both configs: how the model reads data goes to its
    # reading_config.
    reading_names = set(ReadingConfig.__dataclass_fields__)
    reading = reading_from_preset(
        preset, **{k: v for k, v in overrides.items() if k in reading_names}
    )
    config = config_from_preset(
        preset, **{k: v for k, v in overrides.items() if k not in reading_names}
    )
    torch.manual_seed(seed)  # the same preset and seed give the same weights
    return MixtureTransformer(config, reading)


def _save_untrained(model, folder: Path, preset: str, seed: int, card: str | None) -> Path:
    from .storage.format import default_model_card, save_checkpoint

    if card is None:
        note = (
            f"**Untrained**: initialised from preset `{preset}` with seed {seed}. Its estimates "
            "are random, so EM does all the work until you train it; replace this note with "
            "how it was trained before you publish it."
        )
        card = default_model_card(model.config, note=note, reading_config=model.reading_config)
    return save_checkpoint(model, folder, model_card=card)
