"""The Session's data feed: this worker's batches, sharded, shuffled per epoch, resumable at a batch.

A map-style dataset gets a `ShardSampler`: the epoch's order is a permutation drawn from (train.seed, epoch), the
same on every worker, and each worker takes every world_size-th index of it (DistributedSampler's split, padded to
equal length so every worker has the same number of batches). A mid-epoch resume starts the sampler at the next
batch: the batches already trained are neither loaded nor collated again.

A DataLoader the loop built itself keeps its own sampler: a resume replays (loads and skips) the batches already
trained, since raytrain cannot position a sampler it did not make. Ray Data shards skip the same number of batches
(not necessarily the same samples).

Loaders are cached per split name, and for datasets the loop passes in, by object in a small bounded cache: a loop
that makes a new dataset object every epoch does not grow it.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Iterator, Optional

if TYPE_CHECKING:
    import torch

LOADER_CACHE_SIZE = 4




class ShardSampler:
    """Indices of this worker's shard of one epoch, from `start_batch` on (see the module's doc)."""

    def __init__(self, length: int, *, rank: int, world_size: int, seed: int, shuffle: bool, batch_size: int):
        self.length, self.rank, self.world_size = length, rank, world_size
        self.seed, self.shuffle, self.batch_size = seed, shuffle, batch_size
        self.epoch = 0
        self.start_batch = 0

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        self.epoch, self.start_batch = epoch, start_batch

    def _shard(self) -> list[int]:
        import torch

        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.length, generator=generator).tolist()
        else:
            order = list(range(self.length))
        per_worker = math.ceil(self.length / self.world_size) if self.length else 0
        total = per_worker * self.world_size
        if order and total > len(order):  # pad by repeating from the start, as DistributedSampler does
            order += (order * math.ceil(total / len(order)))[:total - len(order)]
        return order[self.rank:total:self.world_size]

    def __iter__(self) -> Iterator[int]:
        return iter(self._shard()[self.start_batch * self.batch_size:])

    def __len__(self) -> int:
        per_worker = math.ceil(self.length / self.world_size) if self.length else 0
        return max(per_worker - self.start_batch * self.batch_size, 0)


class DataFeed:
    """Builds and caches this worker's loaders; positions them for an epoch."""

    def __init__(self, *, rank: int, world_size: int, seed: int, batch_size: int):
        self.rank, self.world_size, self.seed, self.batch_size = rank, world_size, seed, batch_size
        self._by_split: dict[str, Any] = {}
        self._by_object: OrderedDict[int, tuple[Any, Any]] = OrderedDict()  # id -> (dataset, loader)

    def loader(self, dataset: Any, *, shuffle: bool, batch_size: Optional[int] = None) -> Any:
        """A DataLoader over a map-style dataset with this worker's ShardSampler."""
        from torch.utils.data import DataLoader

        size = batch_size or self.batch_size
        sampler = ShardSampler(len(dataset), rank=self.rank, world_size=self.world_size, seed=self.seed,
                               shuffle=shuffle, batch_size=size)
        return DataLoader(dataset, batch_size=size, sampler=sampler)

    def cached(self, key: Any, dataset: Any, shuffle: bool) -> Any:
        """The loader for a split name (key: str) or a dataset/DataLoader object the loop passed (key: None)."""
        if isinstance(key, str):
            if key not in self._by_split:
                self._by_split[key] = self._make(dataset, shuffle)
            return self._by_split[key]
        entry = self._by_object.get(id(dataset))
        if entry is not None and entry[0] is dataset:  # the same object, not a new one at a reused address
            self._by_object.move_to_end(id(dataset))
            return entry[1]
        loader = self._make(dataset, shuffle)
        self._by_object[id(dataset)] = (dataset, loader)
        while len(self._by_object) > LOADER_CACHE_SIZE:
            self._by_object.popitem(last=False)
        return loader

    def _make(self, dataset: Any, shuffle: bool) -> Any:
        from torch.utils.data import DataLoader

        return dataset if isinstance(dataset, DataLoader) else self.loader(dataset, shuffle=shuffle)

    @property
    def cache_size(self) -> int:
        return len(self._by_split) + len(self._by_object)

    def epoch_batches(self, loader: Any, epoch: int, skip: int) -> tuple[Iterator, int]:
        """(the epoch's batches, how many of the first `skip` the iterator still yields and the caller must
        drop): 0 when raytrain's own sampler starts at the batch, `skip` when the loader's own sampler replays."""
        sampler = getattr(loader, "sampler", None)
        if isinstance(sampler, ShardSampler):
            sampler.set_epoch(epoch, start_batch=skip)
            return iter(loader), 0
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)  # a DistributedSampler of the loop's own
        elif getattr(loader, "generator", None) is not None:
            loader.generator.manual_seed(self.seed + epoch)
        return iter(loader), skip


def to_device(batch: Any, device: "torch.device") -> tuple["torch.Tensor", "torch.Tensor"]:
    x, y = (batch["x"], batch["y"]) if isinstance(batch, dict) else batch  # Ray Data: columns x and y
    return x.to(device, non_blocking=True), y.to(device, non_blocking=True)
