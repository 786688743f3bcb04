"""The one place the device decisions are made: where a rank runs, in what precision, compiled
or not (and how), in what memory format. Pure functions of a described machine (machine.py's
`Machine`, which hardware.py fills in for this one), so a test hands them "an H100 with a CPU
without bf16" or "two A100s in one node" and checks every choice. `train` (plan/core.py) and
eval/predict/export (use/inference.py) ask `device_choices`; nothing else decides these.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import TrainError
from .decision import Decision
from .machine import GpuInfo, Machine

# torch.compile's mode on CUDA. "default": Inductor's fused Triton kernels, one launch each.
# "reduce-overhead" adds CUDA graphs (a step's launches replayed as one), which removes the
# host's launch time but costs memory, a graph per input shape and a re-record after any
# change; "max-autotune-no-cudagraphs" benchmarks kernel variants at compile time (minutes for
# ResNet-50). Not measured on a GPU yet: `python bench/gpu_check.py --all` times all three
# side by side, and its numbers decide whether this default changes.
COMPILE_MODE = "default"


def pick_device(requested: str, gpus: tuple[GpuInfo, ...], local_rank: int = 0) -> Decision:
    """The rank's device: `cuda:LOCAL_RANK % GPUs` when CUDA is there (or asked for)."""
    import torch
    if requested == "cuda" and not gpus:
        raise TrainError("--device cuda was asked for but no CUDA device is available "
                         "(torch.cuda.is_available() is False)")
    if requested == "cpu" or (requested == "auto" and not gpus):
        return Decision(torch.device("cpu"), "asked for" if requested == "cpu" else
                        "no CUDA device found")
    index = local_rank % len(gpus)
    return Decision(torch.device("cuda", index), "asked for" if requested == "cuda" else
                    f"CUDA available ({gpus[index].name})")


def pick_precision(requested: str, device_type: str, gpu: GpuInfo | None, cpu_bf16: bool
                   ) -> Decision:
    if requested != "auto":
        if requested == "bf16" and device_type == "cuda" and gpu is not None and not gpu.bf16:
            raise TrainError("--precision bf16: this GPU has no bf16 support; use fp16 or auto")
        slow = slow_precision(requested, device_type, cpu_bf16)
        return Decision(requested, "asked for" + (f" ({slow})" if slow else ""), warning=slow)
    if device_type == "cuda":
        major, minor = gpu.capability
        if major >= 8:
            return Decision("bf16", f"{gpu.name}: compute capability {major}.{minor} >= 8.0 has "
                            "bf16 tensor cores; bf16 needs no loss scaling")
        return Decision("fp16", f"{gpu.name}: compute capability {major}.{minor} < 8.0: fp16 "
                        "tensor cores with a GradScaler")
    if cpu_bf16:
        return Decision("bf16", "CPU has native bf16 (avx512_bf16/amx): measured 1.5-2.3x "
                        "faster steps than fp32 on the dev box")
    return Decision("fp32", "CPU has no native bf16; emulated bf16 is not faster")


def slow_precision(precision: str, device_type: str, cpu_bf16: bool) -> str:
    """Why `precision` is slower than fp32 on this CPU ("" when it is not): emulated math.
    Measured on an AVX2 CPU (issue 36): ResNet-18 3 img/s in bf16 vs 9 in fp32, one fp16
    step 41 s vs 7 s."""
    if device_type != "cpu" or precision == "fp32" or (precision == "bf16" and cpu_bf16):
        return ""
    what = "has no native bf16 (avx512_bf16/amx_bf16)" if precision == "bf16" else \
        "runs fp16 emulated"
    return (f"--precision {precision} is 3-6x slower than fp32 here: this CPU {what}; use "
            f"--precision auto or fp32")


def pick_compile(requested: bool | None, device_type: str, gpu: GpuInfo | None) -> Decision:
    if requested is not None:
        return Decision(requested, "asked for")
    if device_type == "cuda":
        on = f" ({gpu.name})" if gpu else ""
        return Decision(True, f"CUDA{on}: Inductor fuses the elementwise work around each "
                        "convolution/matmul into one kernel: fewer launches and less memory "
                        "traffic per step; the compile warm-up is kept out of images/s")
    return Decision(False, "CPU: measured no speedup and a 35-60 s compile")


def pick_compile_mode(device_type: str, gpu: GpuInfo | None) -> Decision:
    """torch.compile's `mode` for a compiled run (see COMPILE_MODE)."""
    if device_type != "cuda":
        return Decision(COMPILE_MODE, "CPU: CUDA graphs do not apply")
    on = f" on {gpu.name}" if gpu else ""
    return Decision(COMPILE_MODE, f"CUDA{on}: fused kernels without CUDA graphs; "
                    "'reduce-overhead' (CUDA graphs) and 'max-autotune-no-cudagraphs' are "
                    "timed against it by bench/gpu_check.py --all before either becomes the "
                    "default")


def pick_channels_last(requested: bool | None, is_conv_net: bool) -> Decision:
    if requested is not None:
        return Decision(requested, "asked for")
    if is_conv_net:
        return Decision(True, "conv net: NHWC convolutions skip layout conversions, and the "
                        "pipeline hands over NHWC uint8 anyway")
    return Decision(False, "not a conv net")


@dataclass(frozen=True)
class DeviceChoices:
    """Every device decision for one rank, each with its reason."""
    device: Decision  # torch.device
    precision: Decision  # "fp32" | "bf16" | "fp16"
    compile: Decision  # bool
    compile_mode: Decision | None  # torch.compile's mode; None when not compiled
    channels_last: Decision | None  # None when the model (conv net or not) is not known yet
    gpu: GpuInfo | None  # the rank's GPU the choices were made for (None on a CPU device)


def device_choices(machine: Machine, *, device: str = "auto", precision: str = "auto",
                   compile: bool | None = None, channels_last: bool | None = None,
                   conv_net: bool | None = None) -> DeviceChoices:
    """The device decisions for `machine`'s rank (machine.local_rank), from what was asked
    ("auto"/None: decide). The CPU's bf16 is the CPU's own flag, whatever the GPUs are."""
    where = pick_device(device, machine.gpus, machine.local_rank)
    kind = where.value.type
    gpu = machine.gpu if kind == "cuda" else None
    compiled = pick_compile(compile, kind, gpu)
    return DeviceChoices(
        device=where, precision=pick_precision(precision, kind, gpu, machine.cpu_bf16),
        compile=compiled, compile_mode=pick_compile_mode(kind, gpu) if compiled.value else None,
        channels_last=None if conv_net is None else pick_channels_last(channels_last, conv_net),
        gpu=gpu)
