"""Loaders that turn a prepared split into `(images, labels)` batches (see base.py)."""
from .base import Pipeline, PipelineError, PipelineOptions, PipelineUnavailable
from .registry import (Capabilities, OptionalPackage, build_pipeline, capabilities,
                       pipeline_names, register_pipeline)

# Importing a pipeline module registers it with its capabilities; DALI and FFCV themselves are
# imported only when their pipeline is built. A new pipeline is one module, imported here.
from . import dali, ffcv, pytorch, resident  # noqa: E402,F401
from .auto import build_auto, choose_pipeline  # noqa: E402
from .workers import choose_workers  # noqa: E402

__all__ = ["Capabilities", "OptionalPackage", "Pipeline", "PipelineError", "PipelineOptions",
           "PipelineUnavailable", "build_auto", "build_pipeline", "capabilities",
           "choose_pipeline", "choose_workers", "pipeline_names", "register_pipeline"]
