"""Rank and world size from torchrun's environment; rank 0 writes, every rank computes.

A plain `train` is world size 1 and never touches torch.distributed. Under
`torchrun --nproc-per-node N -m turbotrain train ...` (and `--nnodes/--rdzv-*` across machines)
the variables below are set, the process group is started (NCCL on CUDA, Gloo on CPU) with a
timeout, the model is wrapped in DistributedDataParallel, and the logged metrics and the eval
sums are reduced across ranks.

Failure handling: every collective is bounded by `--dist-timeout`. A rank that dies closes its
sockets, so the others' next collective fails at once ("connection reset"); a rank that hangs
makes theirs time out. Either way `train()` turns the collective's error into
DistributedFailure (one line, exit code 1) on every surviving rank; torchrun then stops the
rest. Under NCCL the timeout is enforced by its watchdog, which aborts the process.
"""
from __future__ import annotations

import contextlib
import datetime
import os
import re
import signal
import threading
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..errors import TrainError


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


def init_process_group(env: DistEnv, device: torch.device, timeout_seconds: int) -> None:
    if env.enabled and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo",
                                timeout=datetime.timedelta(seconds=timeout_seconds))


def destroy_process_group(env: DistEnv) -> None:
    if env.enabled and dist.is_initialized():
        try:
            dist.destroy_process_group()
        except RuntimeError:
            # Tearing down a group whose peer already died can fail too; the error that
            # matters (the collective's) is already on its way up.
            pass


def wrap_model(model: torch.nn.Module, env: DistEnv, device: torch.device) -> torch.nn.Module:
    """DDP on more than one rank (it broadcasts rank 0's weights when built)."""
    if not env.enabled:
        return model
    from torch.nn.parallel import DistributedDataParallel
    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids)


def convert_sync_batchnorm(model: torch.nn.Module, env: DistEnv,
                           device: torch.device) -> tuple[torch.nn.Module, str]:
    """`--sync-bn`: BatchNorm statistics over the global batch instead of each rank's share
    (worth it when a rank's micro-batch is small, below ~32 images). Returns (model, reason)."""
    if not env.enabled:
        return model, "off: one process, its BatchNorm already sees the whole batch"
    if device.type != "cuda":
        raise TrainError("--sync-bn needs CUDA: torch's SyncBatchNorm does not run on CPU "
                         "tensors; drop --sync-bn for a CPU run")
    converted = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    return converted, f"on: BatchNorm statistics over all {env.world_size} ranks' batches"


def sync_context(model: torch.nn.Module, will_step: bool):
    """Skips DDP's gradient all-reduce on the micro-batches that do not end in a step."""
    if will_step or not hasattr(model, "no_sync"):
        return contextlib.nullcontext()
    return model.no_sync()


def all_reduce_sum(values: torch.Tensor, env: DistEnv) -> torch.Tensor:
    if env.enabled:
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values


def all_reduce_max(values: torch.Tensor, env: DistEnv) -> torch.Tensor:
    if env.enabled:
        dist.all_reduce(values, op=dist.ReduceOp.MAX)
    return values


def max_over_ranks(value: float, env: DistEnv, device: torch.device) -> float:
    """The largest of every rank's `value`, on every rank: one all-reduce of a float64 on
    `device` (NCCL needs a CUDA tensor), which holds integers up to 2**53 exactly."""
    if not env.enabled:
        return value
    values = torch.tensor([value], dtype=torch.float64, device=device)
    return float(all_reduce_max(values, env))


def min_over_ranks(value: float, env: DistEnv, device: torch.device) -> float:
    """The smallest of every rank's `value`, on every rank (max_over_ranks of its negation)."""
    return -max_over_ranks(-value, env, device)


def mean_loss_and_any_stop(loss_sum: torch.Tensor, stop_requested: bool,
                           env: DistEnv) -> tuple[float, bool]:
    """(a log window's loss sum averaged over ranks, whether any rank was asked to stop), in
    one all-reduce at a log point: every rank then takes the same divergence and stop
    decisions, and stops at the same step."""
    if not env.enabled:
        return float(loss_sum), stop_requested
    stop = torch.tensor(float(stop_requested), dtype=torch.float64, device=loss_sum.device)
    values = torch.stack([loss_sum.detach().to(torch.float64), stop])
    total, stops = all_reduce_sum(values, env).tolist()
    return total / env.world_size, stops > 0


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


# ---------------------------------------------------------------------------- failures

# Gloo raises a plain RuntimeError whose text starts with its source path, e.g.
# "[.../third_party/gloo/gloo/transport/tcp/pair.cc:545] Read error ...: Connection reset by
# peer"; NCCL and the c10d store raise torch.distributed.DistError subclasses.
_GLOO_SOURCE = "/gloo/"
# ...but a pair gloo closed itself raises these bare (DDP's buffer broadcast in a forward met
# one when the other rank stopped answering): its own texts, from torch 2.14's libtorch_cpu.
_GLOO_BARE_MESSAGES = ("Application timeout caused pair closure", "Connection closed by peer")
_SOURCE_PREFIX = re.compile(r"^\[[^\]]*\]\s*")


def is_collective_failure(exc: BaseException) -> bool:
    if isinstance(exc, dist.DistError):
        return True
    text = str(exc) if isinstance(exc, RuntimeError) else ""
    return _GLOO_SOURCE in text or any(text.startswith(m) for m in _GLOO_BARE_MESSAGES)


def report_collective_failures_before_sigterm(env: DistEnv):
    """An ExitStack exit callback: once a collective has failed, SIGTERM is ignored so that this
    rank lives to print why. torchrun SIGTERMs the surviving ranks within ~0.1 s of one dying
    (and SIGKILLs them 30 s later), which otherwise kills them mid-unwinding, silently."""
    def on_exit(exc_type, exc, traceback) -> bool:
        if (env.enabled and exc is not None and is_collective_failure(exc)
                and threading.current_thread() is threading.main_thread()):
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        return False  # the error goes on up
    return on_exit


def explain_collective_failure(exc: BaseException, env: DistEnv, timeout_seconds: int,
                               run_dir=None) -> str:
    """The one line every surviving rank prints."""
    detail = _SOURCE_PREFIX.sub("", str(exc).strip().split("\n", 1)[0])
    detail = detail.split(". ", 1)[0].rstrip(".")  # gloo appends a generic hint after a period
    if "timed out" in detail.lower() or "timeout" in detail.lower():
        what = (f"no answer from another rank within --dist-timeout {timeout_seconds} s (a rank "
                "hung or is far slower, or the network stalled)")
    else:
        what = "lost the connection to another rank (it died, or the network failed)"
    resume = (f"continue with --out {run_dir} --resume" if run_dir else
              "continue with --out RUNDIR --resume")
    return (f"rank {env.rank} of {env.world_size}: {what} [{detail}]; if another rank failed "
            f"first, its error above says why; the last checkpoint is kept: {resume}")
