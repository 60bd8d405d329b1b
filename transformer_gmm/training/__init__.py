"""Training the mixture transformer: synthetic tasks, symmetric losses, a script-shaped loop.

Run ``python -m transformer_gmm.training --help`` (needs tqdm: ``pip install
transformer-gmm[train]``). Importing this package does not import tqdm.
"""

from .losses import (
    hungarian_loss,
    m_step_mean_loss,
    match_components,
    matched_mean_error,
    mixture_nll,
    point_cross_entropy,
    training_loss,
)
from .task_batch import TaskBatch, collate
from .tasks import PRIORS, Prior, Task, sample_batch, sample_task

__all__ = [
    "PRIORS",
    "Prior",
    "Task",
    "TaskBatch",
    "collate",
    "hungarian_loss",
    "m_step_mean_loss",
    "match_components",
    "matched_mean_error",
    "mixture_nll",
    "point_cross_entropy",
    "sample_batch",
    "sample_task",
    "training_loss",
]
