"""`raytrain cluster`: Ray on plain machines (VMs, a laptop), the same pieces `raytrain emulate` uses for its
local clusters (cluster/vmnode.py): start a head, join workers, status, submit a run as the RayJob does, stop;
and the emulated RayJob's suspend, delete-node and kill-node."""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from raytrain.errors import EXIT_FAILED
from raytrain.rundir import console

if TYPE_CHECKING:
    from raytrain.cluster.raynode import Ports

EXIT_OK = 0
# What `pip install 'raytrain[kube]'` adds (pyproject.toml): a missing one means the extra is not installed.
KUBE_EXTRA_MODULES = ("helm_python", "kubernetes_validate", "jsonschema")
LOG_FORMAT_HELP = "raytrain's console lines: human, or one JSON object each (default: $RAYTRAIN_LOG_FORMAT, else human)"

def _duration(text: str) -> float:
    """A number of seconds, 0 or more (argparse: a bad one is a usage error naming the option)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a finite number of seconds, 0 or more")
    return value


def _error(message: str) -> None:
    console.error(message)


def node_ports(args: argparse.Namespace) -> "Ports":
    """Ray's default ports, or free ones with --free-ports; a head's --port and --dashboard-port win either way
    (without them, --free-ports frees those two as well: Ray's defaults may belong to another head here)."""
    from raytrain.cluster.raynode import Ports

    ports = Ports.pick() if args.free_ports else Ports()
    if getattr(args, "port", None) is not None:
        ports.gcs = args.port
    if getattr(args, "dashboard_port", None) is not None:
        ports.dashboard = args.dashboard_port
    return ports


def cmd_cluster(args: argparse.Namespace) -> int:
    """Ray on plain machines, the same pieces `raytrain emulate` uses for its local clusters (cluster/vmnode.py)."""
    from raytrain.cluster import localcluster, pods, raynode, vmnode
    from raytrain.cluster.dashboard import alive_nodes, wait_dashboard
    from raytrain.cluster.raynode import ClusterError

    try:
        if args.action in ("head", "join"):
            from ray._private.services import get_node_ip_address

            ports = node_ports(args)
            record = vmnode.start_vm_node(
                head_address=args.address if args.action == "join" else None, temp_dir=Path(args.temp_dir),
                node_ip=args.node_ip or get_node_ip_address(), num_cpus=args.num_cpus,
                token_file=Path(args.token_file) if args.token_file else None, ports=ports, auth=not args.no_auth)
            if record["head"]:
                token = f" --token-file {record['token_file']}" if record["token_file"] else ""
                print(f"head started (pid {record['pid']}): GCS {record['gcs_address']}, dashboard "
                      f"{record['dashboard_url']}\n  on each worker machine: raytrain cluster join "
                      f"{record['gcs_address']}{token}"
                      + (f"\n  (copy {record['token_file']} there first)" if token else ""))
            else:
                print(f"worker started (pid {record['pid']}), joined {record['gcs_address']}")
            return EXIT_OK
        if args.action == "stop":
            target = args.target
            if localcluster.is_run_id(target):
                ok = localcluster.stop_run(target)
            else:
                ok = vmnode.stop_vm_node(Path(target))
            print(f"stopped {target}" if ok else f"nothing to stop at {target}")
            return EXIT_OK if ok else EXIT_FAILED
        if args.action == "kill-node":
            pids = pods.kill_node(localcluster.RUN_ROOT / args.run_id / "state.json", args.node)
            print(f"killed {len(pids)} processes of {args.node}")
            return EXIT_OK
        if args.action in ("suspend", "unsuspend"):  # kubectl patch rayjob ... spec.suspend, for `raytrain emulate`
            from raytrain.cluster.rayjobfile import RayJobError
            from raytrain.cluster.suspend import set_suspend

            try:
                print(set_suspend(args.run_id, args.action == "suspend"))
            except RayJobError as err:
                _error(f"cluster {args.action}: {err}")
                return EXIT_FAILED
            return EXIT_OK
        if args.action == "delete-node":
            outcome = pods.delete_node(localcluster.RUN_ROOT / args.run_id / "state.json", args.node,
                                               grace=args.grace, out=sys.stdout, pending_s=args.pending)
            if outcome["pre_stop_output"].strip():
                print(outcome["pre_stop_output"].rstrip())
            return EXIT_OK
        token = Path(args.token_file).read_text().strip() if args.token_file else None
        if args.action == "status":
            wait_dashboard(args.address, token, 30)
            for node in alive_nodes(args.address, token):
                print(f"{node['node_ip']:<16} {'head' if node.get('is_head_node') else 'worker':<7} "
                      f"{node.get('resources_total')}")
            return EXIT_OK
        env = raynode.bare_environ(os.environ)
        if args.token_file:
            env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(Path(args.token_file).absolute()))
        return vmnode.submit_training(args.config, args.address, args.name, args.storage, env)
    except (ClusterError, OSError) as err:
        _error(f"cluster {args.action}: {err}")
        return EXIT_FAILED


def add_cluster_command(sub) -> None:
    cluster = sub.add_parser("cluster", help="Ray on plain machines (VMs, a laptop): start a head, join workers, "
                                             "status, submit a run as the RayJob does, stop",
                             description="Ray on plain machines. Token auth is on by default: `head` writes "
                                         "TEMP_DIR/auth_token; copy it to every machine that joins or submits. Every "
                                         "machine needs the same shared storage at the same path (e.g. NFS at "
                                         "/mnt/shared).")
    actions = cluster.add_subparsers(dest="action", required=True, metavar="ACTION")

    def node_args(p):
        p.add_argument("--temp-dir", default="/tmp/raytrain-node", help="this node's Ray temp dir and records")
        p.add_argument("--node-ip", default=None, help="address the other nodes reach this one at")
        p.add_argument("--num-cpus", type=float, default=None, help="CPUs this node offers Ray (default: all)")
        p.add_argument("--token-file", default=None, help="the cluster's auth token (default: TEMP_DIR/auth_token)")
        p.add_argument("--no-auth", action="store_true", help="turn Ray token auth off (not recommended)")
        p.add_argument("--free-ports", action="store_true", help="pick free ports instead of Ray's defaults")

    head = actions.add_parser("head", help="start the head node here")
    node_args(head)
    head.add_argument("--port", type=int, default=None,
                      help="the GCS port workers join (default 6379, or a free one with --free-ports)")
    head.add_argument("--dashboard-port", type=int, default=None,
                      help="the dashboard and job API port (default 8265, or a free one with --free-ports)")
    join = actions.add_parser("join", help="start a worker node here that joins HEAD:PORT")
    join.add_argument("address", metavar="HEAD:PORT", help="the head's address and GCS port")
    node_args(join)
    status = actions.add_parser("status", help="the cluster's nodes and resources")
    status.add_argument("--address", required=True, metavar="http://HEAD:DASHBOARD_PORT", help="the head's dashboard")
    status.add_argument("--token-file", default=None, help="the cluster's auth token file")
    submit = actions.add_parser("submit", help="run the training package on the cluster, as the RayJob does")
    submit.add_argument("config", metavar="CONFIG", help="run config YAML or preset name")
    submit.add_argument("--address", required=True, metavar="http://HEAD:DASHBOARD_PORT",
                        help="the head's dashboard (job API)")
    submit.add_argument("--name", required=True, help="run name (same name resumes)")
    submit.add_argument("--storage", default="/mnt/shared/runs", help="shared storage path on every node")
    submit.add_argument("--token-file", default=None, help="the cluster's auth token file")
    stop = actions.add_parser("stop", help="stop the node started from TEMP_DIR, or an emulated cluster rte<id>")
    stop.add_argument("target", metavar="TEMP_DIR|RUN_ID")
    kill = actions.add_parser("kill-node", help="SIGKILL one node of an emulated cluster (failure drills)")
    kill.add_argument("run_id", help="the emulated cluster, rte<id>")
    kill.add_argument("node", help="its node, e.g. worker-0")
    delete = actions.add_parser("delete-node", help="delete one node of an emulated cluster as kubelet deletes a pod: "
                                                    "its preStop hook, SIGTERM, SIGKILL after the grace period")
    delete.add_argument("run_id", help="the emulated cluster, rte<id>")
    delete.add_argument("node", help="its node, e.g. worker-0")
    delete.add_argument("--grace", type=float, default=None, metavar="SECONDS",
                        help="as kubectl delete pod --grace-period (default: the pod's terminationGracePeriodSeconds)")
    delete.add_argument("--pending", type=_duration, default=0.0, metavar="SECONDS",
                        help="the pod recreated for it stays Pending this long before `raytrain emulate` starts it "
                             "(no room for it, as while an autoscaler brings a node up; default 0)")
    for name, value, why in (("suspend", "true", "Kueue's preemption"), ("unsuspend", "false", "its readmission")):
        patch = actions.add_parser(name, help=f"set spec.suspend {value} on the RayJob a running `raytrain emulate` "
                                              f"runs, as `kubectl patch rayjob` ({why})")
        patch.add_argument("run_id", metavar="RUN_ID", help="the emulated cluster, rte<id>")
    cluster.set_defaults(func=cmd_cluster)
