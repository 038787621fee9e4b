"""training/raytrain/driver/runstart.py: a start's resume check refuses a checkpoint this config cannot load, naming
the setting that would."""

from __future__ import annotations

import pytest

from raytrain.driver import runstart
from raytrain.spec.config import load_config


def test_a_resume_with_the_other_checkpointer_is_refused_naming_the_setting(tmp_path):
    import torch

    from raytrain.checkpoint.checkpoints import Position
    from raytrain.checkpoint.resume import ResumeRefused
    from raytrain.checkpoint.sharded import ShardedCheckpointer
    from raytrain.rundir import runrecords

    path = tmp_path / "job.yaml"
    path.write_text(f"model: {{_component_: mlp}}\ndata: {{_component_: raytrain.data.linear.Linear}}\n"
                    f"run: {{storage_path: {tmp_path / 'runs'}, name: r}}\n")
    cfg = load_config(str(path))
    run_dir = tmp_path / "runs" / "r"
    model = torch.nn.Linear(1, 1)
    saver = ShardedCheckpointer(run_dir, asynchronous=False)
    saver.save(Position(1), model, None, lambda: {"epoch": 1, "step": 0, "config": cfg.to_dict(), "extra": {}},
               config=cfg.to_dict())
    with pytest.raises(ResumeRefused) as caught:
        runstart.check_resume(cfg, runrecords.Records(run_dir))
    assert "a sharded checkpoint, but this config writes file ones" in str(caught.value)
    assert "--set run.checkpointer=sharded" in str(caught.value)
