"""benchmarks/dask_fit.py runs in quick mode: a Dask fit, the in-memory one and the check
from the same start, on two worker processes."""

from __future__ import annotations

import csv
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip(
    "dask.distributed", reason='needs dask.distributed: pip install "dask[array,distributed]"'
)

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "dask_fit.py"


@pytest.mark.slow  # a LocalCluster and fresh processes that import torch: about 20 s
def test_quick_run(tmp_path):
    # dask-ml's first fit compiles with numba for most of a minute: left out here.
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--no-dask-ml", "--results", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    with (tmp_path / "dask_fit.csv").open() as file:
        rows = {row["method"]: row for row in csv.DictReader(file)}
    assert set(rows) == {
        f"{method} ({where})"
        for method in ("TransformerGMM", "TransformerClusterer")
        for where in ("Dask", "in memory")
    }
    for method in ("TransformerGMM", "TransformerClusterer"):
        dask_fit, in_memory = rows[f"{method} (Dask)"], rows[f"{method} (in memory)"]
        assert float(dask_fit["same_start_max_difference"]) < 1e-6
        assert dask_fit["same_start_same_n_iter"] == "True"
        assert int(dask_fit["passes"]) >= 2  # the first pass, then one an iteration
        assert float(dask_fit["seconds"]) > 0 and float(in_memory["seconds"]) > 0
        assert math.isfinite(float(dask_fit["worker_memory_mb"]))
        assert float(dask_fit["mean_error"]) < 1e-3 and float(in_memory["mean_error"]) < 1e-3
    assert "Targets" in done.stdout
