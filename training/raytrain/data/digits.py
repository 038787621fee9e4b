"""Real 8x8 handwritten digits shipped inside scikit-learn (load_digits): no download, held-out split."""

from __future__ import annotations

import gzip
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, ClassVar

import numpy as np
from pydantic import Field

from raytrain.data import DataContext, DataSource, arrays_to_ray, splits, tensor_dataset


def digits_csv() -> Path:
    """The file behind sklearn's load_digits, found without importing scikit-learn: its import takes ~1.4 s of
    CPU, paid on the driver's path to the first training step, for a 1797-row CSV."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("scikit-learn is not installed. Fix: pip install scikit-learn (raytrain depends on it)")
    return Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"


def load() -> tuple[np.ndarray, np.ndarray]:
    """(images N x 1 x 8 x 8 float32 in [0, 1], labels int64): the same data as sklearn's load_digits."""
    with gzip.open(digits_csv(), "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.float32)
    images = (table[:, :-1] / 16.0).reshape(-1, 1, 8, 8)
    return images, table[:, -1].astype(np.int64)


def stratified_split(labels: np.ndarray, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices (train, val): each class contributes round(val_fraction * its count) rows to val."""
    rng = np.random.default_rng(seed)
    val = []
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        val.append(members[: int(round(val_fraction * len(members)))])
    val_idx = np.sort(np.concatenate(val))
    return np.setdiff1d(np.arange(len(labels)), val_idx), val_idx


@dataclass
class Digits(DataSource):
    val_fraction: Annotated[float, Field(gt=0, lt=1)] = 0.2  # held out, stratified by class

    loaders: ClassVar[tuple[str, ...]] = ("ray", "torch")
    ROWS: ClassVar[int] = 1797  # sklearn's load_digits

    def memory_bytes(self) -> int:
        return self.ROWS * (64 * 4 + 8)  # 8x8 float32 images, int64 labels

    def arrays(self, seed: int):
        """(x_train, x_val, y_train, y_val)"""
        images, labels = load()
        train_idx, val_idx = stratified_split(labels, self.val_fraction, seed)
        return images[train_idx], images[val_idx], labels[train_idx], labels[val_idx]

    def datasets(self, ctx: DataContext) -> dict:
        x_train, x_val, y_train, y_val = self.arrays(ctx.seed)
        to_ds = arrays_to_ray if ctx.loader == "ray" else tensor_dataset
        return splits(to_ds(x_train, y_train), to_ds(x_val, y_val))

    def check(self, cfg, fail) -> None:
        if cfg.model_kwargs.get("num_classes", 10) != 10:
            fail("model.num_classes", "digits has 10 classes", "set model.num_classes=10")
