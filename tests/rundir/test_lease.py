"""The run lease on a real directory: exclusive claims, refusal naming a holder that renews, takeover of one that
stopped renewing (no flag needed), fencing of a holder that lost it (also when it was paused), release."""

from __future__ import annotations

import json
import time

import pytest

from raytrain.lifecycle.endings import AttemptEnded, Ending
from raytrain.rundir import layout, runrecords
from raytrain.rundir import lease as leases
from raytrain.rundir.lease import Lease, LeaseHeld, LeaseLost
from raytrain.rundir.runcontrol import RunControl, WorkerControl


def test_a_second_start_is_refused_once_it_sees_the_holder_renew(tmp_path):
    first = Lease(tmp_path, ttl_s=3).acquire()  # renews every 0.6 s
    try:
        told = []
        with pytest.raises(LeaseHeld) as refused:
            Lease(tmp_path, ttl_s=3).acquire(poll_s=0.1, notify=told.append)
        message = str(refused.value)
        assert f"attempt 1 on host {first.host}, pid {first.pid}" in message and "so it is running" in message
        assert "taken over 3 s after its last renewal" in message and "--wait-for-lease" in message
        assert "watching its lease" in told[0]
    finally:
        first.release()
    second = Lease(tmp_path, ttl_s=3).acquire()  # released: the next start takes it at once
    assert second.token == 2
    second.release()


def test_a_holder_that_stopped_renewing_is_taken_over_at_its_expiry_without_a_flag(tmp_path):
    """A killed driver, or a RayJob's retry after a lost head pod: the next start waits out the TTL, no more."""
    stale = Lease(tmp_path, ttl_s=2).acquire()
    stale._stop.set()  # its process is paused: no more renewals
    expires, told = leases.current_holder(tmp_path).expires(), []
    taker = Lease(tmp_path, ttl_s=2).acquire(poll_s=0.1, notify=told.append)
    assert time.time() >= expires  # not before its stated takeover time
    assert taker.token == stale.token + 1
    assert "attempt 1" in told[0] and "if not, it has died and is taken over at" in told[0]
    with pytest.raises(LeaseLost):  # gave itself up: no renewal for 3/4 of its ttl
        stale.check()
    with pytest.raises(AttemptEnded, match="attempt 1 lost run directory .* to attempt 2"):
        WorkerControl(tmp_path, stale.token).check()  # its workers see the newer token
    WorkerControl(tmp_path, taker.token).check()
    taker.check()
    taker.release()


def test_fenced_commits_of_a_lost_attempt_write_nothing(tmp_path):
    records = runrecords.Records(tmp_path, WorkerControl(tmp_path, 1))
    (tmp_path / layout.LEASE_FILE).write_text(json.dumps(
        {"token": 2, "host": "h", "pid": 1, "since": time.time(), "renewed": time.time(), "ttl_s": 30}))
    for commit in (lambda: records.append_metrics({"epoch": 1}),
                   lambda: records.write_result({"status": "succeeded"}),
                   lambda: records.write_config("x: 1\n")):
        with pytest.raises(AttemptEnded) as ended:
            commit()
        assert ended.value.ending is Ending.LEASE_LOST
    assert sorted(p.name for p in tmp_path.iterdir()) == [layout.LEASE_FILE]  # no file, no temporary left


def test_renewal_keeps_a_live_holder_and_commits_carry_its_token(tmp_path):
    control = RunControl.acquire(tmp_path, ttl_s=1.2)
    records = runrecords.Records(tmp_path, control)
    try:
        time.sleep(1.5)  # longer than the ttl: only renewals keep it
        with pytest.raises(LeaseHeld):
            Lease(tmp_path, ttl_s=1.2).acquire(poll_s=0.1)
        records.append_metrics({"epoch": 1})
        records.write_result({"status": "succeeded"})
    finally:
        control.release()
    assert runrecords.read_metrics(tmp_path) == [{"epoch": 1, "attempt": 1}]
    assert runrecords.read_result(tmp_path)["attempt"] == 1
    assert [r["attempt"] for r in runrecords.read_jsonl(tmp_path / layout.RESULTS_HISTORY_FILE)] == [1]


def test_claims_are_exclusive_so_tokens_only_grow(tmp_path):
    (tmp_path / layout.CLAIMS_DIR).mkdir()
    path = tmp_path / layout.CLAIMS_DIR / "7.json"
    assert leases._create_exclusive(path, {"token": 7})
    assert not leases._create_exclusive(path, {"token": 7})
    assert json.loads(path.read_text()) == {"token": 7}
    # a claim with no lease.json yet (its claimant is about to write it) is the current holder: a start waits
    # for it, and takes over only once its claim is ttl_s old with no lease.json written
    (tmp_path / layout.CLAIMS_DIR / "8.json").write_text(json.dumps(
        {"token": 8, "host": "h", "pid": 1, "since": time.time(), "renewed": time.time(), "ttl_s": 1}))
    assert leases.current_holder(tmp_path).token == 8
    told = []
    taker = Lease(tmp_path).acquire(poll_s=0.1, notify=told.append)
    assert "attempt 8 on host h" in told[0] and taker.token == 9
    taker.release()


def test_wait_for_lease_takes_over_when_the_holder_releases(tmp_path):
    import threading

    holder = Lease(tmp_path, ttl_s=30).acquire()
    threading.Timer(0.6, holder.release).start()
    told = []
    waiter = Lease(tmp_path, ttl_s=30).acquire(wait=True, poll_s=0.1, notify=told.append)
    assert waiter.token == 2 and "waiting until it ends" in told[0]
    waiter.release()
