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
Ray Train. `data.loader: auto` (a source that feeds both): torch for data that `memory_bytes()` puts at most at
AUTO_TORCH_MAX_BYTES, ray above it or when the source cannot say (choose_loader; the run's `launch` event says which
and why). A parameter annotated `DataContext` receives where datasets live, the seed and the loader.

Nothing here imports torch at import time (raytrain validate reads these signatures without it).

May import: errors, rundir
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar, Optional

from raytrain.errors import shown
from raytrain.rundir import layout, storage


class DataUnavailable(RuntimeError):
    """The data cannot be found or fetched; the message says how to provide it."""


@dataclass(frozen=True)
class DataContext:
    root: Path  # where datasets live: <storage_path>/datasets, the shared volume on a cluster
    seed: int = 0
    loader: str = "torch"  # torch: map-style datasets; ray: Ray Datasets with columns x and y


AUTO = "auto"
# data.loader: auto takes torch for data of at most this many bytes in memory: on small data Ray Data's per-epoch
# iterator start (about 65 ms here) is a large share of a short epoch (digits: 0.59x a plain loop's speed,
# docs/benchmarks.md), and every worker holding its own copy costs little. Above it, Ray Data streams the data
# from the object store (one copy per node, not per worker).
AUTO_TORCH_MAX_BYTES = 64 * 2**20


class DataSource:
    """Base class for data components that need more than a function: see the module docstring."""

    loaders: ClassVar[tuple[str, ...]] = ("torch",)  # the first is the default
    default_loss: ClassVar[str] = "cross_entropy"  # train.loss when the config sets none

    def memory_bytes(self) -> Optional[int]:
        """About how many bytes all splits take in memory as arrays, without loading them (for data.loader:
        auto); None: unknown."""
        return None

    def prepare(self, ctx: DataContext) -> None:
        """Driver, once, before workers start: download or generate what the workers will read."""

    def check(self, cfg: Any, fail: Callable[[str, str, str], None]) -> None:
        """Driver, before Ray starts: cross-section rules; call fail(key, problem, fix)."""

    def datasets(self, ctx: DataContext) -> dict:
        raise NotImplementedError


def choose_loader(source: Optional[DataSource], loaders: tuple[str, ...], elastic: bool = False,
                  torchft: bool = False) -> tuple[str, str]:
    """data.loader: auto -> (the loader, why), said in the run's records."""
    if "torch" not in loaders or "ray" not in loaders:
        return loaders[0], f"auto: {loaders[0]}, the only loader this data source feeds"
    if elastic:
        return "torch", "auto: torch, as every elastic run (Ray Data's tasks need CPUs a grow would take)"
    if torchft:
        return "torch", ("auto: torch, as every scaling.fault_tolerance torchft run (a replacement's loader starts at "
                         "the step its peers are at)")
    size = source.memory_bytes() if source is not None else None
    if size is None:
        return "ray", "auto: ray, the data source does not say how large its data is (DataSource.memory_bytes)"
    mb = f"{size / 2**20:.1f} MB"
    if size <= AUTO_TORCH_MAX_BYTES:
        return "torch", (f"auto: torch, the data is {mb} in memory (at most {AUTO_TORCH_MAX_BYTES // 2**20} MB): "
                         f"a DataLoader over each worker's copy, without Ray Data's start every epoch")
    return "ray", (f"auto: ray, the data is {mb} in memory (over {AUTO_TORCH_MAX_BYTES // 2**20} MB): Ray Data "
                   f"streams it from the object store")


def resolve_loader(loader: Any, loaders: tuple[str, ...], path: str, function: str,
                   source: Callable[[], Optional[DataSource]], elastic: bool = False,
                   torchft: bool = False) -> tuple[str, str]:
    """data.loader as the config gives it -> (the loader, why: "" unless auto chose it), or ValueError with the
    fix. function: the component's path where it is a plain function (auto cannot ask it its size); source: makes
    the DataSource to ask (None where its code is not imported)."""
    reason = ""
    if loader == AUTO:
        if function:
            raise ValueError(f"data.loader: auto chooses by the data's size, which only a DataSource class says (its "
                             f"memory_bytes()); {function} is a function. Fix: set data.loader: torch (map-style "
                             f"datasets) or ray (Ray Datasets), whichever it returns.")
        loader, reason = choose_loader(source(), loaders, elastic=elastic, torchft=torchft)
    if loader not in loaders:
        raise ValueError(f"data.loader: {shown(loader)} is not available for {path}. Fix: use one of {', '.join(loaders)}"
                         + (f", or {AUTO} (chosen by the data's size)." if len(loaders) > 1 and not function else "."))
    return loader, reason


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
