"""The mixture transformer: reads a set of points, writes a Gaussian mixture and labels.

Read top to bottom: attention, MLP, block, the per-K readout head, the head that reads
the number of components, then the model.

The points are read as a SET: there are no positional embeddings and no causal mask, so
pooled outputs (weights, means, scales) are invariant and per-point outputs (point_logits)
are equivariant under permuting the rows. Padded rows (``mask`` False) are never used as
keys, so they influence nothing.

References: Chen, Wu & Fang 2025 (TGMM: shared backbone, an embedding of K, per-K
attentive-pooling readouts); Lee et al. 2019 (Set Transformer: pooling by multi-head
attention with K learned seeds); He et al. 2025 (per-point cluster labels).
"""

from __future__ import annotations

import math
import numbers
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import ModelConfig, ReadingConfig

# Smallest standard deviation the model can output, in standardized units (the data has
# std 1). It keeps the Gaussian likelihood bounded: a zero-width component on one point
# would have infinite density.
MIN_SCALE = 1e-3


# The names of the weights that read P(K | X) (prefixes of state-dict keys): the K-posterior
# head and the "K unknown" task embedding. Training adds them onto a trained backbone, and
# fine-tuning the backbone leaves them behind.
K_POSTERIOR_WEIGHTS = ("k_unknown", "k_posterior_head", "cluster_count_head")


def is_skeleton() -> bool:
    """Whether modules are being built under ``torch.device("meta")``: a skeleton that a
    checkpoint's weights are loaded into. It holds no values, so none are drawn: drawing
    random values on the meta device imports torch's compiler and sympy, most of a second
    of a process's first fit."""
    return torch.empty(0).is_meta


def standard_normal(*shape: int) -> Tensor:
    """``torch.randn(shape)``, or, in a skeleton, an empty tensor of that shape."""
    return torch.empty(shape) if is_skeleton() else torch.randn(shape)


class Linear(nn.Linear):
    """``nn.Linear``, whose initial values are not drawn in a skeleton (see
    :func:`is_skeleton`; elsewhere they are ``nn.Linear``'s own draws)."""

    def reset_parameters(self) -> None:
        if not is_skeleton():
            super().reset_parameters()


class MixtureOutput(NamedTuple):
    """What one forward pass returns; component k and cluster label k are the same slot.

    :meth:`MixtureTransformer.forward` shows one.
    """

    log_weights: Tensor  # (B, K) log mixing weights, for training losses
    weights: Tensor  # (B, K) mixing weights, summing to 1
    means: Tensor  # (B, K, d_max)
    # (B, K, 1) spherical or (B, K, d_max) diag: positive standard deviations; or
    # (B, K, d_max, d_max) full: lower Cholesky factors L of the covariances L @ L.mT
    scales: Tensor
    point_logits: Tensor  # (B, N, K) cluster logits; rows where mask is False are meaningless


class Attention(nn.Module):
    """Multi-head attention of queries over keys/values, masking padded keys."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.q = Linear(config.d_model, config.d_model)
        self.kv = Linear(config.d_model, 2 * config.d_model)
        self.proj = Linear(config.d_model, config.d_model)

    def forward(self, x_q: Tensor, x_kv: Tensor, key_mask: Tensor | None) -> Tensor:
        """Attend from ``x_q`` (B, L, D) over ``x_kv`` (B, N, D); returns (B, L, D).

        ``key_mask`` (B, N) is bool (True: the key takes part) or float: each key's log
        multiplicity, added to its logits (-inf: no part), so a key of weight w counts as w
        copies of itself (see :meth:`MixtureTransformer.forward`)."""
        B, L, D = x_q.shape
        N = x_kv.shape[1]
        H = self.n_head
        q = self.q(x_q).view(B, L, H, D // H).transpose(1, 2)  # (B, H, L, hd)
        k, v = self.kv(x_kv).split(D, dim=-1)  # (B, N, D) each
        k = k.view(B, N, H, D // H).transpose(1, 2)  # (B, H, N, hd)
        v = v.view(B, N, H, D // H).transpose(1, 2)  # (B, H, N, hd)
        # Bool: True = this key takes part; float: added to the logits. Broadcast over heads
        # and queries.
        attn_mask = None
        if key_mask is not None:
            attn_mask = key_mask[:, None, None, :]  # (B, 1, 1, N)
            if attn_mask.is_floating_point():
                attn_mask = attn_mask.to(q.dtype)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)  # (B, H, L, hd)
        y = y.transpose(1, 2).reshape(B, L, D)  # (B, L, D)
        return self.proj(y)


class MLP(nn.Module):
    """The feed-forward part of a block: Linear, GELU, Linear, back to ``d_model``."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.fc = Linear(config.d_model, config.mlp_ratio * config.d_model)
        self.proj = Linear(config.mlp_ratio * config.d_model, config.d_model)

    def forward(self, x: Tensor) -> Tensor:
        """Apply the MLP to the last dimension of ``x`` (..., D); returns (..., D)."""
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    """Pre-LayerNorm transformer block: self-attention over the set, then an MLP."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.d_model)
        self.attn = Attention(config)
        self.ln_2 = nn.LayerNorm(config.d_model)
        self.mlp = MLP(config)

    def forward(self, x: Tensor, key_mask: Tensor | None) -> Tensor:
        """Update the tokens ``x`` (B, N, D); ``key_mask`` (B, N) marks the real points."""
        h = self.ln_1(x)
        x = x + self.attn(h, h, key_mask)
        x = x + self.mlp(self.ln_2(x))
        return x


def scale_width(config: ModelConfig) -> int:
    """Raw scale outputs per slot: 1 (spherical), d_max (diag), or d_max (d_max + 1) / 2
    (full: the diagonal of a Cholesky factor, then its strictly lower entries)."""
    d = config.d_max
    return {"spherical": 1, "diag": d, "full": d * (d + 1) // 2}[config.scale_type]


class ReadoutHead(nn.Module):
    """Readout for one K: Set Transformer's PMA with K learned seeds, then per-slot params.

    Each seed cross-attends over the point tokens and becomes one slot = one component.
    The same slots score every point for the per-point cluster logits, so label k and
    component k agree by construction.
    """

    def __init__(self, config: ModelConfig, n_components: int) -> None:
        super().__init__()
        d = config.d_model
        scale_dim = scale_width(config)
        # Distinct random seeds break the symmetry between slots; unit scale matches the
        # LayerNorm'd tokens they attend over.
        self.seeds = nn.Parameter(standard_normal(n_components, d))
        self.attn = Attention(config)
        self.ln = nn.LayerNorm(d)
        # A small MLP per slot: width d, not mlp_ratio * d, as there is one head per K.
        self.fc = Linear(d, d)
        self.out = Linear(d, 1 + config.d_max + scale_dim)  # weight logit, mean, raw scale
        self.point_proj = Linear(d, d, bias=False)
        self.slot_proj = Linear(d, d, bias=False)

    def forward(self, tokens: Tensor, key_mask: Tensor | None) -> tuple[Tensor, Tensor]:
        """Raw slot outputs (B, K, 1 + d_max + scale_dim) and point logits (B, N, K)."""
        B, N, D = tokens.shape
        slots = self.seeds.expand(B, -1, -1)  # (B, K, D)
        slots = slots + self.attn(slots, tokens, key_mask)  # masked pooling over points
        slots = self.ln(slots)  # (B, K, D)
        raw = self.out(F.gelu(self.fc(slots)))  # (B, K, 1 + d_max + scale_dim)
        points = self.point_proj(tokens)  # (B, N, D)
        keys = self.slot_proj(slots)  # (B, K, D)
        point_logits = points @ keys.transpose(1, 2) / math.sqrt(D)  # (B, N, K)
        return raw, point_logits


class KPosteriorHead(nn.Module):
    """P(K | X) for K = 1..k_max, read from tokens computed under the "K unknown" embedding.

    A block of its own lets the head rework the shared backbone's tokens; then a few learned
    seeds pool them (as in :class:`ReadoutHead`), and an MLP reads the pooled slots together
    and scores each K (Cluster-PFN, Bhaskaran & Viering 2025).
    """

    def __init__(self, config: ModelConfig, n_seeds: int | None = None) -> None:
        super().__init__()
        d = config.d_model
        n_seeds = config.k_posterior_seeds if n_seeds is None else n_seeds
        self.block = Block(config)
        self.ln_f = nn.LayerNorm(d)
        self.seeds = nn.Parameter(standard_normal(n_seeds, d))
        self.attn = Attention(config)
        self.ln = nn.LayerNorm(d)
        self.fc = Linear(n_seeds * d, d)
        self.out = Linear(d, config.k_max)  # logits of K = 1..k_max

    def forward(self, tokens: Tensor, key_mask: Tensor | None) -> Tensor:
        """Log-probabilities (B, k_max) of K = 1..k_max for tokens (B, N, D)."""
        B = tokens.shape[0]
        tokens = self.ln_f(self.block(tokens, key_mask))  # (B, N, D)
        slots = self.seeds.expand(B, -1, -1)  # (B, S, D)
        slots = self.ln(slots + self.attn(slots, tokens, key_mask))  # (B, S, D)
        logits = self.out(F.gelu(self.fc(slots.flatten(1))))  # (B, k_max)
        return logits.log_softmax(dim=-1)


def _parse(raw: Tensor, point_logits: Tensor, d_max: int, scale_type: str) -> MixtureOutput:
    """Every output constraint, in one place."""
    logits, means, raw_scales = raw.split([1, d_max, raw.shape[-1] - 1 - d_max], dim=-1)
    log_weights = logits.squeeze(-1).log_softmax(dim=-1)  # (B, K)
    raw_diag = raw_scales[..., :d_max] if scale_type == "full" else raw_scales
    # softplus + floor, not exp: the 1 / scale**2 in a Gaussian NLL is then bounded by
    # 1 / MIN_SCALE**2 without a clamp (which would zero the gradient outside its range),
    # and the scale grows only linearly with the raw output, so one wild output cannot
    # overflow float32. softplus(0) ~ 0.69: an untrained model starts at a moderate width.
    scales = F.softplus(raw_diag) + MIN_SCALE  # (B, K, 1 | d_max)
    if scale_type == "full":
        # L = diag(scales) + strictly lower entries: a valid Cholesky factor for any output.
        rows, cols = torch.tril_indices(d_max, d_max, offset=-1, device=raw.device)
        lower = raw.new_zeros(*raw.shape[:-1], d_max, d_max)  # (B, K, d_max, d_max)
        lower[..., rows, cols] = raw_scales[..., d_max:]
        scales = lower + torch.diag_embed(scales)  # (B, K, d_max, d_max)
    return MixtureOutput(log_weights, log_weights.exp(), means, scales, point_logits)


class MixtureTransformer(nn.Module):
    """Shared set-transformer backbone with one readout head per number of components K.

    Save, load and publish it with :mod:`transformer_gmm.storage`
    (``save_checkpoint``, ``load_checkpoint``, ``push_to_hub``).

    Parameters
    ----------
    config : ModelConfig
        The model's shape; it fixes every weight's shape.
    reading_config : ReadingConfig, default=None
        How a fit shows the model a dataset (``ReadingConfig()`` if None); kept as
        ``reading_config`` for the fit and the checkpoint, never read by the forward pass.

    Examples
    --------
    >>> import torch
    >>> from transformer_gmm.nn import MixtureTransformer, config_from_preset
    >>> model = MixtureTransformer(config_from_preset("tiny"))  # d_max=4, K from 2 to 4
    >>> model.supported_n_components, model.has_head(3), model.has_head(5)
    (range(2, 5), True, False)
    >>> model(torch.randn(1, 50, 4), n_components=2).means.shape
    torch.Size([1, 2, 4])
    """

    def __init__(
        self, config: ModelConfig, reading_config: ReadingConfig | None = None
    ) -> None:
        super().__init__()
        self.config = config
        self.reading_config = ReadingConfig() if reading_config is None else reading_config
        skeleton = is_skeleton()  # no values to draw (is_skeleton)
        self.readin = Linear(config.d_max, config.d_model)
        if config.reads_gaps:
            # Each point's share of each coordinate that was missing, added to its token.
            self.readin_gaps = Linear(config.d_max, config.d_model, bias=False)
        n_k = config.k_max - config.k_min + 1
        self.k_embedding = nn.Embedding(
            n_k, config.d_model, _weight=torch.empty(n_k, config.d_model) if skeleton else None
        )
        self.blocks = nn.ModuleList([Block(config) for _ in range(config.n_layer)])
        self.ln_f = nn.LayerNorm(config.d_model)
        self.heads = nn.ModuleDict(
            {str(k): ReadoutHead(config, k) for k in self.supported_n_components}
        )
        if config.k_posterior_seeds:
            # The task embedding of "K unknown", beside those of each K.
            self.k_unknown = nn.Parameter(torch.zeros(config.d_model))
            self.k_posterior_head = KPosteriorHead(config)
        if config.cluster_count_seeds:
            # The same head's shape, reading the same tokens: how many clusters, of any
            # shape, where K counts Gaussian components.
            self.cluster_count_head = KPosteriorHead(config, config.cluster_count_seeds)
        if not skeleton:
            self._init_parameters()

    def _init_parameters(self) -> None:
        """nanoGPT's initialization: normal weights of standard deviation 0.02, zero biases."""
        config = self.config
        self.apply(self._init_weights)
        # nanoGPT: scale the projections that write into the residual stream by the depth,
        # so the stream's variance does not grow with n_layer.
        for block in self.blocks:
            for proj in (block.attn.proj, block.mlp.proj):
                nn.init.normal_(proj.weight, std=0.02 / math.sqrt(2 * config.n_layer))
        if config.reads_gaps:
            # Zero: complete data read as by a model without the channel, so fine-tuning a
            # model that lacks it starts from exactly what it computed.
            nn.init.zeros_(self.readin_gaps.weight)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=0.02)

    @property
    def has_k_posterior(self) -> bool:
        """Whether the model reads P(K | X) (:meth:`k_log_posterior`)."""
        return self.config.k_posterior_seeds > 0

    @property
    def has_cluster_count(self) -> bool:
        """Whether the model reads how many clusters the data hold
        (:meth:`cluster_count_log_posterior`)."""
        return self.config.cluster_count_seeds > 0

    @property
    def supported_n_components(self) -> range:
        """The K this model has a readout head for, ``range(k_min, k_max + 1)``."""
        return range(self.config.k_min, self.config.k_max + 1)

    def freeze(self) -> MixtureTransformer:
        """This model, in place, for inference alone: eval mode, no gradients, and each
        linear layer's weight (out, in) held as the transpose of an (in, out) array. The
        values are the same; MKL multiplies a few dozen rows (a dataset read as cells) by
        a weight in that layout faster, so products round differently in the last bits
        (docs/performance.md, "Weights laid out for few rows"). Returns the model.

        Examples
        --------
        >>> from transformer_gmm.nn import MixtureTransformer, config_from_preset
        >>> model = MixtureTransformer(config_from_preset("tiny")).freeze()
        >>> model.training, model.readin.weight.requires_grad, model.readin.weight.stride()
        (False, False, (1, 16))
        """
        for module in self.modules():
            if isinstance(module, nn.Linear):
                module.weight = nn.Parameter(module.weight.detach().mT.contiguous().mT)
        return self.eval().requires_grad_(False)

    def has_head(self, n_components: int) -> bool:
        """Whether the model has a readout head for ``n_components`` (an int).

        Parameters
        ----------
        n_components : int
            The number of components K.

        Returns
        -------
        bool
            True when K is an integer (not ``3.0``) in :attr:`supported_n_components`.
        """
        # Integral only: `2.0 in range(2, 5)` is True, but there is no head "2.0".
        is_int = isinstance(n_components, numbers.Integral) and not isinstance(n_components, bool)
        return is_int and n_components in self.supported_n_components

    def forward(
        self,
        x: Tensor,
        n_components: int,
        mask: Tensor | None = None,
        gaps: Tensor | None = None,
        weights: Tensor | None = None,
    ) -> MixtureOutput:
        """Mixture estimate for each dataset in the batch.

        Parameters
        ----------
        x : Tensor of shape (B, N, d_max)
            Standardized points, zero-padded to d_max coordinates.
        n_components : int
            K, the number of components to estimate.
        mask : bool Tensor of shape (B, N), optional
            True for real points, False for padding rows (datasets of different sizes).
        gaps : Tensor of shape (B, N, d_max), optional
            For a model that reads gaps (``config.reads_gaps``): each point's share, in
            [0, 1], of each coordinate that was missing (filled) in the data; None: none.
        weights : Tensor of shape (B, N), optional
            Each point's multiplicity (non-negative; zero: not read): the set is read as
            if a point of weight w were there w times. Softmax attention over w copies of
            a key is attention over the key with log w added to its logits, and every other
            step is per point, so this is exact, and a weighted summary of many rows
            (centres with counts) reads as the rows it summarizes. Scaling every weight of
            a dataset by one constant changes nothing.

        Returns
        -------
        MixtureOutput
            Weights, means and scales of K components (in the standardized space), and each
            point's cluster logits.

        Examples
        --------
        >>> import torch
        >>> from transformer_gmm.nn import MixtureTransformer, config_from_preset
        >>> model = MixtureTransformer(config_from_preset("tiny"))
        >>> x = torch.randn(2, 40, 4)
        >>> mask = torch.ones(2, 40, dtype=torch.bool)
        >>> mask[1, 25:] = False  # the second dataset has only 25 points
        >>> out = model(x, n_components=3, mask=mask)
        >>> out.weights.shape, out.means.shape, out.scales.shape, out.point_logits.shape
        (torch.Size([2, 3]), torch.Size([2, 3, 4]), torch.Size([2, 3, 1]), torch.Size([2, 40, 3]))
        >>> torch.allclose(out.weights.sum(-1), torch.ones(2))
        True
        """
        self._check_inputs(x, n_components, mask, gaps, weights)
        k_embedding = self.k_embedding.weight[n_components - self.config.k_min]  # (D,)
        h, mask = self._tokens(x, k_embedding, mask, gaps, weights)  # (B, N, D)
        return self.read_out(h, n_components, mask)

    def read_out(
        self, tokens: Tensor, n_components: int, mask: Tensor | None = None
    ) -> MixtureOutput:
        """The readout head of ``n_components`` on the backbone's tokens (B, N, D).

        :meth:`forward` reads the tokens of K's own embedding; the tokens of the "K
        unknown" embedding (:meth:`k_unknown_tokens`) read as well, so one pass gives
        P(K | X) and the estimate of any K (what ``n_components="auto"`` fits from).
        ``mask`` is the one those methods return with the tokens: bool, or, for weighted
        points, float log multiplicities.

        Examples
        --------
        >>> import torch
        >>> from transformer_gmm.nn import MixtureTransformer, config_from_preset
        >>> model = MixtureTransformer(config_from_preset("tiny", k_posterior_seeds=2))
        >>> tokens, mask = model.k_unknown_tokens(torch.randn(1, 40, 4))
        >>> model.read_out(tokens, 3, mask).means.shape
        torch.Size([1, 3, 4])
        """
        self._check_n_components(n_components)
        raw, point_logits = self.heads[str(int(n_components))](tokens, mask)
        return _parse(raw, point_logits, self.config.d_max, self.config.scale_type)

    def k_log_posterior(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        gaps: Tensor | None = None,
        weights: Tensor | None = None,
    ) -> Tensor:
        """log P(K | X) for K = 1..k_max, one pass under the "K unknown" embedding.

        Parameters
        ----------
        x : Tensor of shape (B, N, d_max)
            Standardized points, zero-padded, projected as for ``n_components=k_max``.
        mask : bool Tensor of shape (B, N), optional
            True for real points.
        gaps, weights : Tensor, optional
            As for :meth:`forward`.

        Returns
        -------
        Tensor of shape (B, k_max)
            Column ``k - 1`` holds log P(K = k | X).

        Examples
        --------
        >>> import torch
        >>> from transformer_gmm.nn import MixtureTransformer, config_from_preset
        >>> model = MixtureTransformer(config_from_preset("tiny", k_posterior_seeds=2))
        >>> log_p = model.k_log_posterior(torch.randn(3, 40, 4))
        >>> log_p.shape, torch.allclose(log_p.exp().sum(-1), torch.ones(3))
        (torch.Size([3, 4]), True)
        """
        tokens, mask = self.k_unknown_tokens(x, mask, gaps, weights)  # (B, N, D); checks the head
        return self.k_posterior_head(tokens, mask)

    def cluster_count_log_posterior(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        gaps: Tensor | None = None,
        weights: Tensor | None = None,
    ) -> Tensor:
        """log P(C | X) for C = 1..k_max clusters, from the same pass as
        :meth:`k_log_posterior` (its arguments, its shapes); a cluster may be any shape, so
        C is at most the number of Gaussian components K where they differ.

        Examples
        --------
        >>> import torch
        >>> from transformer_gmm.nn import MixtureTransformer, config_from_preset
        >>> config = config_from_preset("tiny", k_posterior_seeds=2, cluster_count_seeds=2)
        >>> MixtureTransformer(config).cluster_count_log_posterior(torch.randn(3, 40, 4)).shape
        torch.Size([3, 4])
        """
        if not self.has_cluster_count:
            raise ValueError("This model has no cluster-count head (cluster_count_seeds=0).")
        tokens, mask = self.k_unknown_tokens(x, mask, gaps, weights)
        return self.cluster_count_head(tokens, mask)

    def k_unknown_tokens(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        gaps: Tensor | None = None,
        weights: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """The backbone's tokens (B, N, D) under the "K unknown" embedding, and the mask
        the K-posterior head reads them with; arguments as :meth:`k_log_posterior`."""
        if not self.has_k_posterior:
            raise ValueError("This model has no K-posterior head (k_posterior_seeds=0).")
        self._check_inputs(x, self.config.k_max, mask, gaps, weights)
        return self._tokens(x, self.k_unknown, mask, gaps, weights)

    def _tokens(
        self,
        x: Tensor,
        task_embedding: Tensor,
        mask: Tensor | None,
        gaps: Tensor | None = None,
        weights: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """The backbone: point tokens (B, N, D) under one task embedding (D,), and the mask
        the heads read them with (float log multiplicities where ``weights`` are given)."""
        real = None if weights is None else weights > 0  # (B, N): the points read
        if real is not None:
            mask = real if mask is None else mask & real
        if mask is not None:
            # Padding rows are never keys, but 0 * NaN is NaN inside attention: zero them.
            x = x.masked_fill(~mask[..., None], 0.0)
            # A dataset with no real points would give all -inf attention rows, hence NaN.
            # Let it attend over its padding instead: finite, meaningless outputs.
            mask = mask | ~mask.any(dim=-1, keepdim=True)  # (B, N)
        if real is not None:
            # Log multiplicities, -inf where a point is not read (a mask that reads every
            # point where none is real, as above): what attention adds to its logits.
            log_weights = torch.where(real, weights, 1.0).to(x.dtype).log()
            mask = torch.where(mask, log_weights, -torch.inf)  # (B, N) float
        h = self.readin(x) + task_embedding  # (B, N, D): every token knows the task
        if gaps is not None:
            h = h + self.readin_gaps(gaps)  # (B, N, D): and how much of its point was filled
        for block in self.blocks:
            h = block(h, mask)
        return self.ln_f(h), mask

    def _check_inputs(
        self,
        x: Tensor,
        n_components: int,
        mask: Tensor | None,
        gaps: Tensor | None = None,
        weights: Tensor | None = None,
    ) -> None:
        self._check_n_components(n_components)
        if x.dim() != 3 or x.shape[-1] != self.config.d_max:
            raise ValueError(
                f"x must have shape (B, N, d_max={self.config.d_max}), got {tuple(x.shape)}."
            )
        if mask is not None and (mask.dtype != torch.bool or mask.shape != x.shape[:2]):
            raise ValueError(
                f"mask must be a bool tensor of shape {tuple(x.shape[:2])}, "
                f"got {mask.dtype} of shape {tuple(mask.shape)}."
            )
        if weights is not None and weights.shape != x.shape[:2]:
            raise ValueError(
                f"weights must have shape {tuple(x.shape[:2])}, got {tuple(weights.shape)}."
            )
        if weights is not None and bool((weights < 0).any()):
            raise ValueError("weights must be non-negative: a weight is a point's multiplicity.")
        if gaps is not None and not self.config.reads_gaps:
            raise ValueError("This model does not read gaps (reads_gaps=0): pass gaps=None.")
        if gaps is not None and gaps.shape != x.shape:
            raise ValueError(
                f"gaps must have the shape of x, {tuple(x.shape)}, got {tuple(gaps.shape)}."
            )

    def _check_n_components(self, n_components: int) -> None:
        if not self.has_head(n_components):
            k = self.supported_n_components
            raise ValueError(
                f"This model has readout heads for n_components in [{k.start}, {k.stop - 1}], "
                f"got n_components={n_components}."
            )
