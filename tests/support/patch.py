"""A manifest with a few fields changed, for table-driven validator tests: `patched(base, {"spec.a[0].b": 3})`."""

from __future__ import annotations

import copy
import re

DELETE = "__delete__"  # a patch value: remove the field


def dotted_path(text: str) -> list:
    # a label key holds dots: metadata.labels[kueue.x-k8s.io/queue-name] is written as one key after 'labels'
    return [int(p) if p.isdigit() else p for p in re.findall(r"[^.\[\]]+", text)]


def patched(base: dict, patch: dict, *, merge_mappings: bool = False) -> dict:
    """A deep copy of `base` with each dotted path set (parents made as needed), DELETE removed, an index one past a
    list's end appended; with merge_mappings, a mapping given for a mapping is merged into it instead of replacing it."""
    obj = copy.deepcopy(base)
    for dotted, value in patch.items():
        *parents, last = dotted_path(dotted)
        node = obj
        for key in parents:
            node = node.setdefault(key, {}) if isinstance(node, dict) else node[key]
        if value == DELETE:
            del node[last]
        elif isinstance(node, list) and last == len(node):
            node.append(copy.deepcopy(value))
        elif merge_mappings and isinstance(node, dict) and isinstance(value, dict) and isinstance(node.get(last), dict):
            node[last] = {**node[last], **copy.deepcopy(value)}
        else:
            node[last] = copy.deepcopy(value)
    return obj
