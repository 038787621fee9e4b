"""raytrain.Session in one plain process with no Ray (`LocalSession`, behind `raytrain local`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

from raytrain.data import DataContext, data_context
from raytrain.parallel import sharding
from raytrain.rundir import runrecords
from raytrain.rundir.runcontrol import UNFENCED, Control
from raytrain.spec import build
from raytrain.spec.sections import RunConfig

if TYPE_CHECKING:
    import torch
    from torch import nn

from raytrain.worker.session import Session, torch_threads


class LocalSession(Session):
    """The same contract in one process with no Ray: the whole global batch per step, checkpoints in the run
    directory (the newest `run.keep_checkpoints` kept), so `raytrain local` resumes like `run`."""

    def __init__(self, config: RunConfig, run_dir: Path, cpus: int, on_row: Optional[Callable[[dict], None]] = None,
                 control: Control = UNFENCED):
        import torch

        super().__init__(config, run_dir, control)
        self.on_row = on_row  # `raytrain local` prints each row as it is written
        self.local_batch_size = config.train.batch_size  # one process sees the whole global batch
        self._device = torch.device("cuda" if config.scaling.use_gpu and torch.cuda.is_available() else "cpu")
        torch.set_num_threads(torch_threads(config, cpus))
        torch.manual_seed(config.train.seed)

    @property
    def device(self) -> "torch.device":
        return self._device

    def prepare_model(self, model: "nn.Module") -> "nn.Module":
        # One process: nothing to shard over (scaling.strategy applies on Ray Train); the same units recompute.
        return sharding.wrap_activation_checkpointing(model, self.config).to(self.device)

    def _load_datasets(self) -> dict:
        if self.config.data is None:
            return super()._load_datasets()
        ctx = data_context(self.config)
        return build.call_data_component(self.config, DataContext(root=ctx.root, seed=ctx.seed, loader="torch"))

    def report(self, epoch: int, metrics: Mapping[str, Any], *, model: "nn.Module", optimizer: Any = None,
               **stateful: Any) -> None:
        super().report(epoch, metrics, model=model, optimizer=optimizer, **stateful)
        if self.on_row is not None:
            self.on_row(runrecords.read_metrics(self.run_dir)[-1])
