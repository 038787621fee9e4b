"""Only the run-directory room (raytrain/rundir/) knows whether a run directory is a directory or an object store:
every other module asks it for what it needs (rundir.checkpointstore for checkpoints; storage.nodes_share,
beside_on_this_node, run_scratch, output_dir for the rest) and never branches on the kind itself. Checked on the
syntax tree, whatever the spelling: a call of is_remote (imported under any name, or reached as an attribute), a
`remote` name or attribute (a checkpointer's old `self.remote`, a local `remote = ...`), the same asked through
getattr/hasattr, or the URL scheme and UPath's protocol read to tell the two apart."""

from __future__ import annotations

import ast

from tests.test_imports import PACKAGE

# What asks "is this an object store?": rundir.storage's own questions and the attributes that answer it.
QUESTIONS = {"is_remote", "remote", "url_scheme", "URL_SCHEMES", "protocol"}
# Reading a manifest is not touching a run directory: the validator checks the storage path a RayJob names (a
# bucket URL in shape, or a directory on a shared mount) before any run exists, so it reads the URL's scheme.
EXEMPT = {("validator/raytrain_rules.py", "url_scheme")}


def storage_questions(source: str, where: str = "<source>") -> list[str]:
    """`where:line asks NAME` for each place in `source` that asks which kind of storage something is."""
    tree = ast.parse(source)
    # Ray's own `.remote`: an actor's or task's `.remote(...)` call and the `@ray.remote` decorator are not questions
    calls = {id(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)}
    decorators = {id(d) for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                          ast.ClassDef)) for d in node.decorator_list}
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Name):
            names = [node.id]
        elif isinstance(node, ast.Attribute):
            ray_api = node.attr == "remote" and (id(node) in calls or id(node) in decorators)
            names = [] if ray_api else [node.attr]
        elif isinstance(node, ast.alias):
            names = [node.name.rsplit(".", 1)[-1], node.asname or ""]
        elif isinstance(node, ast.arg):
            names = [node.arg]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names = [node.name]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr") \
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant):
            names = [str(node.args[1].value)]
        for name in names:
            if name in QUESTIONS and (where, name) not in EXEMPT:
                found.append(f"{where}:{getattr(node, 'lineno', '?')} asks {name}")
    return sorted(set(found))


def test_no_module_outside_the_run_directory_room_asks_which_storage_it_is():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(PACKAGE).as_posix()
        if where.startswith("rundir/"):
            continue
        found += storage_questions(path.read_text(), where)
    assert found == [], "branch on a rundir.checkpointstore method (or add one) instead:\n" + "\n".join(found)


def test_every_spelling_of_the_question_is_found():
    asked = {
        "if checkpointer.remote:\n    pass\n": "remote",
        "x = a if self.files.remote else b\n": "remote",
        "self.remote = storage.is_remote(run_dir)\n": "remote",
        "ok = not storage.is_remote(p)\n": "is_remote",
        "from raytrain.rundir.storage import is_remote as far\nif far(p):\n    pass\n": "is_remote",
        "remote = bool(storage.url_scheme(p))\nif remote:\n    pass\n": "remote",
        "if getattr(path, 'protocol', '') in ('s3', 'gs'):\n    pass\n": "protocol",
        "if hasattr(c, 'remote') and c.remote:\n    pass\n": "remote",
        "def f(remote: bool):\n    return 1 if remote else 2\n": "remote",
    }
    for source, name in asked.items():
        assert any(line.endswith(f"asks {name}") for line in storage_questions(source)), source


def test_rays_own_remote_is_not_a_question():
    source = ("import ray\n@ray.remote\ndef f():\n    pass\n@ray.remote(num_cpus=1)\nclass A:\n    pass\n"
              "ref = f.remote()\nactor = A.options(name='a').remote()\nray.get(actor.ping.remote())\n")
    assert storage_questions(source) == []
