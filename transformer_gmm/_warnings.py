"""Warnings that point at the user's own line: shared by the estimators, the engine's
callers and storage, so that it lives apart from all of them."""

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
