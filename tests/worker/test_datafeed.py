"""raytrain.worker.datafeed: each worker's shard of an epoch (DistributedSampler's split, seeded by train.seed and the
epoch), a mid-epoch resume that starts the sampler at the next batch (nothing before it is loaded again), and
loader caches that stay bounded when a loop passes a new dataset object every epoch."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

from raytrain.worker.datafeed import LOADER_CACHE_SIZE, DataFeed, ShardSampler


def shards(length, world, seed=0, epoch=0, shuffle=True):
    out = []
    for rank in range(world):
        sampler = ShardSampler(length, rank=rank, world_size=world, seed=seed, shuffle=shuffle, batch_size=4)
        sampler.set_epoch(epoch)
        out.append(list(sampler))
    return out


def test_the_shards_cover_the_epoch_once_padded_to_equal_length():
    parts = shards(10, 3)
    assert [len(p) for p in parts] == [4, 4, 4]  # 10 samples, padded to 12 as DistributedSampler does
    every = sum(parts, [])
    assert set(every) == set(range(10)) and len(every) - len(set(every)) == 2  # two repeated to pad


def test_the_order_is_a_function_of_seed_and_epoch_the_same_on_every_worker():
    assert shards(50, 2, seed=1, epoch=3) == shards(50, 2, seed=1, epoch=3)
    assert shards(50, 2, seed=1, epoch=3) != shards(50, 2, seed=1, epoch=4)
    assert shards(50, 2, seed=1, epoch=3) != shards(50, 2, seed=2, epoch=3)
    assert shards(8, 2, shuffle=False) == [[0, 2, 4, 6], [1, 3, 5, 7]]


class Counting(Dataset):
    """Counts every item loaded: a resume must not load the batches it skips."""

    def __init__(self, n):
        self.n, self.loaded = n, 0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.loaded += 1
        return torch.tensor([float(i)]), torch.tensor(i)


def test_a_resume_starts_the_sampler_at_the_next_batch_without_loading_the_ones_before():
    feed = DataFeed(rank=0, world_size=1, seed=0, batch_size=4)
    data = Counting(40)
    loader = feed.cached("train", data, shuffle=True)
    batches, replay = feed.epoch_batches(loader, 2, 0)
    whole = [y.tolist() for _, y in batches]
    data.loaded = 0
    batches, replay = feed.epoch_batches(loader, 2, 6)
    rest = [y.tolist() for _, y in batches]
    assert replay == 0 and rest == whole[6:]
    assert data.loaded == 40 - 6 * 4  # the six batches before were never loaded


def test_a_loader_of_the_loops_own_is_replayed_instead():
    feed = DataFeed(rank=0, world_size=1, seed=0, batch_size=4)
    own = DataLoader(TensorDataset(torch.arange(12.0), torch.arange(12)), batch_size=4)
    _, replay = feed.epoch_batches(feed.cached(None, own, shuffle=True), 1, 2)
    assert replay == 2  # the session drops that many before its first step


def test_the_loader_cache_stays_bounded_for_a_new_dataset_object_every_epoch():
    feed = DataFeed(rank=0, world_size=1, seed=0, batch_size=4)
    sizes = []
    for epoch in range(10):
        dataset = TensorDataset(torch.arange(8.0), torch.arange(8))  # a new object each epoch
        feed.cached(None, dataset, shuffle=True)
        sizes.append(feed.cache_size)
    assert max(sizes) == LOADER_CACHE_SIZE
    same = TensorDataset(torch.arange(8.0), torch.arange(8))
    assert feed.cached(None, same, shuffle=True) is feed.cached(None, same, shuffle=True)
