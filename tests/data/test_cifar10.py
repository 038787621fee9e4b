"""training/raytrain/data/cifar10.py: synthetic data, the shared transforms, the Parquet form and both loaders agreeing."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from raytrain.data import DataContext, DataUnavailable
from raytrain.data import cifar10
from raytrain.spec.config import ConfigError, load_config


def params(**kw) -> cifar10.CIFAR10:
    return cifar10.CIFAR10(**{"synthetic": True, "synthetic_train": 40, "synthetic_val": 10, **kw})


def test_synthetic_arrays_are_cifar_shaped_deterministic_and_cover_the_classes():
    images, labels = cifar10.synthetic_arrays(500, seed=3)
    assert images.shape == (500, 32, 32, 3) and images.dtype == np.uint8
    assert labels.dtype == np.int64 and set(labels.tolist()) == set(range(10))
    again, _ = cifar10.synthetic_arrays(500, seed=3)
    assert np.array_equal(images, again)
    assert not np.array_equal(images, cifar10.synthetic_arrays(500, seed=4)[0])


def test_synthetic_classes_are_learnable_from_their_mean_colour():
    images, labels = cifar10.synthetic_arrays(2000, seed=0)
    colour = images.reshape(len(images), -1, 3).mean(axis=1)
    centroids = np.stack([colour[labels == c].mean(axis=0) for c in range(10)])
    test_images, test_labels = cifar10.synthetic_arrays(500, seed=1)
    test_colour = test_images.reshape(len(test_images), -1, 3).mean(axis=1)
    predicted = np.argmin(((test_colour[:, None, :] - centroids[None]) ** 2).sum(-1), axis=1)
    assert (predicted == test_labels).mean() > 0.9


def test_normalise_maps_0_and_255_to_minus_one_and_one_in_chw():
    images = np.zeros((2, 32, 32, 3), dtype=np.uint8)
    images[1] = 255
    x = cifar10.normalise(images)
    assert x.shape == (2, 3, 32, 32) and x.dtype == np.float32
    assert np.allclose(x[0], -1.0) and np.allclose(x[1], 1.0)


def test_augment_keeps_shape_and_moves_pixels():
    images, _ = cifar10.synthetic_arrays(16, seed=0)
    out = cifar10.augment(images, np.random.default_rng(0))
    assert out.shape == images.shape and out.dtype == np.uint8
    assert not np.array_equal(out, images)


def test_parquet_round_trip_and_both_loaders_give_the_same_tensors(tmp_path):
    ctx = DataContext(root=tmp_path)
    p = params(augment=False)
    root = cifar10.to_parquet(p, ctx, tmp_path / "pq")
    assert cifar10.parquet_complete(root / "train") and cifar10.parquet_complete(root / "val")
    table = pq.read_table(root / "train")
    assert table.column_names == ["image", "label"] and table.num_rows == 40

    decoded = cifar10.DecodeNormalise(train_augment=False)(
        {"image": table.column("image").to_pylist(), "label": np.asarray(table.column("label"))})
    train_ds, val_ds = cifar10.torch_datasets(p, ctx)
    assert (len(train_ds), len(val_ds)) == (40, 10)
    torch_x = torch.stack([train_ds[i][0] for i in range(len(train_ds))])
    torch_y = [train_ds[i][1] for i in range(len(train_ds))]
    assert torch.equal(torch_x, torch.from_numpy(decoded["x"]))  # PNG is lossless
    assert torch_y == decoded["y"].tolist()


def test_a_half_written_parquet_directory_is_rewritten(tmp_path):
    ctx = DataContext(root=tmp_path)
    (tmp_path / "pq" / "train").mkdir(parents=True)
    (tmp_path / "pq" / "train" / "part-00000.parquet").write_bytes(b"truncated")
    cifar10.to_parquet(params(), ctx, tmp_path / "pq")
    assert pq.read_table(tmp_path / "pq" / "train").num_rows == 40


def test_missing_real_data_without_download_says_how_to_stage_it(tmp_path):
    with pytest.raises(DataUnavailable) as err:
        cifar10.prepare(cifar10.CIFAR10(download=False), DataContext(root=tmp_path))
    message = str(err.value)
    assert "raytrain data cifar10 --root" in message and "data.synthetic=true" in message
    assert (tmp_path / ".cifar10.lock").exists()  # the download runs under the storage path's lock


@pytest.mark.parametrize("override, key", [
    ("model.num_classes=100", "model.num_classes"),
    ("model.image_size=64", "model.image_size"),
    ("data.synthetic_train=1", "data.synthetic_train"),
    ("data.loader=files", "data.loader"),
])
def test_bad_cifar10_settings_name_the_key_and_the_fix(override, key):
    with pytest.raises(ConfigError) as err:
        load_config("cifar10-vit", ["data.synthetic=true", override])
    assert key in str(err.value) and "Fix:" in str(err.value)


def test_preset_is_the_issue_vit_and_smoke_shrinks_it():
    cfg = load_config("cifar10-vit")
    m = cfg.model.kwargs
    assert tuple(m[k] for k in ("patch_size", "num_layers", "num_heads", "hidden_dim", "mlp_dim")) == (4, 12, 8, 384, 768)
    assert (cfg.train.optimizer, cfg.train.lr, cfg.train.weight_decay, cfg.train.batch_size) == ("adamw", 1e-3, 1e-2, 512)
    assert cfg.train.mixed_precision == "auto"
    smoke = load_config("cifar10-vit", smoke=True)
    assert smoke.data.kwargs["synthetic"] and smoke.model.kwargs["num_layers"] < m["num_layers"]
