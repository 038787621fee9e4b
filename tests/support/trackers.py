"""Real experiment trackers for the tests: an `mlflow server` process (SQLite, a free port on 127.0.0.1) and a
reader of W&B's offline run files. Nothing here patches a client: the code under test talks HTTP to a real server.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import struct
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Iterator, Optional

from raytrain.cluster.raynode import free_port

MLFLOW = Path(sys.executable).parent / "mlflow"  # the dev extra's mlflow (the server; the client is mlflow-skinny)


@contextlib.contextmanager
def mlflow_server(root: Path, port: Optional[int] = None, timeout_s: float = 90) -> Iterator[str]:
    """A real MLflow tracking server for the block: yields its URI; stopped (its whole process group) after."""
    port = port or free_port("127.0.0.1")
    root.mkdir(parents=True, exist_ok=True)
    log = open(root / "server.log", "ab")
    # MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false: no job-runner processes (five of them, idle but heavy on 2 cores)
    proc = subprocess.Popen(
        [str(MLFLOW), "server", "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}", "--artifacts-destination",
         str(root / "artifacts"), "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while not healthy(uri):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"mlflow server did not start: {(root / 'server.log').read_text()[-3000:]}")
            time.sleep(0.3)
        yield uri
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def healthy(uri: str) -> bool:
    try:
        with urllib.request.urlopen(f"{uri}/health", timeout=2) as answer:
            return answer.status == 200
    except OSError:
        return False


def mlflow_runs(uri: str, experiment: str) -> list:
    """Every run of an experiment ([] when it does not exist)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    return client.search_runs([found.experiment_id]) if found else []


def mlflow_history(uri: str, run_id: str) -> dict[str, list[tuple[int, float]]]:
    """{metric: [(step, value)...]} of a run, in step order, every point the server holds."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    metrics = client.get_run(run_id).data.metrics
    return {key: sorted((m.step, m.value) for m in client.get_metric_history(run_id, key)) for key in metrics}


def expected_history(metrics_jsonl: Path, skip: tuple[str, ...] = ("attempt", "resumed_from_epoch")
                     ) -> dict[str, list[tuple[int, float]]]:
    """What a tracker must hold for a run: each numeric value of metrics.jsonl at step = epoch."""
    history: dict[str, list[tuple[int, float]]] = {}
    for line in metrics_jsonl.read_text().splitlines():
        row = json.loads(line)
        for key, value in row.items():
            if key not in skip and isinstance(value, (int, float)) and not isinstance(value, bool):
                history.setdefault(key, []).append((row["epoch"], float(value)))
    return history


# ---------------------------------------------------------------------------------------------------- W&B offline

def wandb_records(path: Path) -> Iterator:
    """The records of a W&B transaction log (an offline run's run-<id>.wandb): LevelDB-log framing (7-byte file
    header; 32 KiB blocks of records, each crc32, length, type, then data), protobuf Records inside."""
    from wandb.proto import wandb_internal_pb2

    raw = path.read_bytes()
    assert raw[:4] == b":W&B", f"{path} is not a W&B transaction log"
    block, position, pending = 32768, 7, b""
    while position + 7 <= len(raw):
        left = block - position % block
        if left < 7:  # a block's tail too short for a header is padding
            position += left
            continue
        _crc, length, kind = struct.unpack("<IHB", raw[position:position + 7])
        if kind == 0 and length == 0:
            break
        pending += raw[position + 7:position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # FULL, or LAST of FIRST/MIDDLE/LAST
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def wandb_offline_runs(wandb_dir: Path) -> list[Path]:
    """The offline run directories W&B wrote under DIR/wandb, oldest first."""
    return sorted((wandb_dir / "wandb").glob("offline-run-*"))


def wandb_history(run_dir: Path) -> list[dict]:
    """The history rows (step and values) of one offline run directory."""
    rows = []
    for log in run_dir.glob("run-*.wandb"):
        for record in wandb_records(log):
            if record.WhichOneof("record_type") == "history":
                rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                             for item in record.history.item})
    return rows
