"""What TransformerGMM and TransformerClusterer share: parameters, validation, and the
route from raw data to the backbone's estimate (or to the EM fallback). No torch here."""

from __future__ import annotations

import os
import sys
import warnings
from numbers import Integral, Real

import numpy as np
import sklearn
from sklearn.base import BaseEstimator
from sklearn.utils._param_validation import Interval
from sklearn.utils.validation import validate_data

from . import _backend
from ._preprocessing import Standardization, fit_standardization


class FallbackWarning(UserWarning):
    """The transformer could not serve the request; EM from k-means++ ran instead."""


# Frames in these folders are skipped so a warning points at the user's own line
# (Python 3.12's `skip_file_prefixes`, by hand, for 3.10 and 3.11).
_INTERNAL_FOLDERS = tuple(
    os.path.dirname(module.__file__) + os.sep for module in (sys.modules[__package__], sklearn)
)


def warn_user(message: str, category: type[Warning]) -> None:
    """``warnings.warn`` with the stack level of the first caller outside this package."""
    level, frame = 2, sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_INTERNAL_FOLDERS):
        level, frame = level + 1, frame.f_back
    warnings.warn(message, category, stacklevel=level)


DEFAULT_CHECKPOINT = "default"


class _TransformerMixtureBase(BaseEstimator):
    """Skeleton shared by the estimators; subclasses name their component count."""

    _parameter_constraints: dict = {
        "checkpoint": [str, os.PathLike, None],
        "max_iter": [Interval(Integral, 0, None, closed="left")],
        "tol": [Interval(Real, 0.0, None, closed="left")],
        "n_init": [Interval(Integral, 1, None, closed="left")],
        "device": [str],  # "auto", "cpu", "cuda" or "cuda:N", checked when fit resolves it
        "random_state": ["random_state"],
    }

    def _n_components(self) -> int:
        raise NotImplementedError

    # --- input -----------------------------------------------------------------------

    def _validate_fit_data(self, X) -> np.ndarray:
        X = validate_data(self, X, dtype=[np.float64, np.float32], ensure_min_samples=2)
        n_components = self._n_components()
        if X.shape[0] < n_components:
            name = "n_clusters" if hasattr(self, "n_clusters") else "n_components"
            raise ValueError(
                f"Expected n_samples >= {name} but got {name} = {n_components}, "
                f"n_samples = {X.shape[0]}. Pass more samples or lower {name}."
            )
        return X

    def _validate_predict_data(self, X) -> np.ndarray:
        return validate_data(self, X, dtype=[np.float64, np.float32], reset=False)

    # --- the transformer's estimate ----------------------------------------------------

    def _load_backbone(self) -> _backend.Backbone | None:
        """The backbone that covers this request, or None (with a FallbackWarning when the
        user would expect the transformer). A checkpoint the user named that cannot be
        found or loaded raises CheckpointError: that is never silently replaced."""
        n_components = self._n_components()
        if self.checkpoint is None or n_components == 1:
            # No checkpoint asked for, or nothing to learn: one component's maximum
            # likelihood estimate is the sample mean and covariance.
            return None
        if self.checkpoint == DEFAULT_CHECKPOINT and not _backend.has_bundled(DEFAULT_CHECKPOINT):
            warn_user(
                "No default checkpoint is bundled with this version of transformer_gmm, so "
                "the estimator falls back to EM with k-means++ initialisation. Pass "
                "checkpoint=<folder or Hub id> to use a trained transformer, or "
                "checkpoint=None to choose this fallback explicitly and silence this warning.",
                FallbackWarning,
            )
            return None
        backbone = _backend.load_backbone(self.checkpoint)
        if n_components not in backbone.supported_n_components:
            k = backbone.supported_n_components
            warn_user(
                f"Checkpoint {str(self.checkpoint)!r} has readout heads for "
                f"{k.start} to {k.stop - 1} components, not {n_components}; falling back to EM "
                f"with k-means++ initialisation.",
                FallbackWarning,
            )
            return None
        return backbone

    def _transformer_estimate(
        self, X: np.ndarray, backbone: _backend.Backbone, device: str, random_state
    ) -> tuple[Standardization, np.ndarray, _backend.TransformerEstimate]:
        """Standardize, subsample to the model's context, run one forward pass.

        Returns the standardization, the indices of the rows the backbone read, and its
        estimate (in model space).
        """
        standardization = fit_standardization(X, backbone.d_max)
        n_samples = X.shape[0]
        if n_samples > backbone.context_size:
            rows = np.sort(random_state.choice(n_samples, backbone.context_size, replace=False))
        else:
            rows = np.arange(n_samples)
        Z = standardization.transform(X[rows])
        estimate = _backend.transformer_estimate(backbone, Z, self._n_components(), device)
        return standardization, rows, estimate

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = False
        tags.input_tags.sparse = False
        return tags


def draw_seed(random_state: np.random.RandomState) -> int:
    """One integer seed for torch's generator, drawn from the estimator's random state."""
    return int(random_state.randint(np.iinfo(np.int32).max))
