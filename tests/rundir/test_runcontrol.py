"""raytrain.rundir.runcontrol on a real run directory, with threads: the one object that owns the lease, the fence and
the stop decision. A stop request survives a renewal in flight (slowed as an NFS write can be); a lost lease is
never read as a stop request, nor a stop request as a lost lease; the phases refuse late writers."""

from __future__ import annotations

import json
import threading
import time

import pytest

from raytrain.lifecycle.endings import AttemptEnded, Ending
from raytrain.rundir import layout, runrecords
from raytrain.rundir.lease import Lease
from raytrain.rundir.runcontrol import Phase, RunControl, WorkerControl


class SlowLease(Lease):
    """A lease whose writes of lease.json take `delay` seconds after the record is built (a slow NFS write)."""

    delay = 0.3

    def _write(self, record: dict) -> None:
        time.sleep(self.delay)
        super()._write(record)


def test_a_stop_request_survives_a_slow_renewal_in_flight(tmp_path):
    lease = SlowLease(tmp_path, ttl_s=1.5).acquire()  # renews every 0.3 s, each write taking 0.3 s
    control = RunControl(lease)
    worker = WorkerControl(tmp_path, lease.token)
    try:
        for _ in range(5):  # requests landing at different points of the renewals' writes
            time.sleep(0.17)
            control.phase = Phase.HOLDING
            lease.stop_reason = None
            control.request_stop("SIGTERM: the pod is being deleted")
            # from the moment request_stop returns, every read of lease.json sees the request: no renewal
            # that began before it may overwrite it afterwards
            deadline = time.monotonic() + 1.2
            while time.monotonic() < deadline:
                assert worker.poll() == (Ending.STOPPED, "SIGTERM: the pod is being deleted")
                time.sleep(0.02)
    finally:
        control.release()


def test_a_takeover_is_never_read_as_a_stop_nor_a_stop_as_a_takeover(tmp_path):
    first = RunControl.acquire(tmp_path, ttl_s=30)
    token = first.token
    first.request_stop("Ctrl-C")
    assert WorkerControl(tmp_path, token).poll() == (Ending.STOPPED, "Ctrl-C")
    # a newer attempt's lease.json (even one that carries a stop of its own) means LEASE_LOST to the old workers
    record = {"token": token + 1, "host": "h", "pid": 1, "since": time.time(), "renewed": time.time(),
              "ttl_s": 30, "stop": "SIGTERM"}
    (tmp_path / layout.LEASE_FILE).write_text(json.dumps(record))
    ending, reason = WorkerControl(tmp_path, token).poll()
    assert ending is Ending.LEASE_LOST and f"attempt {token + 1}" in reason
    assert WorkerControl(tmp_path, token + 1).poll() == (Ending.STOPPED, "SIGTERM")
    first.lease.stop_renewing()


def test_the_driver_sees_its_lease_lost_through_the_renewal_and_commits_nothing(tmp_path):
    lost = threading.Event()
    control = RunControl.acquire(tmp_path, ttl_s=1.0, on_lost=lambda reason: lost.set())
    records = runrecords.Records(tmp_path, control)
    records.append_metrics({"epoch": 1})
    (tmp_path / layout.CLAIMS_DIR / f"{control.token + 1}.json").write_text(json.dumps(
        {"token": control.token + 1, "host": "h", "pid": 1, "since": time.time(), "renewed": time.time(),
         "ttl_s": 30}))
    assert lost.wait(3), "the renewal thread did not notice the newer claim"
    assert control.phase is Phase.LOST and control.poll()[0] is Ending.LEASE_LOST
    with pytest.raises(AttemptEnded) as ended:
        records.append_metrics({"epoch": 2})
    assert ended.value.ending is Ending.LEASE_LOST
    control.release()  # lost: releases nothing, it is the newer attempt's now
    assert runrecords.read_metrics(tmp_path) == [{"epoch": 1, "attempt": 1}]


def test_phases_stopping_lets_the_last_checkpoint_in_and_closed_refuses_everything(tmp_path):
    control = RunControl.acquire(tmp_path, ttl_s=30)
    records = runrecords.Records(tmp_path, control)
    try:
        control.request_stop("SIGTERM")
        assert control.poll() == (Ending.STOPPED, "SIGTERM")
        records.append_metrics({"epoch": 1})  # the stop's own checkpoint and rows still commit
        control.close("the attempt ended (stopped)")
        with pytest.raises(AttemptEnded, match="the attempt ended"):
            records.append_metrics({"epoch": 2})
    finally:
        control.release()
    assert json.loads((tmp_path / layout.LEASE_FILE).read_text())["released"] is True
