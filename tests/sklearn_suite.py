"""What the two suites that run scikit-learn's own test modules on our estimators share:
the fixtures those modules take from scikit-learn's conftest, and the substitution."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture(params=[np.float32, np.float64])
def global_dtype(request):
    return request.param


@pytest.fixture
def global_random_seed():
    return 42  # scikit-learn's default for this fixture


def substitute(
    request,
    monkeypatch,
    module,
    name: str,
    replacement: type,
    not_applicable: dict,
    differences: dict,
) -> None:
    """Run the current test of ``module`` with its global ``name`` replaced: skip it if
    ``not_applicable`` names it, mark it as a strict expected failure if ``differences``
    does (by name, or name[parameters]), each with the reason given."""
    for test in (request.node.name, request.node.originalname):
        if test in not_applicable:
            pytest.skip(f"not applicable: {not_applicable[test]}")
        if test in differences:
            request.applymarker(pytest.mark.xfail(reason=differences[test], strict=True))
            break
    monkeypatch.setattr(module, name, replacement)
