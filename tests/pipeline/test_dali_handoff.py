"""DALI's hand-off to torch, ordered explicitly (issue 41): each GPU batch is run bound to
torch's current stream, so the stream waits for DALI's work before the model reads the pixels.
A race would not fail loudly, it would train on half-written images: the CPU test checks the
stream is handed to DALI with a fake pipeline and DLPack producer; the CUDA test checks the
pixels exactly against the CPU path on the same crop boxes."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from turbotrain.datasets import open_dataset
from turbotrain.datasets.beton import layout
from turbotrain.datasets.beton.writer import BetonWriter
from turbotrain.pipeline import PipelineOptions
from turbotrain.pipeline.dali import DaliPipeline, run_on_our_stream

from .conftest import run_epoch, small_images

pytestmark = pytest.mark.timeout(120)


class FakeProducer:
    """A DLPack producer (what DALI's TensorGPU is), holding host bytes."""

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor
        self.asked_streams = []

    def __dlpack__(self, stream=None, **kwargs):
        self.asked_streams.append(stream)
        return torch.utils.dlpack.to_dlpack(self.tensor)

    def __dlpack_device__(self):
        return (1, 0)  # kDLCPU: torch asks for no stream of its own


class FakeOutput:
    def __init__(self, producer):
        self.producer = producer

    def as_tensor(self):
        return self.producer


class FakePipe:
    def __init__(self, producer):
        self.producer, self.runs = producer, []

    def run(self, *stream):
        self.runs.append(stream)
        return (FakeOutput(self.producer),)


def test_gpu_batches_are_bound_to_torchs_current_stream(monkeypatch):
    ours = object()  # torch.cuda.current_stream(device), stubbed: no GPU here
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: ours)
    pixels = torch.arange(2 * 4 * 4 * 3, dtype=torch.uint8).view(2, 4, 4, 3)
    pipe = FakePipe(FakeProducer(pixels))
    pipeline = DaliPipeline.__new__(DaliPipeline)  # _run needs only the device
    pipeline.device = torch.device("cuda", 0)
    out = pipeline._run(pipe)
    assert pipe.runs == [(ours,)]  # DALI was told which stream reads the batch
    assert torch.equal(out, pixels)
    assert run_on_our_stream(pipe, torch.device("cuda", 0)) and pipe.runs[-1] == (ours,)


def test_cpu_batches_need_no_stream():
    pipe = FakePipe(FakeProducer(torch.zeros(1, 2, 2, 3, dtype=torch.uint8)))
    run_on_our_stream(pipe, torch.device("cpu"))
    assert pipe.runs == [()]


def _raw_split(path, count=64, side=32) -> str:
    """Raw (not JPEG) samples at the training size: decode and centre crop are exact copies on
    every path, so GPU and CPU batches must be equal byte for byte."""
    images = small_images(count, side)
    with BetonWriter(path, count, page_size=layout.MIN_PAGE_SIZE) as writer:
        for i in range(count):
            writer.append(layout.MODE_RAW, side, side, images[i].tobytes(), i % 10)
    return str(path)


@pytest.mark.cuda
def test_gpu_pixels_equal_the_cpu_paths_exactly(tmp_path):
    dataset = open_dataset(_raw_split(tmp_path / "raw.beton"))
    options = dict(train=False, batch_size=16, image_size=32, seed=3, workers=2)
    with DaliPipeline(dataset, PipelineOptions(device=torch.device("cuda"), **options)) as gpu:
        assert gpu.spec.on_gpu
        on_gpu = [run_epoch(gpu, epoch=e) for e in range(3)]  # reused pipeline too
    with DaliPipeline(dataset, PipelineOptions(device=torch.device("cpu"), **options)) as cpu:
        on_cpu = run_epoch(cpu, epoch=0)
    for epoch in on_gpu:
        for (g_img, g_lab), (c_img, c_lab) in zip(epoch, on_cpu):
            assert g_img.is_cuda and torch.equal(g_lab.cpu(), c_lab)
            assert torch.equal(g_img.cpu(), c_img)
    stored = np.stack([dataset.image(i) for i in range(16)])  # and both are the stored bytes
    assert torch.equal(on_cpu[0][0].permute(0, 2, 3, 1).cpu(), torch.from_numpy(stored))
