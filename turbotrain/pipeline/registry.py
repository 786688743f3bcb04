"""Pipelines by name. An unknown name lists the choices; argparse `choices` come from here."""
from __future__ import annotations

from typing import Callable

from .base import Pipeline, PipelineError, PipelineOptions

# name -> factory(dataset, options) -> Pipeline. Factories import heavy optional packages
# (nvidia.dali, ffcv) themselves, so registering costs nothing.
_PIPELINES: dict[str, Callable[..., Pipeline]] = {}


def register_pipeline(name: str):
    def decorator(factory):
        if name in _PIPELINES:
            raise ValueError(f"pipeline {name!r} is registered twice")
        _PIPELINES[name] = factory
        return factory
    return decorator


def pipeline_names() -> list[str]:
    return sorted(_PIPELINES)


def build_pipeline(name: str, dataset, **options) -> Pipeline:
    """Builds pipeline `name` over `dataset` (an open split) with PipelineOptions keywords."""
    if name not in _PIPELINES:
        raise PipelineError(
            f"unknown pipeline {name!r}; choose one of: {', '.join(pipeline_names())}")
    return _PIPELINES[name](dataset, PipelineOptions(**options))
