"""How many CPUs (and GPUs) each Ray Train worker gets on the cluster as it is, and whether the job can ever be
scheduled there. Plain arithmetic over node resources: `raytrain run`/`tune` size with it after joining Ray, and
`raytrain validate` sizes a RayJob against its RayCluster's nodes with the same code, importing neither Ray nor
torch."""

from __future__ import annotations

import math

from raytrain.errors import LaunchError
from raytrain.spec.sections import RunConfig

# The least share of a CPU `cpus_per_worker: auto` gives a worker. Each worker is a whole PyTorch process (DDP, its
# own threads and ~300 MB): 64 of them on 2 CPUs are admitted by Ray at 1/32 CPU each and then never train.
MIN_AUTO_SHARE = 0.25


def auto_cpus_per_worker(node_cpus: list[float], num_workers: int, reserve: float) -> float:
    """The largest share of a CPU, 1, 1/2, 1/3, 1/4, that lets every worker fit on the nodes as they are, after
    `reserve` CPUs are kept free (for Ray Data's tasks) on the largest node; MIN_AUTO_SHARE when none does (the
    job then cannot be scheduled, which size_workers says)."""
    capacities = sorted(node_cpus, reverse=True)
    if capacities:
        capacities[0] = max(capacities[0] - reserve, 0.0)
    for divisor in range(1, round(1 / MIN_AUTO_SHARE) + 1):
        share = 1.0 / divisor
        if sum(math.floor(c / share + 1e-9) for c in capacities) >= num_workers:
            return share
    return MIN_AUTO_SHARE


def workers_that_fit(nodes: list[dict], per_worker: dict[str, float]) -> int:
    """How many workers of this shape the nodes can hold at once (each worker lives on a single node)."""
    total = 0
    for resources in nodes:
        fits = [math.floor(resources.get(name, 0.0) / amount + 1e-9) for name, amount in per_worker.items() if amount > 0]
        total += min(fits) if fits else 0
    return total


def data_reserve(cfg: RunConfig, nodes: list[dict]) -> float:
    """CPUs kept free for Ray Data's tasks when the data streams through Ray Data (and there is more than one)."""
    return 1.0 if cfg.data is not None and cfg.data.loader == "ray" and sum(n.get("CPU", 0.0) for n in nodes) >= 2 else 0.0


def size_workers(cfg: RunConfig, nodes: list[dict]) -> dict[str, float]:
    """Resources per worker; LaunchError if the cluster can never hold the job (an elastic one: its min workers).
    `cpus_per_worker: auto` takes the largest share that fits that many: an elastic run then grows at that share."""
    s = cfg.scaling
    if s.cpus_per_worker == "auto":
        cpus = auto_cpus_per_worker([n.get("CPU", 0.0) for n in nodes], s.min_workers, data_reserve(cfg, nodes))
    else:
        cpus = float(s.cpus_per_worker)
    per_worker = {"CPU": cpus}
    if s.use_gpu:
        per_worker["GPU"] = s.gpus_per_worker
    fit = workers_that_fit(nodes, per_worker)
    if fit < s.min_workers:
        shape = ", ".join(f"{k} {v:g}" for k, v in per_worker.items())
        held = "; ".join(", ".join(f"{k} {v:g}" for k, v in sorted(n.items()) if k in ("CPU", "GPU")) or "nothing"
                         for n in nodes)
        floor = (f" (cpus_per_worker: auto gives a worker at least {MIN_AUTO_SHARE:g} CPU: each is a whole "
                 f"PyTorch process, and thinner shares never train)") if s.cpus_per_worker == "auto" else ""
        raise LaunchError(
            f"this job can never be scheduled: it needs {'at least ' if s.elastic else ''}{s.min_workers} workers of {{{shape}}}{floor} but the "
            f"cluster's {len(nodes)} node(s) ({held}) hold at most {fit}. Fix: lower scaling.num_workers or the "
            f"resources per worker (scaling.cpus_per_worker, scaling.gpus_per_worker), or add worker nodes to the "
            f"cluster."
        )
    return per_worker


def grown_per_worker(cfg: RunConfig) -> dict[str, float]:
    """Resources per worker on a cluster that can still grow (an autoscaler adds nodes): `cpus_per_worker: auto`
    takes its cap, 1 CPU, instead of squeezing the workers into the nodes alive right now (which, on a cluster
    scaled to zero, is the head alone)."""
    s = cfg.scaling
    per_worker = {"CPU": 1.0 if s.cpus_per_worker == "auto" else float(s.cpus_per_worker)}
    if s.use_gpu:
        per_worker["GPU"] = s.gpus_per_worker
    return per_worker


def scale_up_bundles(cfg: RunConfig, per_worker: dict[str, float]) -> list[dict[str, int]]:
    """What to ask the autoscaler for: one bundle per worker, plus the CPU kept for Ray Data's tasks. Whole units:
    Ray's request_resources takes integers only (a fractional cpus_per_worker asks for a whole CPU each)."""
    bundle = {name: math.ceil(amount) for name, amount in per_worker.items() if amount > 0}
    bundles = [dict(bundle) for _ in range(cfg.scaling.min_workers)]
    if cfg.data.loader == "ray":
        bundles.append({"CPU": 1})
    return bundles
