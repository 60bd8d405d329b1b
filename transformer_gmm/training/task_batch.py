"""A task (one dataset and the map ``fit`` applies to it), and tasks of one K stacked into
the padded model-space tensors a training step reads."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ..engine.standardize import Standardization


@dataclass(frozen=True)
class Task:
    """One dataset in the user's (original) space, and the map ``fit`` would apply to it.

    Attributes
    ----------
    X : ndarray of shape (n, d)
        The points; a missing entry holds its column's observed mean (what a fit reads).
    labels : ndarray of shape (n,)
        The component each point came from.
    means : ndarray of shape (K, d)
    weights : ndarray of shape (K,)
    stds : ndarray of shape (K, d)
        Noise standard deviation per component and coordinate.
    center : ndarray of shape (d,)
    scale : float
    basis : ndarray of shape (d, kept)
    d_max : int
        The map ``fit`` applies to ``X``, fitted by the engine's
        :func:`~transformer_gmm.engine.standardize.fit_standardization` and kept as numpy
        (tasks cross process boundaries from the DataLoader's workers, where every tensor
        would hold a file descriptor): :attr:`standardization` gives it back as the
        engine's map, and :meth:`to_model_space` and :meth:`from_model_space` apply it.
    factors : ndarray of shape (K, d, d) or None
        Where covariances are full: covariance k is ``factors[k] @ factors[k].T``, and
        ``stds`` is the root of its diagonal. None where they are diagonal (``stds``).
    observed : ndarray of shape (n, d) or None
        False where an entry of ``X`` was missing (and filled); None where none was.

    Examples
    --------
    >>> import numpy as np
    >>> from transformer_gmm.training import PRIORS, sample_task
    >>> task = sample_task(np.random.default_rng(0), PRIORS["tiny"], K=3, d=2, n=30, d_max=4)
    >>> task.X.shape, task.means.shape, bool(np.bincount(task.labels).min() >= 1)
    ((30, 2), (3, 2), True)
    """

    X: np.ndarray  # (n, d) points
    labels: np.ndarray  # (n,) the component each point came from
    means: np.ndarray  # (K, d)
    weights: np.ndarray  # (K,)
    stds: np.ndarray  # (K, d) noise standard deviation per component and coordinate
    # The engine's map of X, as numpy: z = basis.T @ (x - center) / scale, zero-padded.
    center: np.ndarray  # (d,)
    scale: float
    basis: np.ndarray  # (d, kept)
    d_max: int
    factors: np.ndarray | None = None  # (K, d, d): covariance k is factors[k] @ factors[k].T
    observed: np.ndarray | None = None  # (n, d) False where X's entry was missing (filled)

    @property
    def standardization(self) -> Standardization:
        """The map ``fit`` applies to ``X``: the engine's, for a batch of one dataset.

        Examples
        --------
        >>> import numpy as np
        >>> from transformer_gmm.training import PRIORS, sample_task
        >>> task = sample_task(np.random.default_rng(0), PRIORS["tiny"], 2, 6, 20, d_max=4)
        >>> task.standardization.basis.shape, task.standardization.n_kept  # 1 of 6 kept
        (torch.Size([1, 6, 1]), 1)
        """
        return Standardization(
            center=torch.from_numpy(self.center)[None],
            scale=torch.tensor([self.scale], dtype=torch.float64),
            basis=torch.from_numpy(self.basis)[None],
            d_max=self.d_max,
        )

    def to_model_space(self, points: np.ndarray) -> np.ndarray:
        """Points (m, d) of the user's space as float32 model inputs (m, d_max).

        Examples
        --------
        >>> import numpy as np
        >>> from transformer_gmm.training import PRIORS, sample_task
        >>> task = sample_task(np.random.default_rng(0), PRIORS["tiny"], 2, 6, 20, d_max=4)
        >>> z = task.to_model_space(task.X)  # 1 direction kept of 6, then zero padding
        >>> z.shape, z.dtype, bool((z[:, 1:] == 0).all())
        ((20, 4), dtype('float32'), True)
        """
        points = torch.as_tensor(points, dtype=torch.float64)[None]
        return self.standardization.transform(points)[0].numpy()

    def from_model_space(self, means: np.ndarray) -> np.ndarray:
        """Model-space means (K, d_max) back in the user's space, float64 (K, d).

        Examples
        --------
        >>> import numpy as np
        >>> from transformer_gmm.training import PRIORS, sample_task
        >>> task = sample_task(np.random.default_rng(0), PRIORS["tiny"], 3, 2, 30, d_max=4)
        >>> back = task.from_model_space(task.to_model_space(task.means))  # d = K - 1: all kept
        >>> bool(np.allclose(back, task.means, atol=1e-5))
        True
        """
        means = torch.as_tensor(means, dtype=torch.float64)[None]
        return self.standardization.inverse_transform_means(means)[0].numpy()

    def model_space_gaps(self) -> np.ndarray:
        """Each point's share of each model-space coordinate that was missing, float32
        (n, d_max); zero where the point is complete."""
        if self.observed is None:
            return np.zeros((len(self.X), self.d_max), np.float32)
        missing = torch.from_numpy(~self.observed)[None]
        return self.standardization.transform_gaps(missing)[0].numpy()

    def model_space_stds(self) -> np.ndarray:
        """Noise std per component along each kept direction in model space, (K, kept)."""
        basis, scale = self.basis, self.scale
        if self.factors is None:  # basis.T diag(std^2) basis: its diagonal
            return np.sqrt(self.stds**2 @ basis**2) / scale
        return np.sqrt(((basis.T @ self.factors) ** 2).sum(-1)) / scale

    def oracle_means(self) -> np.ndarray:
        """Means of the true clusters, (K, d): what an estimator that knew the labels gets.

        Examples
        --------
        >>> import numpy as np
        >>> from transformer_gmm.training import PRIORS, sample_task
        >>> task = sample_task(np.random.default_rng(0), PRIORS["tiny"], K=3, d=2, n=30, d_max=4)
        >>> oracle = task.oracle_means()
        >>> oracle.shape, bool(np.allclose(oracle[0], task.X[task.labels == 0].mean(0)))
        ((3, 2), True)
        """
        K = self.means.shape[0]
        counts = np.bincount(self.labels, minlength=K)[:, None]  # (K, 1), >= 1 by construction
        sums = np.zeros_like(self.means)
        np.add.at(sums, self.labels, self.X)
        return sums / counts


# --- sampling ------------------------------------------------------------------------


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
    gaps : Tensor of shape (B, N, d_max) or None
        Each point's share of each coordinate that was missing (the model input of
        ``reads_gaps``), zero on padding; None where no task has missing entries.
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
    gaps: Tensor | None  # (B, N, d_max) float32 share of each coordinate missing, or None
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

    def gaps_read_by(self, config) -> Tensor | None:
        """The gaps a model of ``config`` (a ModelConfig) reads: None unless it reads them
        (``reads_gaps``); zeros where no task of the batch has missing entries."""
        if not config.reads_gaps:
            return None
        return torch.zeros_like(self.x) if self.gaps is None else self.gaps

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
        gaps = None if self.gaps is None else self.gaps.to(device, non_blocking=True)
        return TaskBatch(**moved, gaps=gaps, tasks=self.tasks)


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
    gappy = any(task.observed is not None for task in tasks)
    gaps = np.zeros((B, N, d_max), np.float32) if gappy else None
    for b, task in enumerate(tasks):
        n, kept = len(task.X), task.basis.shape[1]
        x[b, :n] = task.to_model_space(task.X)
        mask[b, :n] = True
        labels[b, :n] = task.labels
        means[b] = task.to_model_space(task.means)  # (mu - center) @ basis / scale, padded
        scales[b, :, :kept] = task.model_space_stds()
        dim_mask[b, :kept] = True
        if gappy:
            gaps[b, :n] = task.model_space_gaps()
    weights = np.stack([t.weights for t in tasks]).astype(np.float32)  # (B, K)
    as_tensor = torch.from_numpy
    return TaskBatch(
        *map(as_tensor, (x, mask, labels, means, weights, scales, dim_mask)),
        gaps=None if gaps is None else as_tensor(gaps),
        tasks=tasks,
    )
