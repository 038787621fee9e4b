"""bench/probes.py: the model wrapper that records rank 0's first step from inside a training job, with real
forward passes, a real optimizer and a real two-process gloo group."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from bench import probes
from tests.bench.support import train_epochs

REPO = Path(__file__).resolve().parents[2]
LINEAR = {"_component_": "torch.nn.Linear", "in_features": 4, "out_features": 2}


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_the_first_train_forward_and_the_one_after_the_first_step_are_recorded_once(tmp_path):
    path = tmp_path / "run.first-step.jsonl"
    model = probes.FirstStepProbe(inner=LINEAR, path=str(path))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model.eval()
    model(torch.zeros(1, 4))  # an evaluation before training is not a step
    assert _rows(path) == []
    model.train()
    for _ in range(3):
        optimizer.zero_grad()
        model(torch.randn(8, 4)).sum().backward()
        optimizer.step()
    rows = _rows(path)
    assert [r["event"] for r in rows] == [probes.STEP_BEGAN, probes.STEP_DONE]
    assert rows[0]["time"] <= rows[1]["time"]


def test_the_probe_trains_as_its_inner_model_does(tmp_path):
    torch.manual_seed(0)
    inner = nn.Linear(4, 2)
    probe = probes.FirstStepProbe(inner=inner, path=str(tmp_path / "p.jsonl"))
    x = torch.randn(3, 4)
    assert torch.equal(probe(x), inner(x))
    assert set(probe.state_dict()) == {"inner.weight", "inner.bias"}


def test_a_new_instance_records_its_own_first_step(tmp_path):
    """A restarted worker group builds its model anew: its first step is recorded too."""
    path = tmp_path / "p.jsonl"
    for _ in range(2):
        model = probes.FirstStepProbe(inner=LINEAR, path=str(path))
        model(torch.randn(2, 4))
        model(torch.randn(2, 4))
    assert [r["event"] for r in _rows(path)] == [probes.STEP_BEGAN, probes.STEP_DONE] * 2


RANK = """
import sys
import torch
import torch.distributed as dist
from bench import probes
from tests.bench.support import train_epochs

rank, init_file, path = int(sys.argv[1]), sys.argv[2], sys.argv[3]
dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
try:
    model = probes.FirstStepProbe(inner={"_component_": "torch.nn.Linear", "in_features": 4, "out_features": 2},
                                  path=path)
    model(torch.randn(2, 4))
    model(torch.randn(2, 4))
    dist.barrier()  # neither rank leaves the group while the other still uses it
finally:
    dist.destroy_process_group()
"""


def test_only_rank_zero_writes(tmp_path):
    # Fresh interpreters, not fork: a fork of the test process (with torch's and other tests' threads) can hang or
    # die in gloo under load.
    path = tmp_path / "p.jsonl"
    procs = [subprocess.Popen([sys.executable, "-c", RANK, str(r), str(tmp_path / "init"), str(path)],
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in (0, 1)]
    outputs = [p.communicate(timeout=180)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    rows = _rows(path)
    assert [r["event"] for r in rows] == [probes.STEP_BEGAN, probes.STEP_DONE]
    assert {r["pid"] for r in rows} == {procs[0].pid}


@pytest.mark.parametrize("inner, message", [
    ({"in_features": 4}, "inner must be a mapping with _component_"),
    ("torch.nn.Linear", "inner must be a mapping with _component_"),
    ({"_component_": "Linear"}, "is not package.module.name"),
    ({"_component_": "torch.nn:"}, "is not package.module.name"),
])
def test_bad_inner_specs_are_named(inner, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        probes.FirstStepProbe(inner=inner, path=str(tmp_path / "p.jsonl"))


def test_the_colon_form_of_an_import_path_builds_too(tmp_path):
    model = probes.FirstStepProbe(inner={"_component_": "torch.nn:Linear", "in_features": 3, "out_features": 1},
                                  path=str(tmp_path / "p.jsonl"))
    assert isinstance(model.inner, nn.Linear) and model.inner.in_features == 3


def test_every_step_records_each_forward_with_its_phase_and_step(tmp_path):
    """A phase is what a loop's model.train() at an epoch's start begins; evaluation forwards are recorded untagged
    (they tell that the phase's last step finished)."""
    path = tmp_path / "p.jsonl"
    model = probes.FirstStepProbe(inner=LINEAR, path=str(path), every_step=True)
    train_epochs(model, [3, 2])
    forwards = [r for r in _rows(path) if r["event"] == probes.FORWARD]
    assert [(r["train"], r.get("phase"), r.get("step")) for r in forwards] == [
        (True, 1, 1), (True, 1, 2), (True, 1, 3), (False, None, None), (True, 2, 1), (True, 2, 2), (False, None, None)]
    assert len({r["group"] for r in forwards}) == 1
    assert [r["event"] for r in _rows(path) if r["event"] != probes.FORWARD] == [probes.STEP_BEGAN, probes.STEP_DONE]
    again = probes.FirstStepProbe(inner=LINEAR, path=str(path), every_step=True)  # a restarted group: its own id
    again(torch.zeros(1, 4))
    assert _rows(path)[-1]["group"] != forwards[0]["group"] and _rows(path)[-1]["phase"] == 1


def test_without_every_step_only_the_first_step_is_recorded(tmp_path):
    path = tmp_path / "p.jsonl"
    model = probes.FirstStepProbe(inner=LINEAR, path=str(path))
    for _ in range(4):
        model(torch.randn(2, 4))
    assert [r["event"] for r in _rows(path)] == [probes.STEP_BEGAN, probes.STEP_DONE]
