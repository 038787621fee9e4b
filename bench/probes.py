"""A probe that runs inside a training job, in the model's place, so that the benchmark learns when rank 0 trained
without the product carrying a hook for it.

A run config names it like any model of the user's own (`_component_`), with the real model as `inner`:

    model:
      _component_: bench.probes.FirstStepProbe
      inner: {_component_: my_models.TinyConvNet, channels: 8}
      path: /mnt/shared/runs/NAME.first-step.jsonl

On rank 0 it appends one JSON line to `path` at its first forward pass in train mode (STEP_BEGAN: the first
step starts) and one at the forward pass after that, in either mode (STEP_DONE: the first optimizer step has
finished, since a loop steps the optimizer before it calls the model again). Each worker group builds its model
anew, so a restarted group writes its own pair. Needs only torch and the standard library."""

from __future__ import annotations

import importlib
import json
import os
import time
from typing import Any

import torch.distributed as dist
from torch import nn

STEP_BEGAN = "first_forward"
STEP_DONE = "first_step_done"


def build_component(spec: dict[str, Any]) -> nn.Module:
    """{"_component_": "package.module.name" (or "package.module:name"), **kwargs} -> name(**kwargs)."""
    if not isinstance(spec, dict) or not isinstance(spec.get("_component_"), str):
        raise ValueError(f"FirstStepProbe: inner must be a mapping with _component_: package.module.name and the "
                         f"callable's keyword arguments, got {spec!r}")
    kwargs = {k: v for k, v in spec.items() if k != "_component_"}
    path = spec["_component_"]
    module_name, _, name = path.partition(":") if ":" in path else path.rpartition(".")
    if not module_name or not name:
        raise ValueError(f"FirstStepProbe: inner _component_ '{path}' is not package.module.name")
    return getattr(importlib.import_module(module_name), name)(**kwargs)


class FirstStepProbe(nn.Module):
    """Wraps `inner` (a built module, or a `_component_` mapping to build) and records rank 0's first step."""

    def __init__(self, inner: Any, path: str):
        super().__init__()
        self.inner = inner if isinstance(inner, nn.Module) else build_component(inner)
        self.path = path
        self._written = 0  # lines this instance has written: STEP_BEGAN, then STEP_DONE

    def forward(self, *args, **kwargs):
        if self._written == 0 and self.training:
            self._record(STEP_BEGAN)
        elif self._written == 1:
            self._record(STEP_DONE)
        return self.inner(*args, **kwargs)

    def _record(self, event: str) -> None:
        self._written += 1
        if dist.is_available() and dist.is_initialized() and dist.get_rank() != 0:
            return
        with open(self.path, "a") as handle:  # one short line per append: a reader never sees half of one
            handle.write(json.dumps({"event": event, "time": time.time(), "pid": os.getpid()}) + "\n")
