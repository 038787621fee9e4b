"""The built-in data components, and the contract every data component (built-in or a user's own) meets.

A run config's `data` section names a callable by import path (`_component_`); its other keys, except `loader`,
are the callable's keyword arguments. It produces the datasets in one of two ways:

- a function returning {"train": dataset, "val": dataset} ("val" optional) - the simplest user component; or
- a class whose instances are data sources (subclass `DataSource`): built from the keyword arguments in the driver
  (cheap: it only stores them), with hooks for what a dataset needs beyond being built:
  `prepare(ctx)` runs once in the driver before any worker starts (downloads, under a file lock, so missing data
  fails fast), `check(cfg, fail)` checks the run config across sections before Ray starts (e.g. the model's
  num_classes against the data's), `datasets(ctx)` returns the dict, and `loaders` says which loaders it feeds.

`data.loader: torch`: map-style torch Datasets of (input, target) pairs, built on each worker and sharded by
prepare_data_loader. `data.loader: ray`: Ray Datasets with columns x and y, built once in the driver and sharded by
Ray Train. A parameter annotated `DataContext` receives where datasets live, the seed and the loader.

Nothing here imports torch at import time (raytrain validate reads these signatures without it).

May import: errors, rundir
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar

from raytrain.rundir import layout, storage


class DataUnavailable(RuntimeError):
    """The data cannot be found or fetched; the message says how to provide it."""


@dataclass(frozen=True)
class DataContext:
    root: Path  # where datasets live: <storage_path>/datasets, the shared volume on a cluster
    seed: int = 0
    loader: str = "torch"  # torch: map-style datasets; ray: Ray Datasets with columns x and y


class DataSource:
    """Base class for data components that need more than a function: see the module docstring."""

    loaders: ClassVar[tuple[str, ...]] = ("torch",)  # the first is the default
    default_loss: ClassVar[str] = "cross_entropy"  # train.loss when the config sets none

    def prepare(self, ctx: DataContext) -> None:
        """Driver, once, before workers start: download or generate what the workers will read."""

    def check(self, cfg: Any, fail: Callable[[str, str, str], None]) -> None:
        """Driver, before Ray starts: cross-section rules; call fail(key, problem, fix)."""

    def datasets(self, ctx: DataContext) -> dict:
        raise NotImplementedError


def dataset_root(storage_path: str) -> Path:
    """Where datasets are prepared: STORAGE/datasets on a shared volume (prepared once, read by every node), or with
    object storage a local directory per node (TMPDIR/raytrain-local/datasets: each node prepares its own copy, as Ray
    Train's examples download into each worker's local disk)."""
    return storage.beside_on_this_node(storage_path, layout.DATASETS_DIR)


def data_context(cfg) -> DataContext:
    return DataContext(root=dataset_root(cfg.run.storage_path), seed=cfg.train.seed,
                       loader=cfg.data.loader)


def check_generated_size(fail: Callable, key: str, count: int, bytes_each: int, what: str) -> None:
    """A generated data set is built whole in memory, in the driver (its first sample is read before Ray starts) and
    in every worker: one over half this machine's memory would take the machine down (the kernel's OOM killer picks
    other processes too), so it is refused in one paragraph naming `key`."""

    try:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):  # no such sysconf here: no bound to check against
        return
    if count * bytes_each > memory // 2:
        fail(key, f"{count:,} {what} take {_gib(count * bytes_each)} in memory, more than half of this machine's "
             f"{_gib(memory)}", f"generate at most {memory // 2 // bytes_each:,}")


def _gib(count: int) -> str:
    return f"{count / 2**30:,.1f} GiB"


def arrays_to_ray(x, y):
    """A small in-memory (x, y) array pair as a Ray Dataset with columns x and y: one Arrow table, ~30x faster
    to build than a dataset of per-row dicts (from_items)."""
    import pyarrow as pa
    import ray.data
    from ray.data.extensions import ArrowTensorArray

    def column(a):  # a tensor column where rows are arrays, a plain column where they are scalars
        return ArrowTensorArray.from_numpy(a) if a.ndim > 1 else a

    return ray.data.from_arrow(pa.table({"x": column(x), "y": column(y)}))


def tensor_dataset(x, y):
    """Map-style (x, y) pairs over numpy arrays (torch imported here, on the worker)."""
    import torch
    from torch.utils.data import TensorDataset

    return TensorDataset(torch.from_numpy(x), torch.from_numpy(y))


def splits(train: Any, val: Any = None) -> dict:
    return {"train": train, **({"val": val} if val is not None else {})}
