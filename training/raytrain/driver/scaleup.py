"""Sizing a run on a cluster that an autoscaler grows: KubeRay's in-tree autoscaler removes idle workers (after
`idleTimeoutSeconds`, down to `minReplicas`, often 0), so the nodes alive when `raytrain run` starts can be the
head alone. Sizing against them would refuse the job ("can never be scheduled") although the cluster can grow to
`maxReplicas`, the size `raytrain validate` checks it against. Here the run asks the autoscaler for its workers
(`ray.autoscaler.sdk.request_resources`) and waits for them, bounded, saying so; on a cluster without an
autoscaler it sizes as before."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

from raytrain.errors import LaunchError
from raytrain.platform import rayinternals
from raytrain.rundir import console
from raytrain.spec.sections import RunConfig
from raytrain.spec.sizing import data_reserve, grown_per_worker, scale_up_bundles, size_workers, workers_that_fit

# Node start on a managed cloud: a new VM, the image pulled (several GB), `ray start`. GPU nodes take longest.
SCALE_UP_TIMEOUT_S = 900.0
POLL_S = 2.0
# Ray's v1 monitor reports every AUTOSCALER_UPDATE_INTERVAL_S (5 s by default): three intervals for its first report.
MONITOR_FIRST_REPORT_S = 15.0


def autoscaler_running(first_report_s: float = MONITOR_FIRST_REPORT_S) -> bool:
    """Whether an autoscaler that can add nodes watches this cluster (read from Ray's internals: rayinternals). On a
    head that has just started (a RayJob's own cluster) its monitor may not have reported yet: wait for that, bounded,
    rather than take a cluster that can grow for one that cannot."""
    deadline = time.monotonic() + first_report_s
    while True:
        known = rayinternals.autoscaler_can_add_nodes()
        if known is not None:
            return known
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.5)


def _fits(cfg: RunConfig, per_worker: dict[str, float], nodes: list[dict]) -> bool:
    reserve = data_reserve(cfg, nodes)
    held = [dict(n) for n in sorted(nodes, key=lambda n: -n.get("CPU", 0.0))]
    if held and reserve:
        held[0]["CPU"] = max(held[0].get("CPU", 0.0) - reserve, 0.0)
    return workers_that_fit(held, per_worker) >= cfg.scaling.min_workers


def size_on_cluster(cfg: RunConfig, alive_nodes: Callable[[], list[dict]], out: TextIO = sys.stdout,
                    timeout_s: float = SCALE_UP_TIMEOUT_S, autoscaled: Callable[[], bool] = autoscaler_running
                    ) -> dict[str, float]:
    """Resources per worker. Where the nodes alive now cannot hold the job at its full size and an autoscaler
    runs, ask it for the workers and wait up to `timeout_s` for them; LaunchError when they do not come."""
    nodes = alive_nodes()
    per_worker = grown_per_worker(cfg)
    if _fits(cfg, per_worker, nodes) or not autoscaled():
        return size_workers(cfg, nodes)
    from ray.autoscaler.sdk import request_resources

    n = cfg.scaling.min_workers
    shape = ", ".join(f"{k} {v:g}" for k, v in per_worker.items())
    console.info("scaling", f"the cluster's {len(nodes)} node(s) hold fewer than {n} workers of {{{shape}}}: asked "
                 f"the autoscaler for them, waiting up to {timeout_s:.0f} s", out=out, per_worker=per_worker)
    # Sticky until replaced: it bypasses the autoscaler's upscaling speed, and is withdrawn below once the nodes
    # are up (the run's placement group then keeps them busy), so the cluster can scale down after the run.
    request_resources(bundles=scale_up_bundles(cfg, per_worker))
    started = time.monotonic()
    try:
        while not _fits(cfg, per_worker, nodes):
            waited = time.monotonic() - started
            if waited > timeout_s:
                raise LaunchError(
                    f"the autoscaler did not bring up room for {n} workers of {{{shape}}} within {timeout_s:.0f} s "
                    f"({len(nodes)} node(s) alive). Fix: look for Pending worker pods (`kubectl get pods -l "
                    f"ray.io/node-type=worker`, `kubectl describe pod`: no node fits, quota, image pull); check that "
                    f"the worker groups' maxReplicas hold the job (`raytrain validate` sizes against them); or "
                    f"lower scaling.num_workers")
            time.sleep(POLL_S)
            nodes = alive_nodes()
    finally:
        request_resources(bundles=[])
    console.info("scaling", f"{len(nodes)} node(s) up after {time.monotonic() - started:.0f} s", out=out)
    return size_workers(cfg, nodes)
