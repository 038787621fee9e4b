"""Step boundaries on the workers: when to checkpoint mid-epoch and when to end.

At agreed optimizer steps rank 0 decides, and all_reduce hands its decision to every worker, so that all of
them checkpoint (ray.train.report is a barrier) and stop at the same step. Rank 0 also says when the next such
step is: about every SYNC_S seconds of steps (every step when a step takes longer), so that small, fast steps
do not pay a collective each. The decisions:
- stop: the driver asked its attempt to end (SIGTERM, Ctrl-C: raytrain.attempt writes the request into the run's
  lease.json, which rank 0 reads at most every POLL_S); the workers checkpoint at this step and return. A lease
  taken over by a newer attempt also ends them, without a checkpoint (they may no longer commit);
- checkpoint: run.checkpoint_every_steps steps or run.checkpoint_every_s seconds since the last checkpoint;
- drain: some worker's node is being drained (its pod is being deleted: raytrain.drain.node_draining, probed by
  every worker at each decision); all checkpoint at this step and end the group with NodeDraining, so that Ray
  Train starts a new one on the nodes left, which resumes from that checkpoint. stop and lost win over it.

Worst case from the request to the workers' end: POLL_S + SYNC_S (or one step, if longer) + writing and uploading
one checkpoint. The
driver waits raytrain.attempt.STOP_GRACE_S for that, inside Kubernetes' default 30 s grace period.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

from raytrain.lease import stop_requested

if TYPE_CHECKING:
    import torch

POLL_S = 0.5
SYNC_S = 0.05
MAX_STEPS_BETWEEN_SYNCS = 64


@dataclass
class Decision:
    checkpoint: bool = False
    stop: bool = False
    lost: bool = False  # the lease is gone: stop without committing anything
    drain: bool = False  # a worker's node is draining: checkpoint, then end the group for Ray Train to restart


class StepBoundary:
    def __init__(self, run_dir: Path, token: Optional[int], *, every_steps: int, every_s: float,
                 is_rank_zero: bool, device: "torch.device",
                 node_draining: Optional[Callable[[], bool]] = None):
        """node_draining: probed by every worker at each decision; true on any of them makes all of them checkpoint
        at that step and end the group (Decision.drain)."""
        self.run_dir, self.token = run_dir, token
        self.node_draining = node_draining
        self.every_steps, self.every_s = every_steps, every_s
        self.is_rank_zero, self.device = is_rank_zero, device
        self.steps_since = 0
        self.last_checkpoint = self.last_poll = self.last_sync = time.monotonic()
        self.reason: Optional[str] = None
        self.until_sync = 1  # steps to the next decision, the same count on every worker
        self.synced_steps = 0

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
        flags = [0.0, 0.0, 0.0, 1.0, 0.0]  # checkpoint, stop, lost, steps to the next decision, drain
        if self.is_rank_zero:
            now = time.monotonic()
            per_step = (now - self.last_sync) / max(self.synced_steps, 1)
            self.last_sync, self.synced_steps = now, 0
            flags[3] = float(min(max(int(SYNC_S / max(per_step, 1e-6)), 1), MAX_STEPS_BETWEEN_SYNCS))
            if at_epoch_end:
                flags[3] = 1.0  # the next epoch's first step decides again
            if self.token and (at_epoch_end or now - self.last_poll >= POLL_S):
                self.last_poll = now
                try:
                    reason = stop_requested(self.run_dir, self.token)
                except OSError:
                    reason = None
                if reason:
                    self.reason = reason
                    lost = "took the run over" in reason
                    flags[:3] = [0.0 if lost else 1.0, 1.0, 1.0 if lost else 0.0]
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

        if dist.is_available() and dist.is_initialized():
            tensor = torch.tensor(flags, dtype=torch.float32, device=self.device)
            dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
            flags = tensor.tolist()
        self.until_sync = int(flags[3])
        drain = bool(flags[4]) and not flags[1] and not flags[2]
        return Decision(checkpoint=bool(flags[0]) or drain, stop=bool(flags[1]), lost=bool(flags[2]), drain=drain)
