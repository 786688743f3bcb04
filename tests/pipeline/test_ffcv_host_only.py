"""A CPU-device `ffcv` pipeline on a GPU host makes no CUDA stream or event (issue 41): FFCV
decides IS_CUDA once per process, so its epoch iterator made a stream per batch slot (a CUDA
context on GPU 0) for host batches. The GPU host is described by FFCV's own flag, with torch's
stream and event constructors made to fail."""
from __future__ import annotations

import pytest
import torch

import ffcv.loader.epoch_iterator as epoch_iterator
from turbotrain.datasets import open_dataset
from turbotrain.pipeline import PipelineOptions
from turbotrain.pipeline.ffcv import FfcvPipeline

from .conftest import run_epoch

pytestmark = [pytest.mark.timeout(180), pytest.mark.usefixtures("child_processes")]


def test_a_cpu_pipeline_on_a_gpu_host_makes_no_cuda_stream(monkeypatch, photo_path):
    def no_cuda(*args, **kwargs):
        raise AssertionError("a CPU-device ffcv pipeline touched CUDA")
    monkeypatch.setattr(epoch_iterator, "IS_CUDA", True)  # what FFCV sets on a GPU host
    for name in ("Stream", "Event", "current_stream", "stream"):
        monkeypatch.setattr(torch.cuda, name, no_cuda)
    options = PipelineOptions(train=True, batch_size=8, image_size=32,
                              device=torch.device("cpu"), seed=5, workers=2)
    with FfcvPipeline(open_dataset(photo_path), options) as pipeline:
        batches = run_epoch(pipeline, epoch=0, limit=3)
    assert len(batches) == 3 and batches[0][0].shape == (8, 3, 32, 32)
    assert not batches[0][0].is_cuda
