"""The largest micro-batch that fits in memory, for `train --batch-size auto` and `tune`.

* CUDA: real training steps (the trainer's StepEngine from loop.make_engine: forward,
  backward through the fp16 GradScaler, the fused optimizer step; twice so the optimizer state
  exists) on a throwaway copy of the model, under a memory cap of CUDA_SEARCH_FRACTION of the
  device less what the pipeline will hold; the cap is tried first (the common case: it fits,
  one trial), then a bisection with out-of-memory recovery (~log2(limit) trials).
* CPU: no trial can fail safely (the kernel's OOM killer ends the process instead of raising),
  so the peak is estimated: the bytes autograd saves for backward, measured with
  saved-tensors hooks at batches 2 and 4 (their difference removes the weights, which are saved
  too), times BACKWARD_FACTOR, plus weights, gradients and optimizer state.

All ranks of a torchrun job take the smallest answer, so they train the same micro-batch.
"""
from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from turbotrain.pipeline.resident import memory_budget

from ..step.device import autocast_context, make_grad_scaler
from ..step.distributed import min_over_ranks
from ..step.loop import StepSettings, make_engine

MAX_BATCH = 4096  # the search's ceiling (tune); `train` searches up to its preferred batch
# Peak step memory / bytes saved for backward, measured on the dev box (ResNet-18, CPU, fp32 and
# bf16, 32-128 px, batches 16-128): 1.43-1.57 (gradients of activations live during backward).
BACKWARD_FACTOR = 1.6
# Share of the GPU the search may use: 10 % stays free for allocator fragmentation, cuDNN
# workspaces chosen later by benchmark mode, DDP's gradient buckets and DALI's buffers.
CUDA_SEARCH_FRACTION = 0.9
ALIGN = 8  # batches above this are rounded down to a multiple: tensor-core/vector friendly


@dataclass(frozen=True)
class BatchFit:
    batch_size: int  # the largest that fits, at most `limit`
    limit: int
    how: str  # one line: how it was found


def largest_fitting(fits: Callable[[int], bool], limit: int) -> int:
    """Largest b in [1, limit] with fits(b), assuming fitting is monotonic; 0 if none does.
    Tries `limit` first, then bisects; a bisected result above ALIGN is rounded down to a
    multiple of it (a smaller batch than one that fits always fits)."""
    if limit < 1:
        return 0
    if fits(limit):
        return limit
    good, bad = 0, limit
    while bad - good > 1:
        middle = (good + bad) // 2
        if fits(middle):
            good = middle
        else:
            bad = middle
    return _aligned(good)


def _aligned(batch: int) -> int:
    return batch - batch % ALIGN if batch > ALIGN else batch


def is_out_of_memory(exc: BaseException) -> bool:
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    # cuDNN/cuBLAS report allocation failures as plain RuntimeErrors.
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("out of memory" in text
                                              or "CUDNN_STATUS_ALLOC_FAILED" in text)


def release_memory(device: torch.device) -> None:
    """Frees what a failed trial left cached. Called *after* the except block: inside it, the
    traceback still holds the trial's tensors, and empty_cache() would free nothing."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------- trials

class TrialSteps:
    """`fits(b)`: two training steps of a throwaway model at micro-batch b; False on OOM.
    The steps are the trainer's own (loop.make_engine: the fused optimizer on CUDA, the
    GradScaler under fp16), so the trial's memory peak is a run's."""

    def __init__(self, build: Callable[[], nn.Module], settings: StepSettings, *,
                 image_size: int, num_classes: int):
        model = build().to(settings.device, memory_format=settings.memory_format)
        # A tiny LR: the trial steps must not matter, only their memory.
        self.engine = make_engine(model, settings.replace(lr=1e-6))
        self.image_size, self.num_classes, self.device = image_size, num_classes, settings.device
        self.precision = settings.precision
        self.trials: list[tuple[int, bool]] = []

    def _steps(self, batch: int) -> None:
        images = torch.randint(0, 256, (batch, 3, self.image_size, self.image_size),
                               dtype=torch.uint8, device=self.device)
        labels = torch.randint(0, self.num_classes, (batch,), device=self.device)
        for step in range(2):  # the second step has the optimizer state of the first
            self.engine.micro_step(images, labels, will_step=True)
            self.engine.optimizer_step(step)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def fits(self, batch: int) -> bool:
        out_of_memory = False
        try:
            self._steps(batch)
        except RuntimeError as exc:
            if not is_out_of_memory(exc):
                raise
            out_of_memory = True
        if out_of_memory:
            self._recover()
        self.trials.append((batch, not out_of_memory))
        return not out_of_memory

    def _recover(self) -> None:
        """After an out-of-memory error mid-step: no gradients left over, and a fresh
        GradScaler (one stopped between its unscale_ and update would refuse the next step)."""
        self.engine.optimizer.zero_grad(set_to_none=True)
        self.engine.scaler = make_grad_scaler(self.device, self.precision)
        self.engine.grad_norm = None
        release_memory(self.device)

    def close(self) -> None:
        del self.engine
        release_memory(self.device)


def estimate_cpu_bytes(build: Callable[[], nn.Module], settings: StepSettings, *,
                       image_size: int) -> tuple[float, float]:
    """(fixed bytes, bytes per image) of one CPU training step (see the module docstring)."""
    precision, channels_last = settings.precision, settings.channels_last
    model = build().to(memory_format=settings.memory_format)
    saved: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()  # one entry per buffer: a view saved twice counts once
        saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    def saved_bytes(batch: int) -> int:
        saved.clear()
        images = torch.randint(0, 256, (batch, 3, image_size, image_size), dtype=torch.uint8)
        if channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            with autocast_context(torch.device("cpu"), precision):
                model(images)
        return sum(saved.values())

    per_image = max(0, saved_bytes(4) - saved_bytes(2)) / 2 * BACKWARD_FACTOR
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    states = 1 if settings.optimizer == "sgd" else 2  # momentum; AdamW's two moments
    return float(params * (2 + states)), float(per_image)  # weights + grads + states


def find_batch_size(build: Callable[[], nn.Module], settings: StepSettings, *,
                    num_classes: int, image_size: int, limit: int = MAX_BATCH,
                    reserve_bytes: int = 0, budget_bytes: int | None = None,
                    env=None) -> BatchFit:
    """The largest micro-batch <= `limit` whose training step (`settings`: the run's, from the
    plan) fits; `reserve_bytes` stay free for the pipeline (a resident store). `budget_bytes`
    overrides the CPU budget (tests). `env` (distributed.DistEnv): a torchrun job's ranks all
    take the smallest answer; None for one process."""
    settings = settings.replace(device=indexed(settings.device))
    device = settings.device
    state = torch.random.get_rng_state()  # the throwaway model must not move the run's seed
    try:
        if device.type == "cuda":
            fit = _search_cuda(build, settings, num_classes=num_classes, image_size=image_size,
                               limit=limit, reserve_bytes=reserve_bytes)
        else:
            fit = _estimate_cpu(build, settings, image_size=image_size, limit=limit,
                                reserve_bytes=reserve_bytes, budget_bytes=budget_bytes)
    finally:
        torch.random.set_rng_state(state)
    agreed = fit.batch_size
    if env is not None:
        agreed = int(min_over_ranks(fit.batch_size, env, device))
    if agreed != fit.batch_size:
        fit = BatchFit(agreed, fit.limit, fit.how + f"; {agreed} on the tightest rank")
    return fit


def indexed(device: torch.device) -> torch.device:
    """`cuda` -> `cuda:N`, N the current device (train sets it to LOCAL_RANK's GPU).
    torch.cuda.set_per_process_memory_fraction and friends refuse an index-less device
    ("Expected a torch.device with a specified index"), and `train --batch-size auto` builds
    its device from the type alone."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def memory_fraction(device: torch.device) -> float:
    """The process's CUDA memory cap on `device` (torch.cuda.set_per_process_memory_fraction).
    torch < 2.8 has no getter: then 1.0, torch's default, and the cap a program set before
    calling us is lost after the search (the least surprising thing we can do there: the
    search never leaves its own cap behind)."""
    getter = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    return 1.0 if getter is None else float(getter(device))


def _search_cuda(build, settings: StepSettings, *, num_classes, image_size, limit,
                 reserve_bytes) -> BatchFit:
    device = settings.device
    total = torch.cuda.get_device_properties(device).total_memory
    previous = memory_fraction(device)  # a cap the program set: searched within, then restored
    fraction = max(0.05, min(previous, (CUDA_SEARCH_FRACTION * total - reserve_bytes) / total))
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    trial = None
    batch = tried = 0
    try:
        try:
            trial = TrialSteps(build, settings, image_size=image_size, num_classes=num_classes)
        except RuntimeError as exc:  # the weights alone do not fit
            if not is_out_of_memory(exc):
                raise
        if trial is not None:
            batch = largest_fitting(trial.fits, limit)
            tried = len(trial.trials)
    finally:
        if trial is not None:
            trial.close()
        torch.cuda.set_per_process_memory_fraction(previous, device)
        torch.cuda.reset_peak_memory_stats(device)
    how = (f"{tried} trial step pair(s) on {device} within {fraction:.0%} of its "
           f"{total / 2**30:.0f} GiB")
    return BatchFit(batch, limit, how)


def _estimate_cpu(build, settings: StepSettings, *, image_size, limit, reserve_bytes,
                  budget_bytes) -> BatchFit:
    if budget_bytes is None:
        # Half the available RAM, like the resident store's budget: the box may be shared,
        # and the page cache and the loader need room too.
        budget_bytes = memory_budget(torch.device("cpu"))[0] - reserve_bytes
    fixed, per_image = estimate_cpu_bytes(build, settings, image_size=image_size)
    room = budget_bytes - fixed
    batch = limit if per_image <= 0 else int(max(0.0, room) // per_image)
    batch = limit if batch >= limit else _aligned(batch)
    how = (f"estimated {per_image / 2**20:.1f} MiB per image + {fixed / 2**20:.0f} MiB "
           f"weights/optimizer within {budget_bytes / 2**30:.1f} GiB of RAM")
    return BatchFit(batch, limit, how)


