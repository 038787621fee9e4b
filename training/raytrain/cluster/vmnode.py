"""Ray on plain machines (VMs, a laptop): one Ray node started here with the same `ray start` command as an
emulated node, kept in the background (`--block` under its own session) and recorded in TEMP_DIR/node.json, and a
training run submitted the way the RayJob submits it. `raytrain cluster` runs these."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import IO

from raytrain.cluster.dashboard import wait_dashboard
from raytrain.cluster.raynode import ClusterError, Ports, bare_environ, ray_start_command
from raytrain.cluster.submitter import submitter_script
from raytrain.platform.processes import kill_pids, pids_mentioning, process_start, tree_pids
from raytrain.validator.shape import NodeSpec

NODE_FILE = "node.json"


def start_vm_node(*, head_address: str | None, temp_dir: Path, node_ip: str, num_cpus: float | None,
                  token_file: Path | None, ports: Ports, auth: bool, out: IO[str] = sys.stdout,
                  timeout: float = 120.0) -> dict:
    """Start a head (head_address None) or a worker joining head_address; returns the recorded node."""
    temp_dir = Path(temp_dir).absolute()
    if (temp_dir / NODE_FILE).exists():
        old = json.loads((temp_dir / NODE_FILE).read_text())
        if process_start(old["pid"]) == old.get("started"):
            raise ClusterError(f"a Ray node started from {temp_dir} is running (pid {old['pid']}); stop it first: "
                               f"raytrain cluster stop {temp_dir}")
    # Ray puts its sockets under TEMP_DIR/ray/session_<date>_<time>_<pid>/sockets/, and a socket path has at most
    # 107 bytes: refuse a directory that leaves too little room, before Ray fails on it.
    longest = len(str(temp_dir / "ray" / "session_2026-01-01_00-00-00_000000_4194304" / "sockets" / "plasma_store"))
    if longest > 107:
        raise ClusterError(f"--temp-dir {temp_dir} is too long: Ray's socket paths under it would exceed 107 "
                           f"bytes (by {longest - 107}). Fix: use a shorter directory, e.g. /tmp/raytrain-node")
    temp_dir.mkdir(parents=True, exist_ok=True)
    token = None
    if auth:
        token_file = Path(token_file) if token_file else temp_dir / "auth_token"
        if not token_file.exists():
            if head_address:
                raise ClusterError(f"token auth is on but {token_file} does not exist. Fix: copy the head's token "
                                   "file to this machine and pass --token-file, or start the cluster with --no-auth")
            token_file.write_text(secrets.token_hex(32))
            token_file.chmod(0o600)
        token = token_file.read_text().strip()
    spec = NodeSpec(name="head" if head_address is None else "worker", group="vm", head=head_address is None,
                    num_cpus=num_cpus)
    cmd = ray_start_command(spec, ray_bin=str(Path(sys.executable).parent / "ray"), node_ip=node_ip,
                            temp_dir=str(temp_dir / "ray"), ports=ports, head_address=head_address,
                            dashboard_host=node_ip)
    env = bare_environ(os.environ)
    if auth:
        env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token_file))
    log = temp_dir / "node.log"
    with open(log, "ab") as handle:
        proc = subprocess.Popen(cmd, env=env, stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, cwd=temp_dir)
    record = {"pid": proc.pid, "started": process_start(proc.pid), "temp_dir": str(temp_dir), "log": str(log),
              "node_ip": node_ip, "ports": asdict(ports), "token_file": str(token_file) if auth else None,
              "head": head_address is None, "gcs_address": head_address or f"{node_ip}:{ports.gcs}"}
    if head_address is None:
        record["dashboard_url"] = f"http://{node_ip}:{ports.dashboard}"
        deadline = time.monotonic() + timeout
        while True:  # until the dashboard answers, the head's `ray start` exits, or the time is up
            try:
                wait_dashboard(record["dashboard_url"], token, 2)
                break
            except ClusterError:
                if proc.poll() is None and time.monotonic() < deadline:
                    continue
                kill_pids(tree_pids(proc.pid) + pids_mentioning(str(temp_dir)))
                why = "exited" if proc.poll() is not None else f"did not come up within {timeout:.0f}s"
                raise ClusterError(f"the head {why}: {_last_line(log)} (see {log})") from None
    else:
        deadline = time.monotonic() + timeout
        while not (temp_dir / "ray" / "session_latest").exists() or proc.poll() is not None:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise ClusterError(f"the worker did not join {head_address}: {_last_line(log)} (see {log})")
            time.sleep(0.5)
    (temp_dir / NODE_FILE).write_text(json.dumps(record, indent=1))
    return record


def _last_line(log: Path) -> str:
    try:
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no log"
    return lines[-1].strip() if lines else "no output"


def stop_vm_node(temp_dir: Path) -> bool:
    """Stop the node started from temp_dir: its process tree and anything naming the directory; nothing else."""
    temp_dir = Path(temp_dir).absolute()
    try:
        record = json.loads((temp_dir / NODE_FILE).read_text())
    except (OSError, ValueError):
        return False
    pids = pids_mentioning(str(temp_dir))
    if process_start(record["pid"]) == record.get("started"):
        pids += tree_pids(record["pid"])
    kill_pids(pids)
    (temp_dir / NODE_FILE).unlink(missing_ok=True)
    return True



def submit_training(config: str, address: str, name: str, storage: str, env: dict[str, str]) -> int:
    """What the RayJob does, without Kubernetes: the config file as the working dir's job.yaml, the same
    submitter command as KubeRay's K8sJobMode, `raytrain run job.yaml` on the head."""
    with tempfile.TemporaryDirectory(prefix="raytrain-submit-") as work:
        path = Path(config)
        if path.is_file():
            shutil.copy(path, Path(work) / "job.yaml")
            ref = "job.yaml"
        else:
            ref = config  # a preset name: the package on the head has it
        entrypoint = f"raytrain run {ref} --name {name} --storage {storage} --address auto"
        job_id = f"{name}-{secrets.token_hex(3)}"
        script = submitter_script({}, address.rstrip("/"), job_id, {"working_dir": work}, entrypoint)
        return subprocess.run(["/bin/bash", "-c", script], env={**env, "PYTHONUNBUFFERED": "1"}).returncode
