"""Pipelines by name, each with the capabilities it declares when it registers.

An unknown name lists the choices; argparse `choices` come from here. A pipeline says what it
needs and does in a `Capabilities` given to `register_pipeline` (the way an FFCV Operation
declares its state and memory up front), so `auto`, the plan, `turbotrain info`, the doctor and
`export` ask the registry (`capabilities`, `auto_order`, `first_pipeline`) instead of matching
pipeline names. Adding a pipeline is one module that registers itself, imported by
__init__.py (docs/ARCHITECTURE.md).
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
from dataclasses import dataclass
from typing import Callable, NamedTuple

from .base import Pipeline, PipelineError, PipelineOptions


@dataclass(frozen=True)
class OptionalPackage:
    """A package a pipeline imports only when it is built, so registering it costs nothing."""
    module: str  # the import name: "nvidia.dali"
    distribution: str  # pip's name: auto says "<distribution> is not installed"
    label: str  # `turbotrain info` lists its version under this name: "DALI"

    def importable(self) -> bool:
        """Whether `module` would import (found, not imported: DALI's import takes seconds).
        Each parent is looked for first: find_spec("a.b") raises when "a" is missing."""
        parts = self.module.split(".")
        return all(importlib.util.find_spec(".".join(parts[:i])) is not None
                   for i in range(1, len(parts) + 1))

    def version(self) -> str | None:
        """The installed version; a distribution named after it with a suffix shows its name
        too (DALI ships as nvidia-dali-cudaXYZ, which names the CUDA it targets)."""
        try:
            return importlib.metadata.version(self.distribution)
        except importlib.metadata.PackageNotFoundError:
            pass
        for dist in importlib.metadata.distributions():
            name = (dist.metadata["Name"] or "").lower()
            if name.startswith(self.distribution):
                return f"{dist.version} ({name})"
        return None


@dataclass(frozen=True)
class Capabilities:
    """What a registered pipeline needs and does: only what auto, the plan, info, the doctor
    and export ask. The defaults describe a plain streaming pipeline built only by name (the
    tests' in-memory pipelines register with them)."""
    # Its place in auto's order of preference, lowest first; None: never picked by auto.
    preference: int | None = None
    # Why auto takes it only on a CUDA device, in auto's words; None: on any device.
    needs_cuda: str | None = None
    # How it still runs off CUDA when asked for by name (`--pipeline NAME`), in a few words;
    # None: it needs CUDA then too. `info` says both: usable by name, skipped by auto.
    cpu_path: str | None = None
    # It decodes the images on the GPU: the doctor offers it to JPEG-bound CUDA runs.
    decodes_on_gpu: bool = False
    package: OptionalPackage | None = None  # what it imports when built, if not always there
    # Why it cannot read a split stored in several shards, in auto's words; None: it can.
    refuses_shards: str | None = None
    # It holds the whole decoded split in memory, a store the size resident.resident_bytes
    # gives: auto takes it only when that fits the memory budget, and a batch search leaves
    # room for it.
    holds_decoded_split: bool = False
    # It reads the split during an epoch (disk, page cache, a remote split's cache): the order
    # rule weighs the page cache for it, and it tells the split which shards come next.
    reads_during_epoch: bool = True
    # It makes its batches in the training process between steps, with no loader workers
    # beside the model: torch gets every core, and there are no workers to tune.
    loads_in_process: bool = False
    # Seconds the first batch of it in a process waits beyond a steady one (FFCV: numba
    # compiles its pipeline): `tune` starts a first row of it only when that fits its budget.
    first_batch_seconds: float = 0.0


class _Registered(NamedTuple):
    factory: Callable[..., Pipeline]  # (dataset, PipelineOptions) -> Pipeline
    capabilities: Capabilities


# Factories import heavy optional packages (nvidia.dali, FFCV) themselves, so registering
# costs nothing.
_PIPELINES: dict[str, _Registered] = {}


def register_pipeline(name: str, capabilities: Capabilities = Capabilities()):
    """Decorator: registers `factory(dataset, options) -> Pipeline` as pipeline `name`."""
    def decorator(factory):
        if name in _PIPELINES:
            raise ValueError(f"pipeline {name!r} is registered twice")
        _PIPELINES[name] = _Registered(factory, capabilities)
        return factory
    return decorator


def unregister_pipeline(name: str) -> None:
    """Removes pipeline `name` (tests register a pipeline and take it away again)."""
    del _PIPELINES[name]


def pipeline_names() -> list[str]:
    return sorted(_PIPELINES)


def _registered(name: str) -> _Registered:
    if name not in _PIPELINES:
        raise PipelineError(
            f"unknown pipeline {name!r}; choose one of: {', '.join(pipeline_names())}")
    return _PIPELINES[name]


def capabilities(name: str) -> Capabilities:
    """What pipeline `name` declared; PipelineError listing the choices for an unknown name."""
    return _registered(name).capabilities


def auto_order() -> tuple[str, ...]:
    """The pipelines auto tries, in their declared order of preference (ties by name)."""
    ranked = [(entry.capabilities.preference, name) for name, entry in _PIPELINES.items()
              if entry.capabilities.preference is not None]
    return tuple(name for _, name in sorted(ranked))


def first_pipeline(test: Callable[[Capabilities], bool]) -> str | None:
    """The first pipeline in auto's order whose capabilities pass `test` (None: none does):
    "the pipeline that decodes on the GPU" without naming it."""
    return next((name for name in auto_order() if test(capabilities(name))), None)


def streaming_cpu_pipeline() -> str:
    """The pipeline that decodes batch by batch on the CPU with no optional package: what a
    check of a few batches (export) or a sample's speed (the script doctor) runs anywhere."""
    return first_pipeline(lambda declared: declared.needs_cuda is None and
                          declared.package is None and not declared.holds_decoded_split)


def optional_engines() -> frozenset[str]:
    """The pipelines that need an optional package: what a full install makes importable."""
    return frozenset(name for name, entry in _PIPELINES.items()
                     if entry.capabilities.package is not None)


def build_pipeline(name: str, dataset, options: PipelineOptions | None = None,
                   **keywords) -> Pipeline:
    """Builds pipeline `name` over `dataset` (an open split) with `options` (made once, as
    `train` makes them from its plan), or with PipelineOptions keywords."""
    if options is not None and keywords:
        raise TypeError("build_pipeline takes a PipelineOptions or its keywords, not both")
    return _registered(name).factory(dataset, options or PipelineOptions(**keywords))
