"""No hidden host syncs in a pipeline's batches (issue 41). On a GPU every tensor read on the
host (`bool(t)`, `t.item()`, `t.tolist()`) waits for the device, and a non_blocking copy from
pageable memory is a synchronous one. The CPU tests forbid the reads in the per-batch path and
check what the copies read from; the CUDA test runs one training step of each pipeline under
torch.cuda.set_sync_debug_mode("error"), so a new sync fails it."""
from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
from torch import nn

from turbotrain.datasets import open_dataset
from turbotrain.pipeline import transfer
from turbotrain.pipeline.batched_crops import ResizedCrops, ShiftedCrops
from turbotrain.pipeline.resident import reflect_pad_into

from .conftest import IMAGE_SIZE, build, product_pipelines

pytestmark = pytest.mark.timeout(120)


@contextlib.contextmanager
def no_host_reads(monkeypatch):
    """Any tensor read on the host inside fails: what would be a device sync on CUDA."""
    def refuse(self, *args, **kwargs):
        raise AssertionError("a tensor was read on the host (a device sync on CUDA)")
    with monkeypatch.context() as patch:
        for name in ("__bool__", "item", "tolist"):
            patch.setattr(torch.Tensor, name, refuse)
        yield


@pytest.mark.parametrize("train", [False, True])
def test_resident_small_image_batches_read_nothing_on_the_host(monkeypatch, small_path, train):
    """Evaluation's store has no mirrors: the old check `bool(flip.any())` read every batch's
    flips back from the device."""
    dataset = open_dataset(small_path)
    with build("resident", dataset, train=train, batch_size=8, image_size=IMAGE_SIZE["small"],
               seed=3, workers=1) as pipeline:
        pipeline.set_epoch(0)
        batches = iter(pipeline)
        next(batches)  # the epoch's table is made on the first batch
        with no_host_reads(monkeypatch):
            images, labels = next(batches)
    assert images.shape == (8, 3, 16, 16)


def test_a_store_without_mirrors_refuses_device_flips_without_reading_them():
    crops = ShiftedCrops(torch.zeros(2, 10, 10, 3, dtype=torch.uint8), 2, 8, mirrored=False)
    assert crops(torch.tensor([1]), torch.tensor([1]), torch.tensor([2])).shape == (1, 8, 8, 3)

    class DeviceFlip(torch.Tensor):  # a flip tensor that says it lives on a GPU
        @property
        def device(self):
            return torch.device("cuda", 0)
    flip = torch.tensor([False]).as_subclass(DeviceFlip)
    with pytest.raises(ValueError, match="pass flip=None"):
        crops(torch.tensor([1]), torch.tensor([1]), torch.tensor([2]), flip)


def test_the_cuda_crop_path_reads_nothing_on_the_host(monkeypatch):
    """ResizedCrops' device path (what a CUDA store runs), run on a CPU store."""
    store = torch.randint(0, 256, (4, 40, 40, 3), dtype=torch.uint8)
    crops = ResizedCrops(store, 16, threads=1)
    try:
        indices = torch.tensor([0, 3, 2])
        boxes = torch.tensor([[0, 0, 40, 40, 0], [5, 3, 20, 30, 1], [10, 10, 8, 8, 0]])
        with no_host_reads(monkeypatch):
            out = crops._on_device(indices, boxes)
    finally:
        crops.close()
    assert out.shape == (3, 16, 16, 3) and out.dtype == torch.uint8


@pytest.mark.parametrize("h, w, pad", [(16, 16, 4), (32, 28, 4), (5, 7, 2), (3, 3, 2)])
def test_padding_goes_into_the_callers_buffer(h, w, pad):
    """The resident store's host chunk is padded into the pinned buffer it is copied from
    (np.pad returned a fresh pageable array: every chunk's copy was synchronous)."""
    images = np.random.default_rng(0).integers(0, 256, (2, h, w, 3), dtype=np.uint8)
    out = np.zeros((2, h + 2 * pad, w + 2 * pad, 3), np.uint8)
    assert reflect_pad_into(images, out, pad) is out
    assert np.array_equal(out, np.pad(images, ((0, 0), (pad, pad), (pad, pad), (0, 0)),
                                      mode="reflect"))


def test_every_non_blocking_copy_reads_pinned_memory(monkeypatch):
    """transfer.to_device on CUDA, with torch.cuda stubbed (no GPU here): the labels were
    copied non_blocking from pageable memory."""
    pinned_ids, copies = set(), []

    def pin_memory(self):
        copy = self.clone()
        pinned_ids.add(id(copy))
        return copy

    def to(self, device, non_blocking=False):
        copies.append((id(self) in pinned_ids, non_blocking))
        return self

    class Stub:
        def __init__(self, *args, **kwargs):
            pass

        def record(self, *args):
            pass

        def wait_event(self, event):
            pass

    monkeypatch.setattr(torch.Tensor, "pin_memory", pin_memory)
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda self: id(self) in pinned_ids)
    monkeypatch.setattr(torch.Tensor, "to", to)
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, stream: None)
    monkeypatch.setattr(torch.cuda, "Stream", Stub)
    monkeypatch.setattr(torch.cuda, "Event", Stub)
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Stub())
    batches = [(torch.zeros(2, 4, 4, 3, dtype=torch.uint8), torch.tensor([1, 2]))
               for _ in range(3)]
    out = list(transfer.to_device(batches, torch.device("cuda", 0)))
    assert len(out) == 3 and len(copies) == 6
    assert copies == [(True, True)] * 6  # images and labels: pinned, asynchronous


class _Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.head = nn.Linear(8, 100)

    def forward(self, images):
        x = self.conv(images.float() / 255)
        return self.head(x.mean((2, 3)))


@pytest.mark.cuda
@pytest.mark.parametrize("name", product_pipelines())
@pytest.mark.parametrize("kind", ["small", "photo"])
def test_one_training_step_per_pipeline_makes_no_hidden_sync(name, kind, small_path,
                                                              photo_path):
    from turbotrain.train.step.loop import StepSettings, make_engine
    cuda = torch.device("cuda")
    dataset = open_dataset(small_path if kind == "small" else photo_path)
    settings = StepSettings(device=cuda, precision="bf16", channels_last=True, lr=0.01)
    engine = make_engine(_Tiny().to(cuda, memory_format=torch.channels_last), settings)
    for train in (True, False):
        with build(name, dataset, device=cuda, train=train, batch_size=8,
                   image_size=IMAGE_SIZE[kind], seed=3, workers=2) as pipeline:
            pipeline.set_epoch(0)
            batches = iter(pipeline)
            images, labels = next(batches)  # warm-up: cuDNN plans, the epoch's table
            engine.micro_step(images, labels, will_step=True)
            engine.optimizer_step(0)
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
            try:
                images, labels = next(batches)
                if train:
                    engine.micro_step(images, labels, will_step=True)
                    engine.optimizer_step(1)
            finally:
                torch.cuda.set_sync_debug_mode(0)
            assert images.is_cuda and labels.is_cuda
