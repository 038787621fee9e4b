"""training/raytrain/worker/raytrain_function.py: a Ray Train function (`train_func(config)`) as a run config's loop.
Recognised by config.py (train_loop_config, no model/data), its reported checkpoint directories committed by the
fenced rename with a manifest of files and pruned, get_checkpoint() the newest complete one, a stop at the next
report. The worker side is exercised in this process with a LocalSession (no Ray); the real runs are in
tests/integration/test_ray_train_scripts.py."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from raytrain.checkpoint import checkpoints, resume
from raytrain.checkpoint.checkpoints import FileCheckpointer, Position
from raytrain.driver import raytrainer
from raytrain.errors import ConfigError
from raytrain.lifecycle.endings import AttemptEnded, Ending
from raytrain.rundir import runrecords, storage
from raytrain.spec import loops
from raytrain.spec.config import load_config
from raytrain.worker import raytrain_function

FUNCTIONS = '''
import os, tempfile
import ray.train
from ray.train import Checkpoint, report

def train_func(config):
    start = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d:
            start = int(open(os.path.join(d, "at.txt")).read()) + 1
    for epoch in range(start, config.get("epochs", 3)):
        with tempfile.TemporaryDirectory() as tmp:
            open(os.path.join(tmp, "at.txt"), "w").write(str(epoch))
            os.makedirs(os.path.join(tmp, "sub"))
            open(os.path.join(tmp, "sub", "w.bin"), "wb").write(bytes(range(epoch + 1)))
            report({"epoch": epoch, "loss": 1.0 / (epoch + 1)}, checkpoint=Checkpoint.from_directory(tmp))

def ignores_its_checkpoint(config):
    ray.train.get_checkpoint()  # asked, and ignored: it begins at epoch 0 again
    for epoch in range(config.get("epochs", 3)):
        with tempfile.TemporaryDirectory() as tmp:
            open(os.path.join(tmp, "at.txt"), "w").write(str(epoch))
            report({"epoch": epoch}, checkpoint=Checkpoint.from_directory(tmp))

def steps_in_one_epoch(config):
    # A checkpoint every 2nd step of epoch 1; the first run dies after reporting step 3 (past its checkpoint)
    start = 1
    checkpoint = ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d:
            start = int(open(os.path.join(d, "at.txt")).read()) + 1
    for step in range(start, config.get("epochs", 3) + 1):
        with tempfile.TemporaryDirectory() as tmp:
            open(os.path.join(tmp, "at.txt"), "w").write(str(step))
            report({"epoch": 1, "step": step}, checkpoint=Checkpoint.from_directory(tmp) if step % 2 == 0 else None)
        if step == 3 and not os.path.exists(config["died"]):
            open(config["died"], "w").close()
            raise RuntimeError("the worker died")

def deleted_before_report(config):
    with tempfile.TemporaryDirectory() as tmp:
        open(os.path.join(tmp, "at.txt"), "w").write("1")
    report({"epoch": 1}, checkpoint=Checkpoint.from_directory(tmp))

def negative_epoch(config):
    with tempfile.TemporaryDirectory() as tmp:
        open(os.path.join(tmp, "at.txt"), "w").write("1")
        report({"epoch": -1}, checkpoint=Checkpoint.from_directory(tmp))

def no_args():
    ray.train.report({"loss": 1.0})
    ray.train.report({"loss": 0.5})

def fails_at_two(config):
    start = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d:
            start = int(open(os.path.join(d, "at.txt")).read()) + 1
    for epoch in range(start, 4):
        if epoch == 2:
            raise RuntimeError("fails at epoch 2")
        with tempfile.TemporaryDirectory() as tmp:
            open(os.path.join(tmp, "at.txt"), "w").write(str(epoch))
            report({"epoch": epoch, "loss": 1.0}, checkpoint=Checkpoint.from_directory(tmp))

class LandsLast(Checkpoint):
    """Rank 1's directory, read only once rank 0's copy landed in the checkpoint's staging directory."""

    def __init__(self, path, staged, **kwargs):
        super().__init__(path, **kwargs)
        self.staged = staged

    def as_directory(self):
        import glob, time
        deadline = time.monotonic() + 120
        while not glob.glob(self.staged) and time.monotonic() < deadline:
            time.sleep(0.02)
        return super().as_directory()

def every_rank_reports_rank_0s_output(config):
    # Hugging Face's RayTrainReportCallback with two workers sharing a cwd: every rank reports the output directory
    # rank 0 writes, and rank 1 copies it while rank 0 is still writing (an empty trainer_state.json), after rank 0.
    import torch.distributed as dist
    with tempfile.TemporaryDirectory() as tmp:
        if dist.get_rank() == 0:
            open(os.path.join(tmp, "trainer_state.json"), "w").write('{"global_step": 4}')
            report({"epoch": 1}, checkpoint=Checkpoint.from_directory(tmp))
        else:
            open(os.path.join(tmp, "trainer_state.json"), "w").close()
            open(os.path.join(tmp, "rank1.txt"), "w").write("rank 1's own")
            report({"epoch": 1}, checkpoint=LandsLast(tmp, config["staged"]))

def named_cfg(cfg):
    pass

def session_loop(session, hidden: int = 3):
    pass

def declares(config):
    pass
declares.applied_on_resume = ("loop.train_loop_config.lr",)
'''


@pytest.fixture
def project(tmp_path, monkeypatch):
    (tmp_path / "rt_funcs.py").write_text(FUNCTIONS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    sys.modules.pop("rt_funcs", None)
    yield tmp_path
    sys.modules.pop("rt_funcs", None)


def write(project, text: str, name: str = "job.yaml"):
    path = project / name
    path.write_text(textwrap.dedent(text))
    return str(path)


# ---------------------------------------------------------------------------------------------- the config


def test_a_ray_train_function_with_its_train_loop_config_needs_no_model_or_data(project):
    cfg = load_config(write(project, """
        loop: {_component_: "rt_funcs:train_func", train_loop_config: {lr: 0.01, epochs: 3}}
        scaling: {num_workers: 3}
        run: {storage_path: runs}
    """))
    assert loops.is_ray_train_loop(cfg) and cfg.model is None and cfg.data is None
    assert cfg.to_dict()["loop"] == {"_component_": "rt_funcs.train_func",
                                     "train_loop_config": {"lr": 0.01, "epochs": 3}}
    # train.batch_size 64 over 3 workers would be refused for a Session loop: the function batches on its own
    assert cfg.train.batch_size == 64


def test_a_ray_train_function_may_run_with_torchft_but_not_on_fsdp(project):
    """A function that uses torchft itself (Ray's torchft example) gets Ray Train's TorchftConfig under
    scaling.fault_tolerance torchft; what torchft cannot go with is refused as for a Session loop."""
    from raytrain.spec.config import ConfigError

    cfg = load_config(write(project, """
        loop: {_component_: rt_funcs.train_func}
        scaling: {num_workers: 2, fault_tolerance: torchft}
    """))
    assert loops.is_ray_train_loop(cfg) and cfg.scaling.torchft
    with pytest.raises(ConfigError) as caught:
        load_config(write(project, """
            loop: {_component_: rt_funcs.train_func}
            scaling: {num_workers: [1, 2], fault_tolerance: torchft}
        """))
    assert "scaling.fault_tolerance" in str(caught.value) and "give scaling.num_workers one count" in str(caught.value)


def test_no_parameter_or_a_named_one_with_train_loop_config_and_none_given_at_all(project):
    assert loops.is_ray_train_loop(load_config(write(project, "loop: {_component_: rt_funcs.no_args}")))
    named = load_config(write(project, "loop: {_component_: rt_funcs.named_cfg, train_loop_config: {a: 1}}"))
    assert named.loop.kwargs == {"train_loop_config": {"a": 1}}
    bare = load_config(write(project, "loop: {_component_: rt_funcs.train_func}"))
    assert bare.loop.kwargs == {"train_loop_config": {}} and raytrainer.dataset_config(bare) is None
    split = load_config(write(project, "loop: {_component_: rt_funcs.train_func, datasets_to_split: [train]}"))
    assert raytrainer.dataset_config(split)._datasets_to_split == ["train"]
    session_loop = load_config(write(project, "loop: {_component_: rt_funcs.session_loop, hidden: 4}"))
    assert not loops.is_ray_train_loop(session_loop)


def test_the_issues_config_is_told_where_its_keys_go(project):
    with pytest.raises(ConfigError, match=r"unknown key 'loop.lr'.*Ray Train function.*move lr, epochs under "
                                          r"loop.train_loop_config"):
        load_config(write(project, "loop: {_component_: rt_funcs.train_func, lr: 0.01, epochs: 3}"))


@pytest.mark.parametrize("text, message", [
    ("loop: {_component_: rt_funcs.train_func, train_loop_config: [1, 2]}", "must be a mapping"),
    ("loop: {_component_: rt_funcs.session_loop, train_loop_config: {a: 1}}", "is not a Ray Train function"),
    ("loop: {_component_: rt_funcs.declares, train_loop_config: {}}", "declares applied_on_resume"),
    ("loop: {_component_: rt_funcs.train_func, datasets_to_split: train}", "must be all or a list of dataset names"),
])
def test_what_cannot_be_a_ray_train_loop_is_refused_with_the_fix(project, text, message):
    with pytest.raises(ConfigError, match=message):
        load_config(write(project, text))


def test_validate_without_the_users_code_checks_the_mapping(project):
    cfg = load_config(write(project, "loop: {_component_: absent_pkg.train:train_func, train_loop_config: {a: 1}}"),
                      import_user_code=False)
    assert loops.is_ray_train_loop(cfg) and cfg.model is None
    assert cfg.unchecked == ["loop: absent_pkg.train.train_func, a Ray Train function whose train_loop_config is "
                             "its own"]
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_config(write(project, "loop: {_component_: absent_pkg.train_func, train_loop_config: 3}"),
                    import_user_code=False)


def test_raytrain_local_refuses_it_naming_raytrain_run(project):
    cfg = load_config(write(project, "loop: {_component_: rt_funcs.train_func}"))
    assert "raytrain run" in loops.local_refusal(cfg)


# ---------------------------------------------------------------------------------------------- the manifest commit


def reported_dir(tmp_path, files: dict) -> str:
    source = tempfile.mkdtemp(dir=tmp_path)
    for name, data in files.items():
        os.makedirs(os.path.dirname(os.path.join(source, name)) or source, exist_ok=True)
        with open(os.path.join(source, name), "wb") as handle:
            handle.write(data)
    return source


def commit_dir(run_dir, epoch, files, keep=50, control=None):
    saver = FileCheckpointer(run_dir, keep=keep) if control is None else FileCheckpointer(run_dir, control, keep)
    name = checkpoints.checkpoint_dir_name(Position(epoch))
    staging = saver.staging_path(name)
    listed = checkpoints.copy_tree_hashed(__import__("pathlib").Path(reported_dir(run_dir.parent, files)),
                                          staging / checkpoints.DATA_DIR)
    return saver.commit(name, lambda: checkpoints.write_directory_manifest(staging, Position(epoch), listed,
                                                                           config={"x": 1}))


def test_a_directory_checkpoint_names_its_files_and_commits_by_rename(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    path = commit_dir(run_dir, 2, {"model.pt": b"abc", "sub/opt.bin": b"\x00" * 10})
    meta = json.loads((path / "meta.json").read_text())
    assert meta["kind"] == "directory" and meta["epoch"] == 2 and set(meta["files"]) == {"model.pt", "sub/opt.bin"}
    assert meta["files"]["sub/opt.bin"]["size"] == 10
    assert (path / "data" / "model.pt").read_bytes() == b"abc"
    assert not list(run_dir.glob(".staging-*")) and not list(path.rglob("*.partial"))
    assert checkpoints.incomplete_reason(path) is None and checkpoints.newest_complete(run_dir) == path
    checkpoints.verify_hash(path)
    with pytest.raises(checkpoints.CheckpointUnreadable, match="Session loops cannot load it"):
        checkpoints.load(path)


def test_damage_is_found_by_size_then_by_hash(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    older = commit_dir(run_dir, 1, {"model.pt": b"one"})
    newer = commit_dir(run_dir, 2, {"model.pt": b"two"})
    (newer / "data" / "model.pt").write_bytes(b"tw")
    assert "holds 2 bytes" in checkpoints.incomplete_reason(newer)
    assert checkpoints.newest_complete(run_dir) == older
    (newer / "data" / "model.pt").write_bytes(b"twX")
    with pytest.raises(checkpoints.CheckpointUnreadable, match="does not match the hash"):
        checkpoints.verify_hash(newer)
    warnings = []
    plan = resume.plan(run_dir, {"x": 1}, warnings.append, resume.ResumeRules(), FileCheckpointer(run_dir))
    assert plan.checkpoint == older and "cannot be loaded" in warnings[0]


def test_pruning_keeps_the_newest_complete_and_a_fenced_commit_leaves_nothing(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for epoch in range(1, 5):
        commit_dir(run_dir, epoch, {"m": bytes([epoch])}, keep=2)
    assert [checkpoints.position_of(p).epoch for p in checkpoints.committed(run_dir)] == [4, 3]

    class Lost:
        token = 7

        def check(self):
            raise AttemptEnded(Ending.LEASE_LOST, "taken over")

        def poll(self):
            return None

    with pytest.raises(AttemptEnded):
        commit_dir(run_dir, 5, {"m": b"5"}, keep=2, control=Lost())
    assert not list(run_dir.glob(".staging-*")) and len(checkpoints.committed(run_dir)) == 2


def test_the_loop_section_declares_what_a_resume_may_not_change(project, tmp_path):
    text = """
        loop:
          _component_: rt_funcs.train_func
          train_loop_config: {{hidden: {hidden}, lr: {lr}}}
          fixed_on_resume: [loop.train_loop_config.hidden]
    """
    first = load_config(write(project, text.format(hidden=4, lr=0.1)))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    saver = FileCheckpointer(run_dir)
    name = checkpoints.checkpoint_dir_name(Position(1))
    saver.commit(name, lambda: checkpoints.write_directory_manifest(saver.staging_path(name), Position(1), {},
                                                                    config=first.to_dict()))
    rules = resume.resume_rules(first)
    changed_lr = load_config(write(project, text.format(hidden=4, lr=0.5)))
    assert resume.plan(run_dir, changed_lr.to_dict(), print, rules, saver).epoch == 1  # the function's business
    changed_shape = load_config(write(project, text.format(hidden=8, lr=0.1)))
    with pytest.raises(resume.ResumeRefused, match=r"loop.train_loop_config.hidden: 4 in the checkpoint, 8 now"):
        resume.plan(run_dir, changed_shape.to_dict(), print, rules, saver)
    with pytest.raises(ConfigError, match="must be a list of config keys"):
        load_config(write(project, "loop: {_component_: rt_funcs.train_func, fixed_on_resume: 3}"))


# ---------------------------------------------------------------------------------------------- the worker side


class StopAfter:
    """A run control whose stop request arrives once `n` polls were made."""

    token = 1

    def __init__(self, n):
        self.n = n

    def check(self):
        return None

    def poll(self):
        self.n -= 1
        return (Ending.STOPPED, "SIGTERM") if self.n < 0 else None


def run_function(project, name="train_func", epochs=3, keep=2, control=None, storage_path=None):
    from raytrain.worker.localsession import LocalSession

    raytrain_function.install()  # as the worker entry does: before the function's module is imported
    sys.modules.pop("rt_funcs", None)
    cfg = load_config(write(project, f"""
        loop: {{_component_: rt_funcs.{name}, train_loop_config: {{epochs: {epochs}, died: {project / 'died'}}}}}
        run: {{storage_path: {storage_path or project / 'runs'}, name: r, keep_checkpoints: {keep}}}
    """))
    run_dir = runrecords.run_dir_of(cfg.run.storage_path, cfg.run.name)
    storage.makedirs(run_dir)
    session = LocalSession(cfg, run_dir, 1) if control is None else LocalSession(cfg, run_dir, 1, control=control)
    session.start()
    reported = []
    original = raytrain_function._originals["report"]
    raytrain_function._originals["report"] = reported.append  # Ray Train's own report: there is no Ray here
    try:
        raytrain_function.run(cfg, session)
    finally:
        raytrain_function._originals["report"] = original
    return run_dir, reported


@pytest.fixture(autouse=True)
def ray_train_restored():
    """This process's ray.train as it was: install() replaces its report and get_checkpoint."""
    yield
    if raytrain_function._originals:
        import ray.train

        ray.train.report = raytrain_function._originals["report"]
        ray.train.get_checkpoint = raytrain_function._originals["get_checkpoint"]


def test_reports_are_rows_and_checkpoints_pruned_and_get_checkpoint_resumes(project):
    run_dir, reported = run_function(project, epochs=3)
    assert [(r["epoch"], r["loss"]) for r in runrecords.read_metrics(run_dir)] == [(0, 1.0), (1, 0.5), (2, 1 / 3)]
    assert reported == [{"epoch": e, "loss": 1.0 / (e + 1)} for e in range(3)]  # Ray Train sees the metrics
    newest = checkpoints.committed(run_dir)
    assert [checkpoints.position_of(p).epoch for p in newest] == [2, 1]
    assert (newest[0] / "data" / "sub" / "w.bin").read_bytes() == bytes(range(3))
    # a resubmission with more epochs: get_checkpoint() returns epoch 2's files, training goes on at 3
    run_dir, _ = run_function(project, epochs=5)
    assert [r["epoch"] for r in runrecords.read_metrics(run_dir)] == [0, 1, 2, 3, 4]
    restored = [e for e in runrecords.read_events(run_dir) if e["event"] == "restored"]
    assert restored[-1]["checkpoint"] == newest[0].name and restored[-1]["epoch"] == 2
    assert runrecords.read_metrics(run_dir)[-1]["resumed_from_epoch"] == 2


def test_a_function_that_reports_no_epoch_is_counted_and_one_that_never_asks_is_warned_about(project):
    run_dir, _ = run_function(project, name="no_args")
    assert [r["epoch"] for r in runrecords.read_metrics(run_dir)] == [1, 2]
    run_dir, _ = run_function(project, epochs=2)  # same run: rows past the (absent) checkpoint are dropped
    assert [r["epoch"] for r in runrecords.read_metrics(run_dir)] == [0, 1]
    run_dir, _ = run_function(project, name="no_args")
    assert [r["epoch"] for r in runrecords.read_metrics(run_dir)] == [0, 1, 2, 3]  # numbered on from the checkpoint
    warnings = [e["message"] for e in runrecords.read_events(run_dir) if e["event"] == "warning"]
    assert any("did not call ray.train.get_checkpoint()" in w for w in warnings)


def test_a_stop_request_ends_the_function_at_its_next_report_after_the_commit(project):
    with pytest.raises(AttemptEnded) as ended:
        run_function(project, epochs=10, control=StopAfter(2), keep=5)
    run_dir = project / "runs" / "r"
    assert ended.value.ending is Ending.STOPPED
    assert [r["epoch"] for r in runrecords.read_metrics(run_dir)] == [0, 1, 2]
    assert checkpoints.position_of(checkpoints.committed(run_dir)[0]).epoch == 2


def test_a_function_that_reports_a_position_again_replaces_its_rows_and_says_so(project):
    """Issue 40, 10c: a function that asks for its checkpoint and ignores it (beginning at epoch 0 again), and one
    that repeats the steps past its checkpoint after a mid-epoch restart, leave each position's row once, and a
    warning names the repeat."""
    run_dir, _ = run_function(project, name="ignores_its_checkpoint", keep=5)
    run_dir, _ = run_function(project, name="ignores_its_checkpoint", keep=5)
    assert [r["epoch"] for r in runrecords.read_metrics(run_dir)] == [0, 1, 2]
    warnings = [e["message"] for e in runrecords.read_events(run_dir) if e["event"] == "warning"]
    assert any("reported epoch 0 again" in w and "up to epoch 2" in w for w in warnings)

    shutil.rmtree(project / "runs")  # another run
    with pytest.raises(RuntimeError, match="the worker died"):
        run_function(project, name="steps_in_one_epoch", epochs=5)
    run_dir = project / "runs" / "r"
    run_dir, _ = run_function(project, name="steps_in_one_epoch", epochs=5)  # Ray Train's restart of the group
    assert [(r["epoch"], r["step"]) for r in runrecords.read_metrics(run_dir)] == [(1, s) for s in range(1, 6)]
    warnings = [e["message"] for e in runrecords.read_events(run_dir) if e["event"] == "warning"]
    assert any("reported epoch 1 step 3 again" in w for w in warnings)


@pytest.mark.parametrize("where", ["directory", "s3"])
def test_a_checkpoint_deleted_before_its_report_or_at_a_negative_epoch_is_refused_naming_it(project, where,
                                                                                             request):
    """Issue 40, 11: nothing is committed (no empty checkpoint, no checkpoint_epoch-00001) and the refusal names
    what was reported and the fix; on S3 no staged copy is left either."""
    storage_path = None
    if where == "s3":
        storage_path = f"s3://{request.getfixturevalue('s3_server').new_bucket()}/runs"
    with pytest.raises(raytrain_function.CheckpointRefused, match=r"does not exist \(deleted before ray.train.report"):
        run_function(project, name="deleted_before_report", storage_path=storage_path)
    run_dir = runrecords.run_dir_of(storage_path or str(project / "runs"), "r")
    with pytest.raises(raytrain_function.CheckpointRefused, match="its epoch is -1.*Fix: report an epoch of 0 or more"):
        run_function(project, name="negative_epoch", storage_path=storage_path)
    assert not checkpoints.committed(run_dir) and not checkpoints.staging_dirs(run_dir)
    assert not [name for name in storage.listdir(run_dir) if "checkpoint" in name]


def test_a_group_whose_function_fails_before_its_first_report_is_counted_as_a_restart(project):
    """Issue 40, item 14: a function that raises at epoch 2 with max_failures: 1 ended "failed after 0 worker-group
    restart(s)": the restarted group resumed at epoch 2 and raised before reporting, so it never recorded its start.
    Each group here is what Ray Train starts (the same attempt, the run directory kept)."""
    from raytrain.driver.raytrainer import group_restarts

    for _ in range(2):  # the first group, then Ray Train's restart of it
        with pytest.raises(RuntimeError, match="fails at epoch 2"):
            run_function(project, name="fails_at_two")
    run_dir = runrecords.run_dir_of(str(project / "runs"), "r")
    starts = [e for e in runrecords.read_events(run_dir) if e["event"] == "start"]
    assert [e["resumed_from_epoch"] for e in starts] == [None, 1]
    assert group_restarts(run_dir, starts[0]["attempt"]) == 1
    assert group_restarts(run_dir, 999) == 0  # another attempt's groups are not this one's restarts


def test_after_a_kill_get_checkpoint_offers_the_newest_committed_and_the_rows_past_it_are_trained_again(project):
    """What a SIGKILLed driver leaves (a checkpoint write in flight, a metrics row past the newest commit; the
    process path of a kill and its lease takeover is tests/integration/test_attempt.py's): the rerun's
    get_checkpoint() offers the newest committed checkpoint that verifies, never the torn write, and every epoch is
    recorded once. A damaged newest one is passed over for the one before, saying so."""
    run_dir, _ = run_function(project, epochs=3, keep=3)
    committed = checkpoints.committed(run_dir)[0]
    saver = FileCheckpointer(run_dir, keep=3)
    torn = saver.staging_path(checkpoints.checkpoint_dir_name(Position(3)))
    (torn / checkpoints.DATA_DIR).mkdir(parents=True)
    (torn / checkpoints.DATA_DIR / "at.txt").write_text("3")  # no manifest: never committed
    runrecords.Records(run_dir).append_metrics({"epoch": 3, "loss": 0.25})  # trained, its checkpoint not committed
    run_dir, _ = run_function(project, epochs=5, keep=3)
    restored = [e for e in runrecords.read_events(run_dir) if e["event"] == "restored"]
    assert (restored[-1]["checkpoint"], restored[-1]["epoch"]) == (committed.name, 2)
    assert [r["epoch"] for r in runrecords.read_metrics(run_dir)] == [0, 1, 2, 3, 4]
    redone = runrecords.read_metrics(run_dir)[3]  # the killed attempt's row, trained again from epoch 2's checkpoint
    assert redone["loss"] == 1 / 4 and redone["resumed_from_epoch"] == 2

    newest = checkpoints.committed(run_dir)[0]  # epoch 4's: damaged, so the rerun takes epoch 3's
    (newest / checkpoints.DATA_DIR / "at.txt").write_text("X")
    run_dir, _ = run_function(project, epochs=6, keep=3)
    restored = [e for e in runrecords.read_events(run_dir) if e["event"] == "restored"]
    assert restored[-1]["epoch"] == 3, restored
    warnings = [e["message"] for e in runrecords.read_events(run_dir) if e["event"] == "warning"]
    assert any(f"checkpoint {newest.name} is unreadable" in w and "falling back" in w for w in warnings), warnings
    assert [r["epoch"] for r in runrecords.read_metrics(run_dir)] == [0, 1, 2, 3, 4, 5]


# ---------------------------------------------------------------------------------------------- several workers

RANK = """
import sys
from pathlib import Path

import torch.distributed as dist

rank, init_file, project = int(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
sys.path.insert(0, str(project))
dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
try:
    from raytrain.rundir import runrecords
    from raytrain.spec.config import load_config
    from raytrain.worker import raytrain_function
    from raytrain.worker.localsession import LocalSession

    class Worker(LocalSession):  # a Ray Train worker's rank, in a gloo group of two processes (no Ray)
        pass

    Worker.rank, Worker.world_size = rank, 2
    raytrain_function.install()  # as the worker entry does: before the function's module is imported
    cfg = load_config(str(project / "job.yaml"))
    session = Worker(cfg, runrecords.run_dir_of(cfg.run.storage_path, cfg.run.name), 1)
    session.start()
    raytrain_function._originals["report"] = lambda metrics: None  # Ray Train's own report: there is no Ray here
    raytrain_function.run(cfg, session)
    dist.barrier()  # neither rank leaves the group while the other still uses it
finally:
    dist.destroy_process_group()
"""


def test_a_name_several_ranks_report_is_committed_from_the_lowest_rank_whatever_order_they_were_staged_in(project):
    """tests/integration/test_frameworks.py[transformers] under load: rank 1 copied rank 0's half-written
    trainer_state.json (empty) into the shared staging directory after rank 0's copy, the last copy to land was
    committed, and every resume failed on its JSON. Two real workers (a gloo group of two processes) run the real
    report: rank 0's copy is committed with its hash, a file only rank 1 reported is committed from rank 1, and no
    rank's own staging copy is left."""
    run_dir = project / "runs" / "r"
    run_dir.mkdir(parents=True)
    staged = run_dir / ".staging-checkpoint_*" / checkpoints.DATA_DIR / "trainer_state.json"
    write(project, f"""
        loop:
          _component_: rt_funcs.every_rank_reports_rank_0s_output
          train_loop_config: {{staged: "{staged}"}}
        run: {{storage_path: {project / 'runs'}, name: r}}
    """)
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo / "training"), str(repo),
                                                         os.environ.get("PYTHONPATH", "")])}
    # Fresh interpreters, not fork: a fork of the test process (with torch's threads) can hang in gloo under load.
    procs = [subprocess.Popen([sys.executable, "-c", RANK, str(rank), str(project / "init"), str(project)],
                              cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for rank in (0, 1)]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    [committed] = checkpoints.committed(run_dir)
    rank0s = b'{"global_step": 4}'
    assert (committed / checkpoints.DATA_DIR / "trainer_state.json").read_bytes() == rank0s
    assert (committed / checkpoints.DATA_DIR / "rank1.txt").read_bytes() == b"rank 1's own"
    files = json.loads((committed / checkpoints.META_FILE).read_text())["files"]
    assert files["trainer_state.json"] == {"size": len(rank0s), "sha256": hashlib.sha256(rank0s).hexdigest()}
    checkpoints.verify_hash(committed)
    assert sorted(os.listdir(committed / checkpoints.DATA_DIR)) == ["rank1.txt", "trainer_state.json"]
    assert not list(run_dir.glob(".staging-*"))


def test_a_killed_ranks_own_staging_copy_is_removed_by_the_next_lease_holder(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    older = commit_dir(run_dir, 1, {"at.txt": b"1"})
    saver = FileCheckpointer(run_dir)
    own = saver.store.reported_staging(checkpoints.checkpoint_dir_name(Position(2)), 1)
    (own / checkpoints.DATA_DIR).mkdir(parents=True)
    (own / checkpoints.DATA_DIR / "at.txt").write_text("2")  # copied; killed before it moved its files in
    warnings = []
    plan = resume.plan(run_dir, {"x": 1}, warnings.append, resume.ResumeRules(), saver)
    assert plan.checkpoint == older and plan.removed_staging == [own.name]
    assert any(f"{own.name} was never committed" in w for w in warnings) and not own.exists()
