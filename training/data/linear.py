"""y = 2x + 1: the source material's first example (an MLP fits a line on 3 workers)."""

from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import TensorDataset

from raytrain.data import DatasetSpec, arrays_to_ray


@dataclass
class LinearParams:
    num_samples: int = 200  # x = 0, 1, ..., num_samples - 1
    slope: float = 2.0
    intercept: float = 1.0
    x_scale: float = 200.0  # the model sees x / x_scale: unscaled inputs in the hundreds make Adam crawl


def arrays(p: LinearParams):
    x = (np.arange(p.num_samples, dtype=np.float32) / p.x_scale).reshape(-1, 1)
    y = (p.slope * x + p.intercept).astype(np.float32)
    return x, y


def torch_datasets(p: LinearParams, ctx):
    x, y = arrays(p)
    return TensorDataset(torch.from_numpy(x), torch.from_numpy(y)), None


def ray_datasets(p: LinearParams, ctx):
    return arrays_to_ray(*arrays(p)), None


def check(cfg, fail):
    p = cfg.data.params
    if p.num_samples < cfg.scaling.num_workers:
        fail("data.num_samples", f"{p.num_samples} samples cannot feed {cfg.scaling.num_workers} workers",
             "use more samples than workers")
    if p.x_scale <= 0:
        fail("data.x_scale", f"{p.x_scale} must be > 0", "use e.g. 200")


SPEC = DatasetSpec(LinearParams, "regression", ("torch", "ray"), torch_datasets, ray_datasets, check=check)
