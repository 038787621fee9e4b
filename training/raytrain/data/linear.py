"""y = 2x + 1: the source material's first example (an MLP fits a line on 3 workers)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, ClassVar

import numpy as np
from pydantic import Field

from raytrain.data import DataContext, DataSource, arrays_to_ray, check_generated_size, splits, tensor_dataset


@dataclass
class Linear(DataSource):
    num_samples: Annotated[int, Field(gt=0)] = 200  # x = 0, 1, ..., num_samples - 1
    slope: float = 2.0
    intercept: float = 1.0
    x_scale: Annotated[float, Field(gt=0)] = 200.0  # the model sees x / x_scale: inputs in the hundreds make Adam crawl

    loaders: ClassVar[tuple[str, ...]] = ("torch", "ray")
    default_loss: ClassVar[str] = "mse"  # regression

    def memory_bytes(self) -> int:
        return self.num_samples * 8  # x and y, float32

    def arrays(self):
        x = (np.arange(self.num_samples, dtype=np.float32) / self.x_scale).reshape(-1, 1)
        y = (self.slope * x + self.intercept).astype(np.float32)
        return x, y

    def datasets(self, ctx: DataContext) -> dict:
        x, y = self.arrays()
        return splits(arrays_to_ray(x, y) if ctx.loader == "ray" else tensor_dataset(x, y))

    def check(self, cfg, fail) -> None:
        if self.num_samples < cfg.scaling.max_workers:
            fail("data.num_samples", f"{self.num_samples} samples cannot feed {cfg.scaling.max_workers} workers",
                 "use more samples than workers")
        # x and y as float32 arrays, then as tensors beside them
        check_generated_size(fail, "data.num_samples", self.num_samples, 16, "samples")
