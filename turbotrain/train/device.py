"""Where and how fast to train: device, precision, compile and the CPU thread budget.

Each `choose_*` returns the decision with a reason; the trainer prints them at start and keeps
them in summary.json, so a run says why it is as fast (or slow) as it is.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from .errors import TrainError


@dataclass(frozen=True)
class Decision:
    value: object
    reason: str


@dataclass(frozen=True)
class GpuInfo:
    """What the CUDA decisions depend on; tests pass one for a GPU they do not have."""
    name: str
    capability: tuple[int, int]
    memory_bytes: int

    def __str__(self) -> str:
        major, minor = self.capability
        return (f"{self.name}, compute capability {major}.{minor}, "
                f"{self.memory_bytes / 2**30:.0f} GiB")


def describe_gpu(device: torch.device) -> GpuInfo | None:
    """The GPU behind `device` (None for a CPU device)."""
    if device.type != "cuda":
        return None
    props = torch.cuda.get_device_properties(device)
    return GpuInfo(props.name, (props.major, props.minor), int(props.total_memory))


# torch.compile's mode on CUDA. "default": Inductor's fused Triton kernels, one launch each.
# "reduce-overhead" adds CUDA graphs (a step's launches replayed as one), which removes the
# host's launch time but costs memory, a graph per input shape and a re-record after any
# change; "max-autotune-no-cudagraphs" benchmarks kernel variants at compile time (minutes for
# ResNet-50). Not measured on a GPU yet: `python bench/gpu_check.py --all` times all three
# side by side, and its numbers decide whether this default changes.
COMPILE_MODE = "default"


def choose_device(requested: str, local_rank: int = 0) -> Decision:
    cuda = torch.cuda.is_available()
    if requested == "cuda" and not cuda:
        raise TrainError("--device cuda was asked for but no CUDA device is available "
                         "(torch.cuda.is_available() is False)")
    if requested == "cpu" or (requested == "auto" and not cuda):
        why = "asked for" if requested == "cpu" else "no CUDA device found"
        return Decision(torch.device("cpu"), why)
    index = local_rank % torch.cuda.device_count()
    torch.cuda.set_device(index)
    name = torch.cuda.get_device_name(index)
    return Decision(torch.device("cuda", index),
                    "asked for" if requested == "cuda" else f"CUDA available ({name})")


def cpu_has_native_bf16() -> bool:
    """True when the CPU does bf16 math in hardware (AVX512-BF16 or AMX)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        flags = ""
    if flags:
        return "avx512_bf16" in flags or "amx_bf16" in flags
    # Not Linux: oneDNN's own check (it also says yes for emulated bf16 on plain AVX-512).
    return bool(torch.backends.mkldnn.is_available()
                and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def choose_precision(requested: str, device: torch.device,
                     gpu: GpuInfo | None = None) -> Decision:
    if requested != "auto":
        if requested == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
            raise TrainError("--precision bf16: this GPU has no bf16 support; use fp16 or auto")
        return Decision(requested, "asked for")
    if device.type == "cuda":
        gpu = gpu or describe_gpu(device)
        major, minor = gpu.capability
        if major >= 8:
            return Decision("bf16", f"{gpu.name}: compute capability {major}.{minor} >= 8.0 has "
                            "bf16 tensor cores; bf16 needs no loss scaling")
        return Decision("fp16", f"{gpu.name}: compute capability {major}.{minor} < 8.0: fp16 "
                        "tensor cores with a GradScaler")
    if cpu_has_native_bf16():
        return Decision("bf16", "CPU has native bf16 (avx512_bf16/amx): measured 1.5-2.3x "
                        "faster steps than fp32 on the dev box")
    return Decision("fp32", "CPU has no native bf16; emulated bf16 is not faster")


def choose_compile(requested: bool | None, device: torch.device,
                   gpu: GpuInfo | None = None) -> Decision:
    if requested is not None:
        return Decision(requested, "asked for")
    if device.type == "cuda":
        on = f" ({gpu.name})" if gpu else ""
        return Decision(True, f"CUDA{on}: Inductor fuses the elementwise work around each "
                        "convolution/matmul into one kernel: fewer launches and less memory "
                        "traffic per step; the compile warm-up is kept out of images/s")
    return Decision(False, "CPU: measured no speedup and a 35-60 s compile")


def choose_compile_mode(device: torch.device, gpu: GpuInfo | None = None) -> Decision:
    """torch.compile's `mode` for a compiled run (see COMPILE_MODE)."""
    if device.type != "cuda":
        return Decision(COMPILE_MODE, "CPU: CUDA graphs do not apply")
    on = f" on {gpu.name}" if gpu else ""
    return Decision(COMPILE_MODE, f"CUDA{on}: fused kernels without CUDA graphs; "
                    "'reduce-overhead' (CUDA graphs) and 'max-autotune-no-cudagraphs' are "
                    "timed against it by bench/gpu_check.py --all before either becomes the "
                    "default")


def choose_channels_last(requested: bool | None, is_conv_net: bool) -> Decision:
    if requested is not None:
        return Decision(requested, "asked for")
    if is_conv_net:
        return Decision(True, "conv net: NHWC convolutions skip layout conversions, and the "
                        "pipeline hands over NHWC uint8 anyway")
    return Decision(False, "not a conv net")


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

@dataclass(frozen=True)
class ThreadPlan:
    cores: int  # cores this rank may use
    workers: int  # pipeline workers (threads or processes)
    torch_threads: int  # torch intra-op threads
    reason: str


def available_cores(local_world_size: int = 1) -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, cores // max(1, local_world_size))


def plan_threads(device: torch.device, *, cores: int, workers: int | None,
                 threads: int | None, jpeg_fraction: float) -> ThreadPlan:
    """Splits the cores between pipeline workers and torch's intra-op threads.

    On CPU both compete for the same cores: measured on the 2-core dev box, two torch threads
    beside a busy loader made a step 30x slower, so the two numbers always add up to the cores.
    JPEG decode is the costly part of loading, so JPEG data gets half the cores; raw pixels
    (a memcpy and a crop) get a quarter. On CUDA the model runs on the GPU, so the loader gets
    all cores but the main thread's.
    """
    if workers is not None and threads is not None:
        over = workers + threads > cores
        return ThreadPlan(cores, workers, threads, "asked for" + (
            f" (oversubscribed: {workers} + {threads} > {cores} cores)" if over else ""))
    if device.type == "cuda":
        if workers is None:
            workers = max(1, cores - 1)
        if threads is None:
            threads = max(1, cores - workers)
        return ThreadPlan(cores, workers, threads,
                          f"CUDA: the model runs on the GPU, so {workers} of {cores} cores decode "
                          f"for it and {threads} torch thread(s) only launch its kernels")
    if workers is None and threads is None:
        share = 0.5 if jpeg_fraction > 0.1 else 0.25
        workers = max(1, round(cores * share)) if cores > 1 else 0
        why = (f"{'JPEG' if share == 0.5 else 'raw'} data: loader gets {share:.0%} of "
               f"{cores} cores, torch the rest, so they never compete")
    else:
        why = f"split of {cores} cores around the asked-for " + (
            "workers" if workers is not None else "threads")
    if workers is None:
        workers = max(0, cores - threads)
    if threads is None:
        threads = max(1, cores - workers)
    return ThreadPlan(cores, workers, threads, why)


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
