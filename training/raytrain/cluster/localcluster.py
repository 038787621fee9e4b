"""Local Ray clusters shaped like a KubeRay RayCluster: one real Ray node per pod.

`raytrain emulate` and `raytrain cluster` (plain VMs) both build their `ray start` commands in raynode.py, so the
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
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO

from raytrain.cluster.dashboard import alive_nodes, wait_dashboard
from raytrain.platform.processes import (
    kill_pids, memory_available, memory_total, netns_pids, pids_mentioning, process_start, sh, tree_pids)
from raytrain.cluster.raynode import ClusterError, Ports, ray_start_command
from raytrain.rundir import atomicfile
from raytrain.validator.quantity import QuantityError
from raytrain.validator.shape import NodeSpec, ShapeError, node_spec, start_replicas


RUN_PREFIX = "rte"
RUN_ROOT = Path("/tmp")
SHARED_MOUNT = "/mnt/shared"
# What one Ray node itself costs (raylet, GCS or agent processes) on top of its workers; used to cap node counts.
NODE_OVERHEAD_BYTES = 600 * 2**20
DEFAULT_NODE_MEMORY = 2 * 2**30

# The chart's default failureDetection, as the head's environment: the GCS declares a lost node dead after 3 failed
# health checks 1 s apart instead of Ray's 5 x 3 s, so a run that lost a node restarts its workers sooner.
# Clusters built here without the chart (raytrain bench) use it; tests/kube/test_chart.py keeps the two equal.
FAILURE_DETECTION_ENV = {"RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "3"}


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
    """The node as KubeRay starts it (shape.py), on this machine: without GPUs where it has none."""
    try:
        spec = node_spec(group_spec, name, group, head, where)
    except (ShapeError, QuantityError) as err:
        raise ClusterError(str(err)) from None
    if spec.num_gpus and not shutil.which("nvidia-smi"):
        notes.append(f"{name}: asks for {spec.num_gpus:g} GPU(s) but this machine has none; it starts without GPUs")
        spec.num_gpus = 0
    return spec


def default_max_worker_nodes() -> int:
    """How many worker nodes an emulated cluster starts at most unless told (`raytrain emulate` reads
    RAYTRAIN_EMULATE_MAX_WORKER_NODES): one per CPU of this machine, at least 2."""
    return max(2, os.cpu_count() or 2)


def cluster_shape(raycluster_spec: dict, *, max_worker_nodes: int | None = None,
                  memory_budget: int | None = None, where: str = "rayClusterSpec") -> ClusterShape:
    """The nodes a RayCluster spec asks for, capped to what this machine can hold (with a note per cap)."""
    if not isinstance(raycluster_spec, dict) or not isinstance(raycluster_spec.get("headGroupSpec"), dict):
        raise ClusterError(f"{where}.headGroupSpec: missing; a RayCluster spec needs a head group")
    notes: list[str] = []
    head = _node_spec(raycluster_spec["headGroupSpec"], "head", "head", True, f"{where}.headGroupSpec", notes)
    auth_mode = ((raycluster_spec.get("authOptions") or {}).get("mode") or "").lower()
    auth = auth_mode == "token" or head.env.get("RAY_AUTH_MODE", "").lower() == "token"

    if max_worker_nodes is None:
        max_worker_nodes = default_max_worker_nodes()
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
        replicas = start_replicas(group)
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


def node_env(base: dict[str, str], container_env: dict[str, str], token_path: str | None,
              netns: str | None) -> dict[str, str]:
    """A node's environment (its Ray processes, and the preStop hook that kubelet runs in its container)."""
    env = dict(base)
    env.update(container_env)
    if token_path:  # the cluster's token, never the user's ~/.ray/auth_token
        env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=token_path)
        env.pop("RAY_AUTH_TOKEN", None)
    if netns:
        env["GLOO_SOCKET_IFNAME"] = "eth0"
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


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
        sh("ip", "netns", "del", ns, check=False)
    sh("ip", "link", "del", f"{run_id}h", check=False)
    shutil.rmtree(run_dir, ignore_errors=True)


def _list_netns(run_id: str) -> list[str]:
    result = sh("ip", "netns", "list", check=False)
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
        for ns in sh("ip", "netns", "list", check=False).stdout.split("\n"):
            match = re.match(rf"({RUN_PREFIX}[0-9a-f]{{6}})-", ns)
            if match and not (RUN_ROOT / match.group(1)).exists():
                kill_pids(netns_pids(ns.split()[0]))
                sh("ip", "netns", "del", ns.split()[0], check=False)
                sh("ip", "link", "del", f"{match.group(1)}h", check=False)
                removed.append(ns.split()[0])
    if removed and out:
        print(f"removed leftovers of killed runs: {', '.join(removed)}", file=out)
    return removed


def is_run_id(text: str) -> bool:
    """rte<6 hex>: a local cluster's run id (vs. a VM node's temp dir)."""
    return re.fullmatch(rf"{RUN_PREFIX}[0-9a-f]{{6}}", text) is not None


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
    used = sh("ip", "-4", "-o", "addr", check=False).stdout
    for sw in sh("ip", "netns", "list", check=False).stdout.split("\n"):
        if sw.strip():
            used += sh("ip", "-n", sw.split()[0], "-4", "-o", "addr", check=False).stdout
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
        else:  # not Ray's own choice from the user's ~/.ray/auth_token (raynode.bare_environ)
            env["RAY_AUTH_MODE"] = "disabled"
        return env

    def _write_state(self) -> None:
        state = {
            "run_id": self.run_id, "owner_pid": os.getpid(),
            "owner_started": process_start(os.getpid()), "keep": self.keep, "isolation": self.isolation,
            "shared_dir": str(self.shared_dir), "token_path": str(self.token_path) if self.token else None,
            "dashboard_url": self.dashboard_url if self.nodes else None,
            "gcs_address": self.gcs_address if self.nodes else None,
            "nodes": [{"name": n.spec.name, "group": n.spec.group, "ip": n.ip, "netns": n.netns, "pid": n.pid,
                       "temp_dir": n.temp_dir, "log": n.log, "ports": asdict(n.ports), "env": n.spec.env,
                       "pre_stop": n.spec.pre_stop, "grace_seconds": n.spec.grace_seconds} for n in self.nodes],
        }
        def write(tmp: Path) -> None:
            tmp.write_text(json.dumps(state, indent=1))
            tmp.chmod(0o600)  # the nodes' container env, as the manifest gave it

        atomicfile.write_atomic(self.run_dir / "state.json", write)

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
            try:
                nodes = alive_nodes(self.dashboard_url, self.token)
            except OSError:  # a dashboard still starting (or busy) resets the connection: ask again
                nodes = []
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
            result = sh(*step, check=False)
            if result.returncode != 0:
                raise ClusterError(f"setting up the node network failed at `{' '.join(step)}`: "
                                   f"{result.stderr.strip()}")

    def node_env(self, node: Node) -> dict[str, str]:
        return node_env(self.client_env(), node.spec.env, str(self.token_path) if self.token else None, node.netns)

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

    def pending_for(self, node: Node) -> float:
        """Seconds the deleted node's recreated pod still stays Pending (`delete-node --pending`); 0 once it may
        start."""
        path = pending_path(self.run_dir, node.spec.name)
        try:
            until = float(json.loads(path.read_text())["until"])
        except (OSError, ValueError, KeyError, TypeError):
            return 0.0
        left = until - time.time()
        if left <= 0:
            path.unlink(missing_ok=True)
        return max(left, 0.0)

    def restart_node(self, node: Node) -> None:
        """What the RayCluster controller does for a lost worker pod: remove its remains and start a new pod,
        which (as in Kubernetes) gets a new address. Reusing the old address and ports at once can leave Ray with
        a ghost of the old node that holds placement-group bundles."""
        kill_pids(self.node_pids(node))
        if node.netns:
            sh("ip", "netns", "del", node.netns, check=False)
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


def pending_path(run_dir: Path, name: str) -> Path:
    return Path(run_dir) / f"pending-{name}.json"
