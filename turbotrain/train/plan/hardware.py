"""The one reader of this machine's devices: what the device decisions (device_choice.py) need to
know, read once per command and handed on as a `Machine` (machine.py).

* the CPU's native bf16 (avx512_bf16 or amx_bf16 in /proc/cpuinfo; oneDNN's check off Linux);
* each GPU's name, compute capability and total memory, from its properties, which need no
  CUDA context on that GPU;
* this rank's GPU only: its free memory and whether bf16 works there at all (emulated before
  compute capability 8.0), the two facts that need a context. A context costs ~500 MB of that
  GPU's memory, so a rank never makes one on the other ranks' GPUs (nor `info` on every GPU).

Everything else decides from the description: a test hands `Machine(...)` a GPU it does not have.
"""
from __future__ import annotations

import functools
import sys

import torch

from turbotrain import host
from turbotrain.pipeline.auto import installed_engines
from turbotrain.pipeline.registry import pipeline_names

from .machine import GpuInfo, Machine


@functools.lru_cache(maxsize=1)
def cpu_native_bf16() -> bool:
    """True when the CPU does bf16 math in hardware (AVX512-BF16 or AMX). Read once."""
    return _bf16_from(host.cpu_info())


def _bf16_from(cpu: host.CpuInfo) -> bool:
    if cpu.read:
        return "avx512_bf16" in cpu.flags or "amx_bf16" in cpu.flags
    # Not Linux: oneDNN's own check (it also says yes for emulated bf16 on plain AVX-512).
    return bool(torch.backends.mkldnn.is_available()
                and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def detect_gpus(local_rank: int = 0) -> tuple[GpuInfo, ...]:
    """This node's CUDA devices; only GPU `local_rank % count` is asked what needs a context."""
    if not torch.cuda.is_available():
        return ()
    count = torch.cuda.device_count()
    mine = local_rank % count
    return tuple(_gpu(index, measured=index == mine) for index in range(count))


def _gpu(index: int, measured: bool) -> GpuInfo:
    props = torch.cuda.get_device_properties(index)
    native = props.major >= 8
    if not measured:
        return GpuInfo(props.name, (props.major, props.minor), int(props.total_memory),
                       bf16=native)
    with torch.cuda.device(index):
        free = int(torch.cuda.mem_get_info(index)[0])
        bf16 = native or torch.cuda.is_bf16_supported()
    return GpuInfo(props.name, (props.major, props.minor), int(props.total_memory), free, bf16)


def detect_machine(env, *, gpus: bool = True) -> Machine:
    """This machine, seen from this process. `env`: torchrun's ranks (a DistEnv:
    step/distributed.py's dist_env_from_environ, or the process group's). Reads the affinity,
    /proc/meminfo and the cgroup limit, /proc/cpuinfo (once), the GPUs (detect_gpus) unless
    `gpus` is False: a run asked onto the CPU (`--device cpu`) leaves CUDA untouched."""
    cpu = host.cpu_info()
    return Machine(cores=host.available_cores(), ram_bytes=host.available_ram(),
                   gpus=detect_gpus(env.local_rank) if gpus else (), cpu_model=cpu.model, cpu_flags=cpu.flags,
                   cpu_bf16=cpu_native_bf16(), world_size=env.world_size,
                   local_world_size=env.local_world_size, local_rank=env.local_rank,
                   pipelines=tuple(pipeline_names()), installed=installed_engines(),
                   platform=sys.platform)

