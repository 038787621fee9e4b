"""raytrain's own collectives across a worker group, in one place: whether there is a group to talk to, rank 0's
value on every worker, every worker's value on every worker, and a small all-reduce of numbers. Objects travel
pickled over torch.distributed's default group; in one process (raytrain local, export, a group of one) each is
the identity. torch is imported when one runs."""

from __future__ import annotations

from typing import Any


def in_group() -> bool:
    """Whether this process is one of a process group of more than one."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def broadcast_from_rank0(value: Any, rank: int) -> Any:
    """Rank 0's value on every worker (what the others pass is ignored)."""
    if not in_group():
        return value
    import torch.distributed as dist

    box = [value if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_all(value: Any) -> list:
    """Every worker's value, in rank order, on every worker."""
    if not in_group():
        return [value]
    import torch.distributed as dist

    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def all_reduce(values: list[float], op: str, device: Any) -> list[float]:
    """The element-wise sum (op "sum") or maximum ("max") of every worker's numbers, as float64 on `device`."""
    if not in_group():
        return list(values)
    import torch
    import torch.distributed as dist

    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
    return tensor.tolist()
