"""Real 8x8 handwritten digits shipped inside scikit-learn (load_digits): no download, held-out split."""

from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import TensorDataset

from training.data import DatasetSpec, arrays_to_ray


@dataclass
class DigitsParams:
    val_fraction: float = 0.2  # held out, stratified by class


def arrays(p: DigitsParams, seed: int):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[:, None, :, :]  # N x 1 x 8 x 8 in [0, 1]
    labels = digits.target.astype(np.int64)
    return train_test_split(images, labels, test_size=p.val_fraction, random_state=seed, stratify=labels)


def torch_datasets(p: DigitsParams, ctx):
    x_train, x_val, y_train, y_val = arrays(p, ctx.seed)
    to_ds = lambda x, y: TensorDataset(torch.from_numpy(x), torch.from_numpy(y))  # noqa: E731
    return to_ds(x_train, y_train), to_ds(x_val, y_val)


def ray_datasets(p: DigitsParams, ctx):
    x_train, x_val, y_train, y_val = arrays(p, ctx.seed)
    return arrays_to_ray(x_train, y_train), arrays_to_ray(x_val, y_val)


def check(cfg, fail):
    if not 0 < cfg.data.params.val_fraction < 1:
        fail("data.val_fraction", f"{cfg.data.params.val_fraction} is outside (0, 1)", "use e.g. 0.2")
    if getattr(cfg.model.params, "num_classes", 10) != 10:
        fail("model.num_classes", "digits has 10 classes", "set model.num_classes=10")


SPEC = DatasetSpec(DigitsParams, "classification", ("ray", "torch"), torch_datasets, ray_datasets, check=check)
