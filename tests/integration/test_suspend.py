"""Kueue's preemption of a RayJob, emulated: `raytrain cluster suspend` sets spec.suspend mid-epoch, KubeRay deletes
the cluster (every pod as kubelet deletes it: the preStop hook `raytrain drain`, then SIGTERM) and the submitter,
the RayJob is Suspended; `raytrain cluster unsuspend` (the readmission) brings a new cluster and a new submission,
which resumes at the checkpoint the graceful stop took: no completed step lost or redone.

    .venv/bin/python -m pytest -m integration tests/integration/test_suspend.py -v
"""

from __future__ import annotations

import json
import re
import time

import pytest

from tests.integration.test_drain import _assert_no_step_lost, _emulated_run
from tests.integration.test_emulate import _no_leftovers, assert_torn_down  # noqa: F401 - the autouse teardown
from tests.support import checks
from tests.support.cli import exit_status

from raytrain.cluster import localcluster, pods
from raytrain.platform import processes
from raytrain.rundir import goodput

pytestmark = pytest.mark.integration


def _patch(action: str, run_id: str, capsys) -> str:
    """`raytrain cluster suspend|unsuspend RUN_ID`, in this process (a fresh interpreter would add seconds)."""
    assert exit_status(["cluster", action, run_id]) == 0, capsys.readouterr()
    return capsys.readouterr().out


def test_a_suspended_rayjob_loses_no_completed_step_and_resumes_on_a_new_cluster(tmp_path, capsys):
    run, run_id, directory = _emulated_run(tmp_path)
    run.wait_for(lambda: len(checks.metrics_epochs(directory)) >= 1, 400, "epoch 1")
    time.sleep(3)  # into epoch 2
    suspended_at = time.time()
    assert "spec.suspend set to true" in _patch("suspend", run_id, capsys)
    run.wait_for(lambda: "jobDeploymentStatus Suspended" in run.output, 180, "Suspended")
    # The cluster is gone (every pod's hook ran and its processes ended, none killed), the submitter too.
    state = localcluster.RUN_ROOT / run_id / "state.json"
    old_pids = {node["name"]: node["pid"] for node in json.loads(state.read_text())["nodes"]}
    names = list(old_pids)
    assert not [name for name in names if pods.node_processes(state, name)]
    for name in names:
        assert f"pod {name}: preStop raytrain drain --wait 50 -> 0" in run.output, run.output[-4000:]
    assert "SIGTERM to the raytrain driver(s)" in run.output and "SIGKILL to" not in run.output, run.output[-4000:]
    [first] = re.findall(r"--submission-id (\S+)", run.output)
    assert not processes.pids_mentioning(first)  # the submitter (`ray job logs --follow ID` too) is gone
    assert exit_status(["cluster", "suspend", run_id]) == 1
    assert "spec.suspend is already true (jobDeploymentStatus Suspended)" in capsys.readouterr().err

    unsuspended_at = time.time()
    assert "spec.suspend set to false" in _patch("unsuspend", run_id, capsys)
    # A new cluster: every pod started again (new processes), and the new submission runs on it.
    run.wait_for(lambda: run.output.count("Running entrypoint for job") == 2, 300, "the new submission")
    resubmitted_by = time.time()
    new_pids = {node["name"]: node["pid"] for node in json.loads(state.read_text())["nodes"]}
    assert new_pids.keys() == old_pids.keys() and not set(new_pids.values()) & set(old_pids.values())
    assert all(pods.node_processes(state, name) for name in names)
    code, output, seconds = run.finish()
    assert code == 0, output[-4000:]
    rayjob = checks.rayjob_from_emulate_output(output)
    checks.assert_job_succeeded(rayjob)
    # Suspended, then a new cluster and a new submission (KubeRay: a new jobId after New -> Initializing).
    order = [m.group(0) for m in re.finditer(r"jobDeploymentStatus (Suspending|Suspended|New)", output)]
    assert order == ["jobDeploymentStatus Suspending", "jobDeploymentStatus Suspended", "jobDeploymentStatus New"]
    submissions = re.findall(r"--submission-id (\S+)", output)
    assert len(submissions) == 2 and len(set(submissions)) == 2, submissions
    assert rayjob["status"]["jobId"] == submissions[1] and rayjob["status"]["failed"] == 0, rayjob["status"]
    meta = _assert_no_step_lost(directory, suspended_at)

    # Goodput (issue 38): the suspension is waiting, from the suspended attempt's end (after the suspend) to the
    # new one's start (after the readmission, by the time its submission ran); nothing is trained again, and what
    # the first attempt trained of the suspended epoch is kept (its mark after the suspend), not stopping
    found = goodput.read(directory)
    assert sum(found.seconds.values()) == pytest.approx(found.wall_s) and found.seconds["other"] == 0, found.seconds
    first, second = found.attempts
    assert (first.status, second.status) == ("stopped", "succeeded"), found.attempts
    assert suspended_at < first.end < unsuspended_at < second.start < resubmitted_by, \
        (suspended_at, first, unsuspended_at, second, resubmitted_by)
    assert found.seconds["waiting"] == pytest.approx(second.start - first.end, abs=0.01), found.seconds
    assert found.seconds["lost"] == 0 and found.seconds["recovery"] == 0, found.seconds
    saved = [e for e in checks.read_jsonl(directory / "events.jsonl") if e["event"] == "progress_saved"]
    assert [e["attempt"] for e in saved] == [first.attempt] and suspended_at < saved[0]["time"] <= first.end, saved
    assert first.seconds["stopping"] == pytest.approx(first.end - saved[0]["time"], abs=0.01), first
    print(f"suspended at epoch {meta['epoch'] + 1} step {meta['step']}: resumed there on a new cluster; {seconds:.0f}s")
    assert_torn_down(run_id)
