"""An elastic run (scaling.num_workers [2, 3]) on a real local multi-node Ray cluster: `raytrain emulate` of
rayjob-standalone.yaml with three 1-CPU worker pods. A worker pod deleted mid-epoch drains (its preStop hook) and its
recreated pod stays Pending; the run goes on on 2 workers from the drain's checkpoint. When the pod is back, Ray
Train grows the group to 3 and raytrain's controller callback has the running group checkpoint at its step first.
No completed step is lost or trained twice, and every epoch counts each sample once.

    .venv/bin/python -m pytest -m integration tests/integration/test_elastic.py -v -s
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

# Alone (scripts/test's serial pass): a head and three worker pods on 2 cores, and Ray Train's 30 s worker-group
# start timeout (raytrain.elastic) must not be crowded out by another test's cluster.
pytestmark = [pytest.mark.integration, pytest.mark.serial]

REPO = Path(__file__).resolve().parents[2]
SAMPLES = 24000  # ~3.5 s an epoch on 3 workers here
EPOCHS = 20  # long enough to outlast the shrink and the grow (about 45 s, see PENDING_S), with epochs left after them
# raytrain's controller callback has Ray's AutoscalingCoordinator leave the drained node out at once
# (raytrain.worker.elastic): the run goes on on 2 workers within seconds of the deletion. The recreated pod stays
# Pending for this long, so that the run trains on 2 for a while before it grows back.
PENDING_S = 20


def test_an_elastic_run_shrinks_on_a_deleted_pod_and_grows_back_losing_no_step(tmp_path, monkeypatch):
    from tests.integration.test_emulate import Emulation, assert_torn_down, run_dir, variant
    from tests.support import checks

    monkeypatch.setenv("RAYTRAIN_EMULATE_MAX_WORKER_NODES", "3")  # three 1-CPU worker pods on a 2-core machine
    job = variant(REPO / "manifests" / "rayjob-standalone.yaml", tmp_path / "rayjob.yaml",
                  job={"train": {"epochs": EPOCHS}, "data": {"num_samples": SAMPLES},
                       "scaling": {"num_workers": [2, 3], "elastic_resize_monitor_interval_s": 5},
                       "run": {"checkpoint_every": 1, "keep_checkpoints": 100}})
    run = Emulation(str(job))
    run_id = run.run_id()
    directory = run_dir(run_id, "linear-standalone")
    run.wait_for(lambda: len(checks.metrics_epochs(directory)) >= 1, 400, "epoch 1")
    time.sleep(1.5)  # into epoch 2
    deleted_at = time.time()
    done = subprocess.run([sys.executable, "-m", "raytrain.cli", "cluster", "delete-node", run_id, "worker-0",
                           "--pending", str(PENDING_S)], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0 and "marked DRAINING in the GCS" in done.stdout, done.stdout + done.stderr
    assert "training on this node ended" in done.stdout and "SIGKILL" not in done.stdout, done.stdout
    code, output, seconds = run.finish()
    assert code == 0, output[-4000:]
    checks.assert_job_succeeded(checks.rayjob_from_emulate_output(output))
    assert "its recreated pod is Pending" in output and "the run goes on on 2 workers (it had 3)" in output
    assert "this Ray node is being drained" in output  # raytrain.worker.drain.DRAIN_MESSAGE, from the drained workers

    events = checks.read_jsonl(directory / "events.jsonl")
    starts = [e for e in events if e["event"] == "start"]
    assert [s["world_size"] for s in starts] == [3, 2, 3], \
        f"expected groups of 3, 2, 3 workers (did the run end before the pod came back?): {starts}\n" + \
        "\n".join(json.dumps(e) for e in events if e["event"] not in ("start",)) + "\n" + \
        "\n".join(line for line in output.splitlines() if "raytrain" in line.lower() or "pod" in line)[-6000:]
    assert [(e["previous"], e["workers"]) for e in events if e["event"] == "resize"] == [(3, 2), (2, 3)]
    restored = [e for e in events if e["event"] == "restored"]
    assert len(restored) == 2, restored
    # The shrink: the drain's checkpoint, mid-epoch, is where the 2-worker group started.
    drained = [json.loads((p / "meta.json").read_text()) for p in sorted(directory.glob("checkpoint_*"))
               if (p / "meta.json").exists() and p.stat().st_mtime >= deleted_at]
    first = min(drained, key=lambda m: (m["epoch"], m["step"]))
    assert first["step"] > 0 and (starts[1]["start_epoch"], starts[1]["resumed_at_step"]) == \
        (first["epoch"] + 1, first["step"]), (first, starts[1])
    # The grow: the running group checkpointed at its step when Ray Train asked (the `resizing` event, written by
    # the controller once rank 0 answered), and the 3-worker group started from exactly that checkpoint.
    [resizing] = [e for e in events if e["event"] == "resizing"]
    assert resizing["workers"] == 3 and resizing["checkpoint"] == restored[1]["checkpoint"], (resizing, restored)
    # No warning: among them a group start that failed (raytrain.worker.elastic records Ray Train's start timeout),
    # as the restart after the drain did while Ray's AutoscalingCoordinator still counted the drained node
    assert not [e for e in events if e["event"] == "warning"], events
    checks.assert_run_completed(directory, EPOCHS)
    samples = [row["samples"] for row in checks.read_jsonl(directory / "metrics.jsonl")]
    assert samples == [SAMPLES] * EPOCHS, samples  # every sample once an epoch, across both resizes
    # Emptied after the resize, never deleted (NFS); the loop's end left its standing answer (elastic.FINISHED)
    assert json.loads((directory / "resize-request.json").read_text()) == {"id": None}
    held = json.loads((directory / "resize-held.json").read_text())
    assert held == {"id": None} or (held["id"], held["ending"]) == ("finished", "finished"), held

    # Goodput (issue 38): nothing trained again; each resize's time is its gap, from the group's end at a step
    # (its checkpoint kept: the drain's, then the grow's) to the new group's restore; nothing counts as recovery
    from raytrain.rundir import goodput

    found = goodput.read(directory, epochs=EPOCHS)
    assert sum(found.seconds.values()) == pytest.approx(found.wall_s) and found.seconds["other"] == 0, found.seconds
    saved = [e for e in events if e["event"] == "progress_saved"]
    assert len(saved) == 2 and deleted_at < saved[0]["time"] < starts[1]["time"] and \
        saved[1]["time"] <= resizing["time"], saved
    gaps = [start["time"] - (restore.get("restore_s") or 0) - end["time"]
            for start, restore, end in zip(starts[1:], restored, saved)]
    assert found.seconds["resize"] == pytest.approx(sum(gaps), abs=0.02), (found.seconds, gaps)
    assert found.seconds["lost"] == 0 and found.seconds["recovery"] == 0, found.seconds
    assert gaps[0] < starts[1]["time"] - deleted_at  # the deletion to the drain's checkpoint trained, and is kept

    summary = subprocess.run([sys.executable, "-m", "raytrain.cli", "report", str(directory)], capture_output=True,
                             text=True, timeout=120, cwd=REPO)
    assert summary.returncode == 0, summary.stdout + summary.stderr
    page = (directory / "report.html").read_text()
    assert "workers: 3 -&gt; 2 at epoch 2 step" in page and "2 -&gt; 3 at epoch" in page, page[-2000:]
    shrink_s = starts[1]["time"] - deleted_at
    grow_s = starts[2]["time"] - resizing["time"]
    print(f"elastic: on 2 workers {shrink_s:.0f} s after the pod's deletion; the grow to 3 took {grow_s:.0f} s from "
          f"its checkpoint; {seconds:.0f} s in all; goodput's resizes {found.seconds['resize']:.1f} s (gaps "
          f"{', '.join(f'{g:.1f}' for g in gaps)})")
    assert_torn_down(run_id)
