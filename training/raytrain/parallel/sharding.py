"""Data parallelism for a model: DDP (Ray Train's prepare_model) or FSDP2 (`torch.distributed.fsdp.fully_shard`).

`scaling.strategy: fsdp` shards every parameter, gradient and optimizer state over the workers, so a model that
does not fit one worker trains on several. As in torchtune and torchtitan, each repeated block of the model is its
own FSDP unit (all-gathered just before its forward, resharded after it), then the root. Which modules are units:
`scaling.fsdp_wrap`, class names (or import paths) of the model's modules; empty: the modules kept in an
`nn.ModuleList` (a transformer's blocks), or else the root's direct children that hold parameters. A model with
none of them cannot be sharded this way and is refused before Ray starts (`check_units`, on the meta device).

Mixed precision follows train.mixed_precision: on a GPU, parameters are all-gathered and computed in bf16 while
gradients are reduced in fp32 (FSDP2's MixedPrecisionPolicy); fp16 needs a sharded gradient scaler and is refused
with fsdp. `scaling.activation_checkpointing` recomputes each unit's activations in backward (torch's checkpoint
wrapper, applied before sharding as torchtune does; the state dict's keys stay the model's own through
torch.distributed.checkpoint's state-dict API).

Model and optimizer state of a sharded model are read and set through `torch.distributed.checkpoint.state_dict`
(`model_state`/`load_model_state` here): full tensors for the single-file checkpointer and for export, DTensor
shards for the sharded checkpointer. torch is imported when a function runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from raytrain.errors import ConfigError
from raytrain.spec.fsdp_units import fsdp_wrap_problem

if TYPE_CHECKING:
    import torch
    from torch import nn

    from raytrain.spec.sections import RunConfig


def unit_classes(model: "nn.Module", names: list[str]) -> list[type]:
    """The module classes that become FSDP units, or [] where the model has none (see the module's doc)."""
    from torch import nn

    present = {type(m) for m in model.modules() if m is not model}
    if names:
        chosen = [cls for cls in present if cls.__name__ in names or f"{cls.__module__}.{cls.__qualname__}" in names]
        return sorted(chosen, key=lambda c: c.__name__)
    in_lists = {type(child) for m in model.modules() if isinstance(m, nn.ModuleList) for child in m}
    if in_lists:
        return sorted(in_lists, key=lambda c: c.__name__)
    return sorted({type(c) for c in model.children() if any(True for _ in c.parameters())}, key=lambda c: c.__name__)


def units(model: "nn.Module", classes: list[type]) -> list["nn.Module"]:
    """The model's modules of those classes, outermost only (a unit inside a unit is sharded with its parent)."""
    found: list = []
    for name, module in model.named_modules():
        if module is model or type(module) not in classes:
            continue
        if any(name.startswith(f"{outer}.") for outer, _ in found):
            continue
        found.append((name, module))
    return [module for _, module in found]


def check_units(model: "nn.Module", cfg: "RunConfig") -> None:
    """ConfigError, naming the key and the fix, where FSDP cannot shard this model by modules (built on meta)."""
    names = cfg.scaling.fsdp_wrap
    where = f"{cfg.source}: scaling.fsdp_wrap"
    classes = unit_classes(model, names)
    present = sorted({f"{type(m).__module__}.{type(m).__qualname__}" for m in model.modules() if m is not model})
    problem = fsdp_wrap_problem(names, present, type(model).__name__) if names else None
    if problem:  # the rule the config applies at load to a built-in model (spec/fsdp_units.py)
        raise ConfigError(f"{where}: {problem[0]}. Fix: {problem[1]}.")
    if not classes or not units(model, classes):
        raise ConfigError(f"{cfg.source}: scaling.strategy: fsdp shards a model by its submodules, and "
                          f"{type(model).__name__} has no submodule holding parameters. Fix: use "
                          f"scaling.strategy: ddp for this model, or build it from submodules (e.g. its layers in "
                          f"an nn.ModuleList).")


def mixed_precision_dtype(cfg: "RunConfig", device: "torch.device") -> Optional["torch.dtype"]:
    import torch

    if device.type != "cuda" or cfg.train.mixed_precision in ("off", "fp16"):
        return None
    return torch.bfloat16


def fully_shard_model(model: "nn.Module", cfg: "RunConfig", device: "torch.device", world_size: int) -> "nn.Module":
    """Move `model` to the device and shard it over the default process group's `world_size` ranks (FSDP2)."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if device.type == "cuda":  # the mesh and FSDP's streams are on the current device: this worker's GPU
        torch.cuda.set_device(device)
    model = model.to(device)
    classes = unit_classes(model, cfg.scaling.fsdp_wrap)
    blocks = units(model, classes)
    if cfg.scaling.activation_checkpointing:
        blocks = _checkpoint_activations(model, blocks)  # the wrappers are the units, as in torchtitan
    mesh = init_device_mesh(device.type, (world_size,))
    dtype = mixed_precision_dtype(cfg, device)
    policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32) if dtype else MixedPrecisionPolicy()
    reshard = cfg.scaling.fsdp_reshard_after_forward
    for block in blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)
    # The root holds what no unit does (embeddings, the head); it is not resharded after forward: backward needs it
    # first, as in torchtitan.
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=False)
    return model


def _checkpoint_activations(model: "nn.Module", blocks: list["nn.Module"]) -> list["nn.Module"]:
    """Replace each block by torch's checkpoint wrapper around it, in its parent; returns the wrappers."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    chosen, wrappers = {id(b) for b in blocks}, []
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if id(child) in chosen:
                wrapper = checkpoint_wrapper(child)
                parent.register_module(child_name, wrapper)
                wrappers.append(wrapper)
    return wrappers


def wrap_activation_checkpointing(model: "nn.Module", cfg: "RunConfig") -> "nn.Module":
    """DDP and a single process: the same units recompute their activations (scaling.activation_checkpointing)."""
    if cfg.scaling.activation_checkpointing:
        _checkpoint_activations(model, units(model, unit_classes(model, cfg.scaling.fsdp_wrap)))
    return model


def is_sharded(model: "nn.Module") -> bool:
    """Whether fully_shard was applied to the model (its parameters are DTensors)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


# --------------------------------------------------------------------------------------------------- state


def model_state(model: "nn.Module", *, full: bool) -> dict:
    """The model's state dict under its own parameter names (no DDP `module.` or checkpoint-wrapper prefix): full
    tensors on the CPU (a collective under FSDP: every rank calls it) or this rank's shards."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=full, cpu_offload=full))


def optimizer_state(model: "nn.Module", optimizer: Any, *, full: bool) -> dict:
    """The optimizer's state keyed by parameter names (so that it loads into any sharding of the same model)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=full, cpu_offload=full))


def load_model_state(model: "nn.Module", state: dict, *, full: bool) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=full, broadcast_from_rank0=False))


def load_optimizer_state(model: "nn.Module", optimizer: Any, state: dict, *, full: bool) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=full))
