"""Every example runs as a user would run it, from a fresh working folder."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = sorted((Path(__file__).parents[1] / "examples").glob("*.py"))


@pytest.mark.parametrize("script", EXAMPLES, ids=lambda path: path.stem)
def test_example_runs(script, tmp_path):
    result = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip(), "an example should print what it found"
    for line in result.stdout.splitlines():
        if line.startswith("saved "):
            assert (tmp_path / line.split()[1]).stat().st_size > 0
