"""docs/architecture.md stays true: its rooms table is the rooms' own "May import" lines, every module it names
exists, every module of the package is named, and every claim that something never imports something cites the test
that checks it."""

from __future__ import annotations

import re

from tests.test_imports import PACKAGE, declared, room_paths

DOC = (PACKAGE.parents[1] / "docs" / "architecture.md").read_text()


def documented_modules() -> set[str]:
    """Paths under raytrain/ that the module tables name (`room/module.py`, or a folder `room/` as one row)."""
    return set(re.findall(r"^\| `([\w/]+(?:\.py|/))` \| (?!may import)", DOC, re.MULTILINE))


def test_the_rooms_table_is_the_rooms_declarations():
    table = dict(re.findall(r"^\| `(\w+(?:\.py|/))` \| ([^|]+) \|$", DOC.split("## The modules of each room")[0],
                            re.MULTILINE))
    rooms = room_paths()
    assert {name.rstrip("/").removesuffix(".py") for name in table} == set(rooms) - {"raytrain"}
    for name, may in table.items():
        room = name.rstrip("/").removesuffix(".py")
        text = rooms[room].read_text()
        assert f"May import: {may.strip()}" in text, (name, may)
    assert declared()  # the declarations themselves parse (tests/test_imports.py checks the graph)


def test_every_module_named_exists_and_every_module_is_named():
    named = documented_modules()
    for entry in named:
        path = PACKAGE / (entry if entry.endswith(".py") else entry.rstrip("/")) if "/" in entry.rstrip("/") or \
            entry.endswith(".py") else PACKAGE / entry
        if not path.exists():
            path = PACKAGE / "validator" / entry if (PACKAGE / "validator" / entry).exists() else \
                PACKAGE / "cluster" / entry
        assert path.exists(), f"docs/architecture.md names {entry}, which does not exist"
    covered = set()
    for entry in named:
        covered.add(entry.rstrip("/"))
    missing = []
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        parts = rel.split("/")
        if path.name == "__init__.py" and rel != "cli/__init__.py":
            continue
        if parts[0] in ("data",) or rel.startswith("validator/kuberay/"):
            continue  # one row each: `data/`, `validator/kuberay/`
        if rel not in covered:
            missing.append(rel)
    assert missing == [], f"modules docs/architecture.md does not name: {missing}"


def test_every_never_imports_claim_cites_its_test():
    claims = [s for s in re.split(r"(?<=[.;])\s", DOC.replace("\n", " ")) if "never import" in s]
    assert claims
    for claim in claims:
        assert re.search(r"tests/test_\w+\.py", claim), f"a claim without its test: {claim}"
