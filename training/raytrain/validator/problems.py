"""The message shape of every finding of `raytrain validate`: a Problem names the file, the object, the field path,
what is wrong and the fix. A Doc is one Kubernetes object and where it came from."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any


@dataclasses.dataclass(frozen=True)
class Problem:
    file: str  # the file (or chart + values file) the object came from
    obj: str  # Kind/name, or "" for the file as a whole
    field: str  # dotted path inside the object, e.g. spec.workerGroupSpecs[0].replicas
    message: str
    fix: str
    # "error": the manifest would be refused or cannot work; "note": it is valid, but worth knowing (printed, not
    # counted: `raytrain validate` still exits 0).
    severity: str = "error"

    @property
    def is_error(self) -> bool:
        return self.severity == "error"

    def __str__(self) -> str:
        where = ": ".join(part for part in (self.file, self.obj, self.field) if part)
        return f"{where}: {self.message} Fix: {self.fix}"


@dataclasses.dataclass
class Doc:
    """One object and where it came from; docs of one file, directory or chart render form a manifest set."""

    source: str
    obj: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.obj.get("kind", ""))

    @property
    def name(self) -> str:
        return str((self.obj.get("metadata") or {}).get("name", "") or "")

    @property
    def generate_name(self) -> str:
        return str((self.obj.get("metadata") or {}).get("generateName", "") or "")

    @property
    def ref(self) -> str:
        shown = self.name or (f"{self.generate_name}*" if self.generate_name else "?")
        return f"{self.kind or '?'}/{shown}"

    def problem(self, field: str, message: str, fix: str, severity: str = "error") -> Problem:
        return Problem(self.source, self.ref, field, message, fix, severity)


def field_path(parts: Iterable[Any]) -> str:
    """['spec', 'workerGroupSpecs', 0, 'replicas'] -> 'spec.workerGroupSpecs[0].replicas'."""
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def split_fix(text: str) -> tuple[str, str]:
    """raytrain's error messages end with 'Fix: ...'; a Problem keeps the two apart."""
    message, sep, fix = str(text).partition(" Fix: ")
    return (message.strip(), fix.strip().rstrip(".")) if sep else (str(text).strip(), "correct the value named above")
