"""The sharded checkpointer: every worker writes its own shards with torch.distributed.checkpoint (DCP), while
training goes on; the commit stays atomic and fenced as for the single-file checkpointer (raytrain.checkpoint.checkpoints).

A checkpoint of a run:
  .staging-checkpoint_<...>/  shards/    DCP's files: each worker writes the model's and the optimizer's shards it
                                         holds (`__<rank>_<n>.distcp`), rank 0 also DCP's `.metadata` last, once
                                         every worker's write succeeded
                              extra.pt   the position, the resolved config and rank 0's extra state (an LR
                                         scheduler, running sums): small, written by rank 0, hashed as written
                              meta.json  the manifest, written last by rank 0: kind "sharded", the position, every
                                         file with its size (extra.pt with its sha256), the worker count
  checkpoint_<...>/           the same directory renamed into place by rank 0 after the run's fence passed.
On an object store the shards are written by DCP's fsspec writer straight under the checkpoint's own prefix
(`checkpoint_<...>/shards/`: there is no rename to make them appear), extra.pt and meta.json are staged locally and
uploaded by the commit, meta.json last: a prefix without it is a torn checkpoint (raytrain.checkpoint.checkpoints).
Where the shards go and which DCP writer and reader reach them is the run's checkpoint store's
(raytrain.rundir.checkpointstore).
So, as with the single-file checkpointer, a `checkpoint_*` directory was completely written and a `.staging-*`
one never was; the next lease holder removes the latter (raytrain.checkpoint.resume), and resume considers only the former.

Asynchronous saving (run.async_checkpoint, the default): `save` waits for the previous checkpoint (at most one in
flight), copies this worker's state to host memory (DCP's staging into buffers kept from one save to the next: the
only time training is blocked), and returns; a background thread per worker writes the shards, and on rank 0 then writes the manifest and commits.
DCP's own collectives for that write run on a separate gloo process group, never beside the training's. A write
or commit that failed (a full disk, a lost lease) is raised at the next `save` on every worker alike (rank 0 says
which, the others follow), or at `wait`, which the entry calls when the loop ends or the attempt stops: the last
checkpoint is committed before the attempt reports its result.

Resume (`load_newest`, every worker): rank 0 picks the newest checkpoint whose manifest, sizes and extra.pt agree
and tells the others; all read it with DCP into their own model and optimizer. DCP reshards: a checkpoint written
by N workers loads on M, FSDP or not, and into a single process (`raytrain local`). A checkpoint that fails to load
on any worker fails on all (DCP gathers the error) and the one before is tried. Every file's sha256 is computed
while DCP writes it (each worker hashes its own shards; the hashes reach rank 0 with DCP's write results) and named
in the manifest, so nothing is read back after a write; a start checks them (the driver for the checkpoint it plans
from, rank 0 before the workers load): a shard damaged in place, its size kept, is skipped like a torn one.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

# torch's own staging helpers (what BlockingAsyncStager uses), private: pinned with the image's torch.
from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.staging import BlockingAsyncStager

from raytrain.checkpoint import checkpoints
from raytrain.checkpoint.checkpoints import SHARDS_DIR, CheckpointUnreadable, Loaded, Position
from raytrain.lifecycle.endings import AttemptEnded, Ending
from raytrain.parallel import collectives, sharding
from raytrain.rundir import checkpointstore, storage
from raytrain.rundir.runcontrol import UNFENCED, Control

if TYPE_CHECKING:
    from torch import nn

EXTRA_FILE = "extra.pt"
KIND = "sharded"


class CheckpointWriteFailed(RuntimeError):
    """A sharded checkpoint could not be written or committed (its staging directory was removed)."""


@dataclass
class _InFlight:
    name: str
    position: Position
    thread: Optional[threading.Thread] = None
    committed: Optional[Path] = None
    error: Optional[BaseException] = None
    disk_full: Optional[str] = None  # storage.disk_full's words, measured before the staging directory went


class ShardedCheckpointer:
    """Every worker writes its shards into STORAGE/NAME/<checkpoint>/shards (see the module's doc)."""

    kind = KIND

    def __init__(self, run_dir: Path, control: Control = UNFENCED, keep: int = 2, *, rank: int = 0,
                 asynchronous: bool = True):
        self.run_dir, self.control, self.keep, self.rank = storage.as_path(run_dir), control, keep, rank
        self.asynchronous = asynchronous
        self.files = checkpoints.FileCheckpointer(run_dir, control, keep)  # staging paths, pruning, listing
        self.store = self.files.store
        self._in_flight: Optional[_InFlight] = None
        self._group: Any = None  # DCP's gloo group for background writes, made at the first save
        self._stager: Any = None  # host memory the state is copied into, kept from one save to the next
        self.blocked_s: list[float] = []  # how long each save blocked training (benchmarks read it)
        if not collectives.in_group():  # one process (raytrain local, export) is what it should be: DCP need not say so

            warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)

    # ---------------------------------------------------------------------------------------------- save

    def save(self, position: Position, model: "nn.Module", optimizer: Any, small_state: Callable[[], dict], *,
             config: dict) -> None:
        """Every worker at the same step. small_state(): the position, config and extra state (rank 0's is kept)."""

        import torch.distributed.checkpoint as dcp

        began = time.perf_counter()
        previous = self._settle()
        # Rank 0 decides for all (a failed previous checkpoint, the fence, the name), so that every worker raises or
        # writes alike and none is left waiting in a collective.
        decision = None
        if self.rank == 0:
            decision = self._decide(previous, position)
        kind, detail = collectives.broadcast_from_rank0(decision, self.rank)
        if kind == "lost":
            raise AttemptEnded(Ending.LEASE_LOST, detail)
        if kind == "failed":
            raise CheckpointWriteFailed(detail)
        name = detail
        staging = self.files.staging_path(name)
        # Rank 0's small state, serialized now (a snapshot) and written with the shards, in the background.
        extra = _serialized(small_state()) if self.rank == 0 else None
        state = _sharded_state(model, optimizer)
        shards = self.store.in_place(name, SHARDS_DIR)
        writer = _hashing(self.store.shard_writer(shards))
        if self.asynchronous:
            if self._stager is None:
                self._stager = ReusedHostBuffers()
            future = dcp.async_save(state, storage_writer=writer, process_group=self._dcp_group(),
                                    async_stager=self._stager)
            wait_write: Callable[[], Any] = future.result
        else:
            dcp.save(state, storage_writer=writer)
            wait_write = lambda: None  # noqa: E731
        world = _world_size()
        in_flight = _InFlight(name, position)
        thread = threading.Thread(target=self._finish, name=f"raytrain-checkpoint-{name}", daemon=True,
                                  args=(in_flight, wait_write, staging, shards, extra, position, config, world,
                                        writer.raytrain_digests))
        in_flight.thread, self._in_flight = thread, in_flight
        thread.start()
        if not self.asynchronous:
            self._settle(raise_error=True)
        self.blocked_s.append(time.perf_counter() - began)

    def _decide(self, previous: Optional[_InFlight], position: Position) -> tuple[str, str]:
        if previous is not None and previous.error is not None:
            if isinstance(previous.error, AttemptEnded) and previous.error.ending is Ending.LEASE_LOST:
                return "lost", previous.error.reason
            return "failed", _failed(previous)
        try:
            self.control.check()  # a worker of an attempt that lost the run does not even write
        except AttemptEnded as ended:
            return "lost", ended.reason
        return "ok", checkpoints.checkpoint_dir_name(position)

    def _dcp_group(self) -> Any:
        if self._group is None and collectives.in_group():
            import torch.distributed as dist

            self._group = dist.new_group(backend="gloo")
        return self._group

    def _finish(self, in_flight: _InFlight, wait_write: Callable[[], Any], staging: Path, shards: Path,
                extra: Optional[bytes], position: Position, config: dict, world: int,
                digests: dict[str, str]) -> None:
        try:
            wait_write()  # on rank 0 this returns once DCP wrote .metadata: after every worker's shards succeeded
            if self.rank == 0:
                assert extra is not None
                extra_meta = _write_extra(staging / EXTRA_FILE, extra)
                in_flight.committed = self.files.commit(
                    in_flight.name, lambda: _write_manifest(staging, shards, position, extra_meta, config=config,
                                                            attempt=self.control.token, world_size=world,
                                                            digests=digests))
        except BaseException as err:  # noqa: B036 - handed to the main thread
            in_flight.error = err
            in_flight.disk_full = storage.disk_full(err, staging)
            if self.rank == 0:  # its staging directory, and on an object store the shards uploaded so far
                self.store.abandon(in_flight.name)

    def _settle(self, raise_error: bool = False) -> Optional[_InFlight]:
        """Wait for the checkpoint in flight (if any) and return it."""
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is None:
            return None
        if in_flight.thread is not None:
            in_flight.thread.join()
        if raise_error and in_flight.error is not None:
            _raise(in_flight)
        return in_flight

    def wait(self) -> Optional[Path]:
        """The checkpoint in flight written and (rank 0) committed; its failure raised. Called when the loop ends
        or the attempt stops. Other ranks return once their shards are written, maybe before rank 0's rename."""
        in_flight = self._settle(raise_error=True)
        return in_flight.committed if in_flight is not None else None

    # ---------------------------------------------------------------------------------------------- read

    def latest(self) -> list[Path]:
        return checkpoints.committed(self.run_dir)

    def prune(self, keep: int) -> None:
        self.files.prune(keep)

    def remove_staging(self, warn: Callable[[str], None]) -> list[str]:
        return self.files.remove_staging(warn)

    def load_newest(self, warn: Callable[[str], None], model: "nn.Module", optimizer: Any) -> Optional[Loaded]:
        """Every worker: the newest checkpoint that loads, read into `model` and `optimizer`; Loaded.state holds the
        position, config and extra state (not the tensors). Each skipped one is reported through `warn` (rank 0)."""
        candidates: list = []
        if self.rank == 0:
            for path in self.latest():
                try:
                    small = read_small_state(path)
                    # Every shard against the hash it was written with (DCP reads no checksum: a shard damaged in
                    # place, its size kept, would load): rank 0 reads the checkpoint once more, only at a start.
                    checkpoints.verify_hash(path)
                    candidates.append((str(path), small))
                except CheckpointUnreadable as why:
                    warn(f"checkpoint {path.name} is unreadable: {why}; falling back to the one before")
        candidates = collectives.broadcast_from_rank0(candidates, self.rank)
        for path_text, small in candidates:
            path = storage.as_path(path_text)
            try:
                load_shards(path, model, optimizer)
            except (Exception, CheckpointException) as err:  # on every worker when one of them failed (DCP)
                if self.rank == 0:
                    warn(f"checkpoint {path.name} does not load: {_describe(err)}; falling back to the one before")
                continue
            return Loaded(path, small)
        return None


def _layout(value: Any, path: str = "") -> list:
    """The structure of a state dict: every tensor's place, shape and dtype (a DTensor's local shard), every other
    value's place and type. Host buffers are reused only for the same layout."""
    import torch

    if isinstance(value, dict):
        return [entry for key in sorted(value, key=str) for entry in _layout(value[key], f"{path}/{key}")]
    if isinstance(value, (list, tuple)):
        return [entry for i, item in enumerate(value) for entry in _layout(item, f"{path}/{i}")]
    if isinstance(value, torch.Tensor):
        local = value.to_local() if hasattr(value, "to_local") else value
        return [(path, tuple(local.shape), str(local.dtype))]
    return [(path, type(value).__name__)]


class ReusedHostBuffers(BlockingAsyncStager):
    """DCP's staging with host buffers kept between saves, as BlockingAsyncStager(cache_staged_state_dict=True)
    does, but pinned only where there is a GPU (pinning needs one) and rebuilt when the state's layout changes (the
    optimizer's state appears after its first step). Without it each save allocated and filled every shard twice
    (_create_cpu_state_dict deep-copies a CPU DTensor): 85-105 ms of the 115 ms a save of the gpt preset blocked
    (docs/benchmarks.md, P5). Reuse is safe because a save first waits for the previous write."""

    def __init__(self) -> None:
        super().__init__(cache_staged_state_dict=True)
        self._cached_layout: Optional[list] = None

    def stage(self, state_dict: dict) -> dict:
        import torch

        shape = _layout(state_dict)
        if self.state_dict_cache is None or shape != self._cached_layout:
            self.state_dict_cache = _create_cpu_state_dict(state_dict, pin_memory=torch.cuda.is_available())
            self._cached_layout = shape
        return _copy_state_dict(state_dict, self.state_dict_cache)


def _world_size() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _describe(err: BaseException) -> str:
    """One line: for DCP's CheckpointException, each failed worker's own error (a full disk says so)."""
    failures = getattr(err, "failures", None)
    if isinstance(failures, dict) and failures:
        return "; ".join(f"worker {rank}: {_describe(pair[0] if isinstance(pair, tuple) else pair)}"
                         for rank, pair in sorted(failures.items()))[:800]
    if isinstance(err, OSError) and err.strerror:
        return f"{err.strerror}{f' ({err.filename})' if err.filename else ''}"
    text = str(err).strip().splitlines()
    first = text[0] if text else ""
    return f"{err.__class__.__name__}: {first}"[:500] if first else err.__class__.__name__


def _raise(in_flight: _InFlight) -> None:
    err = in_flight.error
    if isinstance(err, AttemptEnded):
        raise err
    raise CheckpointWriteFailed(_failed(in_flight)) from err


def _failed(in_flight: _InFlight) -> str:
    """Why a checkpoint was not written, one paragraph: a full disk by its place and the fix (not torch's short
    write, "unexpected pos", which names no cause), anything else as it was raised."""
    if in_flight.disk_full:
        return (f"{in_flight.disk_full}: checkpoint {in_flight.name} could not be written (nothing of it was "
                f"committed). Fix: free space there, or make it larger, or lower run.keep_checkpoints; then run the "
                f"same command again to resume from the checkpoints kept")
    return (f"checkpoint {in_flight.name} could not be written: {_describe(in_flight.error)} (nothing of it was "
            f"committed)")


def _serialized(state: dict) -> bytes:
    import torch

    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def _write_extra(path: Path, data: bytes) -> dict:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


class _HashingStream:
    """A stream DCP writes a shard through: its sha256 computed as the bytes go by (no second read). A seek (DCP
    writes each file front to back) makes the hash unknown rather than wrong."""

    def __init__(self, stream: Any):
        self._stream, self._digest, self.size = stream, hashlib.sha256(), 0
        self.seeked = False

    def write(self, data: Any) -> int:
        written = self._stream.write(data)
        view = memoryview(data).cast("B")
        if isinstance(written, int) and written < len(view):
            view = view[:written]
        self._digest.update(view)
        self.size += len(view)
        return written if written is not None else len(view)

    def seek(self, *args: Any) -> int:
        self.seeked = True
        return self._stream.seek(*args)

    def hexdigest(self) -> Optional[str]:
        return None if self.seeked else self._digest.hexdigest()

    def __getattr__(self, name: str) -> Any:  # tell, fileno, flush, close: the stream's own
        return getattr(self._stream, name)


def _hashing(writer: Any) -> Any:
    """DCP's storage writer with every file it writes hashed as written: each worker's shards' hashes travel to
    rank 0 with DCP's own write results (an attribute DCP ignores), and rank 0's finish gathers them into
    `writer.raytrain_digests` ({file name: sha256}, .metadata included) for the manifest."""

    digests: dict[str, str] = {}
    lock = threading.Lock()
    create_stream = writer.fs.create_stream

    @contextlib.contextmanager
    def hashed_stream(path: Any, mode: str) -> Any:
        if "w" not in mode:
            with create_stream(path, mode) as stream:
                yield stream
            return
        with create_stream(path, mode) as stream:
            hashing = _HashingStream(stream)
            yield hashing
        digest = hashing.hexdigest()
        if digest is not None:
            with lock:
                digests[os.path.basename(os.fspath(path))] = digest

    writer.fs.create_stream = hashed_stream
    write_data, finish = writer.write_data, writer.finish

    def hashed_write_data(plan: Any, planner: Any) -> Any:
        future = write_data(plan, planner)
        for result in future.wait():  # the file writer's future is complete when write_data returns
            name = getattr(result.storage_data, "relative_path", None)
            object.__setattr__(result, "raytrain_sha256", digests.get(name))
        return future

    def hashed_finish(metadata: Any, results: Any) -> None:
        for worker_results in results:
            for result in worker_results:
                name = getattr(result.storage_data, "relative_path", None)
                digest = getattr(result, "raytrain_sha256", None)
                if name and digest:
                    digests[name] = digest
        finish(metadata, results)
        metadata_tmp = next((n for n in digests if n.endswith(".metadata.tmp")), None)
        if metadata_tmp is not None:  # written as .metadata.tmp, renamed to .metadata
            digests[".metadata"] = digests.pop(metadata_tmp)

    writer.write_data, writer.finish = hashed_write_data, hashed_finish
    writer.raytrain_digests = digests
    return writer


def _write_manifest(staging: Path, shards: Path, position: Position, extra_meta: dict, *, config: dict,
                    attempt: Optional[int], world_size: int, digests: Optional[dict[str, str]] = None) -> None:
    """meta.json, last: every shard file DCP wrote (size, and the sha256 computed while it was written), extra.pt
    (size and hash). `shards`: staging/shards, or on an object store the checkpoint's own prefix."""
    digests = digests or {}
    files = {f"{SHARDS_DIR}/{p.name}": {"size": p.stat().st_size, **({"sha256": digests[p.name]}
                                                                        if p.name in digests else {})}
             for p in sorted(shards.iterdir()) if p.is_file()}
    if f"{SHARDS_DIR}/.metadata" not in files:
        raise CheckpointWriteFailed(f"DCP wrote no {SHARDS_DIR}/.metadata into {staging}")
    files[EXTRA_FILE] = extra_meta
    storage.fsync_dir(shards)
    meta = {"format": checkpoints.FORMAT, "kind": KIND, "epoch": position.epoch, "step": position.step,
            "files": files, "config": config, "attempt": attempt, "world_size": world_size}
    with open(staging / checkpoints.META_FILE, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(meta))
        handle.flush()
        os.fsync(handle.fileno())
    storage.fsync_dir(staging)


def read_small_state(directory: Path) -> dict:
    """A committed sharded checkpoint's extra.pt (position, config, extra state), checked against its manifest;
    the shards' sizes are checked too. CheckpointUnreadable says why not."""
    import torch

    reason = checkpoints.incomplete_reason(directory)
    if reason is not None:
        raise CheckpointUnreadable(reason)
    meta = checkpoints.read_meta(directory)
    if not checkpoints.is_sharded_manifest(meta):
        raise CheckpointUnreadable("a single-file checkpoint (state.pt): this run writes sharded ones. Fix: resume "
                                   "with run.checkpointer: file")
    try:
        data = (directory / EXTRA_FILE).read_bytes()
    except OSError as err:
        raise CheckpointUnreadable(f"{EXTRA_FILE} cannot be read ({err.strerror or err.__class__.__name__})") from None
    if hashlib.sha256(data).hexdigest() != meta["files"].get(EXTRA_FILE, {}).get("sha256"):
        raise CheckpointUnreadable(f"{EXTRA_FILE} does not match the hash in {checkpoints.META_FILE}")
    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises several types for a bad pickle
        raise CheckpointUnreadable(f"{EXTRA_FILE} cannot be loaded ({err.__class__.__name__})") from None
    if not isinstance(state, dict) or "epoch" not in state:
        raise CheckpointUnreadable(f"{EXTRA_FILE} is not a raytrain checkpoint's state")
    state["world_size"] = meta.get("world_size")
    return state


def _sharded_state(model: "nn.Module", optimizer: Any) -> dict:
    """What DCP writes and reads in place: this worker's shards of the model and the optimizer, by parameter name."""
    state = {"model": sharding.model_state(model, full=False)}
    if optimizer is not None:
        state["optimizer"] = sharding.optimizer_state(model, optimizer, full=False)
    return state


def load_shards(directory: Path, model: "nn.Module", optimizer: Any) -> None:
    """Read a sharded checkpoint into this worker's model and optimizer (a collective where there are several)."""
    import torch.distributed.checkpoint as dcp

    state = _sharded_state(model, optimizer)
    dcp.load(state, storage_reader=checkpointstore.shard_reader(directory / SHARDS_DIR))
    sharding.load_model_state(model, state["model"], full=False)
    if optimizer is not None:
        sharding.load_optimizer_state(model, optimizer, state["optimizer"], full=False)


def export_model(directory: Path) -> dict:
    """A sharded checkpoint's model state as full tensors, in one process (raytrain export)."""
    # The loader that dcp_to_torch_save (torch.distributed.checkpoint.format_utils) uses, limited to the model.
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    state: dict = {}
    _load_state_dict(state, storage_reader=checkpointstore.shard_reader(directory / SHARDS_DIR),
                     planner=_EmptyStateDictLoadPlanner(keys={"model"}), no_dist=True)
    return state["model"]
