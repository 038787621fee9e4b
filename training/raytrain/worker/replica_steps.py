"""The session's side of torchft (`scaling.fault_tolerance: torchft`), mixed into raytrain.worker.session.Session:
the training steps that start with the replicas' quorum and train a step that did not commit again, the gradient
sync the optimizer's step waits for, the step control's flags carried in each step's buffer, and `restore` for a
replica that joins a running group (it heals from a live peer instead of reading the checkpoint). The replicas
themselves (torchft's Manager, the step's all-reduce) are raytrain.worker.replicas; this is only what needs the
session's position, records and tracked objects."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Optional

from raytrain.rundir import runrecords
from raytrain.spec import build
from raytrain.worker.datafeed import to_device

if TYPE_CHECKING:
    import torch
    from torch import nn


class ReplicaSteps:
    """Mixed into Session: every method here runs only when `replicas` is set (a torchft run on Ray Train)."""

    replicas: Any = None  # raytrain.worker.replicas.Replicas, set by the Ray Train session under torchft
    _ft_step: Optional[dict] = None  # what the current step sends: its samples and micro-batches
    _ft_result: Any = None  # what it got back (replicas.StepResult)
    _ft_position: tuple[int, int] = (1, 0)  # (epoch, micro-batches done): what a joining peer is sent
    _ft_partial = False  # an epoch-end sum missed a peer
    # The Session's own (raytrain.worker.session), used here
    rank: int
    config: Any
    records: Any
    run_dir: Any
    resumed_from_epoch: Optional[int]
    _resume_step: int
    _announced: bool
    _rows_truncated: bool
    _tracked: Optional[tuple[Any, Any, dict]]
    _epoch_samples: int

    @property
    def device(self) -> "torch.device": ...

    def _announce(self) -> None: ...

    def _kept_batches(self, batches: Iterator, replay: int, first: int) -> Iterator: ...

    def _step_done(self, epoch: int, micro: int) -> None: ...

    def _started(self, start_epoch: int) -> None: ...

    def _ft_group_barrier(self) -> None:
        """Every worker of a starting group waits for the others (Ray Train's barrier on the Ray Train session)."""

    def _ft_train_steps(self, batches: Iterator, epoch: int, replay: int, first: int) -> Iterator:
        """_train_steps under torchft (raytrain.worker.replicas): each optimizer step starts with the replicas'
        quorum (a joining peer is sent this replica's state, positioned here), and a step that does not commit is
        trained again with the same micro-batches (kept until it commits)."""
        if self.replicas.load_fn is None:
            raise RuntimeError("scaling.fault_tolerance torchft: the loop asked for training batches before "
                               "session.restore(model, optimizer). Fix: call session.restore(model, optimizer) "
                               "before the first epoch (the built-in loop does), so that raytrain can share the "
                               "gradients and heal a replacement")
        self._announce()
        accum = self.config.train.grad_accum_steps
        kept = self._kept_batches(batches, replay, first)
        micro = first
        while True:
            self._ft_position = (epoch, micro)
            step = [to_device(batch, self.device) for batch in itertools.islice(kept, accum)]
            if not step:
                return
            while True:
                heal = self.replicas.quorum()
                if heal is not None:
                    self._ft_healed_in_loop(heal, epoch, micro)
                self._ft_step = {"samples": float(sum(len(y) for _, y in step)), "micro": len(step)}
                self._ft_result = None
                for x, y in step:
                    self._epoch_samples += len(y)
                    yield x, y
                result = self._ft_result
                if result is None or result.committed or len(step) < accum:
                    # committed, or the epoch's last, shorter step, which the loop steps after the batches end
                    break
            micro += len(step)
            self._step_done(epoch, micro)

    def _ft_healed_in_loop(self, heal: Any, epoch: int, micro: int) -> None:
        """A heal at a training step: a joining replica's second (replicas.heal_again), at the position it expects;
        anywhere else (a replica left out of quorums for a while) its data position stays its own: said, once."""
        position = heal.state.get("position") or {}
        if (position.get("epoch"), position.get("micro")) != (epoch, micro):
            self.records.append_event(
                "warning", attempt=self.records.token,
                message=f"rank {self.rank} fell behind its peers and healed from one at epoch {position.get('epoch')}, "
                        f"micro-batch {position.get('micro')}; its own data goes on from epoch {epoch}, micro-batch "
                        f"{micro} (its shard's batches in between are not trained, or trained twice)")

    def _ft_share(self, flags: list[float]) -> list[float]:
        """StepControl's exchange under torchft: this replica's flags go with its next step's buffer; the decision
        is the sum of every replica's flags that the last committed step carried (the same on every replica)."""
        self.replicas.share_flags(flags[:3] + [0.0, 0.0] + flags[5:])
        got = list(self._ft_result.flags) if self._ft_result is not None and self._ft_result.committed else \
            [0.0] * len(flags)
        got[3] = 1.0  # decide at every step: the flags cost nothing extra here
        # A drained node's replica alone ends (its own probe, not the others'): Ray Train replaces it and the others
        # train on, as for a lost one, instead of every replica ending the group
        got[4] = flags[4]
        return [1.0 if value > 0 else 0.0 for value in got]

    def sync_gradients(self) -> bool:
        """torchft: this step's gradients averaged over every sample the replicas trained, and whether the step
        commits (the optimizer steps only then); once per step, before clipping (the built-in loop calls it there;
        a wrapped optimizer.step calls it when the loop did not). True elsewhere (DDP has already averaged them)."""
        if self.replicas is None:
            return True
        if self._ft_result is None:
            model = self._tracked[0] if self._tracked is not None else None
            params = [p for p in model.parameters() if p.requires_grad] if model is not None else []
            step = self._ft_step or {"samples": 0.0, "micro": 0}
            self._ft_result = self.replicas.reduce(params, step["samples"], step["micro"])
        return bool(self._ft_result.committed and self._ft_result.samples > 0)

    def _bind_replicas(self, model: "nn.Module", optimizer: Any, stateful: dict) -> None:
        """Give torchft this replica's state (a joining peer heals from it) and how to load a peer's; wrap the
        optimizer's step so that it syncs the gradients and steps only a committed step."""
        replicas = self.replicas

        def state() -> dict:
            epoch, micro = self._ft_position
            return {"model": build.unwrap(model).state_dict(),
                    "optimizer": optimizer.state_dict() if optimizer is not None else None,
                    "extra": {name: obj.state_dict() for name, obj in stateful.items()},
                    "position": {"epoch": epoch, "micro": micro}, "replicas": replicas.epoch.state_dict()}

        def load(heal: Any) -> None:
            got = heal.state
            build.unwrap(model).load_state_dict(got["model"])
            if optimizer is not None and got.get("optimizer") is not None:
                optimizer.load_state_dict(got["optimizer"])
            for name, obj in stateful.items():
                if name in got.get("extra", {}):
                    obj.load_state_dict(got["extra"][name])
            replicas.epoch.load_state_dict(got.get("replicas") or {})

        replicas.state_fn, replicas.load_fn = state, load
        if optimizer is not None and not getattr(optimizer, "_raytrain_replicas", False):
            inner = optimizer.step

            def step(*args: Any, **kwargs: Any) -> Any:
                if self.sync_gradients():
                    return inner(*args, **kwargs)
                return None

            optimizer.step = step
            optimizer._raytrain_replicas = True

    def _ft_restore(self, model: "nn.Module", optimizer: Any, stateful: dict) -> Optional[int]:
        """restore() under torchft: join the replicas' quorum first. A replica that joins a running group heals from
        a live peer (nothing read from storage) and takes part in its peers' step with no samples; returns the epoch
        to train then. None: no peer is ahead (the group's start, or a whole job's restart): restore from storage."""
        self._tracked = (model, optimizer, stateful)
        self._bind_replicas(model, optimizer, stateful)
        if not any(e.get("event") == "start" and e.get("attempt") == self.records.token
                   for e in runrecords.read_events(self.run_dir)):
            # A worker group starting: its replicas join the first quorum together. Without this, the first to get
            # here would train alone while the others still build their models, and heal them in (their shards'
            # first steps untrained). A replacement finds its group's start recorded and joins at once.
            self._ft_group_barrier()
        began = time.perf_counter()
        self._ft_step, self._ft_result = {"samples": 0.0, "micro": 0}, None
        heal = self.replicas.quorum()
        self.sync_gradients()  # the step its peers are training: this replica adds nothing to it
        result, self._ft_result = self._ft_result, None
        if heal is None:
            return None
        position = heal.state.get("position") or {}
        epoch, micro = int(position.get("epoch", 1)), int(position.get("micro", 0))
        if result is not None and result.committed:
            micro += result.micro  # the peers' step just trained: this replica goes on after it
            self.replicas.heal_again()  # and receives their weights after it at its first step (replicas.heal_again)
        self.resumed_from_epoch, self._resume_step = epoch - 1, micro
        # A replacement of one replica is not a new worker group: no start event (the driver counts restarts by
        # them), and the rows stay; the event says what happened
        self._announced = self._rows_truncated = True
        self.records.append_event("healed", rank=self.rank, epoch=epoch, step=micro, from_step=heal.step,
                                  participants=self.replicas.participants,
                                  heal_s=round(time.perf_counter() - began, 3), attempt=self.records.token)
        self._started(epoch)
        return epoch
