"""Local Ray clusters shaped like a KubeRay RayCluster: one real Ray node per pod.

`raytrain emulate` and `scripts/ray-cluster` (plain VMs) both build their `ray start` commands here, so the
Kubernetes path and the by-hand path stay one code path.

A local cluster (`LocalCluster`) gives every node its own address:
- as root, each node runs in its own network namespace with one veth (`eth0`, so GLOO_SOCKET_IFNAME=eth0 as in a
  pod) on a bridge that lives in a private "switch" namespace (the host's iptables, e.g. Docker's FORWARD DROP,
  never sees the traffic); the host reaches the nodes through one more veth on that bridge. Each node also gets a
  private mount namespace with a tmpfs over /mnt and the run's shared directory bind-mounted at /mnt/shared,
  like the chart's ReadWriteMany volume.
- otherwise each node gets its own 127.0.0.x address and its own free ports; /mnt/shared cannot be mounted, so
  callers rewrite that path to the shared directory (see `SHARED_MOUNT` and `LocalCluster.shared_path`).

Everything a run creates is named `rte<6 hex>` (temp dir /tmp/rte<id>, namespaces rte<id>-N, host veth rte<id>h)
and recorded in /tmp/rte<id>/state.json with the owner's PID, so a later run removes the leftovers of a killed one
(`clean_stale`) and never touches Ray clusters that other people started. The shared directory
(/tmp/rte<id>-shared unless given) is kept, as the chart keeps its volume: runs and checkpoints stay readable.
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any


RUN_PREFIX = "rte"
RUN_ROOT = Path("/tmp")
SHARED_MOUNT = "/mnt/shared"
# What one Ray node itself costs (raylet, GCS or agent processes) on top of its workers; used to cap node counts.
NODE_OVERHEAD_BYTES = 600 * 2**20
DEFAULT_NODE_MEMORY = 2 * 2**30
HEALTH_PATH = "/api/gcs_healthz"  # what KubeRay's submitter polls before `ray job submit`

# The chart's default failureDetection, as the head's environment: the GCS declares a lost node dead after 3 failed
# health checks 1 s apart instead of Ray's 5 x 3 s, so a run that lost a node restarts its workers sooner.
# Clusters built here without the chart (raytrain bench) use it; tests/kube/test_chart.py keeps the two equal.
FAILURE_DETECTION_ENV = {"RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "3"}

# rayStartParams that the local cluster owns (addresses, ports, paths, resources it computes itself).
_MANAGED_PARAMS = {
    "address", "node-ip-address", "port", "temp-dir", "block", "head", "dashboard-host", "dashboard-port",
    "num-cpus", "num-gpus", "memory", "resources", "metrics-export-port", "dashboard-agent-listen-port",
    "dashboard-agent-grpc-port", "ray-client-server-port", "object-manager-port", "node-manager-port",
    "runtime-env-agent-port", "min-worker-port", "max-worker-port", "worker-port-list",
}
_FLAG_PARAMS = {"disable-usage-stats", "include-log-monitor", "ray-debugger-external", "enable-resource-isolation"}


class ClusterError(Exception):
    """A cluster could not be shaped, started or reached; the message says what to fix."""


# --------------------------------------------------------------------------------------------------- shape

_SUFFIXES = {
    "": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}


def parse_quantity(value: Any, where: str = "quantity") -> float:
    """A Kubernetes resource quantity ("500m", "2", "4Gi", "1e3") as a number."""
    if isinstance(value, (int, float)):
        return float(value)
    match = re.fullmatch(r"\s*((?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?)\s*([a-zA-Z]*)\s*", str(value))
    if not match or match.group(2) not in _SUFFIXES:
        raise ClusterError(f"{where}: {value!r} is not a Kubernetes quantity (use e.g. 500m, 2, 4Gi)")
    return float(match.group(1)) * _SUFFIXES[match.group(2)]


def parse_resources_param(value: str, where: str) -> dict[str, float]:
    """rayStartParams.resources, written as in KubeRay samples: '"{\\"TPU\\": 4}"' or '{"TPU": 4}'."""
    text = str(value).strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        text = text[1:-1].replace('\\"', '"')
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as err:
        raise ClusterError(f"{where}: {value!r} is not a JSON object of resource amounts ({err.msg}); "
                           'write it like \'"{\\"CUSTOM\\": 1}"\'') from None
    if not isinstance(parsed, dict) or not all(isinstance(v, (int, float)) for v in parsed.values()):
        raise ClusterError(f"{where}: {value!r} must map resource names to numbers")
    return {str(k): float(v) for k, v in parsed.items()}


@dataclass
class NodeSpec:
    """One Ray node (one pod of a RayCluster group)."""

    name: str
    group: str
    head: bool
    num_cpus: float | None = None
    num_gpus: float | None = None
    memory: int | None = None
    resources: dict[str, float] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)  # other rayStartParams, passed through as --key=value
    env: dict[str, str] = field(default_factory=dict)  # literal container env (valueFrom is not resolvable here)


@dataclass
class ClusterShape:
    head: NodeSpec
    workers: list[NodeSpec]
    auth_token: bool
    notes: list[str] = field(default_factory=list)

    @property
    def nodes(self) -> list[NodeSpec]:
        return [self.head, *self.workers]


def _node_spec(group_spec: dict, name: str, group: str, head: bool, where: str, notes: list[str]) -> NodeSpec:
    params = {str(k): str(v) for k, v in (group_spec.get("rayStartParams") or {}).items()}
    try:
        container = group_spec["template"]["spec"]["containers"][0]
    except (KeyError, IndexError, TypeError):
        raise ClusterError(f"{where}.template.spec.containers: a RayCluster group needs its Ray container first "
                           "in template.spec.containers") from None
    res = container.get("resources") or {}
    limits, requests = res.get("limits") or {}, res.get("requests") or {}

    def amount(key: str) -> float | None:
        value = limits.get(key, requests.get(key))
        return None if value is None else parse_quantity(value, f"{where}...resources.{key}")

    spec = NodeSpec(name=name, group=group, head=head)
    # KubeRay: rayStartParams win, otherwise the container's limits (requests as fallback); CPUs rounded up.
    cpu = params.get("num-cpus")
    spec.num_cpus = float(cpu) if cpu is not None else (math.ceil(amount("cpu")) if amount("cpu") else None)
    gpu = params.get("num-gpus")
    spec.num_gpus = float(gpu) if gpu is not None else amount("nvidia.com/gpu")
    memory = params.get("memory")
    spec.memory = int(float(memory)) if memory is not None else (int(amount("memory")) if amount("memory") else None)
    if "resources" in params:
        spec.resources = parse_resources_param(params["resources"], f"{where}.rayStartParams.resources")
    for key, value in (group_spec.get("resources") or {}).items():  # KubeRay >= 1.4 group-level Ray resources
        if key in ("CPU", "cpu"):
            spec.num_cpus = parse_quantity(value, f"{where}.resources.{key}")
        elif key in ("GPU", "nvidia.com/gpu"):
            spec.num_gpus = parse_quantity(value, f"{where}.resources.{key}")
        elif key == "memory":
            spec.memory = int(parse_quantity(value, f"{where}.resources.memory"))
        else:
            spec.resources[key] = parse_quantity(value, f"{where}.resources.{key}")
    if spec.num_gpus and not shutil.which("nvidia-smi"):
        notes.append(f"{name}: asks for {spec.num_gpus:g} GPU(s) but this machine has none; it starts without GPUs")
        spec.num_gpus = 0
    spec.params = {k: v for k, v in params.items() if k not in _MANAGED_PARAMS}
    spec.env = {e["name"]: str(e["value"]) for e in container.get("env") or [] if "value" in e and "name" in e}
    return spec


def cluster_shape(raycluster_spec: dict, *, max_worker_nodes: int | None = None,
                  memory_budget: int | None = None, where: str = "rayClusterSpec") -> ClusterShape:
    """The nodes a RayCluster spec asks for, capped to what this machine can hold (with a note per cap)."""
    if not isinstance(raycluster_spec, dict) or not isinstance(raycluster_spec.get("headGroupSpec"), dict):
        raise ClusterError(f"{where}.headGroupSpec: missing; a RayCluster spec needs a head group")
    notes: list[str] = []
    head = _node_spec(raycluster_spec["headGroupSpec"], "head", "head", True, f"{where}.headGroupSpec", notes)
    auth_mode = ((raycluster_spec.get("authOptions") or {}).get("mode") or "").lower()
    auth = auth_mode == "token" or head.env.get("RAY_AUTH_MODE", "").lower() == "token"

    max_worker_nodes = max_worker_nodes if max_worker_nodes is not None else max(2, os.cpu_count() or 2)
    if memory_budget is None:
        memory_budget = int(memory_available() * 0.6)
    used = (head.memory or DEFAULT_NODE_MEMORY) + NODE_OVERHEAD_BYTES
    workers: list[NodeSpec] = []
    for gi, group in enumerate(raycluster_spec.get("workerGroupSpecs") or []):
        gwhere = f"{where}.workerGroupSpecs[{gi}]"
        gname = group.get("groupName") or f"group{gi}"
        if group.get("suspend"):
            notes.append(f"{gname}: suspended, no nodes started")
            continue
        replicas = group.get("replicas", group.get("minReplicas", 0)) or 0
        if "maxReplicas" in group:
            replicas = min(replicas, group["maxReplicas"])
        replicas *= group.get("numOfHosts", 1) or 1
        started = 0
        for i in range(replicas):
            spec = _node_spec(group, f"{gname}-{i}", gname, False, gwhere, notes)
            cost = (spec.memory or DEFAULT_NODE_MEMORY) + NODE_OVERHEAD_BYTES
            if len(workers) >= max_worker_nodes or used + cost > memory_budget:
                break
            used += cost
            workers.append(spec)
            started += 1
        if started < replicas:
            notes.append(f"{gname}: {replicas} replica(s) asked, {started} started: this machine "
                         f"({os.cpu_count()} CPUs, {memory_total() / 2**30:.0f} GiB) holds at most "
                         f"{max_worker_nodes} worker node(s) within {memory_budget / 2**30:.1f} GiB")
    return ClusterShape(head=head, workers=workers, auth_token=auth, notes=notes)


# --------------------------------------------------------------------------------------------------- commands

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
        cmd.append(f"--{key}" if key in _FLAG_PARAMS and value.lower() in ("true", "") else f"--{key}={value}")
    return cmd


# --------------------------------------------------------------------------------------------------- processes

def _proc_table() -> dict[int, tuple[int, float, list[str]]]:
    """pid -> (parent pid, start time in clock ticks, command line), read from /proc (no psutil needed)."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        table[int(entry)] = (int(fields[1]), float(fields[19]), [c.decode(errors="replace") for c in cmdline if c])
    return table


def process_start(pid: int) -> float | None:
    entry = _proc_table().get(pid)
    return entry[1] if entry else None


def memory_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 8 * 2**30


def memory_total() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return 8 * 2**30


def _sh(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, check=check)


def tree_pids(root_pid: int) -> list[int]:
    """root_pid and all its descendants."""
    table = _proc_table()
    if root_pid not in table:
        return []
    found, frontier = [root_pid], [root_pid]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, (ppid, _, _) in table.items() if ppid == parent]
        found += children
        frontier += children
    return found


def pids_mentioning(text: str) -> list[int]:
    """Processes whose command line names `text` (our run dir): Ray daemons orphaned by a killed parent."""
    return [pid for pid, (_, _, cmd) in _proc_table().items()
            if pid != os.getpid() and any(text in part for part in cmd)]


def netns_pids(netns: str) -> list[int]:
    result = _sh("ip", "netns", "pids", netns, check=False)
    return [int(p) for p in result.stdout.split()] if result.returncode == 0 else []


def kill_pids(pids: list[int], grace: float = 3.0) -> None:
    """SIGTERM, then SIGKILL what is left: only ever the PIDs we were given."""
    pids = [p for p in dict.fromkeys(pids) if p != os.getpid()]
    starts = {pid: process_start(pid) for pid in pids}
    pids = [pid for pid in pids if starts[pid] is not None]
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, grace)):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + wait
        while pids and time.monotonic() < deadline:
            for pid in pids:  # reap our own children so they do not linger as zombies
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass
            # same PID and start time: still the process we signalled (not a reused PID)
            pids = [pid for pid in pids if process_start(pid) == starts[pid] and not _is_zombie(pid)]
            if pids:
                time.sleep(0.1)
        if not pids:
            return


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.rindex(")") + 2] == "Z"
    except OSError:
        return True


def http_get(url: str, token: str | None, timeout: float = 5.0) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def wait_dashboard(url: str, token: str | None, timeout: float) -> None:
    """Wait as KubeRay's submitter does: until the dashboard's GCS health endpoint answers 200."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if http_get(url + HEALTH_PATH, token, timeout=2)[0] == 200:
                return
        except (OSError, urllib.error.URLError):
            pass
        if time.monotonic() > deadline:
            raise ClusterError(f"the Ray dashboard at {url} did not become healthy within {timeout:.0f}s")
        time.sleep(0.5)


def alive_nodes(url: str, token: str | None) -> list[dict]:
    """Alive Ray nodes through the dashboard's state API (same auth as job submission)."""
    status, body = http_get(url + "/api/v0/nodes?limit=1000&detail=1", token)
    if status != 200:
        return []
    return [n for n in json.loads(body)["data"]["result"]["result"] if n.get("state") == "ALIVE"]


# --------------------------------------------------------------------------------------------------- cluster

@dataclass
class Node:
    spec: NodeSpec
    index: int
    ip: str
    temp_dir: str
    ports: Ports
    netns: str | None = None
    pid: int | None = None
    log: str = ""


def _run_id_alive(state: dict) -> bool:
    started = process_start(state.get("owner_pid", -1))
    return started is not None and started == state.get("owner_started")


def _remove_run(run_dir: Path, state: dict | None) -> None:
    run_id = run_dir.name
    pids = pids_mentioning(str(run_dir))
    for ns in _list_netns(run_id):
        pids += netns_pids(ns)
    if state:
        for node in state.get("nodes", []):
            if node.get("pid"):
                pids += tree_pids(node["pid"])
    kill_pids(pids)
    for ns in _list_netns(run_id):
        _sh("ip", "netns", "del", ns, check=False)
    _sh("ip", "link", "del", f"{run_id}h", check=False)
    shutil.rmtree(run_dir, ignore_errors=True)


def _list_netns(run_id: str) -> list[str]:
    result = _sh("ip", "netns", "list", check=False)
    names = [line.split()[0] for line in result.stdout.splitlines() if line.strip()]
    return [n for n in names if n.startswith(f"{run_id}-")]


def clean_stale(out: IO[str] | None = None, root: Path | None = None) -> list[str]:
    """Remove what killed runs left behind (processes, namespaces, veths, temp dirs): only runs named
    rte<id> whose owner process is gone and that were not started with keep=True. `root` is for tests: a
    directory other than RUN_ROOT, where namespaces without a run directory are left alone."""
    removed = []
    for run_dir in sorted((root or RUN_ROOT).glob(f"{RUN_PREFIX}[0-9a-f]*")):
        if not re.fullmatch(rf"{RUN_PREFIX}[0-9a-f]{{6}}", run_dir.name) or not run_dir.is_dir():
            continue
        try:
            state = json.loads((run_dir / "state.json").read_text())
        except (OSError, ValueError):
            state = None
            if time.time() - run_dir.stat().st_mtime < 120:  # a run that is still writing its state
                continue
        if state and (state.get("keep") or _run_id_alive(state)):
            continue
        _remove_run(run_dir, state)
        removed.append(run_dir.name)
    if root is None and os.geteuid() == 0:  # namespaces and host veths whose run dir is already gone
        for ns in _sh("ip", "netns", "list", check=False).stdout.split("\n"):
            match = re.match(rf"({RUN_PREFIX}[0-9a-f]{{6}})-", ns)
            if match and not (RUN_ROOT / match.group(1)).exists():
                kill_pids(netns_pids(ns.split()[0]))
                _sh("ip", "netns", "del", ns.split()[0], check=False)
                _sh("ip", "link", "del", f"{match.group(1)}h", check=False)
                removed.append(ns.split()[0])
    if removed and out:
        print(f"removed leftovers of killed runs: {', '.join(removed)}", file=out)
    return removed


def stop_run(run_id: str) -> bool:
    """Tear down a run by id (e.g. one kept with --keep). Returns False when there is no such run."""
    run_dir = RUN_ROOT / run_id
    if not re.fullmatch(rf"{RUN_PREFIX}[0-9a-f]{{6}}", run_id) or not run_dir.is_dir():
        return False
    try:
        state = json.loads((run_dir / "state.json").read_text())
    except (OSError, ValueError):
        state = None
    _remove_run(run_dir, state)
    return True


def _pick_subnet() -> str:
    """A 10.213.N.0/24 no interface on this host uses (bridged only inside our own namespaces)."""
    used = _sh("ip", "-4", "-o", "addr", check=False).stdout
    for sw in _sh("ip", "netns", "list", check=False).stdout.split("\n"):
        if sw.strip():
            used += _sh("ip", "-n", sw.split()[0], "-4", "-o", "addr", check=False).stdout
    for n in secrets.SystemRandom().sample(range(1, 255), 254):
        if f"10.213.{n}." not in used:
            return f"10.213.{n}"
    raise ClusterError("no free 10.213.N.0/24 subnet for the node namespaces")


class LocalCluster:
    """A real multi-node Ray cluster on this machine, one node per `NodeSpec`."""

    def __init__(self, shape: ClusterShape, *, out: IO[str] = sys.stdout, isolation: str = "auto",
                 shared_dir: Path | None = None, keep: bool = False):
        if isolation == "auto":
            isolation = "netns" if os.geteuid() == 0 and shutil.which("ip") and shutil.which("unshare") else "loopback"
        if isolation not in ("netns", "loopback"):
            raise ClusterError(f"isolation: {isolation!r} is not one of auto, netns, loopback")
        self.shape, self.out, self.isolation, self.keep = shape, out, isolation, keep
        RUN_ROOT.mkdir(parents=True, exist_ok=True)
        while True:
            self.run_id = f"{RUN_PREFIX}{secrets.token_hex(3)}"
            self.run_dir = RUN_ROOT / self.run_id
            try:
                self.run_dir.mkdir(mode=0o755)
                break
            except FileExistsError:
                continue
        # Like the chart's volume (keepOnUninstall), the shared storage outlives the cluster: it is not removed.
        self.shared_dir = Path(shared_dir) if shared_dir else RUN_ROOT / f"{self.run_id}-shared"
        self.shared_dir.mkdir(parents=True, exist_ok=True)
        self.token: str | None = None
        self.token_path = self.run_dir / "auth_token"
        if shape.auth_token:
            self.token = secrets.token_hex(32)
            self.token_path.write_text(self.token)
            self.token_path.chmod(0o600)
        self.nodes: list[Node] = []
        self.subnet = _pick_subnet() if isolation == "netns" else None
        self._procs: dict[str, subprocess.Popen] = {}
        self._stopped = False
        self._write_state()

    # ---- addresses and environment
    @property
    def head(self) -> Node:
        return self.nodes[0]

    @property
    def gcs_address(self) -> str:
        return f"{self.head.ip}:{self.head.ports.gcs}"

    @property
    def dashboard_url(self) -> str:
        return f"http://{self.head.ip}:{self.head.ports.dashboard}"

    def shared_path(self, path: str) -> str:
        """Where a path under /mnt/shared is for processes on the nodes (bind-mounted there only in netns mode)."""
        if self.isolation == "netns":
            return path
        return path.replace(SHARED_MOUNT, str(self.shared_dir))

    def client_env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """Environment for Ray clients on the host (submitter, status): the cluster's auth settings."""
        env = dict(os.environ if base is None else base)
        for key in ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE"):
            env.pop(key, None)
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        if self.token:
            env["RAY_AUTH_MODE"] = "token"
            env["RAY_AUTH_TOKEN_PATH"] = str(self.token_path)
        return env

    def _write_state(self) -> None:
        state = {
            "run_id": self.run_id, "owner_pid": os.getpid(),
            "owner_started": process_start(os.getpid()), "keep": self.keep, "isolation": self.isolation,
            "shared_dir": str(self.shared_dir), "token_path": str(self.token_path) if self.token else None,
            "dashboard_url": self.dashboard_url if self.nodes else None,
            "gcs_address": self.gcs_address if self.nodes else None,
            "nodes": [{"name": n.spec.name, "group": n.spec.group, "ip": n.ip, "netns": n.netns, "pid": n.pid,
                       "temp_dir": n.temp_dir, "log": n.log, "ports": asdict(n.ports)} for n in self.nodes],
        }
        tmp = self.run_dir / "state.json.tmp"
        tmp.write_text(json.dumps(state, indent=1))
        tmp.replace(self.run_dir / "state.json")

    def mark_keep(self) -> None:
        self.keep = True
        self._write_state()

    # ---- lifecycle
    def start(self, timeout: float = 120.0) -> None:
        for note in self.shape.notes:
            print(f"note: {note}", file=self.out)
        for i, spec in enumerate(self.shape.nodes):
            if self.isolation == "netns":
                node = Node(spec, i, f"{self.subnet}.{i + 2}", str(self.run_dir / f"n{i}"), Ports(),
                            netns=f"{self.run_id}-{i}")
            else:
                node = Node(spec, i, f"127.0.0.{i + 2}", str(self.run_dir / f"n{i}"), Ports.pick())
            node.log = str(self.run_dir / f"{spec.name}.log")
            self.nodes.append(node)
        if self.isolation == "netns":
            self._make_network()
        self._write_state()
        self._boot(timeout)
        where = "own network namespace" if self.isolation == "netns" else "own loopback address"
        print(f"cluster {self.run_id}: {len(self.nodes)} Ray nodes, each on its {where}; dashboard "
              f"{self.dashboard_url}; shared storage {self.shared_dir} (at {SHARED_MOUNT} on the nodes"
              f"{'' if self.isolation == 'netns' else ', path rewritten: no mount namespaces without root'}); "
              f"token auth {'on' if self.token else 'off'}; state {self.run_dir / 'state.json'}", file=self.out)
        for node in self.nodes:
            print(f"  {node.spec.name:<16} {node.ip:<15} cpus={node.spec.num_cpus if node.spec.num_cpus is not None else 'auto'}"
                  f" memory={(node.spec.memory or 0) / 2**30:.1f}GiB resources={node.spec.resources or {}}",
                  file=self.out)
        self.out.flush()

    def _boot(self, timeout: float) -> None:
        self._launch(self.head)
        wait_dashboard(self.dashboard_url, self.token, timeout)
        for node in self.nodes[1:]:
            self._launch(node)
        self.wait_nodes(len(self.nodes), timeout)
        self._write_state()

    def restart(self, timeout: float = 120.0) -> None:
        """A fresh Ray cluster on the same addresses and shared storage (KubeRay's new RayCluster on a retry)."""
        for node in reversed(self.nodes):
            kill_pids(self.node_pids(node))
            shutil.rmtree(node.temp_dir, ignore_errors=True)
        self._boot(timeout)

    def wait_nodes(self, count: int, timeout: float) -> list[dict]:
        deadline = time.monotonic() + timeout
        while True:
            dead = [n.spec.name for n in self.nodes if self.node_exited(n)]
            nodes = alive_nodes(self.dashboard_url, self.token)
            if len(nodes) >= count:
                return nodes
            if dead or time.monotonic() > deadline:
                # The run dir goes with the teardown: keep the end of each failed node's log in the message.
                tails = "".join(f"\n--- {n.spec.name} ({n.log}), last lines:\n"
                                + "\n".join(Path(n.log).read_text(errors="replace").splitlines()[-8:])
                                for n in self.nodes if n.spec.name in dead and Path(n.log).exists())
                raise ClusterError(f"only {len(nodes)} of {count} Ray nodes joined within {timeout:.0f}s "
                                   f"(exited: {dead or 'none'}){tails}")
            time.sleep(1)

    def _make_network(self) -> None:
        sw = f"{self.run_id}-sw"
        steps = [
            ["ip", "netns", "add", sw],
            ["ip", "-n", sw, "link", "set", "lo", "up"],
            ["ip", "-n", sw, "link", "add", "br0", "type", "bridge"],
            ["ip", "-n", sw, "link", "set", "br0", "up"],
            ["ip", "link", "add", f"{self.run_id}h", "type", "veth", "peer", "name", "uplink", "netns", sw],
            ["ip", "-n", sw, "link", "set", "dev", "uplink", "master", "br0", "up"],
            ["ip", "addr", "add", f"{self.subnet}.1/24", "dev", f"{self.run_id}h"],
            ["ip", "link", "set", f"{self.run_id}h", "up"],
        ]
        self._run_steps(steps)
        for node in self.nodes:
            self._make_node_network(node)

    def _make_node_network(self, node: Node) -> None:
        """The node's namespace, with eth0 on the switch's bridge (a pod's network, in short)."""
        ns, sw = node.netns, f"{self.run_id}-sw"
        self._run_steps([
            ["ip", "netns", "add", ns],
            ["ip", "-n", ns, "link", "set", "lo", "up"],
            ["ip", "-n", sw, "link", "add", f"p{node.index}", "type", "veth", "peer", "name", "eth0", "netns", ns],
            ["ip", "-n", sw, "link", "set", f"p{node.index}", "master", "br0", "up"],
            ["ip", "-n", ns, "addr", "add", f"{node.ip}/24", "dev", "eth0"],
            ["ip", "-n", ns, "link", "set", "eth0", "up"],
        ])

    @staticmethod
    def _run_steps(steps: list[list[str]]) -> None:
        for step in steps:
            result = _sh(*step, check=False)
            if result.returncode != 0:
                raise ClusterError(f"setting up the node network failed at `{' '.join(step)}`: "
                                   f"{result.stderr.strip()}")

    def node_env(self, node: Node) -> dict[str, str]:
        env = self.client_env()
        env.update(node.spec.env)
        if self.token:  # the cluster's token, never the user's ~/.ray/auth_token
            env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(self.token_path))
            env.pop("RAY_AUTH_TOKEN", None)
        if node.netns:
            env["GLOO_SOCKET_IFNAME"] = "eth0"
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    def _launch(self, node: Node) -> None:
        cmd = ray_start_command(
            node.spec, ray_bin=str(Path(sys.executable).parent / "ray"), node_ip=node.ip, temp_dir=node.temp_dir,
            ports=node.ports, head_address=None if node.spec.head else self.gcs_address,
            dashboard_host="0.0.0.0" if node.netns else node.ip)
        if node.netns:
            # ip netns exec gives the node a private mount namespace too: hide the host's /mnt under a tmpfs and
            # mount the run's shared directory where the chart mounts its volume.
            script = ('mount -t tmpfs -o size=1m,mode=755 raytrain-mnt /mnt && mkdir -p "$1" && '
                      'mount --bind "$0" "$1" && shift && exec "$@"')
            cmd = ["ip", "netns", "exec", node.netns, "sh", "-c", script, str(self.shared_dir), SHARED_MOUNT, *cmd]
        with open(node.log, "ab") as log:
            proc = subprocess.Popen(cmd, env=self.node_env(node), stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, cwd=self.run_dir, start_new_session=True)
        self._procs[node.spec.name] = proc
        node.pid = proc.pid
        self._write_state()

    def node(self, name: str) -> Node:
        for node in self.nodes:
            if node.spec.name == name:
                return node
        raise ClusterError(f"no node {name!r} in cluster {self.run_id} (nodes: {[n.spec.name for n in self.nodes]})")

    def node_pids(self, node: Node) -> list[int]:
        pids = tree_pids(node.pid) if node.pid else []
        if node.netns:
            pids += netns_pids(node.netns)
        return pids + pids_mentioning(node.temp_dir)

    def node_exited(self, node: Node) -> bool:
        proc = self._procs.get(node.spec.name)
        return proc is not None and proc.poll() is not None

    def restart_node(self, node: Node) -> None:
        """What the RayCluster controller does for a lost worker pod: remove its remains and start a new pod,
        which (as in Kubernetes) gets a new address. Reusing the old address and ports at once can leave Ray with
        a ghost of the old node that holds placement-group bundles."""
        kill_pids(self.node_pids(node))
        if node.netns:
            _sh("ip", "netns", "del", node.netns, check=False)
        index = max(n.index for n in self.nodes) + 1
        if index > 250:
            raise ClusterError(f"node {node.spec.name} was restarted too often: no addresses left in {self.subnet}.0/24")
        node.index, node.temp_dir = index, str(self.run_dir / f"n{index}")
        if node.netns:
            node.netns, node.ip = f"{self.run_id}-{index}", f"{self.subnet}.{index + 2}"
            self._make_node_network(node)
        else:
            node.ip, node.ports = f"127.0.0.{index + 2}", Ports.pick()
        self._launch(node)

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        for node in reversed(self.nodes):
            kill_pids(self.node_pids(node))
        for proc in self._procs.values():
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        _remove_run(self.run_dir, None)


def kill_node(state_file: Path, name: str) -> list[int]:
    """SIGKILL every process of one node of a running local cluster (a pod lost with its raylet and workers).
    Returns the PIDs killed."""
    state = json.loads(Path(state_file).read_text())
    node = next((n for n in state["nodes"] if n["name"] == name), None)
    if node is None:
        raise ClusterError(f"no node {name!r} in {state_file}")
    pids = (tree_pids(node["pid"]) if node.get("pid") else []) + pids_mentioning(node["temp_dir"])
    if node.get("netns"):
        pids += netns_pids(node["netns"])
    for pid in dict.fromkeys(pids):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return list(dict.fromkeys(pids))


def node_processes(state_file: Path, name: str, contains: str = "") -> list[int]:
    """PIDs of one node's processes whose command line contains `contains` (e.g. a job's entrypoint)."""
    state = json.loads(Path(state_file).read_text())
    node = next((n for n in state["nodes"] if n["name"] == name), None)
    if node is None:
        raise ClusterError(f"no node {name!r} in {state_file}")
    pids = set(tree_pids(node["pid"]) if node.get("pid") else []) | set(pids_mentioning(node["temp_dir"]))
    if node.get("netns"):
        pids |= set(netns_pids(node["netns"]))
    table = _proc_table()
    return sorted(pid for pid in pids if pid in table and contains in " ".join(table[pid][2]))


# --------------------------------------------------------------------------------------------------- plain VMs
# `scripts/ray-cluster` runs these: one Ray node on this machine, started with the same `ray start` command as an
# emulated node, kept in the background (`--block` under its own session) and recorded in TEMP_DIR/node.json.

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
                               f"scripts/ray-cluster stop {temp_dir}")
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
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH") and k != "RAY_ADDRESS"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
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
        try:
            wait_dashboard(record["dashboard_url"], token, timeout)
        except ClusterError:
            kill_pids(tree_pids(proc.pid) + pids_mentioning(str(temp_dir)))
            raise ClusterError(f"the head did not come up within {timeout:.0f}s; see {log}") from None
    else:
        deadline = time.monotonic() + timeout
        while not (temp_dir / "ray" / "session_latest").exists() or proc.poll() is not None:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise ClusterError(f"the worker did not join {head_address}; see {log}")
            time.sleep(0.5)
    (temp_dir / NODE_FILE).write_text(json.dumps(record, indent=1))
    return record


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


def _main(argv: list[str] | None = None) -> int:
    """Commands behind scripts/ray-cluster (see its usage)."""
    import argparse

    from ray._private.services import get_node_ip_address

    parser = argparse.ArgumentParser(prog="scripts/ray-cluster")
    sub = parser.add_subparsers(dest="command", required=True)

    def node_args(p):
        p.add_argument("--temp-dir", default="/tmp/raytrain-node", help="this node's Ray temp dir and records")
        p.add_argument("--node-ip", default=None, help="address the other nodes reach this one at")
        p.add_argument("--num-cpus", type=float, default=None)
        p.add_argument("--token-file", default=None, help="the cluster's auth token (default: TEMP_DIR/auth_token)")
        p.add_argument("--no-auth", action="store_true", help="turn Ray token auth off (not recommended)")
        p.add_argument("--free-ports", action="store_true", help="pick free ports instead of Ray's defaults")

    head = sub.add_parser("head", help="start the head node here")
    node_args(head)
    head.add_argument("--port", type=int, default=6379)
    head.add_argument("--dashboard-port", type=int, default=8265)
    join = sub.add_parser("join", help="start a worker node here that joins HEAD:PORT")
    join.add_argument("address", metavar="HEAD:PORT")
    node_args(join)
    status = sub.add_parser("status", help="the cluster's nodes and resources")
    status.add_argument("--address", required=True, metavar="http://HEAD:DASHBOARD_PORT")
    status.add_argument("--token-file", default=None)
    submit = sub.add_parser("submit", help="run the training package on the cluster, as the RayJob does")
    submit.add_argument("config", metavar="CONFIG", help="run config YAML or preset name")
    submit.add_argument("--address", required=True, metavar="http://HEAD:DASHBOARD_PORT")
    submit.add_argument("--name", required=True, help="run name (same name resumes)")
    submit.add_argument("--storage", default=SHARED_MOUNT + "/runs", help="shared storage path on every node")
    submit.add_argument("--token-file", default=None)
    stop = sub.add_parser("stop", help="stop the node started from TEMP_DIR, or an emulated cluster rte<id>")
    stop.add_argument("target", metavar="TEMP_DIR|RUN_ID")
    kill = sub.add_parser("kill-node", help="SIGKILL one node of an emulated cluster (failure drills)")
    kill.add_argument("run_id")
    kill.add_argument("node")
    args = parser.parse_args(argv)

    try:
        if args.command in ("head", "join"):
            ports = Ports.pick() if args.free_ports else Ports()
            if args.command == "head":
                ports.gcs, ports.dashboard = args.port, args.dashboard_port
            record = start_vm_node(
                head_address=args.address if args.command == "join" else None, temp_dir=Path(args.temp_dir),
                node_ip=args.node_ip or get_node_ip_address(), num_cpus=args.num_cpus,
                token_file=Path(args.token_file) if args.token_file else None, ports=ports, auth=not args.no_auth)
            if record["head"]:
                token = f" --token-file {record['token_file']}" if record["token_file"] else ""
                print(f"head started (pid {record['pid']}): GCS {record['gcs_address']}, dashboard "
                      f"{record['dashboard_url']}\n  on each worker machine: scripts/ray-cluster join "
                      f"{record['gcs_address']}{token}"
                      + (f"\n  (copy {record['token_file']} there first)" if token else ""))
            else:
                print(f"worker started (pid {record['pid']}), joined {record['gcs_address']}")
            return 0
        if args.command == "stop":
            target = args.target
            if re.fullmatch(rf"{RUN_PREFIX}[0-9a-f]{{6}}", target):
                ok = stop_run(target)
            else:
                ok = stop_vm_node(Path(target))
            print(f"stopped {target}" if ok else f"nothing to stop at {target}")
            return 0 if ok else 1
        if args.command == "kill-node":
            pids = kill_node(RUN_ROOT / args.run_id / "state.json", args.node)
            print(f"killed {len(pids)} processes of {args.node}")
            return 0
        token = Path(args.token_file).read_text().strip() if args.token_file else None
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH") and k != "RAY_ADDRESS"}
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        if args.token_file:
            env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(Path(args.token_file).absolute()))
        if args.command == "status":
            wait_dashboard(args.address, token, 30)
            for node in alive_nodes(args.address, token):
                print(f"{node['node_ip']:<16} {'head' if node.get('is_head_node') else 'worker':<7} "
                      f"{node.get('resources_total')}")
            return 0
        return submit_training(args.config, args.address, args.name, args.storage, env)
    except ClusterError as err:
        print(f"scripts/ray-cluster: {err}", file=sys.stderr)
        return 1


def submit_training(config: str, address: str, name: str, storage: str, env: dict[str, str]) -> int:
    """What the RayJob does, without Kubernetes: the config file as the working dir's job.yaml, the same
    submitter command as KubeRay's K8sJobMode, `raytrain run job.yaml` on the head."""
    import tempfile

    from raytrain.kube.emulate import JobInput, submitter_script

    with tempfile.TemporaryDirectory(prefix="raytrain-submit-") as work:
        path = Path(config)
        if path.is_file():
            shutil.copy(path, Path(work) / "job.yaml")
            ref = "job.yaml"
        else:
            ref = config  # a preset name: the package on the head has it
        job = JobInput(Path("<submit>"), {"metadata": {"name": name}, "spec": {}}, {})
        entrypoint = f"raytrain run {ref} --name {name} --storage {storage} --address auto"
        job_id = f"{name}-{secrets.token_hex(3)}"
        script = submitter_script(job, address.rstrip("/"), job_id, {"working_dir": work}, entrypoint)
        return subprocess.run(["/bin/bash", "-c", script], env={**env, "PYTHONUNBUFFERED": "1"}).returncode


if __name__ == "__main__":
    sys.exit(_main())
