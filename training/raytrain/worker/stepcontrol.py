"""Step control on the workers: at step boundaries, when to checkpoint mid-epoch and when to end.

At agreed optimizer steps rank 0 decides, and all_reduce hands its decision to every worker, so that all of
them checkpoint (ray.train.report is a barrier) and stop at the same step. Rank 0 also says when the next such
step is: about every SYNC_S seconds of steps (every step when a step takes longer), so that small, fast steps
do not pay a collective each. The decisions:
- end STOPPED: the driver asked its attempt to end (SIGTERM, Ctrl-C: the driver's run control writes the request
  into the run's lease.json, which rank 0 reads through its WorkerControl at most every POLL_S); the workers
  checkpoint at this step and end. LEASE_LOST (a newer attempt took the run over) ends them without a checkpoint
  (they may no longer commit). raytrain.lifecycle.endings names the endings and what each does;
- checkpoint: run.checkpoint_every_steps steps or run.checkpoint_every_s seconds since the last checkpoint;
- end DRAINING: some worker's node is being drained (its pod is being deleted: raytrain.worker.drain.node_draining,
  probed by every worker at each decision); all checkpoint at this step and end the group, so that Ray Train starts
  a new one on the nodes left, which resumes from that checkpoint. STOPPED and LEASE_LOST win over it.
- end RESIZING: Ray Train is about to resize an elastic run's group (raytrain.worker.elastic: its controller's request in
  the run directory, read by rank 0 when it polls for a stop); all checkpoint at this step and hold until the
  controller replaces the group. The other endings win over it.

The decision is one small all_reduce every SYNC_S of steps, not one per step: a host sync per step would stall a
GPU's queue.

Worst case from the request to the workers' end: POLL_S + SYNC_S (or one step, if longer) + writing and uploading
one checkpoint. The
driver waits raytrain.driver.attempt.STOP_GRACE_S for that, inside Kubernetes' default 30 s grace period.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

from raytrain.lifecycle.endings import REACTIONS, Ending
from raytrain.rundir.runcontrol import Control
from raytrain.worker.drain import DRAIN_MESSAGE

if TYPE_CHECKING:
    import torch

POLL_S = 0.5
SYNC_S = 0.25
MAX_STEPS_BETWEEN_SYNCS = 256
RESIZE_MESSAGE = "Ray Train resizes this elastic run's worker group: checkpointed at this step, held for the new group"


@dataclass
class Decision:
    checkpoint: bool = False  # every worker checkpoints at this step (also before ending STOPPED or DRAINING)
    ending: Optional[Ending] = None  # the attempt (DRAINING: the worker group) ends at this step
    reason: Optional[str] = None


class StepControl:
    def __init__(self, control: Control, *, every_steps: int, every_s: float,
                 is_rank_zero: bool, device: "torch.device",
                 node_draining: Optional[Callable[[], bool]] = None,
                 resize_requested: Optional[Callable[[], Optional[dict]]] = None,
                 share: Optional[Callable[[list[float]], list[float]]] = None):
        """control: rank 0 polls it for the attempt's end; node_draining: probed by every worker at each decision;
        true on any of them makes all of them checkpoint at that step and end the group (Ending.DRAINING);
        resize_requested: rank 0 polls it with control (raytrain.worker.elastic.pending): a request ends the group
        (Ending.RESIZING) after the checkpoint; the request is kept in `resize_request` for rank 0's answer.
        share: how the flags reach every worker, instead of an all_reduce over torch.distributed's default group
        (torchft's replicas send them with their next step: raytrain.worker.session._ft_share)."""
        self.share = share
        self.control = control
        self.node_draining = node_draining
        self.resize_requested = resize_requested
        self.resize_request: Optional[dict] = None
        self.every_steps, self.every_s = every_steps, every_s
        self.is_rank_zero, self.device = is_rank_zero, device
        self.steps_since = 0
        self.last_checkpoint = self.last_poll = self.last_sync = time.monotonic()
        self.reason: Optional[str] = None
        self.until_sync = 1  # steps to the next decision, the same count on every worker
        self.synced_steps = 0
        self.first_decision = True

    def checkpointed(self) -> None:
        """Every worker calls it after each checkpoint (the same step on all): counting starts again."""
        self.steps_since, self.last_checkpoint, self.until_sync = 0, time.monotonic(), 1

    def decide(self, at_epoch_end: bool = False) -> Decision:
        """Called by every worker after each optimizer step; the same Decision on all of them. at_epoch_end: called
        by every worker at an epoch's report instead: a stop request is read now, no step is counted and no
        mid-epoch checkpoint is decided (the epoch's own checkpoint is the report's business)."""
        if not at_epoch_end:
            self.steps_since += 1
            self.synced_steps += 1
            self.until_sync -= 1
            if self.until_sync > 0:
                return Decision()
        flags = [0.0, 0.0, 0.0, 1.0, 0.0, 0.0]  # checkpoint, stop, lost, steps to the next decision, drain, resize
        if self.is_rank_zero:
            now = time.monotonic()
            measured = self.synced_steps > 0 and not self.first_decision
            per_step = (now - self.last_sync) / max(self.synced_steps, 1)
            self.last_sync, self.synced_steps, self.first_decision = now, 0, False
            # The first decision has no step time to go by (the time since the start is not one): decide again at
            # the next step, then space decisions SYNC_S of measured steps apart.
            flags[3] = float(min(max(int(SYNC_S / max(per_step, 1e-6)), 1), MAX_STEPS_BETWEEN_SYNCS)) if measured \
                else 1.0
            if at_epoch_end:
                flags[3] = 1.0  # the next epoch's first step decides again
            if self.control.token is not None and (at_epoch_end or now - self.last_poll >= POLL_S):
                self.last_poll = now
                try:
                    signal = self.control.poll()
                except OSError:
                    signal = None
                if signal is not None:
                    ending, self.reason = signal
                    lost = ending is Ending.LEASE_LOST
                    flags[:3] = [0.0 if lost else 1.0, 1.0, 1.0 if lost else 0.0]
                if self.resize_requested is not None:  # raytrain.worker.elastic.pending: None for an unreadable file
                    self.resize_request = self.resize_requested()
                    if self.resize_request is not None:
                        flags[5] = 1.0
            due = ((self.every_steps and self.steps_since >= self.every_steps)
                   or (self.every_s and now - self.last_checkpoint >= self.every_s))
            if due and not flags[2] and not at_epoch_end:
                flags[0] = 1.0
            if self.every_steps and not at_epoch_end:  # the next decision falls on the step a step-count checkpoint is due
                remaining = self.every_steps - (0 if flags[0] else self.steps_since)
                flags[3] = float(max(1, min(flags[3], remaining)))
        if self.node_draining is not None and self.node_draining():
            flags[4] = 1.0
        import torch
        import torch.distributed as dist

        if self.share is not None:
            flags = self.share(flags)
        elif dist.is_available() and dist.is_initialized():
            tensor = torch.tensor(flags, dtype=torch.float32, device=self.device)
            dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
            flags = tensor.tolist()
        self.until_sync = int(flags[3])
        # The first reason to end, in this order, wins; whether to checkpoint first is the ending's (REACTIONS).
        for flag, ending, reason in ((2, Ending.LEASE_LOST, self.reason or "the run's lease was lost"),
                                     (1, Ending.STOPPED, self.reason or "stop requested"),
                                     (4, Ending.DRAINING, DRAIN_MESSAGE), (5, Ending.RESIZING, RESIZE_MESSAGE)):
            if flags[flag]:
                return Decision(checkpoint=REACTIONS[ending].checkpoint, ending=ending, reason=reason)
        return Decision(checkpoint=bool(flags[0]))
