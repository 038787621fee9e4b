"""Building a run config's components: the model, the loss, the data (shared by the Session, the built-in loop and
the driver's checks before Ray starts). torch is imported when a builder runs."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping
from typing import TYPE_CHECKING, Callable, Optional

from raytrain.data import DataContext, DataSource
from raytrain.errors import ConfigError
from raytrain.rundir import storage
from raytrain.spec import components
from raytrain.spec.loops import is_ray_train_loop
from raytrain.spec.sections import RunConfig

if TYPE_CHECKING:
    from torch import nn


def build_model(cfg: RunConfig) -> "nn.Module":
    from torch import nn

    if cfg.model is None:
        raise ConfigError(f"{cfg.source}: the loop builds the config's model (session.build_model()), but the run "
                          f"config has no model section. Fix: add model: {{_component_: your.module.YourModel}}, or "
                          f"build the model in the loop.")
    model = components.instantiate(cfg.model)
    if not isinstance(model, nn.Module):
        raise ConfigError(f"{cfg.source}: model._component_: {cfg.model.path} returned {type(model).__name__}, not a "
                          f"torch.nn.Module. Fix: name a callable (class or function) that returns the model.")
    return model


def build_loss(cfg: RunConfig) -> Callable:

    loss = cfg.loss
    if inspect.isclass(loss.target):
        return components.instantiate(loss)
    return functools.partial(loss.target, **loss.kwargs) if loss.kwargs else loss.target


def data_source(cfg: RunConfig) -> Optional[DataSource]:
    """The DataSource instance of a class-based data component (None for a plain function)."""
    if cfg.data is None:
        return None
    target = cfg.data.component.target
    if isinstance(target, type) and issubclass(target, DataSource):
        return components.instantiate(cfg.data.component)
    return None


def call_data_component(cfg: RunConfig, ctx: Optional[DataContext]) -> dict:
    """The data component's datasets as {"train": ..., "val": ...}, checked."""
    if cfg.data is None:
        raise ConfigError(f"{cfg.source}: the loop asks for the config's data (session.batches('train') or "
                          f"session.datasets()), but the run config has no data section. Fix: add data: "
                          f"{{_component_: your.module.your_data}}, or pass your own dataset to session.batches().")
    source = data_source(cfg)
    if source is not None and ctx is not None and not storage.nodes_share(cfg.run.storage_path):
        # No shared volume: the driver's prepare() filled its own node's TMPDIR only, so each node prepares its copy
        # (the hooks are idempotent and hold a file lock: the workers of one node prepare it once).
        source.prepare(ctx)
    produced = source.datasets(ctx) if source is not None else components.instantiate(cfg.data.component, ctx=ctx)
    where = f"{cfg.source}: data._component_: {cfg.data.path}"
    if not isinstance(produced, Mapping) or "train" not in produced:
        raise ConfigError(f"{where} returned {type(produced).__name__}, not a mapping with a 'train' dataset. Fix: "
                          f"return {{'train': train_dataset, 'val': val_dataset}} ('val' optional).")
    # A Ray Train function asks for its datasets by its own names (ray.train.get_dataset_shard("validation")).

    unknown = [] if is_ray_train_loop(cfg) else [key for key in produced if key not in ("train", "val")]
    if unknown:
        raise ConfigError(f"{where} returned unknown split(s) {', '.join(map(repr, unknown))}. Fix: return only "
                          f"'train' and 'val'.")
    for split, dataset in produced.items():
        if dataset is None:
            continue
        if ctx.loader == "ray":
            import ray.data

            if not isinstance(dataset, ray.data.Dataset):
                raise ConfigError(f"{where}: data.loader is ray but '{split}' is a {type(dataset).__name__}. Fix: "
                                  f"return Ray Datasets with columns x and y, or set data.loader: torch.")
        elif not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
            raise ConfigError(f"{where}: '{split}' is a {type(dataset).__name__}, not a map-style dataset (with "
                              f"__getitem__ and __len__) of (input, target) pairs. Fix: return torch Datasets, or set "
                              f"data.loader: ray and return Ray Datasets.")
    return {split: dataset for split, dataset in produced.items() if dataset is not None}


def unwrap(model: "nn.Module") -> "nn.Module":
    return model.module if hasattr(model, "module") else model
