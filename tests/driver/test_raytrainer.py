"""training/raytrain/driver/raytrainer.py: the driver's pieces that run without a cluster."""

from __future__ import annotations

import inspect

from raytrain.driver.raytrainer import root_cause


def test_root_cause_is_the_innermost_last_line():
    try:
        try:
            raise ValueError("first line\nthe real reason")
        except ValueError as inner:
            raise RuntimeError("wrapper") from inner
    except RuntimeError as outer:
        assert root_cause(outer) == "the real reason"


def test_a_full_disk_on_a_worker_is_named_as_such_with_its_directory(tmp_path):
    """Issue 40, item 14: ENOSPC from a worker's write ends the run saying the disk is full and where."""
    import pytest
    import torch

    from raytrain.checkpoint import checkpoints
    from tests.support.disk import small_disk

    with small_disk(tmp_path / "disk", "64k") as disk:
        try:
            try:
                checkpoints.write_checkpoint(disk / "staging", {"epoch": 1, "step": 0, "w": torch.ones(50_000)},
                                             config={})
            except OSError as full:
                raise RuntimeError("Ray Train worker group failed") from full
        except RuntimeError as outer:
            assert root_cause(outer) == f"the disk is full at {disk / 'staging'} (No space left on device)"
        else:
            pytest.fail("a 64 KiB disk took 200 KB")


def test_progress_prints_what_rank_0_printed_before_the_rows_of_the_same_poll(tmp_path):
    """Issue 38: the driver joins Ray with log_to_driver=False, so rank 0's prints reach its console through the
    run directory (raytrain.rundir.workerlogs): each new line once, before the poll's new rows, a last line without
    its newline at the stop; another attempt's lines are not this one's."""
    import io
    import json

    from raytrain.driver.raytrainer import Progress
    from raytrain.rundir import console, runrecords, workerlogs

    out = io.StringIO()
    progress = Progress(tmp_path, 2, out, attempt=4)
    log = workerlogs.log_path(tmp_path, 4)
    log.parent.mkdir()
    log.write_text("loading data\nepoch 1 done\nhal")
    workerlogs.log_path(tmp_path, 3).write_text("an older attempt's line\n")
    runrecords.Records(tmp_path).append_metrics({"epoch": 1, "train_loss": 0.5, "epoch_s": 1.0})
    progress.poll()
    progress.poll()  # nothing new: nothing printed twice
    progress.final = True
    progress.poll()
    assert out.getvalue().splitlines() == ["loading data", "epoch 1 done", "epoch 1/2  train_loss 0.5000  (50%)", "hal"]

    console.configure("json", run="r")
    try:
        out = io.StringIO()
        progress = Progress(tmp_path, 2, out, attempt=5)
        workerlogs.log_path(tmp_path, 5).write_text("hello\n")
        progress.poll()
        [line] = [json.loads(text) for text in out.getvalue().splitlines()]
        assert (line["event"], line["rank"], line["message"]) == ("output", 0, "hello")
    finally:
        console.configure("human")
        console._settings["run"] = None


def test_a_cluster_runs_workers_report_their_metrics_every_second_unless_the_user_chose(tmp_path):
    """Rank 0 waits one metrics report after the last epoch (telemetry.linger): the workers' interval is that wait.
    The user's RAY_metrics_report_interval_ms (read by cli.py) goes to the workers instead: Ray Train's env_vars
    win over the job's and the node's."""
    from raytrain.driver.raytrainer import build_trainer
    from raytrain.spec.config import load_config
    from raytrain.worker.telemetry import WORKER_REPORT_INTERVAL_MS

    cfg = load_config("linear")

    def env_of(**kwargs) -> dict:
        trainer = build_trainer(cfg, tmp_path, {"CPU": 1.0}, **kwargs)
        return dict(trainer.run_config.worker_runtime_env or {})

    assert env_of(on_cluster=True) == {"env_vars": {"RAY_metrics_report_interval_ms": str(WORKER_REPORT_INTERVAL_MS)}}
    assert env_of(on_cluster=True, worker_report_interval_ms=5000) == {
        "env_vars": {"RAY_metrics_report_interval_ms": "5000"}}
    assert env_of(on_cluster=False) == {}  # an embedded Ray: nothing lingers, nothing to shorten


def test_a_torchft_run_gets_ray_trains_torchft_backend_with_a_lighthouse_that_needs_no_cpu(tmp_path):
    """scaling.fault_tolerance torchft: Ray 2.60's TorchftConfig with raytrain's Lighthouse settings, whose actor
    asks for no CPU (a head with none for training would never schedule Ray's) and is reached by the node's IP;
    torchft's Rust logs kept to warnings on the workers. A restart run keeps Ray Train's plain torch backend."""
    from ray.train.v2.torch.torchft_config import TorchftConfig, _TorchftBackend

    from raytrain.driver.raytrainer import build_trainer
    from raytrain.spec.config import load_config
    from raytrain.worker.replicas import lighthouse_kwargs

    trainer = build_trainer(load_config("linear", ["scaling.fault_tolerance=torchft"]), tmp_path, {"CPU": 1.0})
    config = trainer.backend_config
    assert isinstance(config, TorchftConfig) and config.lighthouse_kwargs == lighthouse_kwargs()
    assert issubclass(config.backend_cls, _TorchftBackend) and config.backend_cls.has_replica_groups
    source = inspect.getsource(config.backend_cls._maybe_create_lighthouse_actor)
    assert "num_cpus=0" in source and "by_ip(" in source
    assert trainer.run_config.worker_runtime_env == {"env_vars": {"RUST_LOG": "warn"}}
    plain = build_trainer(load_config("linear"), tmp_path, {"CPU": 1.0})
    assert not isinstance(plain.backend_config, TorchftConfig)
