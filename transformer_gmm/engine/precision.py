"""The precision of the backbone's matrix products on CPU: float32, or bfloat16 on request.

PyTorch's own switch decides: after ``torch.set_float32_matmul_precision("medium")``,
which allows float32 matrix products to run in bfloat16 "if a fast matmul algorithm using
it is available", the backbone's linear layers multiply in bfloat16 on a CPU that does so
natively (AVX-512 BF16 or AMX), and its attention reads bfloat16 queries, keys and values.
Everything else stays as it was: the tokens between layers, layer norms and activations in
float32, EM in float64. At torch's default (``"highest"``) nothing changes. On CUDA, the
switch is torch's to apply (TF32 there): a bfloat16 copy of this width-128 backbone was
measured slower than TF32 on an H200 (docs/performance.md).

The bfloat16 copy is made once per model (see :func:`transformer_gmm.engine.model_cache.model_on`);
the loaded model itself is never changed.
"""

from __future__ import annotations

import copy
import functools

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..nn.model import Attention


class BFloat16Linear(nn.Module):
    """A linear layer that multiplies in bfloat16 and returns ``out_dtype``.

    Its weights are a bfloat16 copy of ``linear``'s, made once; the bias is added after
    the product, in float32 unless the output is bfloat16.
    """

    def __init__(self, linear: nn.Linear, out_dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.out_dtype = out_dtype
        self.register_buffer("weight", linear.weight.detach().to(torch.bfloat16))
        bias = None if linear.bias is None else linear.bias.detach().to(out_dtype)
        self.register_buffer("bias", bias)

    def forward(self, x: Tensor) -> Tensor:
        """``x`` (..., in) to (..., out) in ``out_dtype``."""
        y = F.linear(x.to(torch.bfloat16), self.weight).to(self.out_dtype)
        return y if self.bias is None else y + self.bias


def bfloat16_copy(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose every ``nn.Linear`` is a :class:`BFloat16Linear`.

    The projections to attention's queries, keys and values stay in bfloat16, so that
    attention itself runs in bfloat16: under ``"medium"``, torch's float32 attention on
    CPU is several times slower than its bfloat16 one.
    """
    copied = copy.deepcopy(model)
    for module in list(copied.modules()):
        attention_inputs = ("q", "kv") if isinstance(module, Attention) else ()
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                dtype = torch.bfloat16 if name in attention_inputs else torch.float32
                setattr(module, name, BFloat16Linear(child, dtype))
    return copied


@functools.cache  # the CPU does not change while the process runs
def native_bfloat16() -> bool:
    """Whether this CPU multiplies bfloat16 natively (AVX-512 BF16 or AMX)."""
    # Private torch helpers (torch.cpu, since 2.2); without them, assume it does not.
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, check, lambda: False)() for check in checks)


def bfloat16_matmuls(device: str) -> bool:
    """Whether the backbone multiplies in bfloat16 on ``device`` (see the module's docstring)."""
    return (
        device == "cpu"
        and torch.get_float32_matmul_precision() == "medium"
        and native_bfloat16()
    )
