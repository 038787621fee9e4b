"""Every touch of a Ray internal, in one room: what raytrain reads or sets in Ray beyond its public API.

Each function names what it relies on; tests/test_rayinternals.py checks each against the pinned Ray, so that a
Ray upgrade that moves one is one failing test and one function to change here, not a search through the package.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional
from urllib.parse import urlsplit

# Ray sets each actor process's title to ray::<Class>[.<method>]: Ray Train's worker actor class (v1 and v2).
TRAIN_WORKER_TITLES = ("ray::RayTrainWorker", "ray::_RayTrainWorker")


def quiet_report_logs() -> None:
    """Ray Train logs every report at INFO on each worker, from a logger named after its module's file
    (ray.train.v2._internal.execution.context); rank 0's per-epoch lines say the same, so keep them quiet."""
    try:
        from ray.train.v2._internal.execution import context as train_context
    except ImportError:  # a Ray version that moved it: the lines are noise, not a failure
        return
    logging.getLogger(train_context.__file__).setLevel(logging.WARNING)


def quiet_ray_thread_warning() -> None:
    """ray.init from a thread other than the main one warns (logger ray._private.worker) that it leaves SIGTERM
    alone: raytrain's attempt does that on purpose, so that the main thread owns the signals."""
    logging.getLogger("ray._private.worker").addFilter(
        lambda record: "SIGTERM handler is not set" not in record.getMessage())


def quiet_token_auth_notice() -> None:
    """A new local ray.init() turns token auth on by default (Ray 2.59 and later: a token in ~/.ray/auth_token) and
    warns that it did (logger ray._private.authentication.authentication_token_setup) on every start: the secure
    default raytrain wants, not news on an embedded run's console. (Setting RAY_AUTH_MODE=token ourselves instead
    leaves Ray's C++ token loader unset in this process: the driver is refused by its own GCS.)"""
    logging.getLogger("ray._private.authentication.authentication_token_setup").addFilter(
        lambda record: "Token authentication is enabled for this Ray cluster" not in record.getMessage())


def this_node() -> Optional[tuple[str, Path]]:
    """(this worker's Ray node id in hex, its session directory), or None outside a connected Ray worker
    (ray._private.worker.global_worker.node.get_session_dir_path)."""
    import ray
    from ray._private import worker as ray_worker

    if not ray.is_initialized():
        return None
    return ray.get_runtime_context().get_node_id(), Path(ray_worker.global_worker.node.get_session_dir_path())


def node_is_draining(node_id: str) -> bool:
    """Whether the GCS reports this node DRAINING, asking about this node only (InnerGcsClient.get_all_node_info
    with a NodeSelector, the node's GcsNodeInfo.state_snapshot), not for the whole cluster's resource state: the
    GCS's load stays one small reply per worker however many nodes there are."""
    from ray import NodeID
    from ray._private import worker as ray_worker
    from ray.core.generated import gcs_pb2, gcs_service_pb2

    selector = gcs_service_pb2.GetAllNodeInfoRequest.NodeSelector(node_id=NodeID.from_hex(node_id).binary())
    infos = ray_worker.global_worker.gcs_client.get_all_node_info(timeout=2, node_selectors=[selector])
    return any(info.state_snapshot.state == gcs_pb2.NodeSnapshot.State.DRAINING for info in infos.values())


def coordinator_refresher(skip_draining: bool = True) -> Callable[[Any], int]:
    """The function refresh_autoscaling_coordinator runs inside Ray's AutoscalingCoordinator actor
    (ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator._AutoscalingCoordinatorActor): from then
    on its view of the nodes (its `_get_cluster_nodes`, ray.nodes by default) marks DRAINING nodes not Alive
    (skip_draining=False puts ray.nodes back), and it looks at the nodes and re-reserves now, as its 20 s `_tick`
    would (under its reentrant `_lock`: Ray 2.60's `_update_cluster_node_resources` then
    `_refresh_resource_reservations`); returns how many nodes it counts (its `_cluster_node_resources` holds them
    by subcluster, {label value: {node id: resources}}). Nested functions, so that cloudpickle ships them by
    value: the actor (detached, started by whichever job came first) need not import raytrain. The view falls back
    to ray.nodes() whenever the GCS does not answer in time: an exception there would end the actor's tick thread,
    which has no handler, for every job on the cluster."""

    def nodes_not_draining() -> list:
        import ray
        from ray._private import worker as ray_worker
        from ray.core.generated import gcs_pb2

        nodes = ray.nodes()
        try:  # the nodes' GcsNodeInfo.state_snapshot, as node_is_draining reads one node's
            infos = ray_worker.global_worker.gcs_client.get_all_node_info(timeout=5)
            draining = {info.node_id.hex() for info in infos.values()
                        if info.state_snapshot.state == gcs_pb2.NodeSnapshot.State.DRAINING}
        except Exception:  # noqa: BLE001 - Ray's own view rather than none
            return nodes
        return [dict(node, Alive=False) if node.get("NodeID") in draining else node for node in nodes]

    def refresh(coordinator: Any) -> int:
        import ray

        coordinator._get_cluster_nodes = nodes_not_draining if skip_draining else ray.nodes
        with coordinator._lock:
            coordinator._update_cluster_node_resources()
            coordinator._refresh_resource_reservations()
            return sum(len(nodes) for nodes in coordinator._cluster_node_resources.values())

    return refresh


def refresh_autoscaling_coordinator(timeout_s: float = 5.0, skip_draining: bool = True) -> int:
    """Have Ray's AutoscalingCoordinator (the detached actor Ray Train's elastic policy asks which workers fit:
    ray/train/v2/_internal/execution/scaling_policy/elastic.py) leave DRAINING nodes out and look at the cluster's
    nodes now instead of at its next 20 s tick (TICK_INTERVAL_S). Without it, a group restarted after its node's
    drain asks for a worker on the drained node and waits out Ray Train's start timeout. Runs
    coordinator_refresher's function in the actor through Ray's `__ray_call__` (ray/actor.py). Returns the number
    of nodes it counts."""
    import ray
    from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import (
        get_or_create_autoscaling_coordinator,
    )

    if not ray.is_initialized():  # its get_runtime_context() would start a Ray of its own
        raise RuntimeError("not connected to a Ray cluster")
    coordinator = get_or_create_autoscaling_coordinator()
    return int(ray.get(coordinator.__ray_call__.remote(coordinator_refresher(skip_draining)), timeout=timeout_s))


def torchft_config(lighthouse_kwargs: dict) -> Any:
    """Ray 2.60's TorchftConfig (ray/train/v2/torch/torchft_config.py) whose Lighthouse actor asks for no CPU. Ray's
    `LighthouseServerActor` is a plain `@ray.remote` class pinned to the controller's node (hard affinity), so it
    asks for the default 1 CPU there: on a head with no CPUs for training (the chart's, `raytrain emulate`'s) it
    never schedules and the run fails at its start ("The node specified via NodeAffinitySchedulingStrategy doesn't
    exist any more or is infeasible"). The Lighthouse is a small server thread (torchft's LighthouseServer).
    Its address goes to the workers with the node's IP: torchft's own names the host (socket.gethostname()), a pod's
    name, which other pods cannot resolve ("failed to connect to http://<host>:<port>")."""
    from ray.train.v2.torch.torchft_config import TorchftConfig

    class RaytrainTorchftConfig(TorchftConfig):
        @property
        def backend_cls(self):
            return _lighthouse_without_cpu_backend()

    return RaytrainTorchftConfig(lighthouse_kwargs=lighthouse_kwargs)


def url_host(ip: str) -> str:
    """`ip` as the host of a URL: bracketed when it is IPv6."""
    return f"[{ip}]" if ":" in ip else ip


def by_ip(address: str, ip: str) -> str:
    """torchft's http://<host>:<port> with the host replaced by `ip`."""
    parts = urlsplit(address)
    return f"{parts.scheme or 'http'}://{url_host(ip)}" + (f":{parts.port}" if parts.port else "")


def _lighthouse_without_cpu_backend() -> type:
    """_TorchftBackend with `_maybe_create_lighthouse_actor` as Ray 2.60 has it, but for num_cpus=0 and an address
    by IP (the Lighthouse runs on the controller's node, whose IP the controller knows)."""
    import ray
    from ray.train.v2.torch.torchft_config import LighthouseServerActor, _TorchftBackend
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    class Backend(_TorchftBackend):
        def _maybe_create_lighthouse_actor(self, backend_config: Any) -> str:
            if self.lighthouse_actor is None:
                kwargs = backend_config.lighthouse_kwargs
                self.lighthouse_actor = LighthouseServerActor.options(
                    num_cpus=0,
                    scheduling_strategy=NodeAffinitySchedulingStrategy(
                        node_id=ray.get_runtime_context().get_node_id(), soft=False),
                ).remote(lighthouse_kwargs=kwargs if "bind" in kwargs else {"bind": "[::]:0", **kwargs})
            return by_ip(ray.get(self.lighthouse_actor.address.remote()), ray.util.get_node_ip_address())

    return Backend


def drain_node(gcs_address: str, node_id: str, message: str, deadline_ms: int) -> tuple[bool, str]:
    """Mark a node DRAINING in the GCS, as `ray drain-node --reason DRAIN_NODE_REASON_PREEMPTION` does
    (ray/scripts/scripts.py drain_node, through ray._raylet.GcsClient). (accepted, why not)."""
    from ray._raylet import GcsClient
    from ray.core.generated import autoscaler_pb2

    accepted, rejection = GcsClient(address=gcs_address).drain_node(
        node_id, autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION"), message, deadline_ms)
    return bool(accepted), rejection or ""


# ------------------------------------------------------------------------------------------ raylets from /proc


@dataclass
class LocalRaylet:
    """A raylet process visible here, read from its command line (node id, address, GCS, session directory): the
    flags `ray start` gives the raylet binary (ray/_private/services.py start_raylet)."""
    pid: int
    node_id: str
    node_ip: str
    gcs_address: str
    session_dir: str
    temp_dir: str
    is_head: bool


def _flag(cmd: list[str], name: str) -> str:
    prefix = f"--{name}="
    return next((part[len(prefix):] for part in cmd if part.startswith(prefix)), "")


def local_raylets(table: dict) -> list[LocalRaylet]:
    """Every raylet in a process table (raytrain.platform.processes.proc_table): in a pod (its own PID namespace) exactly
    the pod's one."""

    found = []
    for pid, (_, _, cmd) in table.items():
        if not cmd or os.path.basename(cmd[0]) != "raylet" or not _flag(cmd, "node_id"):
            continue
        found.append(LocalRaylet(
            pid=pid, node_id=_flag(cmd, "node_id"), node_ip=_flag(cmd, "node_ip_address"),
            gcs_address=_flag(cmd, "gcs-address"), session_dir=_flag(cmd, "session_dir"),
            temp_dir=_flag(cmd, "temp_dir"), is_head="node:__internal_head__" in _flag(cmd, "static_resource_list")))
    return found


def autoscaler_can_add_nodes() -> Optional[bool]:
    """Whether an autoscaler that can add nodes watches this cluster. Ray starts a v1 monitor on every head (`ray
    start --head`, an embedded `ray.init`) and it writes its status to the GCS's internal KV
    (ray/autoscaler/_private/monitor.py, DEBUG_AUTOSCALING_STATUS); without an autoscaling config it only mirrors the
    nodes, each as a node type of its own (util.py format_readonly_node_type), and can add none. KubeRay's
    `enableInTreeAutoscaling` runs a real one (its sidecar; the node types are the groups), or v2, which sets its
    enabled key (ray/autoscaler/v2/utils.py, is_autoscaler_v2). None while a v1 monitor has not reported a node yet (it
    reports every AUTOSCALER_UPDATE_INTERVAL_S, 5 s by default, from the head's start)."""

    from ray._private import ray_constants
    from ray.autoscaler.v2.utils import is_autoscaler_v2
    from ray.experimental import internal_kv

    known = v1_monitor_can_add_nodes(internal_kv._internal_kv_get(ray_constants.DEBUG_AUTOSCALING_STATUS))
    if known is not None:
        return known
    if is_autoscaler_v2(fetch_from_server=True):
        return True
    return None


def v1_monitor_can_add_nodes(status: Optional[bytes]) -> Optional[bool]:
    """From a v1 monitor's status (DEBUG_AUTOSCALING_STATUS's JSON): whether any node it lists has a node type of
    the autoscaling config rather than a read-only one; None while it lists no node. The monitor writes a status
    without an autoscaler report (summary() is None while its provider lists no node yet) and skips a node whose
    tags are not all set: on a loaded head that first status would otherwise read as "cannot add nodes"."""
    from ray.autoscaler._private.util import format_readonly_node_type

    if not status:
        return None
    mapping = (json.loads(status).get("autoscaler_report") or {}).get("node_type_mapping") or {}
    if not mapping:
        return None
    return any(node_type != format_readonly_node_type(node) for node, node_type in mapping.items())


def walk_working_dir(directory: Path, excludes: list[str], skip, visit) -> None:
    """Walk `directory` as Ray walks a runtime env's working_dir before it zips it (packaging._dir_travel with
    _get_excludes: gitignore-style `excludes`, and each folder's .gitignore and .rayignore), so that what is
    measured is what Ray would ship. `skip(path)` leaves out a path (and all under it); `visit(path)` sees every
    path kept and may raise to stop the walk."""
    from ray._private.runtime_env import packaging

    quiet = logging.getLogger("raytrain.ship")  # _dir_travel logs every ignore file it honours, and the stop
    quiet.propagate = False
    quiet.addHandler(logging.NullHandler())
    packaging._dir_travel(directory, [packaging._get_excludes(directory, excludes), skip], visit,
                          include_gitignore=True, logger=quiet)
