"""The package's import structure: layers that hold (no module imports a layer above its own), no cycles among
raytrain's modules (imports flow one way, lazy ones included), and commands that never train never import torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "training" / "raytrain"
REPO = PACKAGE.parent


def module_name(path: Path) -> str:
    parts = ["raytrain", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """module -> the raytrain modules it imports anywhere in its body (top level or inside functions)."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # `from raytrain.validator import shape` imports the module raytrain.validator.shape
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                           for a in node.names]
            else:
                continue
            graph[name] |= {t for t in targets if t in modules and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each strongly connected group of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_the_graph_sees_lazy_imports():
    graph = import_graph()
    assert "raytrain.validator.shape" in graph["raytrain.cluster.localcluster"]
    assert "raytrain.sizing" in graph["raytrain.validator.raytrain_rules"]  # imported inside a function


# The layers, bottom first (docs/architecture.md). A module may import its own layer and those below it, never one
# above: the training runtime (what runs on a worker and in the driver) knows nothing of manifests or of the
# emulator; the validator reads run configs with the runtime's torch-free modules; the local cluster builds on the
# validator's reading of a spec; only the command line sees them all.
LAYERS = ("runtime", "validator", "cluster", "cli")


def layer(module: str) -> str:
    if module == "raytrain.cli":
        return "cli"
    for house in ("validator", "cluster"):
        if module == f"raytrain.{house}" or module.startswith(f"raytrain.{house}."):
            return house
    return "runtime"


def upward_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted((module, target) for module, targets in graph.items() for target in targets
                  if LAYERS.index(layer(target)) > LAYERS.index(layer(module)))


def test_no_layer_imports_a_layer_above_it():
    assert upward_imports(import_graph()) == []


def test_upward_imports_are_found():
    graph = {"raytrain.drain": {"raytrain.cluster.localcluster"}, "raytrain.validator.shape": {"raytrain.cli"},
             "raytrain.cluster.emulate": {"raytrain.validator.validate", "raytrain.session"}}
    assert upward_imports(graph) == [("raytrain.drain", "raytrain.cluster.localcluster"),
                                     ("raytrain.validator.shape", "raytrain.cli")]


def test_the_validator_never_imports_torch():
    """Statically: no validator module names torch (the dynamic check below covers what it imports from the runtime)."""
    for path in (PACKAGE / "validator").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n == "torch" or n.startswith("torch.") for n in names), path


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_cycles_are_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def modules_loaded_by(*argv: str) -> set[str]:
    """The modules a `raytrain ...` command has loaded when it ends (run in a fresh interpreter)."""
    code = ("import sys\nfrom raytrain.cli import main\n"
            "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "print('MODULES', ' '.join(sorted(sys.modules)))\n")
    result = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, cwd=REPO,
                            timeout=120)
    line = next(line for line in result.stdout.splitlines() if line.startswith("MODULES "))
    return set(line.split()[1:])


@pytest.mark.parametrize("argv", [
    ["--help"], ["presets"], ["validate", "--help"],
    ["validate", "helm/raytrain-cluster/values-kind.yaml"],
    ["validate", "tests/validator/data/kuberay-v1.7.0-ray-cluster.uv.yaml"], ["validate", "manifests/rayjob.yaml"],
    ["emulate", "no-such-rayjob.yaml"], ["cluster", "stop", "/nonexistent/raytrain-node"],
    ["drain", "--wait", "0", "--temp-dir", "/nonexistent/ray"],
])
def test_commands_that_never_train_never_import_torch(argv):
    loaded = modules_loaded_by(*argv)
    assert "raytrain.cli" in loaded
    assert "torch" not in loaded and "raytrain.launcher" not in loaded, argv
