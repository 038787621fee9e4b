"""raytrain.worker.loadertiming: a Ray Train function's loaders timed into its session (goodput's data wait and
evaluation), on real torch DataLoaders whose dataset sleeps a known time per sample. Ray Data's iterators are timed
the same way on a real Ray: tests/integration/test_ray_train_scripts.py."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from raytrain.worker import loadertiming

SAMPLE_S = 0.01  # each sample's load


class Slow(Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(SAMPLE_S)
        return torch.tensor([float(index)])


@dataclass
class Into:
    _data_s: float = 0.0
    _val_s: float = 0.0
    first_batch_at: Optional[float] = None


class Nested(Dataset):
    """A dataset that iterates a loader of its own for each item: its waits are inside the outer one's."""

    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.cat(list(DataLoader(Slow(), batch_size=4)))


def test_a_training_iteration_counts_its_waits_and_not_the_loop_body() -> None:
    into, loader = Into(), DataLoader(Slow(), batch_size=2)
    with loadertiming.timing(into):
        began = time.time()
        for _ in loader:
            time.sleep(0.05)  # the step: training, not data wait
    assert 8 * SAMPLE_S <= into._data_s < 8 * SAMPLE_S + 0.15, into
    assert into._val_s == 0 and began <= into.first_batch_at <= began + 0.1, into


@pytest.mark.parametrize("off", [torch.no_grad, torch.inference_mode])
def test_an_iteration_without_autograd_is_evaluation_whole_forward_passes_included(off) -> None:
    into, loader = Into(), DataLoader(Slow(), batch_size=4)
    with loadertiming.timing(into):
        with off():
            for _ in loader:
                time.sleep(0.05)
    assert 8 * SAMPLE_S + 2 * 0.05 <= into._val_s < 8 * SAMPLE_S + 2 * 0.05 + 0.15, into
    assert into._data_s == 0, into


def test_an_evaluation_left_early_ends_where_the_loop_left_it() -> None:
    into = Into()
    with loadertiming.timing(into):
        with torch.no_grad():
            for _ in DataLoader(Slow(), batch_size=2):
                break
        time.sleep(0.2)  # after the evaluation: not its
    assert 2 * SAMPLE_S <= into._val_s < 0.15, into


def test_an_iteration_inside_another_is_counted_once() -> None:
    into = Into()
    with loadertiming.timing(into):
        assert len(list(DataLoader(Nested(), batch_size=1))) == 2
    assert 2 * 8 * SAMPLE_S <= into._data_s < 2 * 8 * SAMPLE_S + 0.1, into


def test_prepare_data_loaders_wrapper_is_timed_through_the_loader_it_wraps() -> None:
    from ray.train.torch.train_loop_utils import _WrappedDataLoader

    into = Into()
    with loadertiming.timing(into):
        wrapped = _WrappedDataLoader(DataLoader(Slow(), batch_size=2), torch.device("cpu"), auto_transfer=False)
        assert len(list(wrapped)) == 4
    assert 8 * SAMPLE_S <= into._data_s < 8 * SAMPLE_S + 0.1, into


def test_an_evaluation_iterator_kept_and_dropped_later_counts_only_to_its_last_batch() -> None:
    into = Into()
    with loadertiming.timing(into):
        with torch.no_grad():
            kept = iter(DataLoader(Slow(), batch_size=2))
            next(kept)
        time.sleep(0.3)  # training, while the iterator lives on
        del kept
    assert 2 * SAMPLE_S <= into._val_s < 0.15, into


def test_outside_the_block_loaders_are_as_they_were() -> None:
    original = DataLoader.__iter__
    into = Into()
    with pytest.raises(RuntimeError, match="the function failed"):
        with loadertiming.timing(into):
            assert DataLoader.__iter__ is not original
            raise RuntimeError("the function failed")
    assert DataLoader.__iter__ is original
    list(DataLoader(Slow(), batch_size=4))
    assert into._data_s == 0 and into.first_batch_at is None
