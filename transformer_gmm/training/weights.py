"""Which weights a training run starts from (``--init-from``, grown deeper or with more
heads if asked) and which it trains (all, or some K's own with ``--only-k`` and
``--train-k-from``)."""

from __future__ import annotations

import dataclasses

import torch

from ..nn import MixtureTransformer, ModelConfig
from ..nn.model import K_POSTERIOR_WEIGHTS, scale_width
from .config import TrainConfig


def load_initial_weights(model: MixtureTransformer, source: MixtureTransformer) -> None:
    """Copy ``source``'s weights into ``model``, which may have more blocks: each extra block is
    a copy of the last with its output projections zeroed, so the deeper model starts out
    computing exactly what the source did. A model with fewer blocks keeps evenly spaced
    ones of the source's, its first and last among them (see :func:`kept_blocks`): a
    cheaper backbone that fine-tuning brings back toward the source. A spherical source's
    scales become a "diag" or "full" model's (each coordinate's, or a diagonal Cholesky
    factor), so that model too starts out as the source. A model with more heads (a larger
    ``k_max``) starts each new head from the source's largest (see :func:`_grow_heads`), so
    that for every K the source has, it computes what the source did. A source's
    K-posterior and cluster-count heads are dropped: they read the backbone this run
    changes (``training.k_posterior`` trains them again). A model that reads gaps
    (``reads_gaps``) from a source that does not starts with their weights at zero: on
    complete data it computes what the source did.
    """
    have, want = source.config.n_layer, model.config.n_layer
    changeable = dict(n_layer=want)  # how it reads data (model.reading_config) is free too
    if model.config.k_max >= source.config.k_max:
        changeable["k_max"] = model.config.k_max
    if model.config.k_posterior_seeds == 0:  # the heads that read the old backbone go
        changeable["k_posterior_seeds"] = changeable["cluster_count_seeds"] = 0
    if source.config.scale_type == "spherical":
        changeable["scale_type"] = model.config.scale_type
    if not source.config.reads_gaps:
        changeable["reads_gaps"] = model.config.reads_gaps
    if dataclasses.replace(source.config, **changeable) != model.config:
        raise ValueError(
            f"init_from's model ({source.config}) does not fit this run's ({model.config}): "
            "only n_layer, k_max (upward), a spherical scale_type (to a wider one) and "
            "reads_gaps (from 0) may differ."
        )
    state = without_k_posterior(source.state_dict())
    if want < have:
        state = _with_blocks(state, kept_blocks(have, want))
        have = want
    if source.config.scale_type != model.config.scale_type:
        _widen_scales(state, model.config)
    if model.config.k_max > source.config.k_max:
        _grow_heads(state, source.config.k_max, model)
    if model.config.reads_gaps and not source.config.reads_gaps:
        state["readin_gaps.weight"] = torch.zeros_like(model.readin_gaps.weight)
    last = {k.split(".", 2)[2]: v for k, v in state.items() if k.startswith(f"blocks.{have - 1}.")}
    for index in range(have, want):
        for name, tensor in last.items():
            zeroed = name.startswith(("attn.proj.", "mlp.proj."))
            state[f"blocks.{index}.{name}"] = torch.zeros_like(tensor) if zeroed else tensor
    model.load_state_dict(state)


def kept_blocks(have: int, want: int) -> list[int]:
    """The indices of the ``want`` of ``have`` blocks a shallower model keeps: evenly
    spaced, the first and the last among them (the first reads the embedded rows, the
    last writes what the heads read)."""
    if want == 1:
        return [have - 1]
    return sorted({round(i * (have - 1) / (want - 1)) for i in range(want)})


def _with_blocks(state: dict[str, torch.Tensor], kept: list[int]) -> dict[str, torch.Tensor]:
    """``state`` with blocks ``kept`` alone, renumbered 0, 1, ..."""
    new_index = {old: new for new, old in enumerate(kept)}
    out = {}
    for name, tensor in state.items():
        if not name.startswith("blocks."):
            out[name] = tensor
            continue
        _, index, rest = name.split(".", 2)
        if int(index) in new_index:
            out[f"blocks.{new_index[int(index)]}.{rest}"] = tensor
    return out


def _grow_heads(state: dict[str, torch.Tensor], have: int, model: MixtureTransformer) -> None:
    """Heads and K-embedding rows, in ``state``, for the K from ``have + 1`` to ``model``'s
    ``k_max``: each a copy of K = ``have``'s, whose learned seeds (one per component) are
    the source head's ``have`` seeds followed by ``model``'s own freshly drawn ones (distinct
    seeds tell the new components apart)."""
    fresh = model.state_dict()
    embedding = state["k_embedding.weight"]  # (have - k_min + 1, d_model)
    extra = model.config.k_max - have
    state["k_embedding.weight"] = torch.cat([embedding, embedding[-1:].expand(extra, -1)])
    largest = {k.split(".", 2)[2]: v for k, v in state.items() if k.startswith(f"heads.{have}.")}
    for k in range(have + 1, model.config.k_max + 1):
        for name, tensor in largest.items():
            state[f"heads.{k}.{name}"] = tensor.clone()
        seeds = fresh[f"heads.{k}.seeds"]  # (k, d_model)
        state[f"heads.{k}.seeds"] = torch.cat([largest["seeds"], seeds[have:]])


def without_k_posterior(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` less the weights that read P(K | X) (the head and "K unknown")."""
    return {k: v for k, v in state.items() if not k.startswith(K_POSTERIOR_WEIGHTS)}


def param_groups(model: MixtureTransformer, cfg: TrainConfig) -> list[dict]:
    """The weights the optimizer updates: all, or with ``cfg.only_k`` that K's own, or with
    ``cfg.train_k_from`` those of every K from it up (the others frozen; the K embedding gets
    no weight decay, so other K's rows stay bit for bit).
    """
    if not cfg.only_k and not cfg.train_k_from:
        return [{"params": list(model.parameters())}]
    trained_k = [cfg.only_k] if cfg.only_k else range(cfg.train_k_from, model.config.k_max + 1)
    head = [p for k in trained_k for p in model.heads[str(k)].parameters()]
    trained = {id(p) for p in head} | {id(model.k_embedding.weight)}
    for parameter in model.parameters():
        parameter.requires_grad_(id(parameter) in trained)
    return [{"params": head}, {"params": [model.k_embedding.weight], "weight_decay": 0.0}]


def _widen_scales(state: dict[str, torch.Tensor], config: ModelConfig) -> None:
    """Each head's output rows for a spherical scale, in ``state``, become those of
    ``config.scale_type``: the one raw scale repeated on every coordinate (the diagonal,
    which comes first), and zeros for a full covariance's off-diagonal entries."""
    d_max = config.d_max
    for name in [k for k in state if k.startswith("heads.") and ".out." in k]:
        tensor = state[name]  # (1 + d_max + 1, ...): weight logit, means, raw scale
        head, raw_scale = tensor[: 1 + d_max], tensor[1 + d_max :]
        off_diagonal = tensor.new_zeros(scale_width(config) - d_max, *tensor.shape[1:])
        state[name] = torch.cat([head, raw_scale.expand(d_max, *tensor.shape[1:]), off_diagonal])
