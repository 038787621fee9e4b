"""Dataset builders by name (the config's `data.name`).

Each builder declares its parameters and what it can feed: map-style torch datasets (`data.loader: torch`,
sharded by `prepare_data_loader`) and/or Ray Datasets with columns `x` and `y` (`data.loader: ray`, sharded by
Ray Train and read with `iter_torch_batches`). `prepare` runs once in the driver before any worker starts:
downloads happen there, under a file lock, so that missing data fails fast instead of in every worker.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional


class DataUnavailable(RuntimeError):
    """The data cannot be found or fetched; the message says how to provide it."""


@dataclass(frozen=True)
class DataContext:
    root: Path  # where datasets live: <storage_path>/datasets, the shared volume on a cluster
    seed: int = 0


def _nothing(*_args) -> None:
    return None


@dataclass(frozen=True)
class DatasetSpec:
    params: type
    task: str  # "classification" or "regression": picks the loss and the metrics
    loaders: tuple[str, ...]  # the first is the default
    torch_datasets: Callable[[Any, DataContext], tuple[Any, Optional[Any]]]  # (train, val or None)
    ray_datasets: Optional[Callable[[Any, DataContext], tuple[Any, Optional[Any]]]] = None
    prepare: Callable[[Any, DataContext], None] = _nothing
    check: Callable = _nothing  # check(run_config, fail) for cross-section rules
    # Per-batch transform for the Ray Data path, applied on the worker to the dict of tensors.
    ray_batch: Optional[Callable[[dict], tuple[Any, Any]]] = None


def data_context(cfg) -> DataContext:
    return DataContext(root=Path(cfg.run.storage_path).absolute() / "datasets", seed=cfg.train.seed)


def arrays_to_ray(x, y):
    """A small in-memory (x, y) array pair as a Ray Dataset with columns x and y: one Arrow table, ~30x faster
    to build than a dataset of per-row dicts (from_items)."""
    import pyarrow as pa
    import ray.data
    from ray.data.extensions import ArrowTensorArray

    def column(a):  # a tensor column where rows are arrays, a plain column where they are scalars
        return ArrowTensorArray.from_numpy(a) if a.ndim > 1 else a

    return ray.data.from_arrow(pa.table({"x": column(x), "y": column(y)}))


def _registry() -> dict[str, DatasetSpec]:
    from raytrain.data import cifar10, digits, linear, mnist, streaming, text

    return {
        "linear": linear.SPEC,
        "digits": digits.SPEC,
        "mnist": mnist.SPEC,
        "cifar10": cifar10.SPEC,
        "text": text.SPEC,
        "streaming": streaming.SPEC,
    }


DATASETS: dict[str, DatasetSpec] = _registry()
