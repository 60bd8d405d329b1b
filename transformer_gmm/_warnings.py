"""Warnings that point at the user's own line, and the package's fallback warning: shared by
the estimators, the engine's callers and storage, so that they live apart from all of them."""

from __future__ import annotations

import os
import sys
import warnings

import sklearn

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


class FallbackWarning(UserWarning):
    """The transformer could not serve the request; k-means++ started the fit instead.

    :class:`~transformer_gmm.TransformerGMM` then runs EM from k-means++ initialisation,
    as :class:`sklearn.mixture.GaussianMixture` does, and
    :class:`~transformer_gmm.TransformerClusterer` runs k-means (Lloyd) from k-means++
    seeding, as :class:`sklearn.cluster.KMeans` does.

    Examples
    --------
    A checkpoint with readout heads for 2 to 4 components cannot estimate 5, so the
    estimator falls back to EM and says so:

    >>> import tempfile, warnings
    >>> import numpy as np
    >>> from transformer_gmm import FallbackWarning, TransformerGMM
    >>> from transformer_gmm.nn import MixtureTransformer, config_from_preset
    >>> from transformer_gmm.storage import save_checkpoint
    >>> X = np.random.default_rng(0).normal(size=(40, 2))
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     folder = save_checkpoint(MixtureTransformer(config_from_preset("tiny")), tmp)
    ...     with warnings.catch_warnings(record=True) as caught:
    ...         warnings.simplefilter("always")
    ...         gmm = TransformerGMM(n_components=5, checkpoint=folder, random_state=0).fit(X)
    >>> any(issubclass(w.category, FallbackWarning) for w in caught)
    True
    >>> gmm.init_method_
    'k-means++'
    """
