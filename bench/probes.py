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
anew, so a restarted group writes its own pair.

With `every_step: true` it also appends a FORWARD row at every forward pass of rank 0: its group (this instance),
whether it trains, and for a training one its phase (the n-th `model.train()` that a loop calls at each epoch's
start, counted from 1) and its step in that phase. p4 reads from them which steps a worker group trained before a
node went away. Needs only torch and the standard library."""

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
FORWARD = "forward"


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

    def __init__(self, inner: Any, path: str, every_step: bool = False):
        super().__init__()
        self.inner = inner if isinstance(inner, nn.Module) else build_component(inner)
        self.path = path
        self.every_step = bool(every_step)
        self._written = 0  # first-step lines this instance has written: STEP_BEGAN, then STEP_DONE
        self._group = f"{os.getpid()}-{time.time_ns()}"
        self._phase = self._step = 0
        self._phase_pending = True  # the next training forward begins a phase

    def train(self, mode: bool = True):
        if mode:  # a loop's model.train() at an epoch's start (DDP passes it on to its module)
            self._phase_pending = True
        return super().train(mode)

    def forward(self, *args, **kwargs):
        if self._written == 0 and self.training:
            self._written += 1
            self._record({"event": STEP_BEGAN})
        elif self._written == 1:
            self._written += 1
            self._record({"event": STEP_DONE})
        if self.every_step:
            row = {"event": FORWARD, "group": self._group, "train": self.training}
            if self.training:
                if self._phase_pending:
                    self._phase, self._step, self._phase_pending = self._phase + 1, 0, False
                self._step += 1
                row.update(phase=self._phase, step=self._step)
            self._record(row)
        return self.inner(*args, **kwargs)

    def _record(self, row: dict) -> None:
        if getattr(self, "_rank", None) is None:
            self._rank = _rank()
        if self._rank != 0:
            return
        with open(self.path, "a") as handle:  # one short line per append: a reader never sees half of one
            handle.write(json.dumps({**row, "time": time.time(), "pid": os.getpid()}) + "\n")


def _rank() -> int:
    """This worker's Ray Train rank (torchft gives every worker a process group of its own, where each is rank 0),
    else its torch.distributed rank, else 0."""
    try:
        import ray.train

        return ray.train.get_context().get_world_rank()
    except Exception:  # noqa: BLE001 - outside a Ray Train worker
        return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
