"""What happens when: every way an attempt (or a worker group) ends, and what each one does, as one table.

An attempt is one start of a run (raytrain.driver.attempt). While it trains, its workers meet the reasons to end at
step boundaries (raytrain.worker.stepcontrol: one small all-reduce agrees on them) or at a Ray Train function's
report, and raise `AttemptEnded(ending, reason)`: a BaseException, like KeyboardInterrupt, so that a loop's own
`except Exception` does not swallow it. What follows is read from REACTIONS:

| when                                         | ending     | checkpoint first | the worker group              | result written  |
|----------------------------------------------|------------|------------------|-------------------------------|-----------------|
| the loop returns                             | SUCCEEDED  | (its own)        | ends                          | succeeded       |
| the loop raises, Ray Train gives up          | FAILED     | no               | restarted by Ray Train until  | failed          |
|                                              |            |                  | scaling.max_failures, then ends |               |
| SIGTERM, Ctrl-C, a deleted pod or RayJob     | STOPPED    | yes              | ends                          | stopped         |
| the run's lease is lost to a newer attempt   | LEASE_LOST | no (nothing more | ends                          | nothing: the    |
|                                              |            | is committed)    |                               | newer one owns it |
| a worker's node is drained (preStop hook)    | DRAINING   | yes              | ends as a worker failure: Ray | (the attempt    |
|                                              |            |                  | Train starts a new group on   | goes on)        |
|                                              |            |                  | the nodes left                |                 |
| Ray Train resizes an elastic run's group     | RESIZING   | yes              | holds until Ray Train         | (the attempt    |
|                                              |            |                  | replaces it                   | goes on)        |
| a worker process or node dies (kill -9)      | -          | no: the newest   | restarted by Ray Train (a     | (the attempt    |
|                                              |            | checkpoint is    | worker failure)               | goes on)        |
|                                              |            | resumed          |                               |                 |

Where each is carried out: stepcontrol decides (REACTIONS[e].checkpoint), session.Session._end records and raises,
raysession.worker_entry turns an ending into what Ray Train sees (REACTIONS[e].group), attempt._conclude writes the
result (REACTIONS[e].result), and elastic answers an open resize request however the group ends.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Literal, Optional


class Ending(str, enum.Enum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"  # SIGTERM, Ctrl-C, a deleted pod or job: checkpoint at the next step, then end
    LEASE_LOST = "lease_lost"  # a newer attempt holds the run: commit nothing more, not even a checkpoint
    DRAINING = "draining"  # a worker's node is going away: checkpoint, end the group; Ray Train starts a new one
    RESIZING = "resizing"  # Ray Train resizes an elastic run's group: checkpoint, hold until it is replaced


class AttemptEnded(BaseException):
    """This attempt (for DRAINING: this worker group) must end now; `ending` says how, str() says why."""

    def __init__(self, ending: Ending, reason: str):
        super().__init__(reason)
        self.ending = ending
        self.reason = reason


@dataclass(frozen=True)
class Reaction:
    checkpoint: bool  # every worker checkpoints at the step where it was decided, before ending
    commits: bool  # what the group wrote may still commit (a checkpoint in flight is waited for)
    group: Literal["ends", "restarts", "holds"]  # what the worker group does: Ray Train sees a failure to restart
    answers_resize: bool  # rank 0 answers an open resize request with this ending (RESIZING answers when it holds)
    event: Optional[str]  # the event rank 0 appends to events.jsonl, if any
    result: Optional[Ending]  # the status the attempt writes when this ends it (None: it writes nothing)


REACTIONS: dict[Ending, Reaction] = {
    Ending.SUCCEEDED: Reaction(checkpoint=False, commits=True, group="ends", answers_resize=True, event=None,
                               result=Ending.SUCCEEDED),
    Ending.FAILED: Reaction(checkpoint=False, commits=True, group="restarts", answers_resize=True, event=None,
                            result=Ending.FAILED),
    Ending.STOPPED: Reaction(checkpoint=True, commits=True, group="ends", answers_resize=True, event=None,
                             result=Ending.STOPPED),
    Ending.LEASE_LOST: Reaction(checkpoint=False, commits=False, group="ends", answers_resize=True, event=None,
                                result=None),
    Ending.DRAINING: Reaction(checkpoint=True, commits=True, group="restarts", answers_resize=True, event="drain",
                              result=Ending.STOPPED),
    Ending.RESIZING: Reaction(checkpoint=True, commits=True, group="holds", answers_resize=False, event=None,
                              result=Ending.STOPPED),
}
