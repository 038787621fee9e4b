"""`raytrain local`: the same components and loop in one plain PyTorch process, no Ray.

This is the "before Ray" baseline and the quickest way to debug a user's own model, data or loop: the loop gets a
LocalSession with the same contract as on Ray Train (metrics rows, checkpoints in the run directory, resume, a
graceful stop on SIGTERM or Ctrl-C at the next step), so the two differ only in what Ray adds (processes,
sharding, DDP). It is an attempt like `raytrain run`'s (raytrain.driver.attempt): the same lease, resume check and result.
"""

from __future__ import annotations

import errno
import os
import sys
from typing import Optional, TextIO

from raytrain.driver.attempt import STOP_GRACE_S, Attempt, Outcome
from raytrain.errors import LaunchError
from raytrain.lifecycle.endings import AttemptEnded, Ending
from raytrain.loop import show_rows
from raytrain.rundir import console, runrecords, storage, workerlogs
from raytrain.rundir import lease as leases
from raytrain.spec import components
from raytrain.spec.sections import RunConfig
from raytrain.worker.localsession import LocalSession


class LocalTrainer:
    """Runs the config's loop with a LocalSession in this process."""

    embedded_ray = False

    def __init__(self, cfg: RunConfig, out: Optional[TextIO] = None):
        self.cfg = cfg
        self.out = out if out is not None else sys.stdout  # now, not when this module was imported

    def train(self, records: runrecords.Records) -> None:

        cfg = self.cfg
        session = LocalSession(cfg, records.run_dir, os.cpu_count() or 1, control=records.control,
                               on_row=lambda row: show_rows([row], records.run_dir, cfg.train.epochs, self.out))
        console.info("training", f"local training {cfg.run.name} on {session.device}; run directory "
                     f"{records.run_dir} (attempt {records.token})", out=self.out, run_dir=str(records.run_dir),
                     attempt=records.token)
        session.start()
        try:
            components.instantiate(cfg.loop, session)
            session.wait_for_checkpoint()  # the last one committed before the attempt writes its result
            session.trained()
        except AttemptEnded as ended:
            if ended.ending is Ending.STOPPED:
                return  # checkpointed at this step; the attempt writes "stopped"
            raise
        except (LaunchError, OSError) as err:
            if isinstance(err, OSError) and err.errno is not None and _on_storage(err, records):
                full = storage.disk_full(err, records.run_dir)
                raise LaunchError(f"{full + ': ' if full else ''}writing run {cfg.run.name} failed: {err.strerror} "
                                  f"({err.filename}). Checkpoints "
                                  f"committed so far are kept. Fix: free space on (or make writable) "
                                  f"{cfg.run.storage_path}, then run the same command again to resume.") from None
            if isinstance(err, LaunchError):
                raise
            workerlogs.record_failure(records.run_dir, records.token, 0, 1, err)  # for `raytrain why`
            raise LaunchError(_user_failure(err)) from None
        except Exception as err:  # the model's, data's or loop's own code raised: one paragraph
            workerlogs.record_failure(records.run_dir, records.token, 0, 1, err)
            raise LaunchError(_user_failure(err)) from None

    def close(self) -> None:
        pass


def _on_storage(err: OSError, records: runrecords.Records) -> bool:
    """An OSError of the run directory's storage (full, read-only), not of the user's own files."""

    return err.errno in (errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EACCES) and str(records.run_dir) in str(
        err.filename or records.run_dir)


def _user_failure(err: BaseException) -> str:
    return (f"training failed: {err.__class__.__name__}: {' '.join(str(err).split())}"
            f"{components.innermost_site(err)}. Checkpoints written so far are kept; fix the cause and run the same "
            f"command again to resume.")


def train_local(cfg: RunConfig, out: Optional[TextIO] = None, *, wait_for_lease: bool = False,
                lease_ttl_s: float = leases.DEFAULT_TTL_S, stop_grace_s: float = STOP_GRACE_S) -> Outcome:
    """Train in this process, as one attempt of the run (see the module's doc)."""
    return Attempt(cfg, wait_for_lease=wait_for_lease, lease_ttl_s=lease_ttl_s, stop_grace_s=stop_grace_s,
                   out=out).run(LocalTrainer(cfg, out))
