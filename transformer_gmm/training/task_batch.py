"""Tasks of one K stacked into the padded model-space tensors a training step reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

if TYPE_CHECKING:  # tasks.py builds batches with collate, so it imports this module
    from .tasks import Task


@dataclass
class TaskBatch:
    """B tasks with the same K, padded to the longest, as model inputs and model-space targets.

    Attributes
    ----------
    x : Tensor of shape (B, N, d_max)
        float32 model inputs; padding rows are zero.
    mask : bool Tensor of shape (B, N)
        True for real points.
    labels : int64 Tensor of shape (B, N)
        True component of each point, 0 on padding.
    means : Tensor of shape (B, K, d_max)
        True means in model space, zero-padded.
    weights : Tensor of shape (B, K)
        True mixing weights.
    scales : Tensor of shape (B, K, d_max)
        Noise std per coordinate in model space, 1 on padding.
    dim_mask : bool Tensor of shape (B, d_max)
        True for the coordinates that carry data.
    tasks : list of Task
        The same tasks in the original space, for evaluation.

    Examples
    --------
    >>> import numpy as np
    >>> from transformer_gmm.training import PRIORS, sample_batch
    >>> batch = sample_batch(np.random.default_rng(0), PRIORS["tiny"], 3, 5, 4, 64)
    >>> batch.x.shape[0], batch.x.shape[2], batch.means.shape, len(batch.tasks)
    (5, 4, torch.Size([5, 3, 4]), 5)
    """

    x: Tensor  # (B, N, d_max) float32, each task's standardization of its X, zero rows pad
    mask: Tensor  # (B, N) bool, True for real points
    labels: Tensor  # (B, N) int64 true component, 0 on padding
    means: Tensor  # (B, K, d_max) true means in model space, zero-padded
    weights: Tensor  # (B, K) true mixing weights
    scales: Tensor  # (B, K, d_max) noise std per coordinate in model space, 1 on padding
    dim_mask: Tensor  # (B, d_max) bool, True for the coordinates that carry data
    tasks: list[Task]  # the same tasks in the original space, for evaluation

    @property
    def n_components(self) -> int:
        """K, the number of components of every task in the batch.

        Examples
        --------
        >>> import numpy as np
        >>> from transformer_gmm.training import PRIORS, sample_batch
        >>> sample_batch(np.random.default_rng(0), PRIORS["tiny"], 4, 2, 4, 64).n_components
        4
        """
        return self.means.shape[1]

    def to(self, device: str | torch.device) -> TaskBatch:
        """The batch with its tensors on ``device``; the tasks are shared, not copied.

        Parameters
        ----------
        device : str or torch.device

        Returns
        -------
        TaskBatch

        Examples
        --------
        >>> import numpy as np
        >>> from transformer_gmm.training import PRIORS, sample_batch
        >>> batch = sample_batch(np.random.default_rng(0), PRIORS["tiny"], 2, 2, 4, 64)
        >>> moved = batch.to("cpu")
        >>> moved.x.device.type, moved.tasks is batch.tasks
        ('cpu', True)
        """
        names = ("x", "mask", "labels", "means", "weights", "scales", "dim_mask")
        moved = {name: getattr(self, name).to(device, non_blocking=True) for name in names}
        return TaskBatch(**moved, tasks=self.tasks)


def collate(tasks: list[Task], d_max: int) -> TaskBatch:
    """Stack tasks of one K into padded model-space tensors.

    Parameters
    ----------
    tasks : list of Task
        Tasks with the same number of components K.
    d_max : int
        The model's input width.

    Returns
    -------
    TaskBatch
        CPU tensors, padded to the longest task.

    Examples
    --------
    >>> import numpy as np
    >>> from transformer_gmm.training import PRIORS, collate, sample_task
    >>> rng = np.random.default_rng(0)
    >>> tasks = [sample_task(rng, PRIORS["tiny"], K=2, d=3, n=n, d_max=4) for n in (10, 15)]
    >>> batch = collate(tasks, d_max=4)
    >>> batch.x.shape, batch.mask.sum(-1).tolist()
    (torch.Size([2, 15, 4]), [10, 15])
    """
    B, K, N = len(tasks), tasks[0].means.shape[0], max(len(t.X) for t in tasks)
    x = np.zeros((B, N, d_max), np.float32)
    mask = np.zeros((B, N), bool)
    labels = np.zeros((B, N), np.int64)
    means = np.zeros((B, K, d_max), np.float32)
    scales = np.ones((B, K, d_max), np.float32)
    dim_mask = np.zeros((B, d_max), bool)
    for b, task in enumerate(tasks):
        n, kept = len(task.X), task.basis.shape[1]
        x[b, :n] = task.to_model_space(task.X)
        mask[b, :n] = True
        labels[b, :n] = task.labels
        means[b] = task.to_model_space(task.means)  # (mu - center) @ basis / scale, padded
        scales[b, :, :kept] = task.model_space_stds()
        dim_mask[b, :kept] = True
    weights = np.stack([t.weights for t in tasks]).astype(np.float32)  # (B, K)
    as_tensor = torch.from_numpy
    return TaskBatch(
        *map(as_tensor, (x, mask, labels, means, weights, scales, dim_mask)), tasks=tasks
    )
