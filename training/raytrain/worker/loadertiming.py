"""Goodput's data wait and evaluation for a Ray Train function, which iterates its own loaders (raytrain's built-in
loop times its own: raytrain.worker.session). While the function runs, in its worker process only, the iteration of
every torch DataLoader and Ray Data iterator (`ray.train.get_dataset_shard(...).iter_torch_batches()` and
`.iter_batches()`) is timed into the session, which puts it into the next metrics row's `timing`, and the first
iteration's start ends the worker group's start-up (its `start` event's `first_batch`: a function's group start is
recorded at its first report, which would otherwise count its first epoch as start-up):

- an iteration begun with autograd on (a training loop): the time each next() takes, the data wait;
- one begun with autograd off (under `torch.no_grad()` or `torch.inference_mode()`, as evaluation loops run): its
  whole time, from its first batch asked for to its end, forward passes included: the evaluation. Left early (a
  `break`), it counts to its last batch's arrival.

Two clock reads a batch, as the built-in loop's. An iteration inside another's next() (a dataset that iterates a
loader of its own) is not counted again; Ray's prepare_data_loader wrapper overrides `__iter__` and iterates the
DataLoader it wraps, which is the one timed. What this cannot see: an evaluation that
iterates with autograd on counts its batches' waits as data wait and its forward passes as training; a loader that
is neither a DataLoader nor a Ray Data iterator is training.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any, Optional, Protocol


class Timed(Protocol):
    """What the times go to (raytrain.worker.session.Session): seconds since the last metrics row, and when the
    first batch was asked for (time.time()), which ends the group's start-up."""

    _data_s: float
    _val_s: float
    first_batch_at: Optional[float]


class _Clock(threading.local):
    depth = 0  # iterations being timed on this thread: only the outermost counts


_clock = _Clock()


def _timed(iterator: Iterator, into: Timed) -> Iterator:
    """Which it is, is decided where the iteration starts (a generator's body would only run at the first next())."""
    import torch

    if into.first_batch_at is None:
        into.first_batch_at = time.time()
    return _training(iterator, into) if torch.is_grad_enabled() else _evaluation(iterator, into)


def _training(iterator: Iterator, into: Timed) -> Iterator:
    while True:
        waited = time.perf_counter()
        _clock.depth += 1
        try:
            item = next(iterator)
        except StopIteration:
            return
        finally:
            _clock.depth -= 1
            if _clock.depth == 0:
                into._data_s += time.perf_counter() - waited
        yield item


def _evaluation(iterator: Iterator, into: Timed) -> Iterator:
    # Whether it is nested is known at its first next(): inside an outer iteration's next(), where it runs.
    outermost = _clock.depth == 0
    began = ended = time.perf_counter()
    try:
        while True:
            _clock.depth += 1
            try:
                item = next(iterator)
            except StopIteration:
                ended = time.perf_counter()  # the last batch's forward pass included
                return
            finally:
                _clock.depth -= 1
            ended = time.perf_counter()
            yield item
    finally:
        # Exhausted; or closed when the loop left it (a break, an exception), counted to its last batch's arrival,
        # so that an iterator kept and dropped much later never counts the training in between
        if outermost:
            into._val_s += ended - began


class _TimedIterable:
    """A Ray Data iterable (each `for` over it iterates anew), each iteration timed."""

    def __init__(self, iterable: Iterable, into: Timed):
        self._iterable, self._into = iterable, into

    def __iter__(self) -> Iterator:
        return _timed(iter(self._iterable), self._into)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._iterable, name)


@contextlib.contextmanager
def timing(into: Timed) -> Iterator[None]:
    """Time every loader's iteration into `into` while the block runs; the classes are as they were after it."""
    from ray.data.iterator import DataIterator
    from torch.utils.data import DataLoader

    def loader_iter(original):
        @functools.wraps(original)
        def __iter__(self):
            return _timed(original(self), into)
        return __iter__

    def data_iter(original):
        @functools.wraps(original)
        def method(self, *args, **kwargs):
            return _TimedIterable(original(self, *args, **kwargs), into)
        return method

    patches = [(DataLoader, "__iter__", loader_iter), (DataIterator, "iter_batches", data_iter),
               (DataIterator, "iter_torch_batches", data_iter)]
    # A class without the method (another Ray or torch) is left as it is: its loaders count as training
    patches = [(owner, name, wrap) for owner, name, wrap in patches if name in owner.__dict__]
    originals = [(owner, name, owner.__dict__[name]) for owner, name, _ in patches]
    for owner, name, wrap in patches:
        setattr(owner, name, wrap(owner.__dict__[name]))
    try:
        yield
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)
