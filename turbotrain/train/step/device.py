"""Where and how fast to train, for this process: the device, its GPU, precision, compile and
the CPU thread budget, with the trainer's autocast, grad scaler and peak-memory readings.

The rules themselves live in plan/rules.py (`train` plans with them for a Machine, see
plan/__init__.py). The `choose_*` here apply them to the machine this process runs on, for the
commands that load a model without planning a run (eval, predict, export) and for tests;
`use_device` is the one place the process's current CUDA device is set.
"""
from __future__ import annotations

import contextlib

import torch

from turbotrain import host
from turbotrain.pipeline.workers import ThreadPlan, split_cores

from ..plan import rules
from ..plan.machine import GpuInfo
from ..plan.rules import COMPILE_MODE, Decision

__all__ = ["COMPILE_MODE", "Decision", "GpuInfo", "ThreadPlan"]


def describe_gpu(device: torch.device) -> GpuInfo | None:
    """The GPU behind `device` (None for a CPU device)."""
    if device.type != "cuda":
        return None
    props = torch.cuda.get_device_properties(device)
    return GpuInfo(props.name, (props.major, props.minor), int(props.total_memory),
                   bf16=props.major >= 8)


def choose_device(requested: str, local_rank: int = 0) -> Decision:
    """plan.rules.device for this process's CUDA devices (it does not make the device current:
    use_device does)."""
    gpus = ()
    if requested != "cpu" and torch.cuda.is_available():
        gpus = tuple(describe_gpu(torch.device("cuda", i))
                     for i in range(torch.cuda.device_count()))
    return rules.device(requested, gpus, local_rank)


def use_device(device: torch.device) -> None:
    """Makes `device` this process's current CUDA device (train: LOCAL_RANK's GPU), so that
    index-less CUDA calls (NCCL, the batch finder, torch.compile) use it."""
    if device.type == "cuda":
        torch.cuda.set_device(device)


def cpu_has_native_bf16() -> bool:
    """True when the CPU does bf16 math in hardware (AVX512-BF16 or AMX)."""
    cpu = host.cpu_info()
    if cpu.read:
        return "avx512_bf16" in cpu.flags or "amx_bf16" in cpu.flags
    # Not Linux: oneDNN's own check (it also says yes for emulated bf16 on plain AVX-512).
    return bool(torch.backends.mkldnn.is_available()
                and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def choose_precision(requested: str, device: torch.device,
                     gpu: GpuInfo | None = None) -> Decision:
    if device.type == "cuda":
        if requested == "auto":
            gpu = gpu or describe_gpu(device)
        elif requested == "bf16":  # emulated before compute capability 8.0: torch knows
            gpu = GpuInfo("", (0, 0), 0, bf16=torch.cuda.is_bf16_supported())
        return rules.precision(requested, "cuda", gpu, cpu_bf16=False)
    # (also for bf16 asked for: the decision then says whether it is emulated, and slow)
    return rules.precision(requested, device.type, None,
                           cpu_bf16=requested in ("auto", "bf16") and cpu_has_native_bf16())


def choose_compile(requested: bool | None, device: torch.device,
                   gpu: GpuInfo | None = None) -> Decision:
    return rules.compile_model(requested, device.type, gpu)


def choose_compile_mode(device: torch.device, gpu: GpuInfo | None = None) -> Decision:
    """torch.compile's `mode` for a compiled run (see COMPILE_MODE)."""
    return rules.compile_mode(device.type, gpu)


def choose_channels_last(requested: bool | None, is_conv_net: bool) -> Decision:
    return rules.channels_last(requested, is_conv_net)


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
