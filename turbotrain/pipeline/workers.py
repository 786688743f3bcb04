"""How many decode workers (threads or processes) a CPU pipeline uses when nobody says."""
from __future__ import annotations

import os

import torch


def available_cores() -> int:
    """Cores this process may run on (respects taskset/cgroups' affinity, unlike os.cpu_count)."""
    return len(os.sched_getaffinity(0))


def choose_workers(requested: int | None, device: torch.device | str) -> tuple[int, str]:
    """(workers, why). An explicit request wins (the trainer passes its thread budget on CPU).

    On CPU every core decodes: decode is the bottleneck of a CPU input pipeline (~600 us per
    224 px photo vs a few us of glue), and the model's step waits for the batch anyway. On CUDA
    the cores are split between the ranks of this node, keeping one for the process that
    launches the GPU work (a starved launcher thread stalls the GPU).
    """
    if requested is not None:
        if requested < 0:
            raise ValueError(f"workers must be >= 0 (got {requested})")
        return requested, f"{requested} workers as requested"
    cores = available_cores()
    device = torch.device(device)
    if device.type == "cuda":
        gpus = max(1, torch.cuda.device_count())
        share = max(1, cores // gpus - 1)
        return share, f"{share} workers: {cores} cores / {gpus} GPU(s) on this node, minus 1 " \
                      f"for the process driving the GPU"
    return cores, f"{cores} workers: all cores this process may use decode on a CPU device"
