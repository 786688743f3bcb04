"""The one worker policy: how a rank's CPU cores are split between pipeline workers (threads or
processes) and torch's intra-op threads.

`split_cores` is the rule (train/plan.py asks it for every run, `tune` for every row, eval and
predict through device.plan_threads); `after_pipeline` gives torch the cores a pipeline that
loads in the training process leaves; `choose_workers` is what a pipeline built without a
budget (the `bench` command, a notebook) uses: the same rule, with no model beside the loader.
The core count is `turbotrain.host.available_cores` (the affinity), shared by the ranks of a
node.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..host import available_cores, ranks_on_this_node

# JPEG decode is the costly part of loading, so JPEG data gets this share of a CPU run's cores;
# raw pixels (a memcpy and a crop) get RAW_SHARE. Above JPEG_DATA of the samples: JPEG data.
JPEG_SHARE, RAW_SHARE, JPEG_DATA = 0.5, 0.25, 0.1


@dataclass(frozen=True)
class ThreadPlan:
    cores: int  # cores this rank may use
    workers: int  # pipeline workers (threads or processes)
    torch_threads: int  # torch intra-op threads
    reason: str


def split_cores(device_type: str, *, cores: int, workers: int | None, threads: int | None,
                jpeg_fraction: float, beside_model: bool = True) -> ThreadPlan:
    """Splits a rank's `cores` between pipeline workers and torch's intra-op threads.

    On CPU both compete for the same cores: measured on the 2-core dev box, two torch threads
    beside a busy loader made a step 30x slower, so the two numbers always add up to the cores.
    JPEG data gets half the cores, raw pixels a quarter. On CUDA the model runs on the GPU, so
    the loader gets all cores but the main thread's (a starved launcher thread stalls the GPU).
    With no model beside it (`beside_model=False`: a pipeline measured or used alone) every core
    of a CPU device decodes.
    """
    if workers is not None and threads is not None:
        over = workers + threads > cores
        return ThreadPlan(cores, workers, threads, "asked for" + (
            f" (oversubscribed: {workers} + {threads} > {cores} cores)" if over else ""))
    if device_type == "cuda":
        if workers is None:
            workers = max(1, cores - 1)
        if threads is None:
            threads = max(1, cores - workers)
        return ThreadPlan(cores, workers, threads,
                          f"CUDA: the model runs on the GPU, so {workers} of {cores} cores decode "
                          f"for it and {threads} torch thread(s) only launch its kernels")
    if not beside_model and workers is None:
        return ThreadPlan(cores, cores, threads or 1, f"{cores} workers: all {cores} cores this "
                          "process may use decode (no model trains beside the loader)")
    if workers is None and threads is None:
        share = JPEG_SHARE if jpeg_fraction > JPEG_DATA else RAW_SHARE
        workers = max(1, round(cores * share)) if cores > 1 else 0
        why = (f"{'JPEG' if share == JPEG_SHARE else 'raw'} data: loader gets {share:.0%} of "
               f"{cores} cores, torch the rest, so they never compete")
    else:
        why = f"split of {cores} cores around the asked-for " + (
            "workers" if workers is not None else "threads")
    if workers is None:
        workers = max(0, cores - threads)
    if threads is None:
        threads = max(1, cores - workers)
    return ThreadPlan(cores, workers, threads, why)


def after_pipeline(plan: ThreadPlan, used: int | None, name: str = "",
                   device_type: str = "cpu") -> ThreadPlan:
    """A pipeline that loads in the training process (resident: uint8 already on the device)
    uses fewer CPU workers (`used`, its `cpu_workers`) than planned; its cores go to torch."""
    if used is None or used >= plan.workers:
        return plan
    threads = max(1, plan.cores - used)
    if device_type == "cuda":
        return ThreadPlan(plan.cores, used, threads,
                          f"CUDA: the {name} pipeline uses {used} CPU worker(s) (its batches "
                          f"are made on the GPU), so torch keeps all {threads} cores; they "
                          "only launch kernels")
    return ThreadPlan(plan.cores, used, threads,
                      f"the pipeline uses {used} worker(s): torch gets the other cores")


def choose_workers(requested: int | None, device: torch.device | str) -> tuple[int, str]:
    """(workers, why) for a pipeline. An explicit request wins: the trainer always passes its
    plan's. Otherwise `split_cores` for this rank's share of the cores with no model beside the
    loader: on CPU every core decodes (decode is the bottleneck of a CPU input pipeline, ~600 us
    per 224 px photo vs a few us of glue); on CUDA all but one, kept for the process that
    launches the GPU work."""
    if requested is not None:
        if requested < 0:
            raise ValueError(f"workers must be >= 0 (got {requested})")
        return requested, f"{requested} workers as requested"
    ranks = ranks_on_this_node()
    plan = split_cores(torch.device(device).type, cores=max(1, available_cores() // ranks),
                       workers=None, threads=None, jpeg_fraction=1.0, beside_model=False)
    return plan.workers, plan.reason
