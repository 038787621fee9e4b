"""CIFAR-10 for the ViT preset, fed two ways: map-style arrays through prepare_data_loader (`data.loader: torch`)
or Parquet (PNG image bytes + label) decoded and normalised by Ray Data tasks (`data.loader: ray`).

The real data comes from torchvision's CIFAR10 download, done once per storage path under a file lock by the
driver. Offline, `data.synthetic: true` generates CIFAR-shaped images whose colour pattern depends on the class
(so a model can learn them), of any size; on the Ray path it is written as Parquet exactly like the real data.
Both paths share one normalisation and one augmentation, so they report the same metrics.
"""

from __future__ import annotations

import io
import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, ClassVar

import numpy as np
from pydantic import Field

from raytrain.data import DataContext, DataSource, DataUnavailable, check_generated_size, splits

MEAN = STD = (0.5, 0.5, 0.5)
IMAGE_SHAPE = (32, 32, 3)  # HWC uint8, as torchvision's CIFAR10.data holds it
NUM_CLASSES = 10
ROWS_PER_FILE = 5000
DONE_MARKER = "_COMPLETE"  # written last: a Parquet directory without it is a half-written one


@dataclass
class CIFAR10(DataSource):
    synthetic: bool = False  # true: generated CIFAR-shaped data (offline, tests); false: torchvision CIFAR-10
    synthetic_train: Annotated[int, Field(gt=0)] = 50000  # synthetic only: training images
    synthetic_val: Annotated[int, Field(gt=0)] = 10000  # synthetic only: validation images
    download: bool = True  # false: only use files already staged under <storage>/datasets/cifar-10-batches-py
    parquet_dir: str = ""  # loader ray: the Parquet form (raytrain data cifar10 --to-parquet); "" = under datasets
    augment: bool = True  # training images: random crop (pad 4) and horizontal flip

    loaders: ClassVar[tuple[str, ...]] = ("torch", "ray")

    def memory_bytes(self) -> int:
        """uint8 images and int64 labels: CIFAR-10's 60,000, or the synthetic splits' counts."""
        count = self.synthetic_train + self.synthetic_val if self.synthetic else 60000
        return count * (int(np.prod(IMAGE_SHAPE)) + 8)

    def prepare(self, ctx: DataContext) -> None:
        prepare(self, ctx)

    def datasets(self, ctx: DataContext) -> dict:
        return splits(*(ray_datasets(self, ctx) if ctx.loader == "ray" else torch_datasets(self, ctx)))

    def check(self, cfg, fail) -> None:
        check(self, cfg, fail)


# ----------------------------------------------------------------------------------------------------------
# arrays: (images N x 32 x 32 x 3 uint8, labels N int64)


def synthetic_arrays(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Each class has its own mean colour and stripe direction; noise makes single pixels uninformative."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, NUM_CLASSES, size=n).astype(np.int64)
    palette = np.random.default_rng(1234).integers(80, 176, size=(NUM_CLASSES, 3))  # the same for every split
    rows = np.arange(32)[:, None]
    cols = np.arange(32)[None, :]
    stripes = np.stack([np.sin((rows * (c % 5 + 1) + cols * (c // 5)) / 2.0) for c in range(NUM_CLASSES)])
    images = palette[labels][:, None, None, :] + 12 * stripes[labels][..., None]
    images = images + rng.normal(0, 48, size=(n, *IMAGE_SHAPE))
    return np.clip(images, 0, 255).astype(np.uint8), labels


def torchvision_arrays(root: Path, train: bool) -> tuple[np.ndarray, np.ndarray]:
    from torchvision.datasets import CIFAR10 as TorchvisionCIFAR10

    ds = TorchvisionCIFAR10(str(root), train=train, download=False)
    return np.asarray(ds.data, dtype=np.uint8), np.asarray(ds.targets, dtype=np.int64)


def split_arrays(p: CIFAR10, ctx, train: bool) -> tuple[np.ndarray, np.ndarray]:
    if p.synthetic:
        return synthetic_arrays(p.synthetic_train if train else p.synthetic_val, ctx.seed + (0 if train else 1))
    return torchvision_arrays(ctx.root, train)


# ----------------------------------------------------------------------------------------------------------
# transforms shared by both loaders (batched: N x H x W x C uint8 in, N x C x H x W float32 out)


def augment(images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Random 32x32 crop of the image padded by 4 (zeros), then a horizontal flip with probability 1/2."""
    n = len(images)
    padded = np.pad(images, ((0, 0), (4, 4), (4, 4), (0, 0)))
    dy, dx = rng.integers(0, 9, size=n), rng.integers(0, 9, size=n)
    out = np.stack([padded[i, dy[i]:dy[i] + 32, dx[i]:dx[i] + 32] for i in range(n)])
    flip = rng.random(n) < 0.5
    out[flip] = out[flip][:, :, ::-1]
    return out


def normalise(images: np.ndarray) -> np.ndarray:
    x = images.astype(np.float32).transpose(0, 3, 1, 2) / 255.0
    mean = np.asarray(MEAN, dtype=np.float32)[None, :, None, None]
    std = np.asarray(STD, dtype=np.float32)[None, :, None, None]
    return (x - mean) / std


class ArrayDataset:
    """Map-style CIFAR-shaped dataset over uint8 arrays; what `prepare_data_loader` shards (torch loader)."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, train_augment: bool):
        self.images, self.labels, self.train_augment = images, labels, train_augment
        self.rng = np.random.default_rng()

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        image = self.images[index:index + 1]
        if self.train_augment:
            image = augment(image, self.rng)
        import torch  # on the worker; this module stays importable without torch

        return torch.from_numpy(normalise(image)[0]), int(self.labels[index])


# ----------------------------------------------------------------------------------------------------------
# Parquet: columns image (PNG bytes) and label, ROWS_PER_FILE rows per file


def encode_png(image: np.ndarray) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    return buffer.getvalue()


def decode_png(data: bytes) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), dtype=np.uint8)


def write_parquet(images: np.ndarray, labels: np.ndarray, out_dir: Path) -> None:
    """Write one split atomically: into a temporary sibling, then renamed into place."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tmp = out_dir.with_name(f".{out_dir.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    files = max(1, math.ceil(len(labels) / ROWS_PER_FILE))
    for part, (chunk_images, chunk_labels) in enumerate(zip(np.array_split(images, files), np.array_split(labels, files))):
        table = pa.table({"image": pa.array([encode_png(im) for im in chunk_images], type=pa.binary()),
                          "label": pa.array(chunk_labels, type=pa.int64())})
        pq.write_table(table, tmp / f"part-{part:05d}.parquet")
    (tmp / DONE_MARKER).write_text(f"{len(labels)}\n")
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp, out_dir)


def parquet_complete(split_dir: Path) -> bool:
    return (split_dir / DONE_MARKER).is_file()


def parquet_root(p: CIFAR10, ctx) -> Path:
    if p.parquet_dir:
        return Path(p.parquet_dir).expanduser().absolute()
    if p.synthetic:
        return ctx.root / f"cifar10-synthetic-{p.synthetic_train}-{p.synthetic_val}-seed{ctx.seed}-parquet"
    return ctx.root / "cifar10-parquet"


def to_parquet(p: CIFAR10, ctx, out_root: Path) -> Path:
    """Both splits as Parquet under out_root/{train,val}; `raytrain data cifar10 --to-parquet` calls this."""
    for split, train in (("train", True), ("val", False)):
        if not parquet_complete(out_root / split):
            write_parquet(*split_arrays(p, ctx, train), out_root / split)
    return out_root


# ----------------------------------------------------------------------------------------------------------
# what the DataSource hooks call


def download(p: CIFAR10, ctx) -> None:
    """torchvision's download (and integrity check) of the real data into ctx.root, under a file lock."""
    from filelock import FileLock
    from torchvision.datasets import CIFAR10 as TorchvisionCIFAR10

    ctx.root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(ctx.root / ".cifar10.lock")):
        try:
            TorchvisionCIFAR10(str(ctx.root), train=True, download=p.download)
            TorchvisionCIFAR10(str(ctx.root), train=False, download=p.download)
        except Exception as err:  # torchvision raises RuntimeError/URLError/OSError depending on what failed
            raise DataUnavailable(
                f"CIFAR-10 is not available under {ctx.root / 'cifar-10-batches-py'} and could not be downloaded "
                f"({' '.join(str(err).split())[:200]}). Fix: on a machine with internet run `raytrain data cifar10 "
                f"--root {ctx.root}`, or copy the extracted cifar-10-batches-py directory (from "
                f"https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz) into {ctx.root}; or set data.synthetic=true "
                f"to train on generated CIFAR-shaped data."
            ) from None


def prepare(p: CIFAR10, ctx) -> None:
    if not p.synthetic:
        download(p, ctx)


def torch_datasets(p: CIFAR10, ctx):
    return (ArrayDataset(*split_arrays(p, ctx, True), train_augment=p.augment),
            ArrayDataset(*split_arrays(p, ctx, False), train_augment=False))


class DecodeNormalise:
    """Ray Data map_batches: PNG bytes -> normalised float32 CHW tensors in column x, labels in column y."""

    def __init__(self, train_augment: bool):
        self.train_augment = train_augment

    def __call__(self, batch: dict) -> dict:
        images = np.stack([decode_png(b) for b in batch["image"]])
        if self.train_augment:
            images = augment(images, np.random.default_rng())
        return {"x": normalise(images), "y": np.asarray(batch["label"], dtype=np.int64)}


def ray_datasets(p: CIFAR10, ctx):
    """Runs on the driver after prepare: writes the Parquet form once (under a file lock) when it is missing."""
    import ray.data
    from filelock import FileLock

    root = parquet_root(p, ctx)
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root / ".write.lock")):
        try:
            to_parquet(p, ctx, root)
        except OSError as err:
            raise DataUnavailable(
                f"cannot write the Parquet form of CIFAR-10 to {root} ({err.strerror}). Fix: make it writable, or "
                f"write it elsewhere with `raytrain data cifar10 --to-parquet DIR` and set data.parquet_dir=DIR."
            ) from None
    read = lambda split: ray.data.read_parquet(str(root / split), file_extensions=["parquet"])  # noqa: E731
    train = read("train").map_batches(DecodeNormalise(p.augment), batch_format="numpy", batch_size=256)
    val = read("val").map_batches(DecodeNormalise(False), batch_format="numpy", batch_size=256)
    return train, val


def check(p: CIFAR10, cfg, fail):
    if p.synthetic and (p.synthetic_train < cfg.scaling.max_workers or p.synthetic_val < 1):
        fail("data.synthetic_train", f"{p.synthetic_train} training / {p.synthetic_val} validation images are too few "
             f"for {cfg.scaling.max_workers} workers", "generate at least one image per worker and one to validate")
    if p.synthetic:  # 32x32x3 bytes and a label each
        check_generated_size(fail, "data.synthetic_train", p.synthetic_train + p.synthetic_val, 3 * 32 * 32 + 8,
                             "synthetic images (training and validation)")
    if cfg.model_kwargs.get("num_classes", NUM_CLASSES) != NUM_CLASSES:
        fail("model.num_classes", f"CIFAR-10 has {NUM_CLASSES} classes", f"set model.num_classes={NUM_CLASSES}")
    if cfg.model_kwargs.get("image_size", 32) != 32:
        fail("model.image_size", "CIFAR-10 images are 32x32", "set model.image_size=32")
    if cfg.model_kwargs.get("in_channels", 3) != 3:
        fail("model.in_channels", "CIFAR-10 images have 3 channels", "set model.in_channels=3")
