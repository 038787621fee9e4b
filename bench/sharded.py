"""p5: the sharded checkpointer's blocking time, synchronous against asynchronous, and each worker's peak memory
with FSDP2 against DDP (issue #24's "measured, in the benchmark").

The model is the `gpt` preset's, at full size with the preset's own values (read through raytrain's config
loader: 6 blocks, 384 wide, block 128, AdamW with the preset's lr and weight decay, 10.9 M parameters), trained on
random byte tokens (the data is not what is measured) in 2 worker processes that this part starts itself:
torch.distributed with gloo on the CPU, a free MASTER_PORT, one fresh process per rank and per side. No Ray
cluster is involved: neither figure depends on Ray, only on torch.distributed, FSDP2 and DCP.

Checkpoint blocking (sides `sync` and `async`, interleaved round by round): the model sharded with
`raytrain.parallel.sharding.fully_shard_model` (scaling.strategy fsdp), one warm-up step (AdamW's state exists from then on),
then `p5_checkpoints` x `p5_checkpoint_every` timed steps, with `raytrain.checkpoint.sharded.ShardedCheckpointer.save`
every `p5_checkpoint_every` steps into a run directory under the bench's work dir (asynchronous=False on one side,
True on the other), and `wait()` at the end. Figures:
- blocked per checkpoint: rank 0's `blocked_s` (how long `save` held the training loop), the median over the round's
  checkpoints; the asynchronous side's saves include waiting for the previous checkpoint's write when it is still
  running (at most one in flight), as in a real run;
- the synchronous side's write rate: the committed checkpoint's bytes on disk over its save time;
- the ratio async blocked / sync blocked per round (target <= 0.10), the checkpoint's size, and the asynchronous
  side's committed checkpoints (all are kept, so that they can be counted);
- what blocking does not show: the median step right after a save minus the median of the other steps (the
  background write runs beside the next steps; on a CPU its thread competes with the training's for the cores), and
  the whole timed loop (steps, saves and the final wait) end to end.

Memory (sides `fsdp` and `ddp`): the same model, `p5_memory_steps` steps with AdamW, once sharded with FSDP2 and
once wrapped in DistributedDataParallel. Per worker: the peak resident set (ru_maxrss, the max over the ranks), the
same less the worker's resident set before the model was built, and the bytes of parameters, gradients and optimizer
state it holds (its local tensors: a DTensor's local shard). On the CPU the resident set includes torch's and
Python's own memory (libraries, the allocator's caches, activations, communication buffers), hundreds of MiB that
do not shrink with sharding; and both sides build the whole model on every worker before sharding or wrapping it,
as raytrain's session does, so the peak includes one full copy of the parameters: the tensor bytes are the part
that sharding divides.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional

from bench.harness import TARGETS, BenchSettings, figure, interleaved, ratios
from bench.workload import importable_env

PRESET = "gpt"
WORLD = 2
CKPT_SIDES = ("sync", "async")
MEMORY_SIDES = ("fsdp", "ddp")
MB = 1e6
MIB = 2**20


# ----------------------------------------------------------------------------------------------------------
# one worker (a process of its own, or the test's single process)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tensor_bytes(model: Any, optimizer: Any) -> dict:
    """Bytes of the parameters, gradients and optimizer state this worker holds: local tensors (a DTensor's local
    shard, not the global tensor it stands for)."""
    import torch

    def local(t: Any) -> int:
        if not isinstance(t, torch.Tensor):
            return 0
        if hasattr(t, "to_local"):
            t = t.to_local()
        return t.numel() * t.element_size()

    params = sum(local(p) for p in model.parameters())
    grads = sum(local(p.grad) for p in model.parameters() if p.grad is not None)
    state = sum(local(v) for s in optimizer.state.values() for v in s.values())
    return {"params": params, "grads": grads, "optimizer": state, "total": params + grads + state}


def current_rss_mib() -> Optional[float]:
    """This process's resident set now (VmRSS), or None off Linux."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def p5_worker(params: dict) -> dict:
    """One rank: build the preset's model, shard it (FSDP2) or wrap it (DDP), train, checkpoint (modes sync/async)
    or not (modes fsdp/ddp); returns what this rank measured. params: rank, world, port, mode, preset, smoke,
    overrides, batch_size (global), steps, every (checkpoints: every N steps after the warm-up step), run_dir,
    threads."""
    import resource

    import torch
    import torch.distributed as dist

    from raytrain import loop
    from raytrain.checkpoint.checkpoints import Position, committed
    from raytrain.spec import build
    from raytrain.spec.config import load_config

    rank, world, mode = params["rank"], params["world"], params["mode"]
    torch.set_num_threads(params.get("threads", 1))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(params["port"]))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        rss_before_model = current_rss_mib()  # torch imported, the process group up, no model yet
        strategy = "ddp" if mode == "ddp" else "fsdp"
        cfg = load_config(params["preset"], [*params.get("overrides", []), f"scaling.strategy={strategy}",
                                             f"scaling.num_workers={world}"], smoke=params.get("smoke", False))
        torch.manual_seed(0)
        model = build.build_model(cfg)
        n_params = sum(p.numel() for p in model.parameters())
        device = torch.device("cpu")
        if strategy == "fsdp":
            from raytrain.parallel.sharding import fully_shard_model

            model = fully_shard_model(model, cfg, device, world)
        else:
            from torch.nn.parallel import DistributedDataParallel

            model = DistributedDataParallel(model)
        rss_after_wrap = current_rss_mib()
        optimizer = loop.build_optimizer(cfg, model)
        loss_fn = build.build_loss(cfg)
        local_batch = max(1, params["batch_size"] // world)
        block, vocab = cfg.data.component.kwargs.get("block_size", 128), cfg.model.kwargs.get("vocab_size", 256)
        generator = torch.Generator().manual_seed(1000 + rank)

        def step() -> float:
            tokens = torch.randint(0, vocab, (local_batch, block + 1), generator=generator)
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(tokens[:, :-1]), tokens[:, 1:])
            loss.backward()
            if cfg.train.grad_clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
            optimizer.step()
            return float(loss.detach())

        out: dict = {"rank": rank, "mode": mode, "n_params": n_params, "local_batch": local_batch,
                     "block_size": block, "rss_before_model_mib": rss_before_model,
                     "rss_after_wrap_mib": rss_after_wrap}
        began = time.perf_counter()
        step()  # warm-up: AdamW's state exists from here on, so every checkpoint holds the same tensors
        out["first_step_s"] = time.perf_counter() - began
        step_s: list[float] = []
        if mode in CKPT_SIDES:
            from raytrain.checkpoint.sharded import ShardedCheckpointer

            run_dir = Path(params["run_dir"])
            checkpointer = ShardedCheckpointer(run_dir, keep=params["steps"] + 1, rank=rank,
                                               asynchronous=mode == "async")
            config = cfg.to_dict()
            loop_began = time.perf_counter()
            for n in range(1, params["steps"] + 1):
                t0 = time.perf_counter()
                step()
                step_s.append(time.perf_counter() - t0)
                if n % params["every"] == 0:
                    position = Position(0, n)
                    checkpointer.save(position, model, optimizer,
                                      lambda position=position: {"epoch": position.epoch, "step": position.step,
                                                                 "config": config, "extra": {}}, config=config)
            t0 = time.perf_counter()
            checkpointer.wait()
            out["final_wait_s"] = time.perf_counter() - t0
            out["loop_s"] = time.perf_counter() - loop_began  # the timed steps, every save and the last wait
            out["blocked_s"] = list(checkpointer.blocked_s)
            out["every"] = params["every"]
            dist.barrier()  # rank 0's commit is done (wait() returned on rank 0) before anyone counts
            if rank == 0:
                done = committed(run_dir)
                out["committed"] = len(done)
                out["checkpoint_bytes"] = [dir_bytes(p) for p in done]
        else:
            for _ in range(params["steps"]):
                t0 = time.perf_counter()
                step()
                step_s.append(time.perf_counter() - t0)
            out["tensor_bytes"] = tensor_bytes(model, optimizer)
        out["step_s"] = step_s
        out["rss_end_mib"] = current_rss_mib()
        # ru_maxrss is in KiB on Linux
        out["max_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        return out
    finally:
        dist.destroy_process_group()


# ----------------------------------------------------------------------------------------------------------
# one side of a round: WORLD processes


def run_ranks(params: dict, world: int = WORLD, timeout: float = 900,
              entry: str = "bench.sharded:p5_worker") -> list[dict]:
    """p5_worker (or another `module:function` taking the same params) in `world` fresh processes (one per rank, a
    free port); every rank's result, by rank."""
    module, function = entry.split(":")
    code = (f"import json, sys; from {module} import {function} as f; r = f(json.load(sys.stdin)); "
            "sys.stdout.write('\\nBENCH-RESULT ' + json.dumps(r) + '\\n')")
    threads = str(params.get("threads", 1))
    env = importable_env(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
    port = free_port()
    logs = Path(tempfile.mkdtemp(prefix="p5-"))
    procs = []
    try:
        for rank in range(world):  # output into files: a full pipe would stall a rank inside a collective
            out, err = open(logs / f"{rank}.out", "w+"), open(logs / f"{rank}.err", "w+")
            p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=out, stderr=err,
                                 text=True, env=env)
            p.stdin.write(json.dumps({**params, "rank": rank, "world": world, "port": port}))
            p.stdin.close()
            procs.append((p, out, err))
        results, errors = [], []
        deadline = time.monotonic() + timeout
        # A rank that failed leaves the other waiting in a collective: it is given a few seconds, then ended.
        failed_at: Optional[float] = None
        while any(p.poll() is None for p, _, _ in procs):
            now = time.monotonic()
            if failed_at is None and any(p.poll() not in (None, 0) for p, _, _ in procs):
                failed_at = now
            if now > deadline or (failed_at is not None and now > failed_at + 20):
                break
            time.sleep(0.2)
        for rank, (p, out, err) in enumerate(procs):
            if p.poll() is None:
                p.kill()
                p.wait()
                if failed_at is None:
                    raise RuntimeError(f"p5 {params['mode']}: rank {rank} ran past {timeout} s")
            out.seek(0)
            err.seek(0)
            found = [line for line in out.read().splitlines() if line.startswith("BENCH-RESULT ")]
            if found:
                results.append(json.loads(found[-1].split(" ", 1)[1]))
            else:
                errors.append(f"rank {rank} (exit {p.returncode}): {err.read().strip()[-1500:]}")
    finally:
        for p, out, err in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            out.close()
            err.close()
        shutil.rmtree(logs, ignore_errors=True)
    if errors:
        raise RuntimeError(f"p5 {params['mode']} failed: " + " | ".join(errors))
    return sorted(results, key=lambda r: r["rank"])


# ----------------------------------------------------------------------------------------------------------
# figures


def ckpt_round(ranks: list[dict]) -> dict:
    """A checkpoint side's round from its ranks' results: rank 0's median blocked seconds, the checkpoints' size on
    disk (median), the committed count, the write rate (MB/s over the median blocked time)."""
    zero = next(r for r in ranks if r["rank"] == 0)
    blocked = statistics.median(zero["blocked_s"]) if zero["blocked_s"] else None
    # Steps right after a save (a background write runs beside them) against the others: what the write costs the
    # training beyond the blocked time (on a CPU its thread competes with the training's).
    every = zero.get("every") or 0
    follows = [bool(every) and n > 1 and (n - 1) % every == 0 for n in range(1, len(zero["step_s"]) + 1)]
    after = [t for t, f in zip(zero["step_s"], follows) if f]
    others = [t for t, f in zip(zero["step_s"], follows) if not f]
    extra = statistics.median(after) - statistics.median(others) if after and others else None
    size = statistics.median(zero["checkpoint_bytes"]) if zero.get("checkpoint_bytes") else None
    return {"blocked_s": blocked, "blocked_each_s": zero["blocked_s"], "bytes": size,
            "committed": zero.get("committed", 0), "saves": len(zero["blocked_s"]),
            "mb_per_s": size / MB / blocked if size and blocked else None,
            "step_s": statistics.median(zero["step_s"]) if zero["step_s"] else None,
            "final_wait_s": zero.get("final_wait_s"), "max_rss_mib": max(r["max_rss_mib"] for r in ranks),
            "loop_s": zero.get("loop_s"), "next_step_extra_s": extra}


def memory_round(ranks: list[dict]) -> dict:
    """A memory side's round: the peak RSS (max over ranks) and the tensor bytes per worker (max over ranks)."""
    worst = max(ranks, key=lambda r: r["tensor_bytes"]["total"])

    def worst_of(key: str) -> Optional[float]:
        values = [r[key] for r in ranks if r.get(key) is not None]
        return max(values) if values else None

    return {"max_rss_mib": max(r["max_rss_mib"] for r in ranks),
            "rss_before_model_mib": worst_of("rss_before_model_mib"),
            "rss_after_wrap_mib": worst_of("rss_after_wrap_mib"), "rss_end_mib": worst_of("rss_end_mib"),
            "rss_growth_mib": max((r["max_rss_mib"] - r["rss_before_model_mib"] for r in ranks
                                   if r.get("rss_before_model_mib") is not None), default=None),
            "tensor_mib": worst["tensor_bytes"]["total"] / MIB,
            "tensor_bytes": worst["tensor_bytes"], "n_params": worst["n_params"],
            "step_s": statistics.median(worst["step_s"]) if worst["step_s"] else None}


def p5_figures(ckpt: dict[str, list[dict]], memory: dict[str, list[dict]], workload: str) -> list[dict]:
    """The part's figures from each side's per-round summaries (ckpt_round, memory_round)."""
    target = TARGETS["p5_blocked_ratio"]
    sync, asyn = ckpt.get("sync", []), ckpt.get("async", [])
    rows: list[dict] = []
    if sync and asyn:
        sync_b, async_b = [r["blocked_s"] for r in sync], [r["blocked_s"] for r in asyn]
        ratio = ratios(async_b, sync_b)
        sizes = [r["bytes"] for r in sync + asyn if r["bytes"]]
        rows += [
            figure("p5_checkpoint_mb", "MB", [s / MB for s in sizes], workload=workload),
            figure("p5_sync_blocked_s", "s", sync_b, each=[r["blocked_each_s"] for r in sync],
                   committed=[r["committed"] for r in sync], step_s=[r["step_s"] for r in sync]),
            figure("p5_sync_write_mb_per_s", "MB/s", [r["mb_per_s"] for r in sync]),
            figure("p5_async_blocked_s", "s", async_b, each=[r["blocked_each_s"] for r in asyn],
                   committed=[r["committed"] for r in asyn], saves=[r["saves"] for r in asyn],
                   final_wait_s=[r["final_wait_s"] for r in asyn], step_s=[r["step_s"] for r in asyn]),
            figure("p5_async_committed", "checkpoints", [float(r["committed"]) for r in asyn],
                   saves=[r["saves"] for r in asyn]),
        ]
        median = statistics.median([v for v in ratio if v is not None]) if any(v is not None for v in ratio) \
            else None
        rows.append(figure("p5_blocked_ratio", "x", ratio, target=f"<= {target}",
                           met=median is not None and median <= target))
        for side, rounds in (("sync", sync), ("async", asyn)):
            rows += [figure(f"p5_{side}_next_step_extra_s", "s", [r["next_step_extra_s"] for r in rounds],
                            note="median step right after a save minus the median of the other steps"),
                     figure(f"p5_{side}_loop_s", "s", [r["loop_s"] for r in rounds],
                            note="rank 0's timed steps, every save and the final wait, end to end")]
    for side in MEMORY_SIDES:
        rounds = memory.get(side, [])
        if not rounds:
            continue
        rows += [figure(f"p5_{side}_peak_rss_mib", "MiB", [r["max_rss_mib"] for r in rounds],
                        note="ru_maxrss, max over the 2 workers: includes torch's own memory on the CPU",
                        rss_before_model_mib=[r["rss_before_model_mib"] for r in rounds],
                        rss_after_wrap_mib=[r["rss_after_wrap_mib"] for r in rounds],
                        rss_end_mib=[r["rss_end_mib"] for r in rounds]),
                 figure(f"p5_{side}_peak_rss_above_start_mib", "MiB",
                        [r["rss_growth_mib"] for r in rounds],
                        note="per worker, its peak RSS minus its RSS before the model was built (torch imported, "
                             "gloo up); the max over the workers"),
                 figure(f"p5_{side}_tensor_mib", "MiB", [r["tensor_mib"] for r in rounds],
                        tensor_bytes=rounds[-1]["tensor_bytes"], n_params=rounds[-1]["n_params"])]
    return rows


# ----------------------------------------------------------------------------------------------------------
# the part


def bench_sharded(s: BenchSettings, work: Path, log: Callable[[str], None],
                  runner: Optional[Callable[[dict], list[dict]]] = None) -> list[dict]:
    runner = runner or run_ranks
    base = {"preset": PRESET, "batch_size": s.p5_batch_size, "threads": s.torch_threads}
    workload = (f"{PRESET} preset at full size, {WORLD} workers (gloo, CPU), global batch {s.p5_batch_size}, "
                f"1 warm-up step then {s.p5_checkpoints} checkpoints every {s.p5_checkpoint_every} steps")
    root = work / "p5"

    def ckpt_side(mode: str) -> Callable[[int], dict]:
        def run(r: int) -> dict:
            run_dir = root / f"{mode}-round{r}"
            summary = ckpt_round(runner({**base, "mode": mode, "steps": s.p5_checkpoints * s.p5_checkpoint_every,
                                         "every": s.p5_checkpoint_every, "run_dir": str(run_dir)}))
            log(f"p5 {mode} round {r}: blocked {summary['blocked_s']:.3f} s median "
                f"({', '.join(f'{b:.3f}' for b in summary['blocked_each_s'])}), {summary['committed']} committed, "
                f"{(summary['bytes'] or 0) / MB:.1f} MB, step {summary['step_s']:.2f} s")
            shutil.rmtree(run_dir, ignore_errors=True)  # counted and measured: 3 x 131 MB a round need not stay
            return summary
        return run

    def memory_side(mode: str) -> Callable[[int], dict]:
        def run(r: int) -> dict:
            summary = memory_round(runner({**base, "mode": mode, "steps": s.p5_memory_steps}))
            log(f"p5 {mode} round {r}: peak RSS {summary['max_rss_mib']:.0f} MiB, tensors "
                f"{summary['tensor_mib']:.1f} MiB per worker")
            return summary
        return run

    ckpt = interleaved(s.rounds, {m: ckpt_side(m) for m in CKPT_SIDES})
    memory = interleaved(s.rounds, {m: memory_side(m) for m in MEMORY_SIDES})
    return p5_figures(ckpt, memory, workload)
