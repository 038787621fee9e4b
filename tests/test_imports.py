"""The package's import structure: layers that hold (no module imports a layer above its own), no cycles among
raytrain's modules (imports flow one way, lazy ones included), and commands that never train never import torch."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "training" / "raytrain"
REPO = PACKAGE.parent


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = ["raytrain", *path.relative_to(package).with_suffix("").parts]
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
    assert "raytrain.spec.sizing" in graph["raytrain.validator.raytrain_rules"]  # imported inside a function


# The rooms: each folder of the package (and each module at its top level) is a room whose docstring says what it
# may import, on a line "May import: a, b" (room names: the folder or module under raytrain/; "nothing"; "every
# room"). The declarations form a graph without cycles, so imports flow one way, and every import of a module in
# another room is one its room declares. docs/architecture.md's room table is checked against the same lines.
DECLARATION = re.compile(r"^May import: (.+)$", re.MULTILINE)


def room_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "raytrain"


def room_paths() -> dict[str, Path]:
    rooms = {"raytrain": PACKAGE / "__init__.py"}
    for path in sorted(PACKAGE.iterdir()):
        if path.is_dir() and (path / "__init__.py").exists():
            rooms[path.name] = path / "__init__.py"
        elif path.suffix == ".py" and path.name != "__init__.py":
            rooms[path.stem] = path
    return rooms


def declared() -> dict[str, set[str] | None]:
    """room -> the rooms it may import (None: every room)."""
    rooms = room_paths()
    found: dict[str, set[str] | None] = {}
    for room, path in rooms.items():
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        match = DECLARATION.search(doc)
        assert match, f"{path}: its docstring has no 'May import: ...' line"
        value = match.group(1).strip()
        if value.startswith("every room"):
            found[room] = None
        elif value == "nothing":
            found[room] = set()
        else:
            names = {n.strip() for n in value.split(",")}
            assert names <= set(rooms), f"{path}: 'May import' names rooms that do not exist: {names - set(rooms)}"
            found[room] = names
    return found


def undeclared_imports(graph: dict[str, set[str]], allowed: dict[str, set[str] | None]) -> list[tuple[str, str]]:
    return sorted((module, target) for module, targets in graph.items() for target in targets
                  if room_of(target) != room_of(module) and allowed[room_of(module)] is not None
                  and room_of(target) not in allowed[room_of(module)])


def test_every_room_declares_what_it_may_import_and_the_rooms_form_layers():
    allowed = declared()
    room_graph = {room: (set(allowed) - {room} if may is None else may) for room, may in allowed.items()}
    assert cycles(room_graph) == [], "the rooms' declarations form a cycle"


def test_no_module_imports_a_room_its_room_does_not_declare():
    assert undeclared_imports(import_graph(), declared()) == []


def test_undeclared_imports_are_found():
    graph = {"raytrain.worker.drain": {"raytrain.cluster.localcluster", "raytrain.platform.processes"},
             "raytrain.validator.shape": {"raytrain.cli", "raytrain.validator.quantity"}}
    allowed = {"worker": {"platform"}, "validator": {"spec"}, "cluster": set(), "platform": set(), "cli": None}
    assert undeclared_imports(graph, allowed) == [("raytrain.validator.shape", "raytrain.cli"),
                                                  ("raytrain.worker.drain", "raytrain.cluster.localcluster")]


def test_at_most_a_handful_of_modules_at_the_top_level():
    assert sorted(p.name for p in PACKAGE.glob("*.py")) == ["__init__.py", "errors.py", "loop.py", "models.py",
                                                             "nets.py"]


def test_no_module_is_over_600_lines():
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > 600}
    assert long == {}


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
    ["drain", "--wait", "0", "--temp-dir", "/nonexistent/ray"], ["why", "/nonexistent/run"],
])
def test_commands_that_never_train_never_import_torch(argv):
    loaded = modules_loaded_by(*argv)
    assert "raytrain.cli" in loaded
    assert "torch" not in loaded and "raytrain.driver.raytrainer" not in loaded, argv


# ---------------------------------------------------------------------------------------------- lazy imports
# An import inside a function is for laziness, and laziness is for what is heavy: torch, Ray, the optional extras
# (any third-party package but these light ones), or a raytrain module whose module-level imports reach one of
# them. Every other import is at the top of its module. The command line (each command imports what it uses) and
# the package's root (`raytrain.Session` resolved on first use, so `import raytrain` stays cheap) are lazy by design.
LIGHT = {"yaml", "pydantic", "typing_extensions", "annotated_types"}
LAZY_BY_DESIGN = ("raytrain", "raytrain.cli")


def module_level_imports(path: Path, modules: set[str]) -> set[str]:
    """What importing the module imports: its statements outside functions and classes, `if TYPE_CHECKING:` left out."""
    found: set[str] = set()

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module)
                found.update(f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules)
            elif isinstance(node, ast.If) and not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
                visit(node.body + node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body])

    visit(ast.parse(path.read_text()).body)
    return found


def heavy_reached(module: str, paths: dict[str, Path], cache: dict[str, set[str]]) -> set[str]:
    """The heavy top-level packages importing `module` loads (through raytrain's module-level imports)."""
    if module in cache:
        return cache[module]
    cache[module] = set()  # a cycle adds nothing
    parts = module.split(".")
    heavy: set[str] = set()
    for target in {*module_level_imports(paths[module], set(paths)), *(".".join(parts[:i]) for i in range(1, len(parts)))}:
        root = target.split(".")[0]
        if root == "raytrain":
            if target in paths and target != module:
                heavy |= heavy_reached(target, paths, cache)
        elif root not in sys.stdlib_module_names and root not in LIGHT and root != "__future__":
            heavy.add(root)
    cache[module] = heavy
    return heavy


def needless_lazy_imports(package: Path) -> list[str]:
    paths = {module_name(p, package): p for p in package.rglob("*.py")}
    cache: dict[str, set[str]] = {}
    found = []
    for module, path in sorted(paths.items()):
        if module in LAZY_BY_DESIGN or module.startswith("raytrain.cli."):
            continue
        tree = ast.parse(path.read_text())
        for function in ast.walk(tree):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(function):
                if isinstance(node, ast.Import):
                    targets = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in paths else node.module
                               for a in node.names]
                else:
                    continue
                for target in targets:
                    root = target.split(".")[0]
                    heavy = (heavy_reached(target, paths, cache) if target in paths else set()) if root == "raytrain" \
                        else ({root} if root not in sys.stdlib_module_names and root not in LIGHT else set())
                    if not heavy:
                        found.append(f"{path.relative_to(package.parent)}:{node.lineno} imports {target} lazily")
    return found


def test_lazy_imports_are_only_of_what_is_heavy():
    assert needless_lazy_imports(PACKAGE) == []


def test_needless_lazy_imports_are_found(tmp_path):
    package = tmp_path / "raytrain"
    (package / "room").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "room" / "__init__.py").write_text("")
    (package / "room" / "light.py").write_text("import json\n")
    (package / "room" / "heavy.py").write_text("import torch\n")
    (package / "room" / "user.py").write_text(
        "def f():\n    import os\n    import torch\n    from raytrain.room import heavy, light\n    import ray\n")
    assert needless_lazy_imports(package) == ["raytrain/room/user.py:2 imports os lazily",
                                              "raytrain/room/user.py:4 imports raytrain.room.light lazily"]
