"""One Ray node's `ray start` command, as KubeRay's generated pod command runs it, plus the ports and paths a node
needs where several share one machine. Local clusters and plain VMs (`raytrain cluster`) both start nodes with it."""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import Mapping
from pathlib import Path
from dataclasses import dataclass

from raytrain.validator.shape import NodeSpec

# rayStartParams that the local cluster owns (addresses, ports, paths, resources it computes itself).
MANAGED_PARAMS = {
    "address", "node-ip-address", "port", "temp-dir", "block", "head", "dashboard-host", "dashboard-port",
    "num-cpus", "num-gpus", "memory", "resources", "metrics-export-port", "dashboard-agent-listen-port",
    "dashboard-agent-grpc-port", "ray-client-server-port", "object-manager-port", "node-manager-port",
    "runtime-env-agent-port", "min-worker-port", "max-worker-port", "worker-port-list",
}
FLAG_PARAMS = {"disable-usage-stats", "include-log-monitor", "ray-debugger-external", "enable-resource-isolation"}


class ClusterError(Exception):
    """A cluster could not be shaped, started or reached; the message says what to fix."""



def free_port(host: str = "") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


@dataclass
class Ports:
    gcs: int = 6379
    dashboard: int = 8265
    client: int = 10001
    metrics: int = 8080
    agent_http: int = 52365
    agent_grpc: int = 52366
    runtime_env_agent: int = 52367
    node_manager: int = 52368
    object_manager: int = 52369

    @classmethod
    def pick(cls) -> "Ports":
        """Free ports on this host: needed where nodes share one network stack (loopback mode, plain VMs)."""
        picked: set[int] = set()
        values = {}
        for name in cls.__dataclass_fields__:
            port = free_port()
            while port in picked:
                port = free_port()
            picked.add(port)
            values[name] = port
        return cls(**values)


def ray_start_command(spec: NodeSpec, *, ray_bin: str, node_ip: str, temp_dir: str, ports: Ports,
                      head_address: str | None, dashboard_host: str, block: bool = True) -> list[str]:
    """`ray start` for one node, as KubeRay's generated pod command would run it (plus our ports and paths)."""
    cmd = [ray_bin, "start", f"--node-ip-address={node_ip}", f"--temp-dir={temp_dir}",
           f"--node-manager-port={ports.node_manager}", f"--object-manager-port={ports.object_manager}",
           f"--metrics-export-port={ports.metrics}", f"--dashboard-agent-listen-port={ports.agent_http}",
           f"--dashboard-agent-grpc-port={ports.agent_grpc}", f"--runtime-env-agent-port={ports.runtime_env_agent}",
           "--disable-usage-stats"]
    if block:
        cmd.append("--block")
    if spec.head:
        cmd += ["--head", f"--port={ports.gcs}", f"--dashboard-host={dashboard_host}",
                f"--dashboard-port={ports.dashboard}", f"--ray-client-server-port={ports.client}"]
    else:
        if not head_address:
            raise ClusterError(f"{spec.name}: a worker node needs the head's address (HOST:PORT)")
        cmd.append(f"--address={head_address}")
    if spec.num_cpus is not None:
        cmd.append(f"--num-cpus={spec.num_cpus:g}")
    if spec.num_gpus is not None:
        cmd.append(f"--num-gpus={spec.num_gpus:g}")
    if spec.memory:
        cmd.append(f"--memory={spec.memory}")
        if "object-store-memory" not in spec.params:
            # Ray sizes the object store from the host's memory, not the pod's; keep it inside the pod's limit.
            cmd.append(f"--object-store-memory={max(100 * 2**20, int(spec.memory * 0.3))}")
    if spec.resources:
        cmd.append("--resources=" + json.dumps(spec.resources, separators=(",", ":")))
    for key, value in sorted(spec.params.items()):
        cmd.append(f"--{key}" if key in FLAG_PARAMS and value.lower() in ("true", "") else f"--{key}={value}")
    return cmd


def bare_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment for a Ray node or job of ours: the caller's, without its Ray address and credentials (a node
    joins the cluster it is told to, with the token it is given), and this venv's bin first on PATH (`ray`,
    `raytrain`)."""
    env = {k: v for k, v in environ.items() if not k.startswith("RAY_AUTH") and k != "RAY_ADDRESS"}
    # Token auth only where the caller turns it on with its token: Ray (2.59 and later) turns it on by itself when it
    # finds ~/.ray/auth_token (a local ray.init() writes one), which a pod without a token never has
    env["RAY_AUTH_MODE"] = "disabled"
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env
