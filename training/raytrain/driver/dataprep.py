"""The data's work in the driver: the data source's prepare hook, once before any worker starts, and for
`data.loader: ray` the Ray Datasets that Ray Train shards across the workers.
"""

from __future__ import annotations

from typing import Optional

from raytrain.data import DataUnavailable, data_context
from raytrain.errors import LaunchError
from raytrain.spec.build import call_data_component, data_source
from raytrain.spec.sections import RunConfig


def prepare_data(cfg: RunConfig) -> None:
    """The data source's prepare hook, once, in the driver (downloads under a file lock): missing data fails here
    with the message saying how to provide it."""

    source = data_source(cfg)
    if source is None:
        return
    try:
        source.prepare(data_context(cfg))
    except DataUnavailable as err:
        raise LaunchError(str(err)) from None


def driver_datasets(cfg: RunConfig) -> Optional[dict]:
    """For `data.loader: ray`: the Ray Datasets, built in the driver and sharded by Ray Train."""
    if cfg.data is None or cfg.data.loader != "ray":
        return None

    try:
        return call_data_component(cfg, data_context(cfg))
    except DataUnavailable as err:
        raise LaunchError(str(err)) from None
