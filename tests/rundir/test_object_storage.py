"""Runs on object storage (raytrain.rundir.storage), against a real S3-compatible server started by the tests (moto's
standalone server over HTTP, tests.support.objectstore): the same guarantees as on a directory. One claim per
token under racing starts (If-None-Match), a live holder refused and a dead one taken over, a stale holder fenced
out, appends that lose nothing to a concurrent writer (If-Match), a checkpoint committed by its manifest uploaded
last, and one killed mid-upload ignored, then removed by the next holder. Bad URLs get one paragraph each."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest

from raytrain.checkpoint import checkpoints
from raytrain.checkpoint.checkpoints import FileCheckpointer, Position
from raytrain.lifecycle.endings import AttemptEnded, Ending
from raytrain.rundir import layout, runrecords, storage, storagecheck
from raytrain.rundir import lease as leases
from raytrain.rundir.lease import Lease, LeaseHeld, LeaseLost
from raytrain.rundir.runcontrol import RunControl, WorkerControl
from raytrain.rundir.storage import StorageError


def run_dir(prefix: str, name: str = "run"):
    return storage.as_path(prefix) / name


@pytest.mark.parametrize("url, problem", [
    ("s3:/bucket/runs", "is not how a URL begins"),
    ("S3://bucket/runs", "is not how a URL begins"),
    ("s3:///bucket", "is not how a URL begins"),
    ("hdfs://name/runs", "hdfs:// is not a storage raytrain can use"),
    ("file:///tmp/runs", "is not how a URL begins"),
    ("s3://My_Bucket/runs", "is not a bucket name"),
    ("s3://ab/runs", "is not a bucket name"),
    # the names S3 (and GCS) refuse at CreateBucket, so that no such bucket exists (issue 40)
    ("s3://" + "a" * 64 + "/runs", "3-63 characters"),
    ("s3://my..bucket/runs", "two periods in a row"),
    ("s3://192.168.5.4/runs", "written as an IP address"),
    ("s3://xn--bucket/runs", "beginning with 'xn--'"),
    ("s3://sthree-bucket/runs", "beginning with 'sthree-'"),
    ("s3://bucket--ol-s3/runs", "ending with '--ol-s3'"),
    ("s3://my_bucket/runs", "is not a bucket name S3 accepts"),
    ("gs://10.0.0.1/runs", "written as an IP address"),
    ("gs://google-runs/runs", "holding 'google'"),
    ("gs://goog-runs/runs", "beginning with 'goog'"),
    ("gs://" + "a" * 64 + "/runs", "longer than 63"),
    ("gs://MyBucket/runs", "is not a bucket name GCS accepts"),
    ("s3://bucket/../runs", "'..' part"),
    ("s3://bucket//runs", "empty"),
    ("s3://bucket/ru\x00ns", "not printable"),
    ("s3://bucket/r\udcffuns", "not UTF-8"),
])
def test_a_mistyped_url_is_refused_naming_it_and_the_fix(url, problem):
    found = storage.url_problem(url)
    assert found is not None and problem in found[0], found
    with pytest.raises(StorageError) as refused:
        storagecheck.check_storage(url, "r")
    assert url in str(refused.value) or repr(url) in str(refused.value)
    assert "Fix:" in str(refused.value)


@pytest.mark.parametrize("path", ["./runs", "/mnt/shared/runs", "runs:1", "s3bucket/runs", "s3://bucket", "s3://b.c-d/x/",
                                  "s3://" + "a" * 63 + "/runs", "s3://my.bucket.1/runs", "s3://1.2.3/runs",
                                  "gs://my_bucket/runs", "gs://runs.example.com/runs", "gs://" + "a." * 100 + "b/x"])
def test_paths_and_good_urls_pass_the_shape_check(path):
    assert storage.url_problem(path) is None


def test_the_config_refuses_a_bad_url_at_load_with_the_field():
    from raytrain.errors import ConfigError
    from raytrain.spec.config import load_config
    from raytrain.spec.run_options import config_overrides

    with pytest.raises(ConfigError, match=r"run.storage_path.*not how a URL begins.*s3://BUCKET/PREFIX"):
        load_config("linear", config_overrides(None, None, "s3:/bucket/runs"))


def test_a_missing_bucket_and_an_unreachable_endpoint_are_one_paragraph_each(s3_server, monkeypatch):
    with pytest.raises(StorageError, match=r"its bucket does not exist.*Fix: create the bucket"):
        storagecheck.check_storage("s3://no-such-bucket-here/runs", "r")
    # a new filesystem object for a closed port (fsspec caches one per set of arguments)
    import s3fs

    closed = s3fs.S3FileSystem(endpoint_url="http://127.0.0.1:9", skip_instance_cache=True, retries=1,
                               config_kwargs={"connect_timeout": 1, "retries": {"max_attempts": 1}})
    monkeypatch.setattr(storage, "filesystem", lambda path: closed)
    with pytest.raises(StorageError, match=r"cannot be reached.*AWS_ENDPOINT_URL"):
        storagecheck.check_storage("s3://some-bucket/runs", "r")


@pytest.mark.parametrize("command", ["local", "run"])
def test_a_missing_bucket_ends_the_command_in_one_paragraph(s3_server, capsys, command):
    """The driver log's upload at the end does not meet the missing bucket a second time (issue 40, item 6)."""
    from tests.support.cli import exit_status

    code = exit_status([command, "linear", "--storage", "s3://no-such-bucket-h40/runs", "--set", "train.epochs=1"])
    captured = capsys.readouterr()
    assert code == 2
    assert captured.err.count("raytrain:") == 1 and "its bucket does not exist" in captured.err, captured.err
    assert "driver log" not in captured.err + captured.out


def test_check_storage_probes_for_real_and_leaves_nothing(s3_server, s3_prefix):
    storagecheck.check_storage(s3_prefix, "run")
    bucket = s3_prefix.split("/")[2]
    assert s3_server.keys(bucket) == []


def test_claims_are_exclusive_under_racing_starts(s3_prefix):
    """Eight threads create the same claim at once: S3's If-None-Match lets exactly one win."""
    path = run_dir(s3_prefix) / layout.CLAIMS_DIR / "1.json"
    barrier, wins = threading.Barrier(8), []

    def contend(i: int) -> None:
        barrier.wait()
        if leases._create_exclusive(path, {"token": 1, "who": i}):
            wins.append(i)

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1
    assert json.loads(path.read_text())["who"] == wins[0]


def test_two_concurrent_starts_one_refused_then_a_dead_holder_taken_over(s3_prefix):
    where = run_dir(s3_prefix)
    # renews every 1.2 s: on a loaded machine one request to the server can take a second
    first = Lease(where, ttl_s=6).acquire()
    try:
        with pytest.raises(LeaseHeld, match="attempt 1 on host .* so it is running"):
            Lease(where, ttl_s=6).acquire(poll_s=0.1)
    finally:
        first._stop.set()  # dies without releasing
    told: list[str] = []
    taker = Lease(where, ttl_s=6).acquire(poll_s=0.1, notify=told.append)
    assert taker.token == 2 and "if not, it has died" in told[0]
    with pytest.raises(LeaseLost):
        first.check()
    taker.release()
    assert Lease(where, ttl_s=6).acquire().token == 3  # released: taken at once


def test_a_stale_holder_is_fenced_out_of_every_commit(s3_prefix):
    """A paused attempt whose lease was taken over writes nothing: metrics, results, config, checkpoints."""
    where = run_dir(s3_prefix)
    stale = RunControl.acquire(where, ttl_s=5)
    stale.lease._stop.set()  # paused: no renewals
    newer = RunControl.acquire(where, ttl_s=5, wait=True)
    before = sorted(p.name for p in where.iterdir())
    records = runrecords.Records(where, WorkerControl(where, stale.token))
    for commit in (lambda: records.append_metrics({"epoch": 1}), lambda: records.write_result({"status": "x"}),
                   lambda: records.write_config("x: 1\n"),
                   lambda: FileCheckpointer(where, WorkerControl(where, stale.token)).save(
                       Position(1), lambda: {"epoch": 1, "step": 0}, writer=True)):
        with pytest.raises(AttemptEnded) as ended:
            commit()
        assert ended.value.ending is Ending.LEASE_LOST
    assert sorted(p.name for p in where.iterdir()) == before
    newer.release()


def test_appends_from_two_writers_lose_nothing(s3_prefix):
    """The driver and rank 0 both append to events.jsonl: a conditional rewrite (If-Match) per append."""
    where = run_dir(s3_prefix)
    records = runrecords.Records(where)

    def write(who: str) -> None:
        for i in range(15):
            records.append_event("e", who=who, i=i)

    threads = [threading.Thread(target=write, args=(who,)) for who in ("driver", "rank0")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rows = runrecords.read_events(where)
    assert sorted((r["who"], r["i"]) for r in rows) == sorted((w, i) for w in ("driver", "rank0") for i in range(15))


def test_a_reader_racing_an_appender_reads_every_time(s3_prefix):
    """The driver's progress thread reads metrics.jsonl while rank 0 replaces it with each append (issue 40, item
    5): s3fs's ranged reads of an object replaced meanwhile raise FileExpired; a reader sees an old or a new object,
    never an error, and never fewer rows than it saw before."""
    where = run_dir(s3_prefix)
    records = runrecords.Records(where)
    records.append_metrics({"epoch": 1, "loss": 1.0})
    done = threading.Event()

    def write() -> None:
        for epoch in range(2, 80):
            records.append_metrics({"epoch": epoch, "loss": 1.0 / epoch})
        done.set()

    writer = threading.Thread(target=write)
    writer.start()
    seen, reads = 1, 0
    try:
        while not done.is_set():
            rows = runrecords.read_metrics(where)
            assert len(rows) >= seen
            seen, reads = len(rows), reads + 1
    finally:
        done.set()
        writer.join()
    assert reads > 10 and [r["epoch"] for r in runrecords.read_metrics(where)] == list(range(1, 80))


def test_the_progress_thread_says_what_it_cannot_read_in_one_line_and_goes_on(tmp_path, capsys):
    """Nothing a background thread meets reaches the user as a traceback: an unreadable metrics file is one
    warning, once, and the thread keeps printing the epochs it can read."""
    from raytrain.driver.raytrainer import Progress

    run = tmp_path / "run"
    run.mkdir()
    progress = Progress(run, epochs=2, out=sys.stdout)
    (run / layout.METRICS_FILE).mkdir()  # a directory where the file should be: every read fails
    progress.start()
    time.sleep(1.2)
    (run / layout.METRICS_FILE).rmdir()
    runrecords.Records(run).append_metrics({"epoch": 1, "loss": 0.5, "epoch_s": 1.0})
    time.sleep(1.2)
    progress.stop()
    assert not progress.is_alive()
    captured = capsys.readouterr()
    both = captured.out + captured.err
    assert "Traceback" not in both and both.count("cannot read the run's progress") == 1, both
    assert "epoch 1" in both or "epoch   1" in both or "1/2" in both, both


def test_records_and_truncation_on_resume(s3_prefix):
    where = run_dir(s3_prefix)
    records = runrecords.Records(where)
    for epoch in (1, 2, 3):
        records.append_metrics({"epoch": epoch, "loss": 1.0 / epoch})
    records.truncate_metrics(2)
    assert [r["epoch"] for r in runrecords.read_metrics(where)] == [1, 2]
    records.write_result({"status": "succeeded"})
    assert runrecords.read_result(where)["status"] == "succeeded"


def test_a_checkpoint_commits_by_its_manifest_loads_and_prunes(s3_server, s3_prefix):
    where = run_dir(s3_prefix)
    saver = FileCheckpointer(where, keep=2)
    for epoch in (1, 2, 3):
        saver.save(Position(epoch), lambda e=epoch: {"epoch": e, "step": 0, "w": list(range(e))}, writer=True)
    names = [p.name for p in checkpoints.committed(where)]
    assert len(names) == 2 and names[0].startswith("checkpoint_epoch000003")
    loaded = saver.load_newest(pytest.fail)
    assert loaded is not None and loaded.state["w"] == [0, 1, 2]
    bucket = s3_prefix.split("/")[2]
    assert not any(".staging" in key for key in s3_server.keys(bucket))  # staged locally, never uploaded as such
    checkpoints.verify_hash(checkpoints.newest_complete(where))


UPLOAD_AND_DIE = """
import sys
from raytrain.rundir import storage
from raytrain.checkpoint.checkpoints import FileCheckpointer, Position
saver = FileCheckpointer(storage.as_path(sys.argv[1]), keep=5)
blob = bytes(192 << 20)  # a state whose upload (multipart, 4 parts) outlasts a poll on a loaded machine
saver.save(Position(int(sys.argv[2])), lambda: {"epoch": int(sys.argv[2]), "step": 0, "blob": blob}, writer=True)
"""


def test_a_writer_killed_mid_upload_leaves_a_torn_checkpoint_that_is_ignored_then_removed(s3_server, s3_prefix):
    where = run_dir(s3_prefix)
    FileCheckpointer(where).save(Position(1), lambda: {"epoch": 1, "step": 0}, writer=True)
    bucket, key = s3_prefix.split("/")[2], f"{s3_prefix.split('/', 3)[3]}/run/"
    writer = subprocess.Popen([sys.executable, "-c", UPLOAD_AND_DIE, str(where), "2"])
    deadline = time.monotonic() + 120
    try:
        # SIGKILL once the epoch-2 checkpoint's upload has begun (its multipart upload, or its first object)
        while not (s3_server.client().list_multipart_uploads(Bucket=bucket).get("Uploads")
                   or any("epoch000002" in k for k in s3_server.keys(bucket, key))):
            assert writer.poll() is None, "the writer ended before it was killed"
            assert time.monotonic() < deadline
            time.sleep(0.01)
        writer.kill()
    finally:
        writer.kill()
        writer.wait()
    # the torn upload is not a checkpoint: resume takes epoch 1
    assert [checkpoints.position_of(p).epoch for p in checkpoints.committed(where)] == [1]
    assert checkpoints.newest_complete(where).name.startswith("checkpoint_epoch000001")
    # a torn prefix (an object written without its manifest) is what the next holder removes
    torn = where / "checkpoint_epoch000002_deadbeef"
    storage.put_bytes(torn / "state.pt", b"partial")
    assert torn.name in [p.name for p in checkpoints.staging_dirs(where)]
    control = RunControl.acquire(where, ttl_s=5)
    try:
        removed = FileCheckpointer(where, control).remove_staging(lambda message: None)
    finally:
        control.release()
    assert torn.name in removed
    assert checkpoints.staging_dirs(where) == []
    assert [checkpoints.position_of(p).epoch for p in checkpoints.committed(where)] == [1]


NODE_DATA = """
    import torch
    from torch.utils.data import TensorDataset
    from raytrain.data import DataSource

    class NodeLocal(DataSource):
        def prepare(self, ctx):
            ctx.root.mkdir(parents=True, exist_ok=True)
            (ctx.root / "prepared").write_text("yes")

        def datasets(self, ctx):
            if not (ctx.root / "prepared").exists():
                raise RuntimeError("not prepared on this node")
            x = torch.zeros(4, 1)
            return {"train": TensorDataset(x, x)}
"""


def test_with_object_storage_each_node_prepares_its_own_data(tmp_path, monkeypatch):
    """No shared volume: what the driver prepared is on its node only, so a worker's datasets() first prepares its
    node's copy under TMPDIR (on a directory, the driver's one prepare serves every node)."""
    from raytrain.data import data_context
    from raytrain.spec import build
    from raytrain.spec.config import load_config
    from tests.support.project import user_module

    monkeypatch.setenv("TMPDIR", str(tmp_path / "node-tmp"))
    monkeypatch.setattr("tempfile.tempdir", None)  # read TMPDIR again
    (tmp_path / "node-tmp").mkdir()
    for _ in user_module(tmp_path, "node_data", NODE_DATA):
        job = tmp_path / "job.yaml"
        job.write_text("model: {_component_: mlp}\ndata: {_component_: node_data.NodeLocal}\n"
                       "train: {epochs: 1, batch_size: 4}\nrun: {storage_path: 's3://some-bucket/runs'}\n")
        cfg = load_config(str(job))
        ctx = data_context(cfg)
        assert ctx.root == tmp_path / "node-tmp" / "raytrain-local" / "datasets"
        assert set(build.call_data_component(cfg, ctx)) == {"train"}
        assert (ctx.root / "prepared").read_text() == "yes"


@pytest.mark.parametrize("command", ["report", "export", "track"])
def test_reading_a_run_in_a_store_that_cannot_be_reached_is_one_paragraph(command):
    """A fresh interpreter (fsspec caches its filesystems by their arguments, not the environment): a closed port."""
    import os

    env = {**os.environ, "AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "k",
           "AWS_SECRET_ACCESS_KEY": "s", "AWS_MAX_ATTEMPTS": "1"}
    done = subprocess.run([sys.executable, "-m", "raytrain.cli", command, "s3://some-bucket/runs/r"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 2, done.stderr
    assert f"s3://some-bucket/runs/r (raytrain {command}) cannot be reached" in done.stderr
    assert "AWS_ENDPOINT_URL" in done.stderr and "Traceback" not in done.stderr


# ---------------------------------------------------------------------------------------------- faults (issue 40, 12)


def test_a_bucket_deleted_mid_run_is_named_as_missing_not_as_a_lost_race(s3_server, s3_prefix):
    records = runrecords.Records(run_dir(s3_prefix))
    records.append_event("start")
    bucket = s3_prefix.split("/")[2]
    client = s3_server.client()
    for key in s3_server.keys(bucket):
        client.delete_object(Bucket=bucket, Key=key)
    client.delete_bucket(Bucket=bucket)
    with pytest.raises(StorageError) as missing:
        records.append_event("warning", message="after the bucket went")
    assert f"the bucket {bucket} of" in str(missing.value) and "does not exist any more" in str(missing.value)
    assert "Fix: create the bucket again" in str(missing.value) and "race" not in str(missing.value)


@pytest.fixture
def through_proxy(s3_server, monkeypatch):
    """The S3 server reached through a proxy that fails requests on demand; fresh clients (s3fs caches its
    filesystems with the endpoint they were made with)."""
    import s3fs

    from tests.support.faultproxy import fault_proxy

    with fault_proxy(s3_server.endpoint) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        s3fs.S3FileSystem.clear_instance_cache()
        yield proxy
    s3fs.S3FileSystem.clear_instance_cache()


def test_500s_in_a_row_are_retried_with_backoff_by_the_one_policy(s3_server, through_proxy, tmp_path):
    """S3 answers 500 InternalError (and 503 SlowDown) in normal operation: the one retry policy every client of
    raytrain's uses (the AWS SDKs' standard mode: jittered exponential backoff, storage.S3_RETRIES) rides out five in
    a row on a checkpoint's upload, where botocore's default gave up after five attempts; bounded by max_attempts."""
    bucket = s3_server.new_bucket()
    target = storage.as_path(f"s3://{bucket}/runs/run/checkpoint_epoch000001_0/state.pt")
    local = tmp_path / "state.pt"
    local.write_bytes(b"x" * 1000)
    # this bucket's requests only: a lease renewer another test left running may be writing through the proxy too
    through_proxy.fail_next(5, "PUT", 500, "InternalError", prefix=f"/{bucket}/")
    storage.upload_file(local, target)
    assert [status for method, path, status in through_proxy.seen
            if method == "PUT" and path.startswith(f"/{bucket}/")] == [500] * 5 + [200]
    assert target.read_bytes() == b"x" * 1000


@pytest.mark.parametrize(("value", "attempts"), [(None, 6), ("1", 1), ("10", 10), (" 3 ", 3), ("0", 6),
                                                 ("many", 6), ("-2", 6), ("", 6)])
def test_aws_max_attempts_decides_the_attempts_where_it_is_a_positive_count(value, attempts, monkeypatch):
    """The SDKs' own setting: an explicit botocore Config would override it, so raytrain reads it itself."""
    if value is None:
        monkeypatch.delenv("AWS_MAX_ATTEMPTS", raising=False)
    else:
        monkeypatch.setenv("AWS_MAX_ATTEMPTS", value)
    retries = storage.fsspec_options("s3://bucket/runs")["config_kwargs"]["retries"]
    assert retries == {"mode": "standard", "max_attempts": attempts}


def test_a_full_staging_directory_is_named_with_its_fix_and_commits_nothing(s3_prefix, tmp_path, monkeypatch):
    import tempfile

    import torch

    from tests.support.disk import small_disk

    with small_disk(tmp_path / "tmp", "256k") as tmp:
        monkeypatch.setattr(tempfile, "tempdir", str(tmp))
        saver = FileCheckpointer(run_dir(s3_prefix))
        with pytest.raises(storage.StagingFull) as full:
            saver.save(Position(1), lambda: {"epoch": 1, "step": 0, "model": torch.zeros(200_000)}, writer=True)
        message = str(full.value)
        assert f"the local staging directory {tmp}/raytrain-local/scratch/checkpoint-" in message
        assert "is full" in message and f"Fix: free space in {tmp}/raytrain-local" in message
        assert "s3://" not in message
        assert not checkpoints.committed(run_dir(s3_prefix)) and not list((tmp / "raytrain-local").rglob("state.pt"))


STAGES = """
import sys, time
from raytrain.rundir import storage
path = storage.scratch_dir("checkpoint")
(path / "state.pt").write_bytes(b"x" * 1000)
print(path, flush=True)
time.sleep(600)
"""


def test_what_a_killed_attempt_staged_locally_is_removed_by_the_next_start(s3_prefix, tmp_path, monkeypatch):
    """Each scratch directory is locked by the process that made it (an flock a killed process lets go of): the next
    start removes the killed one's and leaves a live one's."""
    import os
    import tempfile

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(storage, "STALE_AFTER_S", 0.0)
    killed, live = (subprocess.Popen([sys.executable, "-c", STAGES], stdout=subprocess.PIPE, text=True,
                                     env={**os.environ}) for _ in range(2))
    try:
        staged = [storage.as_path(process.stdout.readline().strip()) for process in (killed, live)]
        killed.kill()
        killed.wait()
        warnings = []
        FileCheckpointer(run_dir(s3_prefix)).remove_staging(warnings.append)
        assert not staged[0].exists() and (staged[1] / "state.pt").exists()
        assert warnings == [f"1 local staging directory left by killed attempts removed from {tmp_path}/"
                            f"raytrain-local/scratch"]
    finally:
        live.kill()
        live.wait()


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_sharded_checkpoints_on_s3_hash_their_shards_as_written_and_skip_one_damaged_in_place(s3_server, s3_prefix):
    """Issue 40, 13 on an object store: DCP's fsspec writer's shards are hashed as they are uploaded; a shard
    overwritten in the bucket with bytes of the same size is skipped for the checkpoint before it."""
    import torch

    from raytrain.checkpoint.sharded import SHARDS_DIR, ShardedCheckpointer

    model = torch.nn.Linear(32, 32)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 32)).sum().backward()
    optimizer.step()
    saver = ShardedCheckpointer(run_dir(s3_prefix), keep=5)
    for epoch in (1, 2):
        saver.save(Position(epoch), model, optimizer, lambda e=epoch: {"epoch": e, "step": 0, "extra": {}},
                   config={})
    newest = saver.wait()
    meta = json.loads((newest / checkpoints.META_FILE).read_text())
    assert all(len(entry.get("sha256", "")) == 64 for entry in meta["files"].values())
    checkpoints.verify_hash(newest)
    bucket, key = s3_prefix.split("/")[2], f"{newest.path.split('/', 1)[1]}/{SHARDS_DIR}/__0_0.distcp"
    data = bytearray(s3_server.client().get_object(Bucket=bucket, Key=key)["Body"].read())
    data[len(data) // 2] ^= 0xFF
    s3_server.client().put_object(Bucket=bucket, Key=key, Body=bytes(data))
    warnings = []
    fresh = torch.nn.Linear(32, 32)
    loaded = ShardedCheckpointer(run_dir(s3_prefix)).load_newest(warnings.append, fresh,
                                                                 torch.optim.AdamW(fresh.parameters()))
    assert loaded is not None and loaded.state["epoch"] == 1, warnings
    assert len(warnings) == 1 and newest.name in warnings[0] and "does not match the hash" in warnings[0]
