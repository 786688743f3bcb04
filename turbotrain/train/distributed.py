"""Rank and world size from torchrun's environment; rank 0 writes, every rank computes.

A plain `train` is world size 1 and never touches torch.distributed. Under
`torchrun --nproc-per-node N -m turbotrain.cli train ...` the variables below are set, the
process group is started, the model is wrapped in DistributedDataParallel and the eval sums are
all-reduced.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def dist_env_from_environ() -> DistEnv:
    env = os.environ
    world = int(env.get("WORLD_SIZE", 1))
    return DistEnv(rank=int(env.get("RANK", 0)), world_size=world,
                   local_rank=int(env.get("LOCAL_RANK", 0)),
                   local_world_size=int(env.get("LOCAL_WORLD_SIZE", world)))


def init_process_group(env: DistEnv, device: torch.device) -> None:
    if env.enabled and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")


def destroy_process_group(env: DistEnv) -> None:
    if env.enabled and dist.is_initialized():
        dist.destroy_process_group()


def wrap_model(model: torch.nn.Module, env: DistEnv, device: torch.device) -> torch.nn.Module:
    """DDP on more than one rank (it broadcasts rank 0's weights when built)."""
    if not env.enabled:
        return model
    from torch.nn.parallel import DistributedDataParallel
    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids)


def sync_context(model: torch.nn.Module, will_step: bool):
    """Skips DDP's gradient all-reduce on the micro-batches that do not end in a step."""
    if will_step or not hasattr(model, "no_sync"):
        return contextlib.nullcontext()
    return model.no_sync()


def all_reduce_sum(values: torch.Tensor, env: DistEnv) -> torch.Tensor:
    if env.enabled:
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values


def barrier(env: DistEnv) -> None:
    if env.enabled:
        dist.barrier()


def broadcast_object(value, env: DistEnv):
    """Rank 0's `value` on every rank (for example the auto-named run folder)."""
    if not env.enabled:
        return value
    holder = [value]
    dist.broadcast_object_list(holder, src=0)
    return holder[0]
