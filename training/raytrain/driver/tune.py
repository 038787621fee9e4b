"""`raytrain tune`: Ray Tune over the Ray Train run, the Train V2 way.

Each Tune trial is a light driver function (no CPU of its own) that builds the trial's run config (the base config
with the sampled keys set), constructs a TorchTrainer for it and fits it; a TuneReportCallback forwards the
workers' reports (val_accuracy at every checkpoint epoch) to Tune. Trials run concurrently only as far as the
cluster holds their workers. Layout under STORAGE/NAME/:

    tuner/                                       Ray Tune's own experiment state
    tune.json, best_config.yaml, result.json     the outcome; best_config.yaml is a run config for `raytrain run`

and each trial is an ordinary run beside it, STORAGE/NAME-trial-<trial id>/{config.yaml, metrics.jsonl,
result.json, checkpoint_*}, so that it reads the same STORAGE/datasets.

A search file (YAML) names the metric, the mode, the number of samples and the space: dotted run-config keys
(model.*, data.*, train.*) mapped to one distribution each, and a `smoke:` block of top-level replacements that
`--smoke-test` applies.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, TextIO

from raytrain.driver import preflight, runstart, trackers
from raytrain.driver.attempt import Attempt
from raytrain.driver.raytrainer import (
    CONTROLLER_POLL_INTERVAL_S,
    RayTrainer,
    alive_node_resources,
    connect_for,
    root_cause,
)
from raytrain.rundir import console, layout, runrecords
from raytrain.rundir.lease import DEFAULT_TTL_S
from raytrain.spec.config import PRESETS_DIR, ConfigError, config_from_dict, dump_yaml, read_yaml_mapping
from raytrain.spec.sections import SMOKE_KEY, RunConfig
from raytrain.spec.sizing import data_reserve, size_workers, workers_that_fit
from raytrain.worker import telemetry

DISTRIBUTIONS = {"uniform": 2, "loguniform": 2, "randint": 2, "choice": None}  # name -> number of arguments
TUNABLE_SECTIONS = ("model", "data", "train")
TRIAL_DRIVER_MEMORY = 64 * 1024 * 1024  # bytes reserved per concurrent trial driver  # scaling and run shape the trials themselves: not sampled


@dataclass
class SearchSpec:
    space: dict[str, dict[str, Any]]  # dotted key -> {distribution: arguments}
    metric: str = "val_accuracy"
    mode: str = "max"
    num_samples: int = 4
    max_concurrent_trials: int = 0  # 0: as many as the cluster holds at once
    source: str = "<search>"


# ----------------------------------------------------------------------------------------------------------
# the search file


def resolve_search_path(ref: Optional[str], config_ref: str) -> Path:
    """--search as given (a file, or a path under the presets directory); without it, the preset's own
    <preset>/search.yaml."""
    candidates = [Path(ref), PRESETS_DIR / ref] if ref else [PRESETS_DIR / Path(config_ref).stem / "search.yaml"]
    for path in candidates:
        if path.is_file():
            return path
    if ref:
        raise ConfigError(f"--search {ref}: no such file. Fix: give the path of a search YAML (see "
                          f"{PRESETS_DIR / 'text-rnn' / 'search.yaml'} for the shape).")
    raise ConfigError(f"{config_ref} has no search file ({candidates[0]} does not exist). Fix: pass --search "
                      f"SEARCH.yaml.")


def load_search(path: Path, smoke: bool = False) -> SearchSpec:
    raw = read_yaml_mapping(path)
    source = str(path)
    smoke_block = raw.pop(SMOKE_KEY, None) or {}
    if not isinstance(smoke_block, dict):
        raise ConfigError(f"{source}: '{SMOKE_KEY}' is not a mapping. Fix: give top-level keys, e.g. num_samples: 2.")
    if smoke:
        raw.update(copy.deepcopy(smoke_block))
    known = {"space", "metric", "mode", "num_samples", "max_concurrent_trials"}
    for key in raw:
        if key not in known:
            raise ConfigError(f"{source}: unknown key '{key}'. Fix: use only {', '.join(sorted(known | {SMOKE_KEY}))}.")
    space = raw.get("space")
    if not isinstance(space, dict) or not space:
        raise ConfigError(f"{source}: space is missing or empty. Fix: map run-config keys to distributions, e.g. "
                          f"space: {{train.lr: {{uniform: [1.0e-4, 1.0e-2]}}}}.")
    for key, dist in space.items():
        _check_distribution(source, str(key), dist)
    spec = SearchSpec(space=space, source=source)
    for key, kind in (("metric", str), ("mode", str), ("num_samples", int), ("max_concurrent_trials", int)):
        if key in raw:
            if not isinstance(raw[key], kind) or isinstance(raw[key], bool):
                raise ConfigError(f"{source}: {key}: {raw[key]!r} is not {'a string' if kind is str else 'an integer'}. "
                                  f"Fix: e.g. {key}: {getattr(spec, key)!r}.")
            setattr(spec, key, raw[key])
    if spec.mode not in ("max", "min"):
        raise ConfigError(f"{source}: mode: '{spec.mode}' is not allowed. Fix: use max or min.")
    if spec.num_samples < 1:
        raise ConfigError(f"{source}: num_samples: {spec.num_samples} trials is nothing to tune. Fix: use 1 or more.")
    if spec.max_concurrent_trials < 0:
        raise ConfigError(f"{source}: max_concurrent_trials must be >= 0. Fix: use 0 for as many as fit.")
    return spec


def _check_distribution(source: str, key: str, dist: Any) -> None:
    where = f"{source}: space.{key}"
    if key.split(".")[0] not in TUNABLE_SECTIONS or key.count(".") != 1:
        raise ConfigError(f"{where}: only keys of {', '.join(TUNABLE_SECTIONS)} can be tuned. Fix: write section.key, "
                          f"e.g. train.lr.")
    if not isinstance(dist, dict) or len(dist) != 1 or next(iter(dist)) not in DISTRIBUTIONS:
        raise ConfigError(f"{where}: {dist!r} is not a distribution. Fix: use one of "
                          f"{{uniform: [lo, hi]}}, {{loguniform: [lo, hi]}}, {{randint: [lo, hi]}}, {{choice: [a, b, ...]}}.")
    name, args = next(iter(dist.items()))
    if not isinstance(args, list) or not args or (DISTRIBUTIONS[name] and len(args) != DISTRIBUTIONS[name]):
        count = DISTRIBUTIONS[name]
        raise ConfigError(f"{where}: {name} takes {'[lo, hi]' if count else 'a non-empty list'}. Fix: e.g. "
                          f"{{{name}: {'[0.0001, 0.01]' if count else '[5, 10, 20]'}}}.")
    if DISTRIBUTIONS[name]:
        lo, hi = args
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in args) or not lo < hi:
            raise ConfigError(f"{where}: {name} bounds {args} must be numbers with lo < hi. Fix: e.g. [0.0001, 0.01].")
        if name == "loguniform" and lo <= 0:
            raise ConfigError(f"{where}: loguniform needs lo > 0. Fix: use a positive lower bound.")


def sample_values(dist: dict) -> list:
    """Values the distribution can produce at its edges: each must make a valid run config."""
    name, args = next(iter(dist.items()))
    if name == "choice":
        return list(args)
    return [args[0], args[1] - 1] if name == "randint" else [args[0], args[1]]


def check_space(base: RunConfig, search: SearchSpec) -> None:
    """Every key and every edge value must build a valid run config: fail now, not in trial 7."""
    if base.scaling.elastic:  # trials are compared at one size; Ray Tune does not resize a trial's workers
        raise ConfigError(f"{search.source}: the run config's scaling.num_workers {base.scaling.num_workers} is "
                          f"elastic, and raytrain tune runs every trial at a fixed size. Fix: --set "
                          f"scaling.num_workers={base.scaling.max_workers} (or any one count).")
    if base.scaling.torchft:  # Ray Tune reads a trial's metrics from ray.train.report, which torchft runs skip
        raise ConfigError(f"{search.source}: the run config's scaling.fault_tolerance is torchft, which raytrain tune "
                          f"does not run (its replicas skip ray.train.report, a barrier a missing replica would "
                          f"hold, and that is how Ray Tune reads a trial). Fix: --set "
                          f"scaling.fault_tolerance=restart for the search.")
    for key, dist in search.space.items():
        for value in sample_values(dist):
            try:
                with_params(base.to_dict(), {key: value})
            except ConfigError as err:
                message = str(err).split(": ", 1)[-1]
                raise ConfigError(f"{search.source}: space.{key} = {value!r} makes the run config invalid: "
                                  f"{message}") from None


def with_params(resolved: dict, params: dict) -> RunConfig:
    raw = copy.deepcopy(resolved)
    for key, value in params.items():
        section, name = key.split(".")
        raw[section][name] = value
    return config_from_dict(raw, "<tune trial>")


def param_space(search: SearchSpec) -> dict:
    from ray import tune

    make = {"uniform": tune.uniform, "loguniform": tune.loguniform, "randint": tune.randint}
    space = {}
    for key, dist in search.space.items():
        name, args = next(iter(dist.items()))
        space[key] = tune.choice(args) if name == "choice" else make[name](*args)
    return space


# ----------------------------------------------------------------------------------------------------------
# a trial


def trial_driver(params: dict, base: dict, per_worker: dict,
                 worker_report_interval_ms: int = telemetry.WORKER_REPORT_INTERVAL_MS) -> None:
    """One Tune trial: an attempt of its own run (lease, resume check, result: raytrain.driver.attempt) of the base config
    with `params` set, trained by Ray Train and reporting to Tune."""
    import ray.tune
    from ray.tune.integration.ray_train import TuneReportCallback

    trial_id = ray.tune.get_context().get_trial_id()
    raw = copy.deepcopy(base)
    # Beside the sweep's directory under the same storage path, so the trial finds the same datasets directory.
    raw["run"]["name"] = f"{raw['run']['name']}-trial-{trial_id}"
    cfg = with_params(raw, params)
    # The trial runs inside the sweep's Ray: it neither starts nor stops one.
    trainer = RayTrainer(cfg, address="auto", callbacks=(TuneReportCallback(),), owns_ray=False,
                         per_worker=per_worker, worker_report_interval_ms=worker_report_interval_ms)
    # A trial whose run is finished still starts its worker group: Tune waits for its reports.
    Attempt(cfg, handle_signals=False, skip_finished=False).run(trainer)


# ----------------------------------------------------------------------------------------------------------
# the sweep


def concurrent_trials(nodes: list[dict], per_worker: dict, num_workers: int, asked: int,
                      reserve_cpus: float = 0.0) -> int:
    """How many trials' worker groups the cluster holds at once (at least 1), capped by what was asked, with
    `reserve_cpus` kept free on the largest node (Ray Data's tasks, as the launcher keeps them for one run)."""
    nodes = sorted((dict(n) for n in nodes), key=lambda n: n.get("CPU", 0.0), reverse=True)
    if nodes and reserve_cpus:
        nodes[0]["CPU"] = max(nodes[0].get("CPU", 0.0) - reserve_cpus, 0.0)
    fit = max(1, workers_that_fit(nodes, per_worker) // num_workers)
    return min(fit, asked) if asked else fit


def tune_run(cfg: RunConfig, search: SearchSpec, address: Optional[str] = None, out: TextIO = sys.stdout,
             in_submitted_job: bool = False,
             worker_report_interval_ms: int = telemetry.WORKER_REPORT_INTERVAL_MS) -> dict:
    """Run the sweep; returns the summary also written to STORAGE/NAME/tune.json. worker_report_interval_ms: how
    often the trials' workers send their metrics (raytrain.driver.raytrainer.build_trainer)."""
    check_space(cfg, search)
    trackers.check_installed(trackers.configured(cfg))  # each trial is a run of its own, with its own tracker run
    preflight.check_tracking_destination(cfg)
    started = time.time()
    # The sweep's own directory is held like a run's: one sweep writes it at a time, every commit fenced.
    control = runstart.take_lease(cfg, DEFAULT_TTL_S, wait=False, notify=lambda m: console.info("attempt", m, out=out))
    records = runrecords.Records(control.run_dir, control)
    try:
        return _sweep(cfg, search, records, address, out, in_submitted_job, started, worker_report_interval_ms)
    finally:
        control.release()


def _sweep(cfg: RunConfig, search: SearchSpec, records: runrecords.Records, address: Optional[str], out: TextIO,
           in_submitted_job: bool, started: float, worker_report_interval_ms: int) -> dict:

    import ray.tune

    tune_dir = records.run_dir
    runstart.start_run(cfg, records, lambda _directory, error: {"status": "failed", "error": error})
    connected = connect_for(cfg, address, in_submitted_job)
    console.info("connected", f"{connected}; tune directory {tune_dir}", out=out, run_dir=str(tune_dir))
    nodes = alive_node_resources()
    per_worker = size_workers(cfg, nodes)
    concurrent = concurrent_trials(nodes, per_worker, cfg.scaling.num_workers, search.max_concurrent_trials,
                                   data_reserve(cfg, nodes))
    console.info("tuning", f"tuning {cfg.run.name}: {search.num_samples} trials of {cfg.scaling.num_workers} "
                 f"workers, {concurrent} at a time, {search.mode} {search.metric} over {', '.join(search.space)}",
                 out=out)
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", CONTROLLER_POLL_INTERVAL_S)
    trainable = ray.tune.with_parameters(trial_driver, base=cfg.to_dict(), per_worker=per_worker,
                                         worker_report_interval_ms=worker_report_interval_ms)
    tuner = ray.tune.Tuner(
        # The trial driver only waits on its TorchTrainer: no CPU, so the trials' workers get them all. Tune needs a
        # non-empty resource request, hence a token amount of memory.
        ray.tune.with_resources(trainable, {"CPU": 0, "memory": TRIAL_DRIVER_MEMORY}),
        param_space=param_space(search),
        tune_config=ray.tune.TuneConfig(metric=search.metric, mode=search.mode, num_samples=search.num_samples,
                                        max_concurrent_trials=concurrent),
        run_config=ray.tune.RunConfig(name="tuner", storage_path=str(tune_dir), verbose=0),
    )
    grid = tuner.fit()
    trials = []
    for result in grid:
        trials.append({
            "trial_id": (result.metrics or {}).get("trial_id") or (Path(result.path).name if result.path else None),
            "params": {k: result.config.get(k) for k in search.space},
            "metrics": {k: v for k, v in (result.metrics or {}).items() if k in ("epoch", "train_loss", "val_loss",
                                                                               "val_accuracy", "samples_per_s")},
            "error": root_cause(result.error) if result.error else None,
        })
    scored = [t for t in trials if t["error"] is None and search.metric in t["metrics"]]
    summary = {"status": "succeeded" if scored else "failed", "metric": search.metric, "mode": search.mode,
               "num_samples": search.num_samples, "max_concurrent_trials": concurrent, "trials": trials,
               "duration_s": round(time.time() - started, 3), "run_dir": str(tune_dir)}
    if scored:
        pick = max if search.mode == "max" else min
        best = pick(scored, key=lambda t: t["metrics"][search.metric])
        best_cfg = with_params(cfg.to_dict(), best["params"])
        best_cfg.run.name = f"{cfg.run.name}-best"
        records.write_atomic(tune_dir / "best_config.yaml",
            f"# the best of {len(trials)} trials of `raytrain tune` ({search.metric} "
            f"{best['metrics'][search.metric]:.4f}); train it with: raytrain run {tune_dir / 'best_config.yaml'}\n"
            + dump_yaml(best_cfg))
        summary.update(best=best, best_config=str(tune_dir / "best_config.yaml"))
    else:
        summary["error"] = "no trial reported " + search.metric + "; see the trials' result.json files"
    records.write_atomic(tune_dir / layout.TUNE_FILE, json.dumps(summary, indent=2) + "\n")
    records.write_result(summary)
    return summary
