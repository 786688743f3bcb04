"""Loaders that turn a prepared split into `(images, labels)` batches (see base.py)."""
from .base import Pipeline, PipelineError, PipelineOptions, PipelineUnavailable
from .registry import build_pipeline, pipeline_names, register_pipeline

# Importing a pipeline module registers it; each imports its heavy packages in its builder.
from . import pytorch, resident  # noqa: E402,F401  (register "pytorch", "resident")
from . import dali  # noqa: E402,F401  (registers "dali"; DALI itself is imported on build)
from . import ffcv  # noqa: E402,F401  (registers "ffcv"; FFCV itself is imported on build)
from .auto import build_auto, choose_pipeline  # noqa: E402
from .workers import choose_workers  # noqa: E402

__all__ = ["Pipeline", "PipelineError", "PipelineOptions", "PipelineUnavailable",
           "build_auto", "build_pipeline", "choose_pipeline", "choose_workers", "pipeline_names",
           "register_pipeline"]
