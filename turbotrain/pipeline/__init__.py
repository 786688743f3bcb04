"""Loaders that turn a prepared split into `(images, labels)` batches (see base.py)."""
from .base import Pipeline, PipelineError, PipelineOptions, PipelineUnavailable
from .registry import build_pipeline, pipeline_names, register_pipeline

__all__ = ["Pipeline", "PipelineError", "PipelineOptions", "PipelineUnavailable",
           "build_pipeline", "pipeline_names", "register_pipeline"]
