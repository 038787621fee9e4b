"""bench/cluster.py: when a run reached a step or started, read from the files a run writes; the submitter's
working dir; the probe's config; Ray Train's controller log; and (integration) Ray's task events."""

from __future__ import annotations

import json
import time

import pytest
import torch
import yaml

from bench import cluster, probes
from raytrain.rundir import runrecords
from tests.bench.support import LINEAR, probed_run, train_epochs


def test_wait_row_returns_the_first_row_at_or_after_the_time_or_none_when_the_job_ended(tmp_path):
    rows = [{"time": 1.0, "n": 1}, {"time": 5.0, "n": 2}, {"time": 9.0, "n": 3}]
    assert cluster.wait_row(lambda: rows, 4.0, 5, lambda: True)["n"] == 2
    assert cluster.wait_row(lambda: rows, 10.0, 5, lambda: False) is None  # ended: no waiting out the timeout
    began = time.time()
    assert cluster.wait_row(lambda: rows, 10.0, 0.2, lambda: True) is None
    assert time.time() - began < 5


def test_first_step_is_read_from_the_probes_file_and_start_from_the_runs_events(tmp_path):
    run_dir = tmp_path / "runs" / "p3-0"
    run_dir.mkdir(parents=True)
    t0 = time.time()
    runrecords.Records(run_dir).append_event("start", start_epoch=1, resumed_from_epoch=None, world_size=2)
    probe = probes.FirstStepProbe(inner={"_component_": "torch.nn.Linear", "in_features": 4, "out_features": 2},
                                  path=str(cluster.probe_file(run_dir)))
    assert cluster.first_step_time(run_dir, t0, 0.1, lambda: True) is None  # no step yet
    probe(torch.zeros(1, 4))  # the first step begins
    assert cluster.first_step_time(run_dir, t0, 0.1, lambda: True) is None  # begun is not done
    probe(torch.zeros(1, 4))  # the forward pass after the first optimizer step
    step = cluster.first_step_time(run_dir, t0, 5, lambda: True)
    start = cluster.run_started(run_dir, t0, 5, lambda: True)
    assert start["event"] == "start" and t0 <= start["time"] <= step
    assert cluster.first_step_time(run_dir, time.time() + 1, 0.1, lambda: True) is None  # nothing newer yet
    assert cluster.first_step_time(tmp_path / "runs" / "missing", t0, 0.1, lambda: False) is None


def test_job_dir_holds_the_config_as_job_yaml_and_the_bench_package_only_when_asked(tmp_path):
    from raytrain.spec.config import resolve_config_path

    preset = resolve_config_path("digits")
    plain = cluster.job_dir(tmp_path, "p3-0", preset)
    assert sorted(p.name for p in plain.iterdir()) == ["job.yaml"]
    assert (plain / "job.yaml").read_text() == preset.read_text()
    shipped = cluster.job_dir(tmp_path, "scale-1", {"model": {"name": "mlp"}}, ship_bench=True)
    assert yaml.safe_load((shipped / "job.yaml").read_text()) == {"model": {"name": "mlp"}}
    assert (shipped / "bench" / "probes.py").exists() and (shipped / "bench" / "scaling.py").exists()
    assert not list(shipped.rglob("__pycache__"))

    timed = cluster.timed_job_dir(tmp_path, "p4-0", "digits", str(tmp_path / "p4-0.first-step.jsonl"))
    assert yaml.safe_load((timed / "job.yaml").read_text()) == cluster.probed_config(
        cluster.resolved_preset("digits"), str(tmp_path / "p4-0.first-step.jsonl"))
    assert (timed / "bench" / "probes.py").exists()  # the job imports the probe from its working dir


@pytest.mark.parametrize("preset", ["digits", "text-rnn", "cifar10-vit"])
def test_a_timed_job_is_a_valid_run_config_whose_model_and_smoke_block_reach_the_probe(tmp_path, monkeypatch, preset):
    """What p3/p4 submit loads as `raytrain run job.yaml --smoke-test` does (from the job's working dir): the probe
    wraps the preset's model, the smoke block still shrinks that model, and an include: still finds its files."""
    from raytrain.spec.config import load_config, resolve_config_path

    probe_path = str(tmp_path / "p3-0.first-step.jsonl")
    timed = cluster.timed_job_dir(tmp_path, "p3-0", preset, probe_path)
    monkeypatch.chdir(timed)
    monkeypatch.syspath_prepend(str(timed))
    plain, probed = load_config(preset, smoke=True), load_config("job.yaml", smoke=True)
    assert probed.model.path == "bench.probes.FirstStepProbe" and probed.model.kwargs["path"] == probe_path
    inner = probed.model.kwargs["inner"]
    assert inner["_component_"] == plain.model.path
    assert {k: v for k, v in inner.items() if k != "_component_"}.items() <= plain.model.kwargs.items()
    smoke = yaml.safe_load(resolve_config_path(preset).read_text()).get("smoke", {})
    shrunk = {key.split(".", 1)[1] for key in smoke if key.startswith("model.")}
    assert shrunk <= inner.keys()  # each smoke model key reached the real model
    assert all(probed.to_dict()[k] == plain.to_dict()[k] for k in ("data", "loop", "train", "scaling"))
    full = load_config(preset)
    unsmoked = load_config("job.yaml")  # what p4 runs: the preset without its smoke block
    assert all(unsmoked.to_dict()[k] == full.to_dict()[k] for k in ("data", "loop", "train", "scaling"))
    assert {k: v for k, v in unsmoked.model.kwargs["inner"].items() if k != "_component_"}.items() \
        <= full.model.kwargs.items()


def test_the_probed_config_wraps_the_model_and_keeps_everything_else(tmp_path):
    config = {"model": {"_component_": "torch.nn.Linear", "in_features": 4, "out_features": 2},
              "data": {"name": "digits"}, "train": {"epochs": 2}}
    probed = cluster.probed_config(config, "/mnt/shared/runs/p3-0.first-step.jsonl")
    assert probed["model"] == {"_component_": "bench.probes.FirstStepProbe", "inner": config["model"],
                               "path": "/mnt/shared/runs/p3-0.first-step.jsonl"}
    assert {k: v for k, v in probed.items() if k != "model"} == {k: v for k, v in config.items() if k != "model"}
    with pytest.raises(ValueError, match="no model section"):
        cluster.probed_config({"data": {}}, "x")
    assert cluster.probe_file(tmp_path / "runs" / "p3-0") == tmp_path / "runs" / "p3-0.first-step.jsonl"


def test_failure_detection_time_is_read_from_the_controller_log(tmp_path):
    logs = tmp_path / "n1" / "session_2026-11-21_11-00-00_1_1" / "logs" / "train"
    logs.mkdir(parents=True)
    line = lambda stamp, message: json.dumps({"asctime": stamp, "levelname": "INFO", "message": message})  # noqa: E731
    (logs / "ray-train-sys-controller-abc.log").write_text("\n".join([
        line("2026-11-21 11:00:05,250", "[FailurePolicy] RETRY\\n worker died"),
        line("2026-11-21 11:00:09,000", "Requesting resources"),
        line("2026-11-21 11:00:20,500", "[FailurePolicy] RETRY second failure"),
        "not json [FailurePolicy]",
    ]))
    base = time.mktime(time.strptime("2026-11-21 11:00:00", "%Y-%m-%d %H:%M:%S"))
    marker = cluster.FAILURE_DECIDED
    assert cluster.controller_log_time([tmp_path / "n1"], marker, base) == base + 5.25
    assert cluster.controller_log_time([tmp_path / "n1"], marker, base + 6) == base + 20.5
    assert cluster.controller_log_time([tmp_path / "n1", tmp_path / "n2"], marker, base + 30) is None


@pytest.mark.integration
def test_actor_creation_time_comes_from_rays_task_events():
    import os
    import shutil
    import tempfile

    import ray

    t0 = time.time()
    temp = tempfile.mkdtemp(prefix="rtb", dir="/tmp")  # Ray's socket paths must stay short
    context = ray.init(num_cpus=1, include_dashboard=True, dashboard_port=0, _temp_dir=temp)
    try:
        @ray.remote(num_cpus=0)
        class TrainController:
            def ping(self) -> int:
                return 1

        asked = time.time()
        ray.get(TrainController.remote().ping.remote())
        time.sleep(2)  # task events reach the GCS in batches
        url = f"http://{context.dashboard_url}"
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        created = cluster.actor_created_time(url, env, "TrainController", t0, time.time())
        assert created is not None and asked - 0.1 <= created <= time.time()
        assert cluster.actor_created_time(url, env, "TrainController", time.time(), time.time() + 1) is None
        assert cluster.actor_created_time("http://127.0.0.1:1", env, "TrainController", 0, time.time()) is None
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)


def test_trained_steps_are_the_groups_known_completed_steps_and_lost_ones_those_past_the_resume_point(tmp_path):
    """Real probe rows from a real loop: epochs of 4 steps, the node gone during epoch 3's third step."""
    run_dir, model = probed_run(tmp_path, "p4-kill-0")
    train_epochs(model, [4, 4])
    train_epochs(model, [3], evaluate=False)
    gone = time.time()
    time.sleep(0.01)
    model(torch.randn(2, 4))  # a delete side's group trains on to its checkpoint step: not counted at `gone`
    done, per_epoch = cluster.trained_steps(run_dir, gone)
    # Epoch 3's third forward began but nothing after it: only its first two steps are known finished.
    assert done == [(1, s) for s in range(1, 5)] + [(2, s) for s in range(1, 5)] + [(3, 1), (3, 2)]
    assert per_epoch == 4
    assert cluster.steps_lost(done, 2, 0) == 2  # resumed from epoch 2's checkpoint: epoch 3's two steps again
    assert cluster.steps_lost(done, 1, 0) == 6
    assert cluster.steps_lost(done, 2, 2) == 0  # a checkpoint at epoch 3, step 2 (or later): nothing again
    assert cluster.steps_lost(done, 2, 3) == 0
    assert cluster.steps_lost(done, None, None) == len(done)  # started over: everything again
    assert cluster.trained_steps(run_dir, 0) == ([], None)
    # By the group's end, the step it went on to (a drained group's, up to its checkpoint) counts as well.
    assert cluster.trained_steps(run_dir, time.time())[0] == done + [(3, 3)]


def test_a_resumed_groups_steps_count_from_its_start_event(tmp_path):
    run_dir = tmp_path / "runs" / "p4-delete-0"
    run_dir.mkdir(parents=True)
    runrecords.Records(run_dir).append_event("start", start_epoch=1, resumed_from_epoch=None, resumed_at_step=0, world_size=2)
    time.sleep(0.01)
    runrecords.Records(run_dir).append_event("start", start_epoch=3, resumed_from_epoch=2, resumed_at_step=3, world_size=2)
    model = probes.FirstStepProbe(inner=LINEAR, path=str(cluster.probe_file(run_dir)), every_step=True)
    train_epochs(model, [1, 4])  # the rest of epoch 3 (4 steps), epoch 4
    done, per_epoch = cluster.trained_steps(run_dir, time.time())
    assert done == [(3, 4)] + [(4, s) for s in range(1, 5)]
    assert per_epoch is None  # no whole epoch seen in this group but its last, which it may not have finished


def test_the_bench_cluster_gets_the_charts_prestop_hook_and_grace_period(tmp_path):
    from raytrain.validator.render import default_chart_dir

    values = yaml.safe_load((default_chart_dir() / "values.yaml").read_text())
    hook, grace = cluster.chart_pre_stop()
    assert grace == values["terminationGracePeriodSeconds"]
    assert hook == ["raytrain", "drain", "--wait",
                    str(values["terminationGracePeriodSeconds"] - values["preStopDrain"]["marginSeconds"])]
    off = tmp_path / "values.yaml"
    off.write_text(yaml.safe_dump({**values, "preStopDrain": {"enabled": False, "marginSeconds": 10}}))
    assert cluster.chart_pre_stop(off) == ([], grace)


def test_the_probed_config_asks_for_every_step_only_when_told():
    config = {"model": {"_component_": "torch.nn.Linear", "in_features": 4, "out_features": 2}}
    assert "every_step" not in cluster.probed_config(config, "p.jsonl")["model"]
    assert cluster.probed_config(config, "p.jsonl", every_step=True)["model"]["every_step"] is True
