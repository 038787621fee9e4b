"""Per-step fault tolerance with torchft (`scaling.fault_tolerance: torchft`): each Ray Train worker is its own
torchft replica group, and a lost one costs its peers a step, not a restart.

What Ray 2.60 does (ray/train/v2/torch/torchft_config.py, controller/controller.py `_replace_bad_workers`): the
driver's `TorchftConfig` starts a torchft Lighthouse actor beside Ray Train's controller and gives every worker a
process group of its own (world size 1) with `TORCHFT_LIGHTHOUSE` set; when some but not all workers fail, the
controller starts a replacement for each failed one, with the same rank, and leaves the others running.

What this module does on each worker (`Replicas`, made by the session):
- a torchft `Manager` with a synchronous quorum (use_async_quorum=False): a replica that joins heals before its
  first step, from a live peer's state (model, optimizer, the loop's other state, and the data position);
- every optimizer step: a quorum at the step's first batch (`quorum`), then one all-reduce of one flat buffer
  (`reduce`): each replica's gradients times its batch's samples, the samples, and the step-control flags, summed;
  gradients are set to the sum over the summed samples (the data-parallel mean, however many replicas took part),
  and the optimizer steps only if torchft's `should_commit` says this replica's collectives completed (each
  replica decides for itself: one that did not commit while its peers did is a step behind them, and heals at
  the next quorum). A step that does not
  commit is trained again with the same batches (raytrain.worker.session: `_ft_train_steps`), so that no sample is
  skipped for a peer's failure. torchft 0.2.0's own DistributedDataParallel is not used: it fails the survivor
  when a peer dies between the quorum and the all-reduce (docs/contributing/torchft-probe.md);
- a replica that joins a running group heals at its peers' step start, takes part in that step with nothing (no
  samples: it does not move the mean), and heals again at its first training step, from their state after that
  step (`heal_again`): from then on it trains at its peers' position with their weights;
- other numbers (an epoch's sums) all-reduce over the process group of the last quorum (`all_reduce`): a peer lost
  in between leaves the numbers of the replicas that are left, said in the epoch's row (`replicas_partial`).

The records (rank 0's metrics row, and events): how many replicas trained in each epoch's steps (`replicas_min`,
`replicas_max`: a joining replica's first step, in which it trains nothing, counts its peers only), the steps
committed and trained again, the samples the committed steps trained (`samples`), whether every replica held the
same parameters at the epoch's end (`replicas_in_sync`), and an event for each heal and for each change in the
quorum's size.

May import: errors
"""

from __future__ import annotations

import logging
import math
import socket

from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Callable, Optional

from raytrain.platform.rayinternals import url_host

if TYPE_CHECKING:
    import torch
    from torch import nn

# The Lighthouse's settings (Ray's TorchftConfig passes them to torchft's LighthouseServer): a replica that sends no
# heartbeat for HEARTBEAT_TIMEOUT_MS is left out of the next quorum (torchft's default, 5 s, is the survivors' stall
# after a loss: measured in docs/contributing/torchft-probe.md); a quorum waits at most JOIN_TIMEOUT_MS for members
# of the last one that have not asked yet but are alive (heartbeating): rank 0 writing a checkpoint to a slow shared
# volume, an evaluation. A lost one stops heartbeating and is not waited for.
HEARTBEAT_TIMEOUT_MS = 1000
JOIN_TIMEOUT_MS = 60000
# torchft's operations: a collective, a heal's transfer (PGTransport over the replicas' process group), the commit.
TIMEOUT_S = 30.0
# How long a quorum may take: a replacement waits here for its peers' next step (a long evaluation or checkpoint).
QUORUM_TIMEOUT_S = 600.0
REPLICA_ID_PREFIX = "raytrain_"
# Step-control flags carried in each step's buffer (raytrain.worker.stepcontrol's flags, without the step count)
FLAGS = 6


def lighthouse_kwargs(min_replicas: int = 1) -> dict:
    """What the driver's TorchftConfig gives the Lighthouse: the run goes on with any one replica left."""
    return {"min_replicas": min_replicas, "heartbeat_timeout_ms": HEARTBEAT_TIMEOUT_MS,
            "join_timeout_ms": JOIN_TIMEOUT_MS}


@dataclass
class EpochReplicas:
    """One epoch's account of the replicas, from this replica's view (the same on every replica that saw the whole
    epoch: every number comes from a committed step's all-reduce)."""
    samples: float = 0.0  # samples trained by the committed steps, over every replica that took part
    committed: int = 0  # optimizer steps committed
    retried: int = 0  # steps that did not commit and were trained again
    smallest: int = 0  # the fewest and most replicas that trained in a committed step
    largest: int = 0

    def add(self, trained_by: int, samples: float) -> None:
        self.samples += samples
        self.committed += 1
        self.smallest = trained_by if not self.smallest else min(self.smallest, trained_by)
        self.largest = max(self.largest, trained_by)

    def state_dict(self) -> dict:
        return dict(self.__dict__)

    def load_state_dict(self, state: dict) -> None:
        for key, value in state.items():
            if key in self.__dict__:
                setattr(self, key, value)

    def row(self) -> dict:
        return {"samples": int(self.samples), "replica_steps": self.committed, "replica_steps_retried": self.retried,
                "replicas_min": self.smallest, "replicas_max": self.largest}


@dataclass
class Heal:
    """What a joining replica received from a live peer: the peer's state at its step's start."""
    state: dict
    step: int  # torchft's step count the peer was at


@dataclass
class StepResult:
    committed: bool
    samples: float  # summed over the replicas that took part
    participants: int
    flags: list[float] = field(default_factory=list)  # summed step-control flags
    micro: int = 0  # the micro-batches of the step the replicas trained (a joining replica's next position)


class Replicas:
    """torchft's Manager for this worker (one replica group of one process). `state_fn`/`load_fn` are bound by the
    session once the loop's model and optimizer exist (restore)."""

    def __init__(self, rank: int, device: "torch.device", hostname: str,
                 on_event: Optional[Callable[..., None]] = None, **where: Any):
        """where: torchft's store_addr, store_port and lighthouse_addr (on Ray Train: MASTER_ADDR, MASTER_PORT and
        TORCHFT_LIGHTHOUSE, which Ray sets on every worker)."""
        import torch
        from torchft import Manager, ProcessGroupGloo
        from torchft.checkpointing.pg_transport import PGTransport

        for name in ("torchft_quorums", "torchft_commits", "torchft_errors"):
            logging.getLogger(name).setLevel(logging.WARNING)  # a line per step otherwise
        # Its notes on every quorum, and a traceback for every peer lost mid-collective (one warns on every CPU run
        # that NCCL's flight recorder is absent): the run's records say what happened (the `replicas` event)
        logging.getLogger("torchft.manager").setLevel(logging.CRITICAL)
        self.rank, self.device = rank, device
        timeout = timedelta(seconds=TIMEOUT_S)
        if device.type == "cuda":
            from torchft import ProcessGroupNCCL

            self.pg: Any = ProcessGroupNCCL(timeout=timeout)
        else:
            self.pg = ProcessGroupGloo(timeout=timeout)
        self.state_fn: Optional[Callable[[], dict]] = None
        self.load_fn: Optional[Callable[[Heal], None]] = None
        self.on_event = on_event
        self.healed: Optional[Heal] = None
        self.epoch = EpochReplicas()
        self.participants = 0  # the last quorum's
        # Whether this replica writes the run's records and checkpoints: rank 0 until the first quorum, then the
        # quorum's first replica (torchft ranks a quorum's replicas by their ids, raytrain_<rank>)
        self.writer = rank == 0
        self._joining = 0  # quorums left in which a replica that joined may still be healing
        self._pending_flags = [0.0] * FLAGS
        self._manager_args = dict(
            pg=self.pg, load_state_dict=self._load, state_dict=self._state, min_replica_size=1,
            use_async_quorum=False,  # a joining replica heals before its step, and takes part in it
            timeout=timeout, quorum_timeout=timedelta(seconds=QUORUM_TIMEOUT_S), rank=0, world_size=1,
            replica_id=f"{REPLICA_ID_PREFIX}{rank}",
            # torchft advertises socket.gethostname() by default, which another pod may not resolve: the node's IP
            hostname=hostname,
            checkpoint_transport=PGTransport(self.pg, timeout=timeout, device=device),
            # Every replica builds the same initial weights (the session seeds them alike) or loads the same
            # checkpoint: nothing to copy at step 0
            init_sync=False,
            **where,
        )
        self._manager: Any = None
        self._manager_cls = Manager
        self._torch = torch

    @property
    def manager(self) -> Any:
        """torchft's Manager, made at the first quorum (the loop's restore), not with the session: from then on it
        heartbeats to the Lighthouse, which waits for a live member that has not asked for a quorum yet (up to
        JOIN_TIMEOUT_MS), so a replacement still building its model must not hold its peers back."""
        if self._manager is None:
            self._manager = self._manager_cls(**self._manager_args)
        return self._manager

    # ------------------------------------------------------------------------------------------ heal

    def _state(self) -> dict:
        if self.state_fn is None:  # not bound yet: torchft only asks a replica that has committed a step
            raise RuntimeError("raytrain: a replica was asked for its state before its loop restored")
        return self.state_fn()

    def _load(self, state: dict) -> None:
        self.healed = Heal(state=state, step=self.manager.current_step())

    # ------------------------------------------------------------------------------------------ steps

    def quorum(self) -> Optional[Heal]:
        """At a step's start (every replica): join the step's quorum; a replica that is behind its peers heals here
        (returned, once). The quorum's size, when it changed, goes to the records."""
        self.healed = None
        self.manager.start_quorum()
        participants = self.manager.num_participants()
        # The writer moves to the quorum's first replica, but not while a replica joins: a joining one heals at two
        # quorums in a row (its restore, then heal_again), where it does not decide on checkpoints; the replicas
        # that were there keep what they had until both have passed, so that someone writes at those steps.
        if participants > self.participants and self.participants:  # not at this replica's first quorum
            self._joining = 2
        if self.healed is not None:
            self.writer = False
        elif not self._joining:
            self.writer = self.manager.participating_rank() == 0
        self._joining = max(self._joining - 1, 0)
        if participants != self.participants and self.on_event is not None and self.participants:
            self.on_event("replicas", participants=participants, previous=self.participants,
                          step=self.manager.current_step())
        self.participants = participants
        healed, self.healed = self.healed, None
        if healed is not None and self.load_fn is not None:
            self.load_fn(healed)
        return healed

    def heal_again(self) -> None:
        """Have the next quorum heal this replica once more. A joining replica heals at its peers' step start and
        takes part in that step with nothing: its peers then step their optimizers, which it cannot do for them
        (their clipping, their scheduler). Behind them again (torchft's step count set back, through the Manager's
        own load_state_dict), it receives their state after that step at its first training step."""
        self.manager.load_state_dict({"step": 0, "batches_committed": self.manager.batches_committed()})

    def share_flags(self, flags: list[float]) -> None:
        """This replica's step-control flags, sent with its next step's buffer."""
        self._pending_flags = [max(a, b) for a, b in zip(self._pending_flags, flags)]

    def reduce(self, params: list["nn.Parameter"], samples: float, micro: int) -> StepResult:
        """The step's one all-reduce and its commit (see the module's docstring); on a commit, each parameter's
        gradient is the mean over every sample the replicas trained."""
        torch = self._torch
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        dtype = torch.float32 if any(g.dtype != torch.float32 for g in grads) else grads[0].dtype if grads else \
            torch.float32
        trained = 1.0 if samples > 0 else 0.0  # micro counts only from replicas that trained in the step
        head = torch.tensor([samples, float(micro) * trained, trained, *self._pending_flags], dtype=dtype,
                            device=self.device)
        flat = torch.cat([*(g.detach().reshape(-1).to(dtype) * samples for g in grads), head])
        from torch.distributed import ReduceOp

        self.manager.allreduce(flat, reduce_op=ReduceOp.SUM).wait()
        committed = self.manager.should_commit()
        tail = flat[-len(head):].tolist()
        total, micro_sum, trained_by, flags = tail[0], tail[1], tail[2], tail[3:]
        result = StepResult(committed, total, self.participants, flags,
                            int(round(micro_sum / trained_by)) if trained_by else 0)
        if not committed:
            self.epoch.retried += 1
            return result
        self._pending_flags = [0.0] * FLAGS
        if total > 0:  # a step no replica trained anything in (a joining replica's first) is not the loop's
            # the replicas that trained in it: a joining one takes part in its first step's quorum with nothing
            self.epoch.add(int(round(trained_by)), total)
        offset = 0
        for p, g in zip(params, grads):
            n = g.numel()
            if total > 0:
                mean = flat[offset:offset + n].view_as(g).to(g.dtype) / total
                if p.grad is None:
                    p.grad = mean
                else:
                    p.grad.copy_(mean)
            offset += n
        return result

    # ------------------------------------------------------------------------------------------ between steps

    def all_reduce(self, values: list[float], op: str) -> tuple[list[float], bool]:
        """Sum (or max) over the replicas of the last quorum, over its process group; (values, whether every one of
        them answered): a peer lost since leaves this replica's own numbers."""
        torch = self._torch
        from torch.distributed import AllreduceOptions, ReduceOp

        if self.participants <= 1:
            return list(values), True
        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)
        opts = AllreduceOptions()
        opts.reduceOp = ReduceOp.MAX if op == "max" else ReduceOp.SUM
        try:
            self.pg.allreduce([tensor], opts).wait()
        except Exception as err:  # noqa: BLE001 - a lost peer: the next step's quorum leaves it out
            logging.getLogger(__name__).warning("raytrain: replicas' all-reduce failed (%s): this replica's own "
                                                "numbers are used", err)
            return list(values), False
        return tensor.tolist(), True

    def in_sync(self, model: "nn.Module") -> Optional[bool]:
        """Whether every replica of the last quorum holds the same parameters (their sums compared, in float64);
        None when that cannot be told."""
        torch = self._torch
        with torch.no_grad():
            total = float(sum(p.detach().double().sum() for p in model.parameters()))
        if not math.isfinite(total):
            return None
        (high, low), complete = self.all_reduce([total, -total], "max")
        return (high == -low) if complete else None

    def end_epoch(self) -> dict:
        """This epoch's account for the row; counting starts again."""
        row, self.epoch = self.epoch.row(), EpochReplicas()
        return row

    def shutdown(self) -> None:
        """Leave the quorum (a replica that returned must not hold the others' next quorum back)."""
        if self._manager is None:
            return
        try:
            self._manager.shutdown(wait=False)
        except Exception:  # noqa: BLE001 - the worker is ending anyway
            pass


def replica_hostname() -> str:
    """The address this worker's peers reach it at: its node's IP (Ray's), not a pod's host name."""
    try:
        import ray

        ip = ray.util.get_node_ip_address()
    except Exception:  # noqa: BLE001 - outside Ray: the host's name, as torchft would
        return socket.gethostname()
    return url_host(ip)  # torchft writes http://<hostname>:<port>


