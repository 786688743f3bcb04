"""`auto`: which pipeline to use for a split on a device, and why (logged by the caller).

Not a registered pipeline. The rule is `first_usable` over `why_unavailable`, pure functions of
facts (the registered names, the installed engines, the decoded split's size and the memory
budget) and of what each pipeline declared when it registered (registry.Capabilities):
train/plan.py plans a run with them from a Machine, `choose_pipeline` and `unavailable_reason`
ask them about this process's device (`turbotrain info`, `doctor`), and `build_auto` also falls
back when a chosen pipeline turns out to be unavailable when built.

Pipelines are tried in their declared order of preference (`registry.auto_order`), fastest
first; one is skipped when it needs CUDA off CUDA, its optional package is missing, it cannot
read a sharded split, or it holds the decoded split and that does not fit its memory budget.
Today's order, as the modules declare it:

1. ``resident`` when the decoded split fits in its memory budget (a fraction of free device
   memory): no decoding after the first epoch at all.
2. ``dali`` on CUDA when NVIDIA DALI is installed (and registered): nvJPEG decodes on the GPU.
3. ``pytorch``: the CPU pipeline; measured >= 1.2x FFCV's CPU loader on the same file (see
   bench/bench_pipelines.py), so ``ffcv`` is only the choice when asked for by name — or when
   ``pytorch`` is somehow missing.
"""
from __future__ import annotations

import logging

import torch

from .base import Pipeline, PipelineError, PipelineOptions, PipelineUnavailable
from .registry import Capabilities, auto_order, build_pipeline, capabilities, pipeline_names
from .resident import memory_budget, resident_bytes

log = logging.getLogger(__name__)


def installed_engines() -> frozenset[str]:
    """The registered pipelines whose optional package is importable here."""
    found = set()
    for name in pipeline_names():
        package = capabilities(name).package
        if package is not None and package.importable():
            found.add(name)
    return frozenset(found)


def why_unavailable(name: str, *, registered, installed, device_type: str,
                    resident_need: int, budget: tuple[int, str],
                    num_shards: int = 1, named: bool = False) -> str | None:
    """Why `name` cannot be used, or None when it looks usable: a pure function of the facts
    and of its declared capabilities (`budget`: what resident.memory_budget or budget_of says
    for the store of `resident_need` bytes; `num_shards`: the split's). `named`: asked for by
    name (`--pipeline NAME`), where a pipeline with a `cpu_path` runs off CUDA too; auto's
    question is the other (it takes such a pipeline only on CUDA)."""
    if name not in registered:
        return f"{name} is not registered"
    declared = capabilities(name)
    if declared.holds_decoded_split and resident_need > budget[0]:
        return f"the decoded split needs {resident_need / 2**30:.2f} GiB, over the " \
               f"resident budget of {budget[0] / 2**30:.2f} GiB ({budget[1]})"
    if declared.needs_cuda and device_type != "cuda" and not (named and declared.cpu_path):
        return declared.needs_cuda
    if declared.package is not None and name not in installed:
        return f"{declared.package.distribution} is not installed"
    if declared.refuses_shards and num_shards > 1:
        return sharded_reason(declared, num_shards)
    return None


def sharded_reason(declared: Capabilities, num_shards: int) -> str:
    """Why a pipeline that `refuses_shards` cannot read this split, and which can: the most
    widely usable first (no CUDA needed, then no memory budget to fit)."""
    names = [name for name in auto_order() if not capabilities(name).refuses_shards]
    # A stable sort: within each kind, auto's order.
    names.sort(key=lambda name: (capabilities(name).needs_cuda is not None,
                                 capabilities(name).holds_decoded_split))
    listed = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
    return (f"{declared.refuses_shards}, and this split is stored in {num_shards} shards; use "
            f"--pipeline {listed} (or prepare without --shard-size)")


def first_usable(verdicts: dict[str, str | None], *, resident_need: int,
                 device: torch.device | str) -> tuple[str, str]:
    """(name, reason) of the first usable pipeline in `verdicts` (name -> why not, in the
    order of preference); PipelineError when none is."""
    passed = []
    for name, why_not in verdicts.items():
        if why_not is None:
            reason = f"auto picked {name}"
            if capabilities(name).holds_decoded_split:
                reason += f" ({resident_need / 2**30:.2f} GiB decoded fits in {device} memory)"
            if passed:
                reason += "; skipped " + "; ".join(passed)
            return name, reason
        passed.append(f"{name}: {why_not}")
    raise PipelineError("no pipeline can run here: " + "; ".join(passed))


def unavailable_reason(name: str, dataset, options: PipelineOptions) -> str | None:
    """Why `name` cannot be used with this process's device, or None when it looks usable
    (cheap checks only)."""
    device = torch.device(options.device)
    # Only a pipeline that holds the decoded split needs its size and the memory budget.
    holds = name in pipeline_names() and capabilities(name).holds_decoded_split
    return why_unavailable(name, registered=pipeline_names(), installed=installed_engines(),
                           device_type=device.type,
                           resident_need=resident_bytes(dataset, options) if holds else 0,
                           budget=memory_budget(device) if holds else (0, ""),
                           num_shards=getattr(dataset, "num_shards", 1))


def choose_pipeline(dataset, options: PipelineOptions) -> tuple[str, str]:
    """(pipeline name, one-line reason) for `dataset` with `options` (see the module docstring)."""
    verdicts: dict[str, str | None] = {}
    for name in auto_order():
        verdicts[name] = unavailable_reason(name, dataset, options)
        if verdicts[name] is None:
            break
    name, reason = first_usable(verdicts, resident_need=resident_bytes(dataset, options),
                                device=options.device)
    log.info(reason)
    return name, reason


def build_auto(dataset, **options) -> tuple[Pipeline, str]:
    """Builds the first usable pipeline in auto's order; returns it with the reason.

    Unlike `choose_pipeline` this also survives a builder that raises PipelineUnavailable
    (e.g. DALI installed but without a usable GPU), falling back to the next choice.
    """
    opts = PipelineOptions(**options)
    skipped: list[str] = []
    for name in auto_order():
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
