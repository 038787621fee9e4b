"""What README.md, docs/ and pyproject.toml state about the code, checked, so that they stay true: where the
environment is read, that every third-party import is a declared dependency, that every path they cite exists,
and that every test tier has a time limit."""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "training" / "raytrain"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())

# ---------------------------------------------------------------------------------------------- the environment
# README and docs/architecture.md: "No setting of raytrain's is read from the environment below `cli.py`". Every
# other use of os.environ / os.getenv in the package is here, keyed by module and function, with why it stays.
ENVIRONMENT_USES = {
    # Handing the environment on to the processes a module starts (Ray nodes, clients) is no read of a setting.
    ("cluster/localcluster.py", "LocalCluster.client_env"): "the host's Ray clients get it minus the cluster's auth",
    ("cluster/pods.py", "delete_node"): "a node's preStop hook runs with the host's, minus auth",
    ("cluster/vmnode.py", "start_vm_node"): "`ray start` of a plain machine gets it, minus auth",
    ("driver/raytrainer.py", "connect_ray"): "PYTHONPATH gains the user's code directory: embedded Ray's workers inherit it",
    # Ray's and MLflow's own variables, set before they read them (an explicit value of the user's wins).
    ("driver/trackers.py", "Mlflow._client"): "MLFLOW_HTTP_REQUEST_MAX_RETRIES and _TIMEOUT: one short try per request, "
                                       "as the syncer retries with its own backoff",
    ("driver/raytrainer.py", "RayTrainer.train"): "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S (and an elastic run's "
                                         "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S) for Ray Train's controller",
    ("driver/tune.py", "_sweep"): "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S for the trials' controllers",
    # A Ray worker never runs cli.py: it reads the interval Ray itself runs on (RAY_metrics_report_interval_ms), which
    # the driver sets through Ray Train's worker runtime env (driver/raytrainer.py build_trainer). It stays: the
    # worker's linger must wait for the interval its own Ray runs on, whoever set it.
    ("worker/telemetry.py", "report_interval_s"): "Ray's metrics report interval, on a Ray worker",
    # Where the user cache lives (the XDG convention, as Path.home() reads HOME); cli.py passes nothing else.
    ("validator/crds.py", "cache_dir"): "XDG_CACHE_HOME and HOME: the KubeRay CRDs' user cache",
    # Ray's and MLflow's own variables, read as they read them (raytrain sets nothing from them).
    ("driver/preflight.py", "check_tracking_destination"): "MLFLOW_TRACKING_URI: MLflow's client reads it where the "
                                                           "tracker runs; with no run.tracking.mlflow.uri either, "
                                                           "the run is refused",
    ("driver/runtimeenv.py", "_is_ray_temp"): "RAY_TMPDIR: where Ray keeps its temporary directory, left out of the "
                                              "code a driver ships",
    # The AWS SDKs' own variable, read as botocore would were raytrain's explicit retry Config not overriding it.
    ("rundir/storage.py", "s3_retries"): "AWS_MAX_ATTEMPTS: the attempts of every S3 request, where the user set it",
}
ENVIRONMENT_NAMES = ("environ", "getenv", "putenv", "unsetenv")


@functools.lru_cache(maxsize=None)
def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def environment_uses(path: Path) -> list[tuple[int, str]]:
    """(line, enclosing Class.function) of each os.environ / os.getenv use in a module, however os is imported."""
    tree = parsed(path)
    os_names, direct = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            os_names |= {alias.asname or alias.name for alias in node.names if alias.name == "os"}
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            direct |= {alias.asname or alias.name for alias in node.names if alias.name in ENVIRONMENT_NAMES}
    uses = []

    def visit(node: ast.AST, scope: tuple[str, ...]) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            scope = (*scope, node.name)
        if (isinstance(node, ast.Attribute) and node.attr in ENVIRONMENT_NAMES and isinstance(node.value, ast.Name)
                and node.value.id in os_names) or (isinstance(node, ast.Name) and node.id in direct):
            uses.append((node.lineno, ".".join(scope) or "<module>"))
        for child in ast.iter_child_nodes(node):
            visit(child, scope)

    visit(tree, ())
    return uses


def test_no_setting_is_read_from_the_environment_below_the_cli():
    found: dict[tuple[str, str], list[int]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        if module.startswith("cli/"):
            continue
        for line, scope in environment_uses(path):
            found.setdefault((module, scope), []).append(line)
    unexpected = [f"training/raytrain/{module}:{lines[0]} ({scope})" for (module, scope), lines in found.items()
                  if (module, scope) not in ENVIRONMENT_USES]
    assert not unexpected, ("the environment is read below cli.py at " + ", ".join(unexpected) + ". Fix: read it in "
                            "cli.py and pass the value down (or, for what must stay, add it to ENVIRONMENT_USES "
                            "with why)")
    stale = sorted(set(ENVIRONMENT_USES) - set(found))
    assert not stale, f"ENVIRONMENT_USES names uses that are gone: {stale}. Fix: remove them"


def test_the_scan_sees_every_spelling_of_an_environment_read(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import os as system\nfrom os import getenv\n\nclass C:\n    def f(self):\n"
                      "        return system.environ.get('A'), getenv('B')\n\nX = system.getenv('C')\n")
    assert environment_uses(module) == [(6, "C.f"), (6, "C.f"), (8, "<module>")]


def variables_read(source: str) -> set[str]:
    """The names cli.py reads: os.environ.get(NAME), NAME in os.environ, _seconds_env(NAME, ...)."""
    from raytrain.validator import crds

    names = {"CRDS_ENV": crds.CRDS_ENV}
    read = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and node.args and (
                ast.unparse(node.func) in ("os.environ.get", "os.getenv", "_seconds_env")):
            read.add(node.args[0])
        elif isinstance(node, ast.Compare) and ast.unparse(node.comparators[0]) == "os.environ":
            read.add(node.left)
    values = {n.value if isinstance(n, ast.Constant) else names.get(ast.unparse(n), ast.unparse(n)) for n in read}
    return {value for value in values if value.isupper()}  # not _seconds_env's own parameter: its callers count


def test_the_cli_docstring_lists_every_variable_it_reads():
    source = (PACKAGE / "cli" / "__init__.py").read_text()
    documented = ast.get_docstring(ast.parse(source)).split("Environment it reads:", 1)[1]
    read = variables_read(source)
    assert {"RAY_ADDRESS", "RAYTRAIN_KUBERAY_CRDS", "RAYTRAIN_LEASE_TTL_S", "RAY_TMPDIR"} <= read  # the scan works
    missing = sorted(name for name in read if not re.search(rf"^\s+{name}\s", documented, re.M))
    assert not missing, f"cli.py reads {missing} but its docstring's 'Environment it reads' does not list them"


# ---------------------------------------------------------------------------------------------- dependencies

def third_party_imports(paths) -> dict[str, str]:
    """Top-level module -> the first file importing it, for every import that is neither stdlib nor raytrain."""
    found: dict[str, str] = {}
    for path in paths:
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top != "raytrain":
                    found.setdefault(top, path.relative_to(REPO).as_posix())
    return found


def requirement_name(requirement: str) -> str:
    return re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def declared(*groups: str) -> set[str]:
    names = {requirement_name(r) for r in PYPROJECT["project"]["dependencies"]}
    for group in groups:
        names |= {requirement_name(r) for r in PYPROJECT["project"]["optional-dependencies"][group]}
    return names


# Modules that come with a declared distribution under another distribution's name.
PROVIDED_BY = {"ray": "ray", "google": "ray"}  # google.protobuf: Ray's generated messages (drain.py) need it


@functools.lru_cache(maxsize=None)
def installed_modules() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()


def undeclared(modules: dict[str, str], allowed: set[str]) -> list[str]:
    distributions = installed_modules()
    missing = []
    for module, where in sorted(modules.items()):
        names = {d.lower().replace("_", "-") for d in distributions.get(module, [])} | {PROVIDED_BY.get(module, "")}
        if not names & allowed:
            missing.append(f"{module} (imported by {where}; from {sorted(names - {''}) or 'no installed package'})")
    return missing


# Modules whose imports may come from an optional extra (each imported only when the config asks for it).
EXTRA_MODULES = {"driver/trackers.py": ("mlflow", "wandb")}


def test_every_import_of_the_runtime_is_a_declared_dependency():
    runtime = [p for p in PACKAGE.rglob("*.py") if "validator" not in p.parts and "cluster" not in p.parts
               and p.relative_to(PACKAGE).as_posix() not in EXTRA_MODULES]
    missing = undeclared(third_party_imports(runtime), declared())
    assert not missing, f"imported but not in pyproject.toml's dependencies: {missing}"


@pytest.mark.parametrize("module, extras", EXTRA_MODULES.items())
def test_a_module_of_an_optional_extra_needs_at_most_that_extra(module, extras):
    missing = undeclared(third_party_imports([PACKAGE / module]), declared(*extras))
    assert not missing, f"imported but in neither dependencies nor the {extras} extras: {missing}"


def test_the_validator_and_cluster_need_at_most_the_kube_extra():
    kube_side = [p for p in PACKAGE.rglob("*.py") if "validator" in p.parts or "cluster" in p.parts]
    missing = undeclared(third_party_imports(kube_side), declared("kube"))
    assert not missing, f"imported but in neither dependencies nor the kube extra: {missing}"


# ---------------------------------------------------------------------------------------------- cited paths

CITING = [REPO / "README.md", REPO / "pyproject.toml", *sorted((REPO / "docs").rglob("*.md"))]
# A repository path: a top-level folder of the repository, then at least one more part (not a pattern such as
# tests/test_<room>.py).
CITED = re.compile(r"(?<![\w./-])((?:tests|scripts|training|docs|helm|manifests|images|examples|bench|\.ci)/"
                   r"[\w.-]+(?:/[\w.-]+)*)(?![\w<*{])")


def cited_paths(document: Path) -> set[str]:
    """The paths a document cites: in Markdown, those in `code` and in link targets (prose such as
    training/validation is no path); in pyproject.toml, those in its comments."""
    text = document.read_text()
    if document.suffix == ".md":
        snippets = re.findall(r"`([^`\n]+)`", text) + re.findall(r"\]\(([^)\s]+)\)", text)
    else:
        snippets = [line.split("#", 1)[1] for line in text.splitlines() if "#" in line]
    return {match.rstrip(".") for snippet in snippets for match in CITED.findall(snippet)}


@pytest.mark.parametrize("document", CITING, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_path_a_document_cites_exists(document):
    # A Markdown link is relative to its document's folder; prose paths are relative to the repository.
    missing = sorted(path for path in cited_paths(document)
                     if not (REPO / path).exists() and not (document.parent / path).exists())
    assert not missing, f"{document.relative_to(REPO)} cites paths that do not exist: {missing}"


def test_citations_are_found_in_code_links_and_comments(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("See [`tests/test_cli.py`](tests/test_cli.py), run `scripts/setup --dev`; "
                      "training/validation loss is prose; `tests/test_<room>.py` is a pattern.\n")
    assert cited_paths(readme) == {"tests/test_cli.py", "scripts/setup"}
    toml = tmp_path / "pyproject.toml"
    toml.write_text('x = "tests/not-a-citation"  # checked by tests/test_pins.py\n')
    assert cited_paths(toml) == {"tests/test_pins.py"}


# ---------------------------------------------------------------------------------------------- test tiers

def test_every_tier_has_a_time_limit():
    from tests.conftest import TIER_TIMEOUTS_S

    pytest_options = PYPROJECT["tool"]["pytest"]["ini_options"]
    assert 0 < pytest_options["timeout"] <= 60  # a unit test running longer is a bug
    # `serial` is no tier: it orders scripts/test's passes within the tiers
    tiers = {marker.split(":")[0] for marker in pytest_options["markers"]} - {"serial"}
    assert tiers == set(TIER_TIMEOUTS_S), "each marker (tier) needs its limit in tests/conftest.py TIER_TIMEOUTS_S"
