"""The one YAML reader for everything raytrain reads from a user: run configs, `--set` values, manifests, chart
values files. Stricter than yaml.safe_load where a silent reading would be wrong, and bounded where PyYAML is not:

- the file must be UTF-8 (a Latin-1 file is one error naming the byte, never a UnicodeDecodeError);
- a key given twice in one mapping is refused (PyYAML keeps the last one silently; the API server refuses it too);
- nesting deeper than MAX_DEPTH is refused before PyYAML's recursive composer can overflow the stack;
- aliases that would expand past MAX_NODES nodes are refused ("billion laughs"): every later walk stays bounded;
- a value PyYAML cannot convert (an integer of 5000 digits, 2024-13-45 as a date) names its line.

Every failure is a YAMLFileError: one paragraph naming the source, the line and the fix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import yaml

from raytrain.errors import ConfigError

MAX_DEPTH = 100  # deeper than any config or manifest; far below Python's recursion limit
MAX_NODES = 1_000_000  # nodes after aliases are expanded


class YAMLFileError(ConfigError):
    """A YAML source that cannot be read as data. message and fix are kept apart for the validator's Problems."""

    def __init__(self, source: str, message: str, fix: str, syntax: bool = False):
        # syntax: the text is not YAML at all (a --set value then stays a plain string)
        self.source, self.message, self.fix, self.syntax = source, message, fix, syntax
        super().__init__(f"{source}: {message} Fix: {fix}.")


_Base: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Refused(yaml.constructor.ConstructorError):
    """Valid YAML that is not data raytrain can take: a key twice, a value Python cannot convert."""

    fix = "give each key once per mapping (the one you mean)"


class _StrictLoader(_Base):  # type: ignore[misc, valid-type]
    """SafeLoader that refuses duplicate keys and turns a value Python cannot convert into a marked error."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, Any] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<:` merges; explicit keys may override those
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.setdefault(key, key_node)
                except TypeError:
                    continue  # an unhashable key: SafeConstructor says so below, with its mark
                if first is not key_node:
                    raise _Refused(
                        "while constructing a mapping", node.start_mark,
                        f"found the key {key!r} twice (first at line {first.start_mark.line + 1})",
                        key_node.start_mark)
        return super().construct_mapping(node, deep=deep)

    def construct_object(self, node, deep=False):
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, OverflowError) as err:  # int('9' * 5000), a date with month 13
            refused = _Refused(None, None, f"cannot read this value ({str(err).split(';')[0]})", node.start_mark)
            refused.fix = "write the value as a string in quotes, or as a number or date Python can hold"
            raise refused from None


def read_text(path: Path) -> str:
    """The file as text: UTF-8 (a BOM allowed), or YAMLFileError naming the first byte that is not."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise YAMLFileError(str(path), f"cannot be read ({err.strerror}).",
                            "check the path and its permissions") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise YAMLFileError(str(path), f"is not UTF-8 text (byte 0x{data[err.start]:02x} at line {line}).",
                            "save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)") from None


def _check_bounds(text: str, source: str) -> None:
    """Depth and size after aliases, from the parser's events (the parser keeps its own stack: no recursion)."""
    depth = 0
    sizes: list[int] = [0]  # nodes inside each open collection
    anchored: dict[str, int] = {}
    anchors: list[Optional[str]] = [None]
    for event in yaml.parse(text, Loader=_Base):
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_DEPTH:
                raise YAMLFileError(source, f"nests deeper than {MAX_DEPTH} levels (line "
                                    f"{event.start_mark.line + 1}).", "flatten the structure")
            sizes.append(1)
            anchors.append(event.anchor)
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1
            size = sizes.pop()
            anchor = anchors.pop()
            if anchor:
                anchored[anchor] = size
            sizes[-1] += size
        elif isinstance(event, (yaml.ScalarEvent, yaml.AliasEvent)):
            size = anchored.get(event.anchor, 1) if isinstance(event, yaml.AliasEvent) else 1
            if isinstance(event, yaml.ScalarEvent) and event.anchor:
                anchored[event.anchor] = 1
            sizes[-1] += size
        if sizes[0] + sum(sizes[1:]) > MAX_NODES:
            raise YAMLFileError(source, f"expands to more than {MAX_NODES} values through its aliases (*name) "
                                f"(line {event.start_mark.line + 1}).", "write the data out instead of repeating "
                                "aliases of aliases")


def _syntax_error(source: str, err: yaml.YAMLError) -> YAMLFileError:
    mark = getattr(err, "problem_mark", None)
    at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(err, "problem", None) or str(err)
    if "maximum nesting depth" in str(problem):  # libyaml's own bound (1000), met before ours in flow style
        return YAMLFileError(source, f"nests too deeply{at}.", "flatten the structure")
    if isinstance(err, _Refused):
        return YAMLFileError(source, f"line {mark.line + 1 if mark else '?'}: {problem}.",
                             err.fix)
    return YAMLFileError(source, f"is not valid YAML{at}: {' '.join(str(problem).split())}.", "fix the YAML there",
                         syntax=True)


def load_all(text: str, source: str) -> list[Any]:
    """Every document of a YAML stream (None for an empty one), or YAMLFileError."""
    try:
        _check_bounds(text, source)
        return list(yaml.load_all(text, Loader=_StrictLoader))
    except yaml.YAMLError as err:
        raise _syntax_error(source, err) from None
    except RecursionError:  # a bound above should have refused it first; never a traceback
        raise YAMLFileError(source, "nests too deeply to read.", "flatten the structure") from None


def load(text: str, source: str) -> Any:
    """A single-document YAML text as data (None when empty), or YAMLFileError."""
    documents = load_all(text, source)
    if len(documents) > 1:
        raise YAMLFileError(source, f"holds {len(documents)} YAML documents (separated by ---), where one is "
                            "expected.", "keep one document")
    return documents[0] if documents else None


def read(path: Path) -> Any:
    """A single-document YAML file as data."""
    return load(read_text(path), str(path))


def read_all(path: Path) -> list[Any]:
    """The documents of a YAML file."""
    return load_all(read_text(path), str(path))
