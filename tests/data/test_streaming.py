"""training/raytrain/data/streaming.py: sizing, the generate and preprocess steps, the lazy map-style twin, checks."""

from __future__ import annotations

import numpy as np
import pytest

from raytrain.data import DataContext
from raytrain.data import streaming
from raytrain.spec.config import ConfigError, load_config


def test_data_size_sets_the_number_of_raw_images():
    p = streaming.Streaming(data_size_gb=0.1, image_size=256)
    assert streaming.bytes_per_image(p) == 256 * 256 * 3
    assert streaming.num_images(p) == 100_000_000 // (256 * 256 * 3)


def test_generate_is_deterministic_per_id_and_preprocess_pools_to_train_size():
    p = streaming.Streaming(image_size=64, train_size=16)
    ids = {"id": np.arange(10, 20)}
    raw = streaming.GenerateImages(p)(ids)
    assert raw["image"].shape == (10, 64, 64, 3) and raw["image"].dtype == np.uint8
    assert np.array_equal(raw["image"], streaming.GenerateImages(p)(ids)["image"])
    out = streaming.Preprocess(p)(raw)
    assert out["x"].shape == (10, 3, 16, 16) and out["x"].dtype == np.float32
    assert out["x"].min() >= -1.0 and out["x"].max() <= 1.0
    assert out["y"].tolist() == raw["label"].tolist()


def test_the_classes_are_learnable_from_the_tint():
    p = streaming.Streaming(image_size=32, train_size=8)
    batch = streaming.Preprocess(p)(streaming.GenerateImages(p)({"id": np.arange(400)}))
    colour = batch["x"].mean(axis=(2, 3))
    centroids = np.stack([colour[batch["y"] == c].mean(axis=0) for c in range(p.num_classes)])
    predicted = np.argmin(((colour[:, None] - centroids[None]) ** 2).sum(-1), axis=1)
    assert (predicted == batch["y"]).mean() > 0.9


def test_the_map_style_twin_yields_the_same_samples_as_the_pipeline():
    p = streaming.Streaming(data_size_gb=64 * 64 * 3 * 10 / 1e9, image_size=64, train_size=16, rows_per_block=4)
    ds, val = streaming.torch_datasets(p, DataContext(root=None))
    assert val is None and len(ds) == 10
    pipeline = streaming.Preprocess(p)(streaming.GenerateImages(p)({"id": np.arange(5, 7)}))  # any batching
    x, y = ds[5]
    assert np.array_equal(x.numpy(), pipeline["x"][0]) and y == pipeline["y"][0]


@pytest.mark.parametrize("override, key", [
    ("data.data_size_gb=0", "data.data_size_gb"),
    ("data.train_size=512", "data.train_size"),
    ("data.rows_per_block=0", "data.rows_per_block"),
    ("model.num_classes=3", "model.num_classes"),
    ("data.data_size_gb=0.0000001", "data.data_size_gb"),  # fewer images than workers
])
def test_bad_streaming_settings_name_the_key_and_the_fix(override, key):
    with pytest.raises(ConfigError) as err:
        load_config("streaming", [override])
    assert key in str(err.value) and "Fix:" in str(err.value)
