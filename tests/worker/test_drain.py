"""`raytrain drain`'s reading of this machine's processes (raytrain.worker.prestop), and the workers' probe outside
Ray (raytrain.worker.drain). The drain itself
(GCS, preStop, a worker that ends) runs on a real local cluster in tests/integration/test_drain.py."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from raytrain.platform import rayinternals
from raytrain.worker import drain, prestop

RAYLET = "/venv/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet"


def raylet_cmd(ip: str, temp_dir: str, head: bool = False) -> list[str]:
    resources = "node:__internal_head__,1.0,CPU,2" if head else "CPU,2"
    return [RAYLET, f"--node_id={'ab' * 28}", f"--node_ip_address={ip}", f"--gcs-address={ip}:6379",
            f"--session_dir={temp_dir}/session_1", f"--temp_dir={temp_dir}", f"--static_resource_list={resources}"]


@pytest.mark.parametrize("cmd,is_driver", [
    (["/venv/bin/python", "/venv/bin/raytrain", "run", "job.yaml", "--name", "x"], True),
    (["/venv/bin/python", "/venv/bin/raytrain", "--log-format", "json", "tune", "cfg.yaml"], True),
    (["python", "-m", "raytrain.cli", "run", "digits"], True),
    (["/venv/bin/python", "/venv/bin/raytrain", "drain", "--wait", "50"], False),
    (["/venv/bin/python", "/venv/bin/raytrain", "emulate", "rayjob.yaml"], False),
    (["/bin/bash", "-c", "raytrain run job.yaml"], False),  # the shell around it: its child is the driver
    (["ray::RayTrainWorker.run_train_fn"], False),
    ([], False),
])
def test_drivers_are_raytrain_run_and_tune(cmd, is_driver):
    assert prestop._is_driver(cmd) is is_driver


def test_a_raylet_is_read_from_its_command_line():
    table = {10: (1, 0.0, raylet_cmd("127.0.0.1", "/tmp/rtx/n0", head=True)), 11: (1, 0.0, ["/usr/bin/raylet"])}
    [raylet] = rayinternals.local_raylets(table)
    assert (raylet.pid, raylet.node_ip, raylet.gcs_address, raylet.is_head) == (10, "127.0.0.1", "127.0.0.1:6379", True)
    assert drain.notice_path(raylet) == Path("/tmp/rtx/n0/session_1") / drain.NOTICE_NAME
    assert drain.this_raylet(table=table).pid == 10


def test_nodes_sharing_a_machine_are_told_apart_by_address_then_temp_dir():
    table = {10: (1, 0.0, raylet_cmd("127.0.0.2", "/tmp/rtx/n0", head=True)),
             11: (1, 0.0, raylet_cmd("127.0.0.3", "/tmp/rtx/n1")),
             12: (1, 0.0, raylet_cmd("192.0.2.250", "/tmp/rtx/n2"))}  # TEST-NET: never an address of this machine
    with pytest.raises(drain.DrainError, match=r"2 Ray nodes run on this machine .*--temp-dir DIR"):
        drain.this_raylet(table=table)
    assert drain.this_raylet("/tmp/rtx/n1", table=table).pid == 11
    assert drain.this_raylet(table={12: table[12]}).pid == 12  # the only one: a pod's
    assert drain.this_raylet("/tmp/rtx/n1", table={12: table[12]}) is None  # never another node's, even alone
    assert drain.this_raylet(table={}) is None


def test_drivers_are_only_those_the_nodes_ray_started():
    raylet = drain.LocalRaylet(10, "ab", "127.0.0.2", "127.0.0.2:6379", "/s", "/t", True)
    table = {10: (1, 0.0, raylet_cmd("127.0.0.2", "/t", head=True)), 20: (1, 0.0, raylet_cmd("127.0.0.3", "/u")),
             30: (10, 0.0, ["ray::JobSupervisor"]), 31: (30, 0.0, ["python", "/v/raytrain", "run", "a.yaml"]),
             40: (1, 0.0, ["python", "/v/raytrain", "run", "b.yaml"]),  # someone else's driver
             50: (10, 0.0, ["ray::RayTrainWorker.run_train_fn"]), 60: (20, 0.0, ["ray::RayTrainWorker"])}
    assert prestop.training_processes(raylet, table) == {"drivers": [31], "workers": [50]}
    assert prestop.training_processes(None, table) == {"drivers": [], "workers": []}


# These name a temp dir no Ray node uses: on a shared machine they must never drain another session's Ray.
def test_drain_without_a_ray_node_says_so_and_returns_at_once():
    lines: list[str] = []
    outcome = prestop.drain(5, temp_dir="/nonexistent/ray", say=lines.append)
    assert outcome["node_ip"] is None and outcome["ended"] and outcome["waited_s"] < 5
    assert lines[0] == "no Ray node runs here; nothing to drain"


def test_node_draining_is_false_outside_a_ray_worker():
    assert drain.node_draining() is False


def test_the_command_exits_0_when_nothing_trains_here(raytrain):
    done = raytrain("drain", "--wait", "3", "--temp-dir", "/nonexistent/ray")
    assert done.returncode == 0, done.stderr
    assert "nothing to drain" in done.stderr + done.stdout


def test_a_gcs_that_is_gone_is_not_waited_for():
    """Cluster teardown: the head (and its GCS) can go before a worker's hook runs; Ray's GcsClient would retry
    for ~35 s of the grace period, so the hook asks the port first."""
    import socket
    import time

    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        address = f"127.0.0.1:{listening.getsockname()[1]}"
        assert prestop.gcs_answers(address)
    started = time.monotonic()
    assert not prestop.gcs_answers(address)  # closed now: refused at once
    assert time.monotonic() - started < 2


def test_the_hook_writes_to_the_ray_containers_own_stdout(tmp_path):
    """kubelet drops an exec hook's output: the lines go to PID 1's stdout (`ray start --block`, what `kubectl
    logs` shows). Here a process named like it stands in for the container's PID 1."""
    log = tmp_path / "container.log"
    with log.open("w") as stdout:
        pid1 = subprocess.Popen(["bash", "-c", "sleep 30; true", "ray start --head --block"], stdout=stdout)
    try:
        deadline = time.monotonic() + 10
        while "ray start" not in Path(f"/proc/{pid1.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        stream = prestop.container_log(pid1.pid)
        assert stream is not None
        with stream:
            stream.write("raytrain: preStop: node drained\n")
        assert log.read_text() == "raytrain: preStop: node drained\n"
    finally:
        pid1.kill()
        pid1.wait()
    assert prestop.container_log(os.getpid()) is None  # never our own stdout
    assert prestop.container_log(1) is None or "ray start" in Path("/proc/1/cmdline").read_text()


def test_the_gcs_drain_comes_before_the_notice_and_a_slow_gcs_does_not_hold_the_notice_back(tmp_path, monkeypatch):
    """The node is DRAINING in the GCS before its workers read the notice (the next group is sized without it);
    a GCS that takes longer than first_s does not delay the workers' checkpoint."""
    import threading
    import time

    from raytrain.platform.rayinternals import LocalRaylet

    raylet = LocalRaylet(pid=1, node_id="ab" * 28, node_ip="127.0.0.2", gcs_address="127.0.0.1:1",
                         session_dir=str(tmp_path), temp_dir=str(tmp_path), is_head=False)
    notice = prestop.notice_path(raylet)
    seen: list[bool] = []
    release = threading.Event()

    def gcs_drain(raylet, wait_s, reason):
        seen.append(notice.exists())  # asked before the notice is written
        release.wait(5)
        seen.append(notice.exists())  # and answered before it, when it answers within first_s
        return True, ""

    monkeypatch.setattr(prestop, "gcs_answers", lambda address: True)
    monkeypatch.setattr(prestop, "request_gcs_drain", gcs_drain)
    threading.Timer(0.1, release.set).start()
    assert prestop.drain_then_notice(raylet, 30, "test", first_s=2.0) == (True, "")
    assert seen == [False, False] and notice.exists()

    notice.unlink()
    release.clear()
    began = time.monotonic()
    waiter = threading.Thread(target=lambda: prestop.drain_then_notice(raylet, 30, "test", first_s=0.2))
    waiter.start()
    while not notice.exists() and time.monotonic() - began < 5:
        time.sleep(0.02)
    assert notice.exists() and time.monotonic() - began < 2  # written at first_s, the GCS still asking
    release.set()
    waiter.join(5)
