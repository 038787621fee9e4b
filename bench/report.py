"""The figures for people: results.md (the table docs/benchmarks.md shows) and bench.png (one panel per part)."""

from __future__ import annotations

from pathlib import Path

from bench.harness import TARGETS, BenchSettings

# (title, figures, their tick labels, target line) for each panel; a panel with nothing measured is left out.
PANELS = [
    ("P1 training throughput (samples/s)", ["p1_raw_torch_samples_per_s", "p1_ray_train_samples_per_s"],
     ["raw torch", "Ray Train"], None),
    ("P1 Ray Train / raw torch", ["p1_ratio"], ["ratio"], TARGETS["p1_ratio"]),
    ("P2 ingest, no model (batches/s)", ["p2_dataloader_batches_per_s", "p2_ray_data_batches_per_s"],
     ["DataLoader", "Ray Data"], None),
    ("P2 share of step time waiting for data", ["p2_wait_share_raw_torch", "p2_wait_share_ray_train"],
     ["raw torch", "Ray Train"], TARGETS["p2_wait_share"]),
    ("P1core digits: raytrain run vs plain loop (samples/s)",
     ["p1core_digits_plain_samples_per_s", "p1core_digits_raytrain_samples_per_s"], ["plain", "raytrain run"], None),
    ("P1core ViT: raytrain run vs plain loop (samples/s)",
     ["p1core_vit_plain_samples_per_s", "p1core_vit_raytrain_samples_per_s"], ["plain", "raytrain run"], None),
    ("P1core raytrain run / plain loop", ["p1core_digits_ratio", "p1core_vit_ratio"], ["digits", "ViT"],
     TARGETS["p1core_ratio"]),
    ("Checkpoint bytes read / its size, write to next first step", ["ckptread_run_ratio", "ckptread_local_ratio"],
     ["run (2 workers)", "local"], TARGETS["ckptread_ratio"]),
    ("P3 submission to first step (s)", ["p3_running_cluster_s", "p3_cold_embedded_s"],
     ["running cluster", "cold embedded"], TARGETS["p3_running_s"]),
    ("P4 worker node gone to next step (s)", ["p4_kill_to_next_step_s", "p4_kill_detected_to_next_step_s",
                                              "p4_delete_to_next_step_s", "p4_delete_detected_to_next_step_s"],
     ["kill", "kill\nfrom detection", "delete", "delete\nfrom detection"], TARGETS["p4_next_step_s"]),
    ("P4 completed steps trained again", ["p4_kill_completed_steps_lost", "p4_delete_completed_steps_lost"],
     ["kill (SIGKILL)", "pod deleted (preStop, SIGTERM)"], None),
    ("P5 training blocked per sharded checkpoint (s)", ["p5_sync_blocked_s", "p5_async_blocked_s"],
     ["synchronous", "asynchronous"], None),
    ("P5 asynchronous / synchronous blocked time", ["p5_blocked_ratio"], ["ratio"], TARGETS["p5_blocked_ratio"]),
    ("P5 peak RSS per worker (MiB)", ["p5_fsdp_peak_rss_mib", "p5_ddp_peak_rss_mib"], ["FSDP2", "DDP"], None),
    ("P5 params+grads+AdamW state per worker (MiB)", ["p5_fsdp_tensor_mib", "p5_ddp_tensor_mib"], ["FSDP2", "DDP"],
     None),
    ("Scaling on 2 nodes (samples/s)", ["scaling_1_worker_samples_per_s", "scaling_2_workers_samples_per_s"],
     ["1 worker", "2 workers"], None),
    ("GPU bf16 MFU, the presets' models", ["gpu_cifar10_vit_mfu_raw_torch", "gpu_cifar10_vit_mfu_ray_train",
                                            "gpu_gpt_mfu_raw_torch", "gpu_gpt_mfu_ray_train"],
     ["ViT\nraw torch", "ViT\nRay Train", "gpt\nraw torch", "gpt\nRay Train"], None),
    ("GPU FSDP2 / DDP step time, one GPU", ["gpu_cifar10_vit_fsdp_over_ddp_step", "gpu_gpt_fsdp_over_ddp_step"],
     ["ViT", "gpt"], None),
]


def markdown(figures: list[dict], machine: dict, settings: BenchSettings) -> str:
    """The figures as a Markdown table (what docs/benchmarks.md shows), with the machine they came from."""
    def num(v):
        return "-" if v is None else f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"

    lines = [f"Machine: {machine.get('cores')} cores ({machine.get('cpu')}), {machine.get('memory_gib')} GiB, "
             f"load average {machine.get('load_avg_at_start', [0])[0]:.1f} at the start; torch {machine.get('torch')}, "
             f"Ray {machine.get('ray')}; {settings.rounds} interleaved rounds.", "",
             "| figure | unit | median | min | max | rounds | target | met |", "|---|---|---|---|---|---|---|---|"]
    for f in figures:
        if "skipped" in f or "error" in f:
            why = f"skipped: {f['skipped']}" if "skipped" in f else f"error: {f['error'].splitlines()[0][:120]}"
            lines.append(f"| {f['figure']} | | | | | | {why} | |")
            continue
        met = "" if f.get("met") is None else ("yes" if f["met"] else "no")
        lines.append(f"| {f['figure']} | {f['unit']} | {num(f['median'])} | {num(f['min'])} | {num(f['max'])} | "
                     f"{f['n']} | {f.get('target', '')} | {met} |")
    return "\n".join(lines) + "\n"


def chart(figures: list[dict], path: Path, title: str) -> Path:
    """One panel per part: bars at the median, whiskers from min to max, a dashed line at the target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_name = {f["figure"]: f for f in figures if "median" in f and f.get("median") is not None}
    panels = [p for p in PANELS if any(name in by_name for name in p[1])]
    cols = 2
    rows = max(1, (len(panels) + cols - 1) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(11, 3.2 * rows), squeeze=False)
    for ax, (label, names, ticks, target) in zip(axes.flat, panels):
        present = [(n, t) for n, t in zip(names, ticks) if n in by_name]
        meds = [by_name[n]["median"] for n, _ in present]
        lows = [by_name[n]["median"] - by_name[n]["min"] for n, _ in present]
        highs = [by_name[n]["max"] - by_name[n]["median"] for n, _ in present]
        xs = range(len(present))
        colors = ["#4c72b0", "#dd8452", "#55a868", "#8172b3"]
        ax.bar(xs, meds, yerr=[lows, highs], capsize=6, color=colors[: len(present)])
        ax.set_xticks(list(xs), [t for _, t in present])
        for x, m in zip(xs, meds):
            ax.annotate(f"{m:.0f}" if m >= 100 else f"{m:.3g}", (x, m), ha="center", va="bottom", xytext=(0, 3),
                        textcoords="offset points")
        if target is not None:
            ax.axhline(target, linestyle="--", color="#c44e52", label=f"target {target:g}")
            ax.legend(loc="lower right", fontsize=8)
        ax.set_title(label, fontsize=10)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(figures: list[dict], machine: dict, settings: BenchSettings, out_dir: Path) -> tuple[Path, Path]:
    """OUT_DIR/results.md and OUT_DIR/bench.png."""
    from raytrain.rundir.atomicfile import write_atomic

    out_dir.mkdir(parents=True, exist_ok=True)
    table = out_dir / "results.md"
    write_atomic(table, markdown(figures, machine, settings))
    png = chart(figures, out_dir / "bench.png",
                f"raytrain bench: {machine.get('cores')} cores, {machine.get('cpu')}, "
                f"{settings.rounds} rounds (bars: median, whiskers: min-max)")
    return table, png
