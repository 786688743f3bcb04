"""Carrying the device decisions out in this process: the current CUDA device, autocast, the
grad scaler, torch's threads and the peak-memory readings.

The decisions themselves (device, precision, compile, channels_last) are made in one place,
plan/device_choice.py, from a Machine that plan/hardware.py detects; `use_device` is the one
place the process's current CUDA device is set.
"""
from __future__ import annotations

import contextlib

import torch

from turbotrain import host
from turbotrain.pipeline.workers import ThreadPlan, split_cores

__all__ = ["ThreadPlan"]


def use_device(device: torch.device) -> None:
    """Makes `device` this process's current CUDA device (train: LOCAL_RANK's GPU), so that
    index-less CUDA calls (NCCL, the batch finder, torch.compile) use it."""
    if device.type == "cuda":
        torch.cuda.set_device(device)


def autocast_context(device: torch.device, precision: str):
    """Forward and loss run inside this; fp32 gets a no-op context."""
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def make_grad_scaler(device: torch.device, precision: str) -> torch.amp.GradScaler:
    # Only fp16 needs loss scaling: its 5-bit exponent underflows small gradients; bf16 has
    # fp32's exponent range. A disabled scaler is a pass-through with an (empty) state_dict.
    return torch.amp.GradScaler(device.type, enabled=precision == "fp16")


# ---------------------------------------------------------------------------- thread budget

def available_cores(local_world_size: int = 1) -> int:
    """This rank's share of the cores (turbotrain.host.available_cores: the one count)."""
    return max(1, host.available_cores() // max(1, local_world_size))


def plan_threads(device: torch.device, *, cores: int, workers: int | None,
                 threads: int | None, jpeg_fraction: float) -> ThreadPlan:
    """The one worker policy (pipeline/workers.split_cores) for a model on `device`."""
    return split_cores(torch.device(device).type, cores=cores, workers=workers, threads=threads,
                       jpeg_fraction=jpeg_fraction)


def apply_torch_threads(count: int) -> None:
    if torch.get_num_threads() != count:
        torch.set_num_threads(count)


def peak_memory_bytes(device: torch.device) -> int:
    """Peak GPU memory allocated by torch on CUDA; the process's peak RSS on CPU."""
    if device.type == "cuda":
        return peak_device_memory_bytes(device)
    return peak_host_memory_bytes()


def peak_host_memory_bytes() -> int:
    """Peak resident memory of this process (worker processes not included); 0 off Linux/mac."""
    try:
        import resource
    except ImportError:  # Windows
        return 0
    import sys
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss) if sys.platform == "darwin" else int(rss) * 1024  # bytes on macOS, else KiB


def peak_device_memory_bytes(device: torch.device) -> int | None:
    """Peak memory torch allocated on the GPU; None on CPU (see the host peak instead)."""
    if device.type != "cuda":
        return None
    return int(torch.cuda.max_memory_allocated(device))


def device_memory_bytes(device: torch.device) -> int | None:
    if device.type != "cuda":
        return None
    return int(torch.cuda.get_device_properties(device).total_memory)
