"""Every example runs as a script, each in a fresh process and working folder, in its quick
mode (``TRANSFORMER_GMM_EXAMPLES_QUICK=1``: fewer datasets, rows or grid points; the docs
build runs them at full size), and draws a figure for the gallery.

Starting Python and importing torch, scikit-learn and matplotlib takes about four seconds a
process, longer than most examples' own work. So one runner process imports them once and
forks a child per example, which runs the script as ``python examples/<name>.py`` would
(``__name__ == "__main__"``, its own folder on ``sys.path``, stdout and stderr to files).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = sorted((Path(__file__).parents[1] / "examples").glob("*.py"))
TIMEOUT_S = 300  # for one example

RUNNER = r"""
import json, os, runpy, signal, sys, traceback

import matplotlib

matplotlib.use("Agg")  # no window: plt.show() returns at once
import matplotlib.pyplot, numpy, sklearn.cluster, sklearn.mixture, sklearn.model_selection
import torch, torch._dynamo  # torch imports _dynamo when the first model is built

import transformer_gmm

transformer_gmm.TransformerGMM, transformer_gmm.TransformerClusterer  # the lazy imports

for line in sys.stdin:
    script, folder, timeout = json.loads(line)
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:  # the child: become `python <script>` run in <folder>
        code = 1
        try:
            os.chdir(folder)
            for fd, name in [(0, os.devnull), (1, "stdout.txt"), (2, "stderr.txt")]:
                os.dup2(os.open(name, os.O_RDWR | os.O_CREAT | os.O_TRUNC), fd)
            signal.alarm(timeout)
            sys.argv, sys.path[0] = [script], os.path.dirname(script)
            try:
                runpy.run_path(script, run_name="__main__")
                code = 0
            except SystemExit as stop:
                if isinstance(stop.code, str):
                    print(stop.code, file=sys.stderr)
                code = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    print(os.waitstatus_to_exitcode(status), flush=True)
"""


@pytest.fixture(scope="module")
def run_example():
    env = {**os.environ, "TRANSFORMER_GMM_EXAMPLES_QUICK": "1", "MPLBACKEND": "Agg"}
    env.setdefault("OMP_NUM_THREADS", "1")  # small fits; the test machine's cores are shared
    runner = subprocess.Popen(
        [sys.executable, "-c", RUNNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True, env=env,
    )

    def run(script: Path, folder: Path) -> tuple[int, str, str]:
        runner.stdin.write(json.dumps([str(script), str(folder), TIMEOUT_S]) + "\n")
        runner.stdin.flush()
        line = runner.stdout.readline()
        assert line, f"the example runner stopped (exit status {runner.wait()})"
        return int(line), *((folder / name).read_text() for name in ("stdout.txt", "stderr.txt"))

    yield run
    runner.stdin.close()
    runner.wait(timeout=60)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the runner forks a process per example")
@pytest.mark.parametrize("script", EXAMPLES, ids=lambda path: path.stem)
def test_example_runs(script, tmp_path, run_example):
    returncode, stdout, stderr = run_example(script, tmp_path)
    assert returncode == 0, stderr
    assert stdout.strip(), "an example should print what it found"
    assert "plt.show()" in script.read_text(), "an example should draw a figure for the gallery"
