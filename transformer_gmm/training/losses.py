"""Training losses that do not depend on how the true components are numbered.

A mixture's components have no order: the model may put the true component j in any
output slot. Two answers, both here:

- match, then regress (DETR; Hungarian matching): find the slot-to-component assignment of
  least cost and take the loss under it. ``linear_sum_assignment`` solves it in O(K^3)
  per task; trying all K! permutations would need 3.6M of them at K = 10.
- a loss that needs no matching (Set Transformer): the negative log-likelihood of the
  points under the predicted mixture, which is a symmetric function of the components.

For the per-point head: permutation-invariant cross-entropy (He et al. 2025), the least
cross-entropy over relabellings, which one Hungarian matching finds exactly because the
cross-entropy is a sum of per-label terms.

Every loss takes ``out``, the model's :class:`~transformer_gmm.nn.MixtureOutput` on
``batch.x``, and ``batch``, the :class:`TaskBatch` with the model-space targets, and
returns a scalar tensor; :func:`training_loss` weighs them into the training objective.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from scipy.optimize import linear_sum_assignment
from torch import Tensor

from ..engine.readout import (
    cholesky_on_kept,
    model_space_responsibilities,
    weights_and_means_from_responsibilities,
)
from ..nn.model import MixtureOutput
from .task_batch import TaskBatch

# --- matching ------------------------------------------------------------------------


def match_components(cost: Tensor) -> Tensor:
    """The least-cost assignment per task.

    Parameters
    ----------
    cost : Tensor of shape (B, K, K)
        ``cost[b, i, j]``: the cost of giving output slot i the true component j.

    Returns
    -------
    Tensor of shape (B, K), int64
        For each slot i, the true component j assigned to it.

    Examples
    --------
    >>> import torch
    >>> from transformer_gmm.training import match_components
    >>> cost = torch.tensor([[[5.0, 0.0], [0.0, 5.0]]])  # slot 0 fits component 1
    >>> match_components(cost).tolist()
    [[1, 0]]
    """
    # On CPU, detached: the assignment is a discrete choice, no gradient flows through it.
    cost_np = cost.detach().to("cpu", torch.float64).numpy()
    columns = np.stack([linear_sum_assignment(c)[1] for c in cost_np])  # (B, K)
    return torch.from_numpy(columns).to(cost.device)


def _gather(x: Tensor, index: Tensor) -> Tensor:
    """x of shape (B, K, ...) reordered along K by index (B, K)."""
    index = index.view(*index.shape, *([1] * (x.dim() - 2))).expand(-1, -1, *x.shape[2:])
    return x.gather(1, index)


def matched_mean_error(estimate: np.ndarray, truth: np.ndarray) -> float:
    """sqrt of the summed squared distance between means matched by the Hungarian method.

    Parameters
    ----------
    estimate, truth : ndarray of shape (K, d)

    Returns
    -------
    error : float

    Examples
    --------
    >>> import numpy as np
    >>> from transformer_gmm.training import matched_mean_error
    >>> truth = np.array([[0.0, 0.0], [4.0, 4.0]])
    >>> matched_mean_error(truth[::-1], truth)  # the order of the components does not matter
    0.0
    >>> matched_mean_error(truth + [3.0, 4.0], truth)
    7.0710678118654755
    """
    cost = ((estimate[:, None, :] - truth[None, :, :]) ** 2).sum(-1)  # (K, K)
    rows, cols = linear_sum_assignment(cost)
    return float(np.sqrt(cost[rows, cols].sum()))


# --- parameter losses ------------------------------------------------------------------


def hungarian_loss(out: MixtureOutput, batch: TaskBatch) -> Tensor:
    """Squared error of means + KL of weights + squared log-scale error, under the matching
    of least mean error. All in model space, averaged over tasks and components: a scalar.
    """
    sq = ((out.means[:, :, None, :] - batch.means[:, None, :, :]) ** 2).sum(-1)  # (B, K, K)
    match = match_components(sq)  # (B, K)
    means = _gather(batch.means, match)  # (B, K, d_max)
    weights = _gather(batch.weights, match)  # (B, K)
    scales = _gather(batch.scales, match)  # (B, K, d_max)
    mean_loss = ((out.means - means) ** 2).sum(-1).mean()
    # KL(true || predicted): zero at the truth, unlike the cross-entropy alone.
    weight_loss = (weights * (weights.log() - out.log_weights)).sum(-1).mean()
    # A spherical scale (B, K, 1) broadcasts against every data coordinate.
    log_ratio = (coordinate_stds(out).log() - scales.log()) * batch.dim_mask[:, None, :]
    scale_loss = (log_ratio**2).sum(-1).div(batch.dim_mask.sum(-1, keepdim=True)).mean()
    return mean_loss + weight_loss + scale_loss


def coordinate_stds(out: MixtureOutput) -> Tensor:
    """The standard deviation of each component along each model-space coordinate:
    (B, K, 1) spherical, (B, K, d_max) otherwise (a full covariance's diagonal, rooted)."""
    if out.scales.dim() == 4:  # full: the norm of each row of L is the root of diag(L L^T)
        return out.scales.pow(2).sum(-1).sqrt()
    return out.scales


def _component_log_prob(out: MixtureOutput, batch: TaskBatch) -> Tensor:
    """log w_k + log N(x_n | mu_k, cov_k) over the data coordinates: (B, N, K)."""
    dims = batch.dim_mask[:, None, None, :]  # (B, 1, 1, d_max)
    if out.scales.dim() == 4:  # full
        # Padded coordinates: L's rows and columns there are the identity's and the means
        # zeroed, so they add nothing; the constant per data coordinate is kept.
        lower = cholesky_on_kept(out.scales, batch.dim_mask[:, None, :])  # (B, K, D, D)
        means = out.means * batch.dim_mask[:, None, :]  # (B, K, d_max)
        diff = batch.x[:, :, None, :] - means[:, None]  # (B, N, K, d_max)
        white = torch.linalg.solve_triangular(lower[:, None], diff[..., None], upper=False)
        half_log_det = lower.diagonal(dim1=-2, dim2=-1).log().sum(-1)  # (B, K)
        n_dims = batch.dim_mask.sum(-1)[:, None, None]  # (B, 1, 1)
        log_gauss = -0.5 * white.squeeze(-1).pow(2).sum(-1) - half_log_det[:, None]
        return log_gauss - 0.5 * n_dims * math.log(2 * math.pi) + out.log_weights[:, None, :]
    var = out.scales[:, None, :, :] ** 2  # (B, 1, K, 1 | d_max)
    diff2 = (batch.x[:, :, None, :] - out.means[:, None, :, :]) ** 2  # (B, N, K, d_max)
    per_coordinate = diff2 / var + var.log() + math.log(2 * math.pi)  # (B, N, K, d_max)
    # Padded coordinates hold no data: a component narrow there would gain unbounded
    # likelihood for nothing, so they are left out.
    return -0.5 * (per_coordinate * dims).sum(-1) + out.log_weights[:, None, :]


def mixture_nll(out: MixtureOutput, batch: TaskBatch) -> Tensor:
    """Negative log-likelihood of the points under the predicted mixture, per point and per
    data coordinate (so tasks of every d weigh alike), averaged over tasks: a scalar.

    Symmetric in the components, so no matching. The padded coordinates of the means,
    which the likelihood does not see, are pulled to zero (their true value).
    """
    log_p = _component_log_prob(out, batch).logsumexp(-1)  # (B, N)
    n_points = batch.mask.sum(-1)  # (B,)
    n_dims = batch.dim_mask.sum(-1)  # (B,)
    nll = -(log_p * batch.mask).sum(-1) / (n_points * n_dims)  # (B,)
    padded = (out.means * ~batch.dim_mask[:, None, :]) ** 2  # (B, K, d_max)
    return nll.mean() + padded.sum(-1).mean()


def m_step_mean_loss(out: MixtureOutput, batch: TaskBatch) -> Tensor:
    """Squared error of the means that one M-step on the model's own responsibilities gives,
    under the matching of least error, averaged over the model's two starts: a scalar.

    ``TransformerGMM(max_iter=0)`` returns exactly those means: the responsibilities of
    the model's mixture (its first start) and its per-point probabilities (its second),
    each followed by one M-step. The parameter losses train the heads; this trains what
    the estimator reads out of them. Responsibilities computed with the true parameters
    and one M-step land closer to the true means than the true clusters' own averages
    (on TGMM's d = 2, K = 2 tasks), so it asks for calibrated responsibilities, not only
    for good head means.
    """
    losses = []
    for means in m_step_means(out, batch):
        sq = ((means[:, :, None, :] - batch.means[:, None, :, :]) ** 2).sum(-1)  # (B, K, K)
        matched = _gather(batch.means, match_components(sq))  # (B, K, d_max)
        losses.append(((means - matched) ** 2).sum(-1).mean())
    return (losses[0] + losses[1]) / 2


def m_step_nll(
    out: MixtureOutput, batch: TaskBatch, reg_covar: float = 1e-3, em_steps: int = 1
) -> Tensor:
    """Negative log-likelihood of the points under the full-covariance mixture that
    ``em_steps`` EM steps from the model's own responsibilities give, per point and data
    coordinate, averaged over the model's two starts and the tasks.

    With ``em_steps=1`` that mixture is one M-step on the model's responsibilities, which is
    what ``TransformerGMM(max_iter=0, covariance_type="full")`` returns (in the user's
    space), so this scores the estimate users get, elongated components included, whatever
    the model's own scales. With more, each further step is an E-step then an M-step, all
    differentiable: the loss then asks for a start that EM carries to a likely optimum in a
    few iterations, not for a start that is likely itself. It needs no labels and no
    matching, so it holds for any prior, outliers and non-Gaussian shapes included.
    ``reg_covar`` (model-space units, where the data have unit average variance) keeps a
    component that takes a few points from gaining unbounded likelihood.
    """
    if em_steps < 1:
        raise ValueError(f"em_steps must be >= 1, got {em_steps}.")
    z = batch.x.double()  # (B, N, D); padded rows and coordinates are zero
    mask = batch.mask[..., None].double()  # (B, N, 1)
    dims = batch.dim_mask.double()  # (B, D)
    n_points, n_dims = batch.mask.sum(-1), batch.dim_mask.sum(-1)  # (B,)
    eye = torch.eye(z.shape[-1], dtype=z.dtype, device=z.device)
    # Padded coordinates: unit variance, the same for every component, so they add a
    # constant to each point's likelihood and nothing to the gradient.
    floor = reg_covar * eye * dims[:, None, :, None] + torch.diag_embed(1.0 - dims)[:, None]

    def m_step_log_joint(resp: Tensor) -> Tensor:
        """log w_k + log N(x_n | mu_k, cov_k) of the M-step on resp (B, N, K): (B, N, K)."""
        mass = resp.sum(1).clamp_min(1e-6)  # (B, K)
        means = resp.mT @ z / mass[..., None]  # (B, K, D)
        diff = z[:, :, None, :] - means[:, None]  # (B, N, K, D)
        cov = torch.einsum("bnk,bnki,bnkj->bkij", resp, diff, diff) / mass[..., None, None]
        chol = torch.linalg.cholesky(cov + floor)  # (B, K, D, D)
        # Whitened residuals L^-1 (x - mu) for every point and component.
        white = torch.linalg.solve_triangular(chol[:, None], diff[..., None], upper=False)
        log_det = chol.diagonal(dim1=-2, dim2=-1).log().sum(-1)  # (B, K): half log|cov|
        log_gauss = -0.5 * white.squeeze(-1).pow(2).sum(-1) - log_det[:, None]  # (B, N, K)
        log_gauss = log_gauss - 0.5 * n_dims[:, None, None] * math.log(2 * math.pi)
        return log_gauss + (mass / n_points[:, None]).log()[:, None]  # + log w: (B, N, K)

    losses = []
    for resp in (
        model_space_responsibilities(batch.x, batch.dim_mask, out, batch.mask),
        out.point_logits.softmax(-1),
    ):
        log_joint = m_step_log_joint(resp.double() * mask)
        for _ in range(em_steps - 1):  # E-step, then M-step
            log_joint = m_step_log_joint(log_joint.softmax(-1) * mask)
        log_p = log_joint.logsumexp(-1)  # (B, N)
        nll = -(log_p * batch.mask).sum(-1) / (n_points * n_dims)  # (B,)
        losses.append(nll.mean())
    return ((losses[0] + losses[1]) / 2).float()


def m_step_means(out: MixtureOutput, batch: TaskBatch) -> tuple[Tensor, Tensor]:
    """The means of the model's two starts in model space, each of shape (B, K, d_max), by
    the estimator's own readout: one M-step on the responsibilities of its mixture, and one
    on its per-point probabilities (an empty component keeps the head's mean)."""
    starts = []
    for resp in (
        model_space_responsibilities(batch.x, batch.dim_mask, out, batch.mask),
        out.point_logits.softmax(-1),
    ):
        _, means = weights_and_means_from_responsibilities(
            batch.x, resp, batch.mask, out.weights, out.means
        )
        starts.append(means)
    return starts[0], starts[1]


def oracle_nll(batch: TaskBatch) -> Tensor:
    """:func:`mixture_nll` under the true parameters (scales: root mean variance over the
    data coordinates, i.e. the spherical model closest to the truth). A floor to compare
    the model's NLL with, not a bound: the truth is not the sample's maximum likelihood.

    Parameters
    ----------
    batch : TaskBatch

    Returns
    -------
    nll : Tensor
        A scalar.
    """
    spherical = (batch.scales**2 * batch.dim_mask[:, None, :]).sum(-1, keepdim=True)
    spherical = (spherical / batch.dim_mask.sum(-1)[:, None, None]).sqrt()  # (B, K, 1)
    log_weights = batch.weights.log()
    truth = MixtureOutput(log_weights, batch.weights, batch.means, spherical, None)
    return mixture_nll(truth, batch)


# --- per-point loss ----------------------------------------------------------------------


def point_cross_entropy(point_logits: Tensor, batch: TaskBatch) -> Tensor:
    """Permutation-invariant cross-entropy of the per-point labels (He et al. 2025).

    Parameters
    ----------
    point_logits : Tensor of shape (B, N, K)
    batch : TaskBatch
        Supplies the labels (B, N) and the mask (B, N).

    Returns
    -------
    Tensor
        min over relabellings of the mean cross-entropy per real point, averaged over tasks.

    Examples
    --------
    >>> import numpy as np
    >>> import torch
    >>> from transformer_gmm.training import PRIORS, point_cross_entropy, sample_batch
    >>> batch = sample_batch(np.random.default_rng(0), PRIORS["tiny"], 3, 4, 4, 64)
    >>> perfect = torch.nn.functional.one_hot(batch.labels, 3).float() * 50.0
    >>> relabelled = perfect[..., [2, 0, 1]]  # the labels in another order
    >>> round(point_cross_entropy(relabelled, batch).item(), 6)
    0.0
    """
    K = point_logits.shape[-1]
    log_p = point_logits.log_softmax(-1)  # (B, N, K)
    onehot = F.one_hot(batch.labels, K).to(log_p.dtype) * batch.mask[..., None]  # (B, N, K)
    cost = -torch.einsum("bni,bnj->bij", log_p, onehot)  # (B, K, K): slot i reads label j
    match = match_components(cost)  # (B, K)
    matched = cost.gather(2, match[..., None]).squeeze(-1).sum(-1)  # (B,)
    return (matched / batch.mask.sum(-1)).mean()


# --- distillation ------------------------------------------------------------------------


def distillation_loss(out: MixtureOutput, teacher: MixtureOutput, batch: TaskBatch) -> Tensor:
    """How far ``out`` is from a teacher model's output on the same batch, slot by slot.

    KL(teacher || student) of each real point's responsibilities, plus the squared errors
    of the means, the log weights and the log standard deviations (over the data
    coordinates). No matching: the student starts from the teacher's heads
    (``init_from``), so its slot k is the teacher's slot k, and this keeps it so.

    Examples
    --------
    >>> import numpy as np
    >>> from transformer_gmm.nn import MixtureTransformer, config_from_preset
    >>> from transformer_gmm.training import PRIORS, sample_batch
    >>> from transformer_gmm.training.losses import distillation_loss
    >>> batch = sample_batch(np.random.default_rng(0), PRIORS["tiny"], 3, 4, 4, 64)
    >>> out = MixtureTransformer(config_from_preset("tiny"))(batch.x, 3, batch.mask)
    >>> round(distillation_loss(out, out, batch).item(), 6)
    0.0
    """
    mask = batch.mask.to(out.point_logits.dtype)  # (B, N)
    log_p = teacher.point_logits.log_softmax(-1)  # (B, N, K)
    log_q = out.point_logits.log_softmax(-1)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1)  # (B, N)
    points = ((kl * mask).sum(-1) / mask.sum(-1)).mean()
    means = ((out.means - teacher.means) ** 2).sum(-1).mean()
    weights = ((out.log_weights - teacher.log_weights) ** 2).sum(-1).mean()
    log_ratio = (coordinate_stds(out).log() - coordinate_stds(teacher).log()) * batch.dim_mask[
        :, None, :
    ]
    scales = (log_ratio**2).sum(-1).div(batch.dim_mask.sum(-1, keepdim=True)).mean()
    return points + means + weights + scales


# --- the training objective --------------------------------------------------------------

PARAMETER_LOSSES = {"hungarian": hungarian_loss, "nll": mixture_nll}


def training_loss(
    out: MixtureOutput,
    batch: TaskBatch,
    parameter_loss: str,
    point_weight: float,
    m_step_weight: float = 0.0,
    m_step_nll_weight: float = 0.0,
    em_steps: int = 1,
    teacher: MixtureOutput | None = None,
    distill_weight: float = 0.0,
) -> tuple[Tensor, dict[str, float]]:
    """The parameter loss, plus ``point_weight`` times the per-point loss, plus
    ``m_step_weight`` times :func:`m_step_mean_loss` and ``m_step_nll_weight`` times
    :func:`m_step_nll`, plus ``distill_weight`` times :func:`distillation_loss` against
    ``teacher``, in float32.

    Returns the loss to minimise and its parts, as floats, for logging.

    Parameters
    ----------
    out : MixtureOutput
        The model's output on ``batch.x``.
    batch : TaskBatch
        The tasks and their model-space targets.
    parameter_loss : {"hungarian", "nll"}
        :func:`hungarian_loss` or :func:`mixture_nll`.
    point_weight : float
        Weight of :func:`point_cross_entropy`.
    m_step_weight : float, default=0.0
        Weight of :func:`m_step_mean_loss`; at 0 it is not computed.
    m_step_nll_weight : float, default=0.0
        Weight of :func:`m_step_nll`; at 0 it is not computed.
    em_steps : int, default=1
        The EM steps from the model's responsibilities that :func:`m_step_nll` scores.
    teacher : MixtureOutput or None, default=None
        A teacher model's output on ``batch.x``, for :func:`distillation_loss`.
    distill_weight : float, default=0.0
        Weight of :func:`distillation_loss`; at 0 it is not computed.

    Returns
    -------
    loss : Tensor
        A scalar, to minimise.
    parts : dict
        ``"params"`` and ``"points"`` (and ``"m_step"``, ``"m_step_nll"``, ``"distill"``
        when weighted),
        the losses as floats.

    Examples
    --------
    >>> import numpy as np
    >>> import torch
    >>> from transformer_gmm.nn import MixtureTransformer, config_from_preset
    >>> from transformer_gmm.training import PRIORS, sample_batch
    >>> batch = sample_batch(np.random.default_rng(0), PRIORS["tiny"], 3, 4, 4, 64)
    >>> out = MixtureTransformer(config_from_preset("tiny"))(batch.x, 3, batch.mask)
    >>> from transformer_gmm.training import training_loss
    >>> loss, parts = training_loss(out, batch, "hungarian", point_weight=1.0)
    >>> sorted(parts), loss.requires_grad
    (['params', 'points'], True)
    """
    out = MixtureOutput(*(t.float() for t in out))  # bf16 autocast outputs: losses in fp32
    params = PARAMETER_LOSSES[parameter_loss](out, batch)
    points = point_cross_entropy(out.point_logits, batch)
    loss = params + point_weight * points
    parts = {"params": params.item(), "points": points.item()}
    if m_step_weight > 0:
        m_step = m_step_mean_loss(out, batch)
        loss = loss + m_step_weight * m_step
        parts["m_step"] = m_step.item()
    if m_step_nll_weight > 0:
        m_step_ll = m_step_nll(out, batch, em_steps=em_steps)
        loss = loss + m_step_nll_weight * m_step_ll
        parts["m_step_nll"] = m_step_ll.item()
    if distill_weight > 0:
        teacher = MixtureOutput(*(t.float() for t in teacher))
        distill = distillation_loss(out, teacher, batch)
        loss = loss + distill_weight * distill
        parts["distill"] = distill.item()
    return loss, parts
