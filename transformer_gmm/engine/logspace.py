"""``exp`` and ``logsumexp`` of log-probabilities: torch's results to the bit, faster where
many inputs lie far below zero.

On CPU, torch's float64 ``exp`` takes a slow path below about -708, where its results are
denormal or zero: 20 to 270 times the time of an input in range (one thread, AVX-512). The
E-step's log-probabilities of well separated components are mostly there (a row thousands
of nats less likely under every component but its own), so that on 10,000 rows of 256
features ``exp`` and ``logsumexp`` were most of EM's time. Here, in every chunk of which
many inputs lie below it, the inputs in range go through torch's ``exp`` as they are
(other chunks go whole); those below are made zero, which is what torch
gives below ``ZERO_BELOW``, and the few between that and ``FAST_FROM``, whose results
are denormal, through torch's ``exp`` one by one. Each element's result is torch's own,
as its ``exp`` does not depend on an element's neighbours: the same bits, checked in
``tests/test_logspace.py``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .gaussian import needs_grad

__all__ = ["exp_", "logsumexp", "responsibilities"]

# torch's float64 exp is fast from here up (its results are normal numbers)...
FAST_FROM = -707.0
# ...and 0.0 below here, however it rounds: e^-746 is less than half the smallest
# denormal (5e-324 = e^-745.13); between the two, torch's exp decides, one by one.
ZERO_BELOW = -746.0
# Smaller tensors, and tensors of other dtypes or on other devices, go to torch's exp
# directly: the masks cost more than they save there.
MIN_VALUES = 1 << 15
# Values a pass takes at a time, so that its masks stay a few MB whatever the tensor.
CHUNK_VALUES = 1 << 18
# A chunk takes the masks where a quarter of its first this many values are below
# FAST_FROM (the E-step's of separated components: all but a row's own).
SAMPLE_VALUES = 1 << 12


def exp_(x: Tensor) -> Tensor:
    """``x.exp_()``: the same values, in place."""
    if not _takes_masks(x):
        return x.exp_()
    if not x.is_contiguous():
        return x.copy_(exp_(x.contiguous()))
    flat = x.view(-1)
    for start in range(0, flat.numel(), CHUNK_VALUES):
        _exp_chunk_(flat[start : start + CHUNK_VALUES])
    return x


def _takes_masks(x: Tensor) -> bool:
    """Whether ``x`` is large enough, and of the dtype and device, for the masks to pay."""
    return x.dtype == torch.float64 and x.device.type == "cpu" and x.numel() >= MIN_VALUES


def _exp_chunk_(x: Tensor) -> None:
    """:func:`exp_` of a flat float64 chunk."""
    # Which way is only a matter of time, as both give torch's values. The masks cost
    # about 5 ns a value, torch's slow path 17 to 165 ns a value it takes: where under a
    # quarter of the chunk's first values lie below FAST_FROM, torch's exp takes it whole.
    head = x[:SAMPLE_VALUES]
    if 4 * int((head < FAST_FROM).sum()) < head.numel():
        x.exp_()
        return
    keep = torch.ge(x, FAST_FROM, out=torch.empty_like(x))  # 1.0 in range, else 0.0
    # 1.0 where the result is denormal: at least ZERO_BELOW, below FAST_FROM.
    denormal = torch.ge(x, ZERO_BELOW, out=torch.empty_like(x)).sub_(keep)
    where = denormal.nonzero().squeeze(1)
    values = x[where].exp_()
    # Every input below FAST_FROM is read as FAST_FROM (fast), then its result zeroed.
    x.clamp_min_(FAST_FROM).exp_().mul_(keep)
    x[where] = values


def logsumexp(x: Tensor, dim: int = -1) -> Tensor:
    """``x.logsumexp(dim)``, as torch computes it (the maximum out, its infinities read as
    zero), with :func:`exp_`."""
    if not _takes_masks(x) or needs_grad(x):
        return x.logsumexp(dim)  # one fused call; autograd follows it
    maxes = x.amax(dim, keepdim=True)
    maxes.masked_fill_(maxes.abs() == math.inf, 0.0)
    sums = exp_(x - maxes).sum(dim)
    return sums.log_().add_(maxes.squeeze(dim))


def responsibilities(log_resp: Tensor) -> Tensor:
    """``log_resp.exp()``, an E-step's responsibilities from its own log-responsibilities:
    in place (:func:`exp_`) unless autograd tracks them (training differentiates through)."""
    return log_resp.exp() if needs_grad(log_resp) else exp_(log_resp)
