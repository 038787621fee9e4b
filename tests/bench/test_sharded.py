"""bench/sharded.py (p5): the figures built from the ranks' results, the part's sides and run directories (with a
stand-in runner), and the worker function itself on a tiny model in this one process (world size 1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import harness, sharded


def _ckpt_rank(rank: int, blocked: list[float], committed: int = 3, size: int = 131_000_000) -> dict:
    row = {"rank": rank, "blocked_s": blocked, "step_s": [1.0, 1.0, 1.5, 1.0, 1.4, 1.0], "every": 2,
           "final_wait_s": 1.5, "loop_s": 9.0, "max_rss_mib": 900.0}
    if rank == 0:
        row.update(committed=committed, checkpoint_bytes=[size] * committed)
    return row


def _mem_rank(rank: int, total: int, rss: float) -> dict:
    return {"rank": rank, "tensor_bytes": {"params": total // 4, "grads": total // 4, "optimizer": total // 2,
                                           "total": total},
            "n_params": 10_893_312, "step_s": [1.0], "max_rss_mib": rss, "rss_before_model_mib": 400.0 + rank,
            "rss_after_wrap_mib": 450.0, "rss_end_mib": rss - 10}


def test_a_checkpoint_round_is_rank_zeros_median_blocked_time_and_the_size_on_disk():
    got = sharded.ckpt_round([_ckpt_rank(1, [9.0, 9.0, 9.0]), _ckpt_rank(0, [3.0, 1.0, 2.0])])
    assert got["blocked_s"] == 2.0 and got["blocked_each_s"] == [3.0, 1.0, 2.0]
    assert got["bytes"] == 131_000_000 and got["committed"] == 3 and got["saves"] == 3
    assert got["mb_per_s"] == pytest.approx(65.5)  # 131 MB over the median 2 s
    # the steps right after a save (3 and 5, every 2) against the others (1, 2, 4, 6)
    assert got["next_step_extra_s"] == pytest.approx(0.45) and got["loop_s"] == 9.0


def test_a_memory_round_takes_the_worst_worker():
    got = sharded.memory_round([_mem_rank(0, 4 * 2**20, 700.0), _mem_rank(1, 8 * 2**20, 650.0)])
    assert got["max_rss_mib"] == 700.0 and got["tensor_mib"] == 8.0
    assert got["rss_growth_mib"] == 300.0 and got["rss_end_mib"] == 690.0  # each worker against its own start


def test_figures_judge_the_ratio_of_blocked_times_per_round_against_the_target():
    sync = [sharded.ckpt_round([_ckpt_rank(0, [2.0, 2.0, 2.0])]), sharded.ckpt_round([_ckpt_rank(0, [4.0] * 3)])]
    asyn = [sharded.ckpt_round([_ckpt_rank(0, [0.1, 0.3, 0.1])]), sharded.ckpt_round([_ckpt_rank(0, [0.2] * 3)])]
    memory = {"fsdp": [sharded.memory_round([_mem_rank(0, 2**20, 600.0)])],
              "ddp": [sharded.memory_round([_mem_rank(0, 2**21, 700.0)])]}
    rows = {r["figure"]: r for r in sharded.p5_figures({"sync": sync, "async": asyn}, memory, "w")}
    assert rows["p5_blocked_ratio"]["rounds"] == [0.05, 0.05] and rows["p5_blocked_ratio"]["met"] is True
    assert rows["p5_blocked_ratio"]["target"] == f"<= {harness.TARGETS['p5_blocked_ratio']}"
    assert rows["p5_sync_blocked_s"]["rounds"] == [2.0, 4.0] and rows["p5_async_blocked_s"]["rounds"] == [0.1, 0.2]
    assert rows["p5_sync_write_mb_per_s"]["rounds"] == [65.5, 32.75]
    assert rows["p5_checkpoint_mb"]["median"] == 131.0 and rows["p5_async_committed"]["rounds"] == [3.0, 3.0]
    assert rows["p5_fsdp_tensor_mib"]["median"] == 1.0 and rows["p5_ddp_tensor_mib"]["median"] == 2.0
    assert rows["p5_ddp_peak_rss_mib"]["median"] == 700.0 and rows["p5_ddp_peak_rss_above_start_mib"]["median"] == 300
    assert rows["p5_async_next_step_extra_s"]["median"] == pytest.approx(0.45)
    assert rows["p5_sync_loop_s"]["rounds"] == [9.0, 9.0]

    slow = [sharded.ckpt_round([_ckpt_rank(0, [1.0] * 3)])]
    missed = {r["figure"]: r for r in sharded.p5_figures({"sync": sync[:1], "async": slow}, {}, "w")}
    assert missed["p5_blocked_ratio"]["median"] == 0.5 and missed["p5_blocked_ratio"]["met"] is False
    assert not any(name.startswith(("p5_fsdp", "p5_ddp")) for name in missed)


def test_the_part_interleaves_its_sides_each_round_in_a_run_directory_of_its_own(tmp_path):
    calls = []

    def runner(params: dict) -> list[dict]:
        calls.append(params)
        if params["mode"] in sharded.CKPT_SIDES:
            (tmp_path / "p5").mkdir(exist_ok=True)
            Path(params["run_dir"]).mkdir()
            (Path(params["run_dir"]) / "shard").write_bytes(b"x")
            return [_ckpt_rank(0, [0.1 if params["mode"] == "async" else 2.0] * 3), _ckpt_rank(1, [0.1] * 3)]
        return [_mem_rank(0, 2**20, 600.0), _mem_rank(1, 2**20, 610.0)]

    s = harness.BenchSettings(rounds=2, parts=("p5",))
    rows = {r["figure"]: r for r in sharded.bench_sharded(s, tmp_path, lambda _: None, runner=runner)}
    assert [c["mode"] for c in calls] == ["sync", "async", "async", "sync", "fsdp", "ddp", "ddp", "fsdp"]
    run_dirs = [c["run_dir"] for c in calls if "run_dir" in c]
    assert not any((tmp_path / "p5").iterdir())  # each run directory removed once its round was counted
    assert len(set(run_dirs)) == 4 and all(d.startswith(str(tmp_path / "p5")) for d in run_dirs)
    ckpt = [c for c in calls if c["mode"] == "sync"][0]
    assert ckpt["steps"] == s.p5_checkpoints * s.p5_checkpoint_every and ckpt["every"] == s.p5_checkpoint_every
    assert all(c["preset"] == "gpt" and c["batch_size"] == s.p5_batch_size for c in calls)
    assert rows["p5_blocked_ratio"]["rounds"] == [0.05, 0.05] and rows["p5_fsdp_peak_rss_mib"]["median"] == 610.0


@pytest.mark.parametrize("mode", ["async", "ddp"])
def test_the_worker_trains_a_tiny_model_and_checkpoints_or_counts_its_tensors(tmp_path, mode):
    """One process, world size 1: the gpt preset's smoke-sized model (2 layers, 64 wide)."""
    params = {"rank": 0, "world": 1, "port": sharded.free_port(), "mode": mode, "preset": "gpt", "smoke": True,
              "batch_size": 2, "threads": 1, "steps": 4, "every": 2, "run_dir": str(tmp_path / "run")}
    got = sharded.p5_worker(params)
    # The kernel's RSS counters are per-CPU and batched: ru_maxrss and a VmRSS read earlier may differ by a little.
    assert len(got["step_s"]) == 4 and got["max_rss_mib"] >= got["rss_before_model_mib"] - 4 > 0
    if mode == "async":
        assert len(got["blocked_s"]) == 2 and got["committed"] == 2
        assert all(size > 4 * got["n_params"] for size in got["checkpoint_bytes"])  # the weights and AdamW's state
        summary = sharded.ckpt_round([got])
        assert summary["committed"] == 2 and summary["bytes"] == got["checkpoint_bytes"][0]
    else:
        counted = got["tensor_bytes"]
        assert counted["params"] == counted["grads"] == 4 * got["n_params"]  # fp32, unsharded under DDP
        assert counted["optimizer"] >= 2 * counted["params"]  # exp_avg and exp_avg_sq (and the step counters)
