"""``import transformer_gmm`` and the command's help start without PyTorch; the public
names still load on first use, and fitted estimators pickle under their module paths."""

from __future__ import annotations

import ast
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import transformer_gmm
from transformer_gmm import TransformerClusterer, TransformerGMM


def python(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    # A fresh interpreter: this one has imported torch already (conftest uses it).
    result = subprocess.run([sys.executable, *args], input=stdin, capture_output=True, timeout=120)
    assert result.returncode == 0, result.stderr.decode()
    return result


def test_import_does_not_load_torch():
    code = "import sys, transformer_gmm; print(transformer_gmm.__version__, 'torch' in sys.modules)"
    assert python("-c", code).stdout.decode().split() == [transformer_gmm.__version__, "False"]


def test_help_does_not_load_torch():
    result = python("-X", "importtime", "-m", "transformer_gmm", "--help")
    assert b"usage: transformer-gmm" in result.stdout
    # Each -X importtime line ends with "| <module name>", indented by nesting depth.
    modules = {
        line.rsplit("|", 1)[-1].strip()
        for line in result.stderr.decode().splitlines()
        if line.startswith("import time:")
    }
    assert "transformer_gmm.cli" in modules  # the report does list the package's imports
    assert not {name for name in modules if name.split(".")[0] == "torch"}


def test_first_fit_does_not_load_torch_compiler():
    # A checkpoint's model is built on the meta device before its weights are loaded;
    # drawing initial values there would import torch._dynamo and sympy, most of a second.
    code = (
        "import sys, numpy as np; from transformer_gmm import TransformerGMM; "
        "X = np.random.default_rng(0).normal(size=(60, 3)); "
        "TransformerGMM(2, random_state=0).fit(X); "
        "print([name for name in ('torch._dynamo', 'sympy') if name in sys.modules])"
    )
    assert python("-c", code).stdout.decode().split() == ["[]"]


def test_usage_error_does_not_load_torch():
    code = (
        "import sys; from transformer_gmm.cli import main; "
        "print(main(['frobnicate']), 'torch' in sys.modules)"
    )
    assert python("-c", code).stdout.decode().split() == ["2", "False"]


def test_every_public_name_loads():
    for name in transformer_gmm.__all__:
        assert getattr(transformer_gmm, name) is not None
    assert transformer_gmm.TransformerGMM is TransformerGMM
    assert transformer_gmm.DeviceMemoryError.__module__ == "transformer_gmm.engine.device"
    assert sorted(dir(transformer_gmm)) == sorted(transformer_gmm.__all__)
    assert transformer_gmm.engine.em.fit_em is not None  # submodules, as when imported eagerly
    with pytest.raises(AttributeError, match="no attribute 'TransformerGmm'"):
        transformer_gmm.TransformerGmm  # noqa: B018


def test_type_checking_imports_match_the_public_names():
    tree = ast.parse(Path(transformer_gmm.__file__).read_text(encoding="utf-8"))
    (block,) = [
        node
        for node in tree.body
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING"
    ]
    imported = {(f".{node.module}", alias.name) for node in block.body for alias in node.names}
    assert imported == {(module, name) for name, module in transformer_gmm._LAZY_NAMES.items()}
    assert set(transformer_gmm.__all__) == set(transformer_gmm._LAZY_NAMES) | {"__version__"}


def test_fitted_estimators_unpickle_in_a_fresh_process():
    X = np.random.default_rng(0).normal(size=(60, 2))
    gmm = TransformerGMM(2, checkpoint=None, random_state=0).fit(X)
    clusterer = TransformerClusterer(2, checkpoint=None, random_state=0).fit(X)
    payload = pickle.dumps((gmm, clusterer, X))
    # The module paths that pickles made by every earlier version refer to.
    assert b"transformer_gmm.gmm" in payload and b"transformer_gmm.cluster" in payload
    code = (
        "import pickle, sys; gmm, clusterer, X = pickle.load(sys.stdin.buffer); "
        "pickle.dump((gmm.score_samples(X), clusterer.predict(X)), sys.stdout.buffer)"
    )
    scores, labels = pickle.loads(python("-c", code, stdin=payload).stdout)
    np.testing.assert_array_equal(scores, gmm.score_samples(X))
    np.testing.assert_array_equal(labels, clusterer.predict(X))


def package_imports() -> dict[str, set[str]]:
    """Each module of the package and the package's modules it imports anywhere in it,
    inside functions too; not under ``if TYPE_CHECKING:``, which never runs."""
    root = Path(transformer_gmm.__file__).parent
    files = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(encoding="utf-8"))
        never_run = {
            id(inner)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for statement in node.body
            for inner in ast.walk(statement)
        }
        targets = set()
        for node in ast.walk(tree):
            if id(node) in never_run:
                continue
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.rsplit(".", node.level - 1)[0]
                    base = f"{anchor}.{base}" if base else anchor
                for alias in node.names:
                    submodule = f"{base}.{alias.name}"
                    targets.add(submodule if submodule in files else base)
        graph[name] = {target for target in targets if target in files and target != name}
    return graph


def test_no_import_cycles():
    graph = package_imports()
    assert "transformer_gmm.storage.checkpoints" in graph["transformer_gmm.engine.model_cache"]
    cycles, state = [], {}  # state: 1 while on the search path, 2 once done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                cycles.append(path[path.index(target) :] + [target])
            elif target not in state:
                visit(target, [*path, target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert cycles == []


def test_the_model_imports_nothing_outside_nn():
    graph = package_imports()
    outside = {
        (module, target)
        for module, targets in graph.items()
        if module.startswith("transformer_gmm.nn")
        for target in targets
        if not target.startswith("transformer_gmm.nn")
    }
    assert {"transformer_gmm.nn.model", "transformer_gmm.nn.config"} <= set(graph)
    assert outside == set()


def test_no_module_imports_another_modules_private_names():
    """A helper that two modules share is public in the module whose job it is (a module
    of the package may itself be private: ``from . import _dask``)."""
    root = Path(transformer_gmm.__file__).parent
    modules = {
        ".".join(path.relative_to(root.parent).with_suffix("").parts) for path in root.rglob("*.py")
    }
    private = []
    for path in root.rglob("*.py"):
        package = ".".join(path.relative_to(root.parent).parts[:-1])
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0]
                base = f"{anchor}.{base}" if base else anchor
            if not base.startswith("transformer_gmm"):
                continue
            private += [
                (str(path.relative_to(root)), f"{base}.{alias.name}")
                for alias in node.names
                if alias.name.startswith("_")
                and alias.name != "__version__"
                and f"{base}.{alias.name}" not in modules
            ]
    assert private == []


def test_the_engine_imports_no_estimator():
    """The engine sits below the estimators: it imports the model and the checkpoints,
    never the modules that validate numpy input or build fitted attributes."""
    graph = package_imports()
    allowed = ("transformer_gmm.engine", "transformer_gmm.nn", "transformer_gmm.storage")
    outside = {
        (module, target)
        for module, targets in graph.items()
        if module.startswith("transformer_gmm.engine")
        for target in targets
        if not target.startswith(allowed)
    }
    assert {"transformer_gmm.engine.em", "transformer_gmm.engine.model_cache"} <= set(graph)
    assert outside == set()
