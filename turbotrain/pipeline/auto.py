"""`auto`: which pipeline to use for a split on a device, and why (logged by the caller).

Not a registered pipeline: the trainer asks `choose_pipeline` (or `build_auto`, which also
falls back when a chosen pipeline turns out to be unavailable) and then builds by name.

Order of preference, fastest first:

1. ``resident`` when the decoded split fits in its memory budget (a fraction of free device
   memory): no decoding after the first epoch at all.
2. ``dali`` on CUDA when NVIDIA DALI is installed (and registered): nvJPEG decodes on the GPU.
3. ``pytorch``: the CPU pipeline; measured >= 1.2x FFCV's CPU loader on the same file (see
   bench/bench_pipelines.py), so ``ffcv`` is only the choice when asked for by name — or when
   ``pytorch`` is somehow missing.
"""
from __future__ import annotations

import importlib.util
import logging

import torch

from .base import Pipeline, PipelineError, PipelineOptions, PipelineUnavailable
from .registry import build_pipeline, pipeline_names
from .resident import memory_budget, resident_bytes

log = logging.getLogger(__name__)

FALLBACK_ORDER = ("resident", "dali", "pytorch", "ffcv")


def unavailable_reason(name: str, dataset, options: PipelineOptions) -> str | None:
    """Why `name` cannot be used here, or None when it looks usable (cheap checks only)."""
    if name not in pipeline_names():
        return f"{name} is not registered"
    device = torch.device(options.device)
    if name == "resident":
        need = resident_bytes(dataset, options)
        budget, how = memory_budget(device)
        if need > budget:
            return f"the decoded split needs {need / 2**30:.2f} GiB, over the resident budget " \
                   f"of {budget / 2**30:.2f} GiB ({how})"
        return None
    if name == "dali":
        if device.type != "cuda":
            return "DALI's GPU decode needs a CUDA device"
        if importlib.util.find_spec("nvidia") is None or \
                importlib.util.find_spec("nvidia.dali") is None:
            return "nvidia-dali is not installed"
    if name == "ffcv" and importlib.util.find_spec("ffcv") is None:
        return "ffcv is not installed"
    return None


def choose_pipeline(dataset, options: PipelineOptions) -> tuple[str, str]:
    """(pipeline name, one-line reason) for `dataset` with `options` (see the module docstring)."""
    passed = []
    for name in FALLBACK_ORDER:
        why_not = unavailable_reason(name, dataset, options)
        if why_not is None:
            reason = f"auto picked {name}"
            if name == "resident":
                reason += f" ({resident_bytes(dataset, options) / 2**30:.2f} GiB decoded fits " \
                          f"in {options.device} memory)"
            if passed:
                reason += "; skipped " + "; ".join(passed)
            log.info(reason)
            return name, reason
        passed.append(f"{name}: {why_not}")
    raise PipelineError("no pipeline can run here: " + "; ".join(passed))


def build_auto(dataset, **options) -> tuple[Pipeline, str]:
    """Builds the first usable pipeline in FALLBACK_ORDER; returns it with the reason.

    Unlike `choose_pipeline` this also survives a builder that raises PipelineUnavailable
    (e.g. DALI installed but without a usable GPU), falling back to the next choice.
    """
    opts = PipelineOptions(**options)
    skipped: list[str] = []
    for name in FALLBACK_ORDER:
        why_not = unavailable_reason(name, dataset, opts)
        if why_not is None:
            try:
                pipeline = build_pipeline(name, dataset, **options)
            except PipelineUnavailable as e:
                why_not = str(e)
            else:
                reason = f"auto picked {name}" + \
                         (f"; skipped {'; '.join(skipped)}" if skipped else "")
                log.info(reason)
                return pipeline, reason
        skipped.append(f"{name}: {why_not}")
    raise PipelineError("no pipeline can run here: " + "; ".join(skipped))
