"""What the p4 tests share: a run directory whose worker group's model is the every-step probe, trained by a real
loop (real forward passes and optimizer steps), so that the rows they read are the ones a job writes."""

from __future__ import annotations

from pathlib import Path

import torch

from bench import cluster, probes
from raytrain.rundir import runrecords

LINEAR = {"_component_": "torch.nn.Linear", "in_features": 4, "out_features": 2}


def probed_run(tmp_path: Path, name: str) -> tuple[Path, probes.FirstStepProbe]:
    """A fresh run's directory with its first `start` event, and rank 0's probed model writing beside it."""
    run_dir = tmp_path / "runs" / name
    run_dir.mkdir(parents=True)
    runrecords.Records(run_dir).append_event("start", start_epoch=1, resumed_from_epoch=None, resumed_at_step=0, world_size=2)
    return run_dir, probes.FirstStepProbe(inner=LINEAR, path=str(cluster.probe_file(run_dir)), every_step=True)


def train_epochs(model: torch.nn.Module, epochs_steps: list[int], evaluate: bool = True) -> None:
    """An epoch of each length in `epochs_steps` as the package's loop runs one: model.train(), the steps, then
    (with `evaluate`) model.eval() and one evaluation forward pass."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for steps in epochs_steps:
        model.train()
        for _ in range(steps):
            optimizer.zero_grad()
            model(torch.randn(2, 4)).sum().backward()
            optimizer.step()
        if evaluate:
            model.eval()
            with torch.no_grad():
                model(torch.zeros(1, 4))
