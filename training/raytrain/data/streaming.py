"""The end-to-end Ray Data streaming example: synthetic raw images, as many as `data.data_size_gb` of them,
generated and preprocessed by Ray Data CPU tasks and streamed into the training workers while they train.

Nothing is materialised: every epoch re-runs range -> generate -> preprocess block by block, and Ray Data's
streaming executor keeps the blocks in flight within the object store's budget (backpressure), so a data set
several times larger than the object store trains in bounded memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, ClassVar

import numpy as np
from pydantic import Field

from raytrain.data import DataContext, DataSource, splits


@dataclass
class Streaming(DataSource):
    data_size_gb: Annotated[float, Field(gt=0)] = 10.0  # raw image bytes streamed per epoch (10**9 bytes per GB)
    image_size: Annotated[int, Field(gt=0)] = 256  # raw synthetic images: image_size^2 x 3 uint8, like decoded JPEGs
    train_size: Annotated[int, Field(gt=0)] = 32  # preprocessing crops the centre and pools it to train_size^2
    num_classes: Annotated[int, Field(ge=2)] = 10
    rows_per_block: Annotated[int, Field(gt=0)] = 32  # images per generated block; the unit Ray Data streams

    loaders: ClassVar[tuple[str, ...]] = ("ray", "torch")

    def datasets(self, ctx: DataContext) -> dict:
        return splits(*(ray_datasets(self, ctx) if ctx.loader == "ray" else torch_datasets(self, ctx)))

    def check(self, cfg, fail) -> None:
        check(self, cfg, fail)


def bytes_per_image(p: Streaming) -> int:
    return p.image_size * p.image_size * 3


def num_images(p: Streaming) -> int:
    return max(1, round(p.data_size_gb * 1e9) // bytes_per_image(p))


class GenerateImages:
    """range ids -> raw uint8 images with a class-dependent tint (learnable) over uniform noise; the stand-in for
    reading and decoding files. Deterministic per id, so every epoch streams the same data."""

    def __init__(self, p: Streaming):
        self.size, self.num_classes = p.image_size, p.num_classes
        self.palette = np.random.default_rng(1234).integers(0, 128, size=(p.num_classes, 3)).astype(np.uint8)

    def __call__(self, batch: dict) -> dict:
        ids = np.asarray(batch["id"], dtype=np.int64)
        labels = (ids * 7919) % self.num_classes
        noise = np.stack([np.random.default_rng(int(i)).integers(0, 128, size=(self.size, self.size, 3), dtype=np.uint8)
                          for i in ids]) if len(ids) else np.zeros((0, self.size, self.size, 3), dtype=np.uint8)
        return {"image": noise + self.palette[labels][:, None, None, :], "label": labels}


class Preprocess:
    """Centre crop to a multiple of train_size, average-pool down to train_size, scale to [-1, 1], CHW float32."""

    def __init__(self, p: Streaming):
        self.out = p.train_size
        self.factor = p.image_size // p.train_size

    def __call__(self, batch: dict) -> dict:
        images = batch["image"]
        crop = self.out * self.factor
        top = (images.shape[1] - crop) // 2
        images = images[:, top:top + crop, top:top + crop]
        pooled = images.reshape(len(images), self.out, self.factor, self.out, self.factor, 3).mean(axis=(2, 4))
        x = (pooled.astype(np.float32) / 127.5 - 1.0).transpose(0, 3, 1, 2)
        return {"x": np.ascontiguousarray(x), "y": np.asarray(batch["label"], dtype=np.int64)}


def ray_datasets(p: Streaming, ctx):
    import ray.data

    n = num_images(p)
    blocks = max(1, -(-n // p.rows_per_block))
    ds = (
        ray.data.range(n, override_num_blocks=blocks)
        .map_batches(GenerateImages(p), batch_size=p.rows_per_block, batch_format="numpy")
        .map_batches(Preprocess(p), batch_size=p.rows_per_block, batch_format="numpy")
    )
    return ds, None


class GeneratedDataset:
    """The same images as a lazy map-style dataset (`raytrain local streaming`, `data.loader: torch`): each image
    is generated from its id on access, so nothing is held and any shuffle order costs the same."""

    def __init__(self, p: Streaming):
        self.p, self.generate, self.preprocess = p, GenerateImages(p), Preprocess(p)

    def __len__(self) -> int:
        return num_images(self.p)

    def __getitem__(self, index: int):
        import torch

        if not 0 <= index < len(self):
            raise IndexError(index)
        sample = self.preprocess(self.generate({"id": np.asarray([index])}))
        return torch.from_numpy(sample["x"][0]), int(sample["y"][0])


def torch_datasets(p: Streaming, ctx):
    return GeneratedDataset(p), None


def check(p: Streaming, cfg, fail):
    if p.data_size_gb <= 0:
        fail("data.data_size_gb", f"{p.data_size_gb} must be > 0", "give the size to stream in GB, e.g. 10 or 0.05")
    if p.train_size < 1 or p.image_size < p.train_size:
        fail("data.train_size", f"{p.train_size} must be between 1 and data.image_size {p.image_size}",
             "use e.g. train_size 32 with image_size 256")
    if p.rows_per_block < 1:
        fail("data.rows_per_block", f"{p.rows_per_block} must be >= 1", "use e.g. 32")
    if num_images(p) < cfg.scaling.max_workers:
        fail("data.data_size_gb", f"{p.data_size_gb} GB holds {num_images(p)} images of {p.image_size}x{p.image_size}, "
             f"fewer than the {cfg.scaling.max_workers} workers", "stream more data or use fewer workers")
    if cfg.model_kwargs.get("num_classes", p.num_classes) != p.num_classes:
        fail("model.num_classes", f"the streamed data has data.num_classes={p.num_classes} classes",
             f"set model.num_classes={p.num_classes}")
    if cfg.model_kwargs.get("in_channels", 3) != 3:
        fail("model.in_channels", "the streamed images have 3 channels", "set model.in_channels=3")
