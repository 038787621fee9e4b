"""The two kinds of loop a run config names: a `raytrain.Session` loop (`my_loop(session, **kwargs)`), or a Ray Train
function (`train_func(config)` or `train_func()`, its settings under `train_loop_config`; the contract it runs under
on the workers is raytrain.worker.raytrain_function). Recognised here, without torch or Ray, by the config loader,
the builders and the CLI."""

from __future__ import annotations

import inspect
from typing import Any, Callable, Optional

RunConfig = Any  # raytrain.spec.config imports this module

TRAIN_LOOP_CONFIG = "train_loop_config"
FIXED_ON_RESUME = "fixed_on_resume"  # the run config may declare it for a function it cannot edit
# TorchTrainer's dataset_config=DataConfig(datasets_to_split=...): which of the data component's Ray Datasets each
# worker gets a shard of (default "all", as Ray Train's); the others every worker reads whole.
DATASETS_TO_SPLIT = "datasets_to_split"
RAY_TRAIN_PARAMETER = "config"


def positional_parameters(target: Callable) -> Optional[list[inspect.Parameter]]:
    try:
        parameters = list(inspect.signature(target).parameters.values())
    except (TypeError, ValueError):
        return None
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.KEYWORD_ONLY) for p in parameters):
        return None
    return parameters


def is_ray_train_function(target: Callable, loop_config_given: bool = False) -> bool:
    """Ray Train's contract: no parameter, or one named `config` (any one positional parameter when the section
    gives train_loop_config). A raytrain.Session loop takes `session` first."""
    if inspect.isclass(target):
        return False
    parameters = positional_parameters(target)
    if parameters is None:
        return False
    if not parameters:
        return True
    if len(parameters) != 1:
        return False
    return parameters[0].name == RAY_TRAIN_PARAMETER or loop_config_given


def describe_parameters(target: Callable) -> str:
    try:
        parameters = list(inspect.signature(target).parameters)
    except (TypeError, ValueError):
        return "an unknown signature"
    return "no parameter" if not parameters else f"({', '.join(parameters)})"


def is_ray_train_loop(cfg: RunConfig) -> bool:
    """Whether the run config's loop is a Ray Train function (config.py stores its train_loop_config always)."""
    return TRAIN_LOOP_CONFIG in cfg.loop.kwargs


def local_refusal(cfg: RunConfig) -> Optional[str]:
    if not is_ray_train_loop(cfg):
        return None
    return (f"{cfg.source}: loop {cfg.loop.path} is a Ray Train function (ray.train.report, get_context, "
            f"prepare_model need Ray Train's worker context), which `raytrain local` does not emulate. Fix: run it "
            f"with `raytrain run` (an embedded Ray on this machine; --set scaling.num_workers=1 for one process), or "
            f"write the loop against raytrain.Session to train without Ray.")
