"""Which weights a training run starts from (``--init-from``, grown deeper if asked) and
which it trains (all, or one K's own with ``--only-k``)."""

from __future__ import annotations

import dataclasses

import torch

from ..nn import MixtureTransformer, ModelConfig
from ..nn.model import K_POSTERIOR_WEIGHTS, scale_width
from .config import TrainConfig


def load_initial_weights(model: MixtureTransformer, source: MixtureTransformer) -> None:
    """Copy ``source``'s weights into ``model``, which may have more blocks: each extra block is
    a copy of the last with its output projections zeroed, so the deeper model starts out
    computing exactly what the source did; a spherical source's scales become a "diag" or
    "full" model's (each coordinate's, or a diagonal Cholesky factor), so that model too
    starts out as the source. A source's K-posterior head is dropped: it reads the
    backbone this run changes (``training.k_posterior`` trains one again).
    """
    have, want = source.config.n_layer, model.config.n_layer
    changeable = dict(n_layer=want, noise_directions=model.config.noise_directions)
    if model.config.k_posterior_seeds == 0:
        changeable["k_posterior_seeds"] = 0
    if source.config.scale_type == "spherical":
        changeable["scale_type"] = model.config.scale_type
    if dataclasses.replace(source.config, **changeable) != model.config or want < have:
        raise ValueError(
            f"init_from's model ({source.config}) does not fit this run's ({model.config}): "
            "only n_layer (upward), noise_directions and a spherical scale_type (to a "
            "wider one) may differ."
        )
    state = without_k_posterior(source.state_dict())
    if source.config.scale_type != model.config.scale_type:
        _widen_scales(state, model.config)
    last = {k.split(".", 2)[2]: v for k, v in state.items() if k.startswith(f"blocks.{have - 1}.")}
    for index in range(have, want):
        for name, tensor in last.items():
            zeroed = name.startswith(("attn.proj.", "mlp.proj."))
            state[f"blocks.{index}.{name}"] = torch.zeros_like(tensor) if zeroed else tensor
    model.load_state_dict(state)


def without_k_posterior(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` less the weights that read P(K | X) (the head and "K unknown")."""
    return {k: v for k, v in state.items() if not k.startswith(K_POSTERIOR_WEIGHTS)}


def param_groups(model: MixtureTransformer, cfg: TrainConfig) -> list[dict]:
    """The weights the optimizer updates: all, or with ``cfg.only_k`` that K's own (the others
    frozen; the K embedding gets no weight decay, so other K's rows stay bit for bit).
    """
    if not cfg.only_k:
        return [{"params": list(model.parameters())}]
    head = list(model.heads[str(cfg.only_k)].parameters())
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
