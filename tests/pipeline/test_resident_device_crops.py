"""The resident photo store's crops on a device (issue 41): the CPU path's pixels (the compiled
kernel's linear / area resize, clamped to each box) within 1 grey level, in a work memory that
does not grow with the batch and that the plan reserves beside the store."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from turbotrain.pipeline import kernel
from turbotrain.pipeline.batched_crops import DEVICE_CHUNK, ResizedCrops
from turbotrain.train.config.config import TrainConfig
from turbotrain.train.plan import PRESETS, DatasetFacts, plan

TOLERANCE = 1  # grey levels: the kernel rounds fixed-point weights, the device path floats


def _store() -> torch.Tensor:
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:64, 0:64].astype(np.float32)
    smooth = np.stack([x * 4, y * 4, (x + y) * 2], axis=-1).clip(0, 255).astype(np.uint8)
    noise = rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)
    return torch.from_numpy(np.stack([smooth, noise, smooth[::-1].copy()]))


def _boxes(count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random boxes inside the 64 px store: upscales, slight and >= 2x (area) shrinks, flips."""
    rng = np.random.default_rng(seed)
    h, w = rng.integers(4, 65, count), rng.integers(4, 65, count)
    top, left = rng.integers(0, 65 - h), rng.integers(0, 65 - w)
    boxes = np.stack([top, left, h, w, rng.integers(0, 2, count)], axis=1).astype(np.int64)
    return torch.from_numpy(rng.integers(0, 3, count)), torch.from_numpy(boxes)


@pytest.mark.skipif(kernel.NATIVE is None, reason="compares with the compiled kernel")
@pytest.mark.parametrize("seed", [0, 1])
def test_device_path_matches_the_cpu_paths_pixels(seed):
    crops = ResizedCrops(_store(), 24, threads=1)
    try:
        indices, boxes = _boxes(2 * DEVICE_CHUNK + 5, seed)  # several chunks and a remainder
        cpu = crops(indices, boxes).int()  # the CPU store's own path: the kernel
        device = crops._on_device(indices, boxes).int()
    finally:
        crops.close()
    assert (cpu - device).abs().max() <= TOLERANCE
    area = torch.minimum(boxes[:, 2], boxes[:, 3]) >= 48
    assert area.any() and (~area).any()  # both filters were compared


def test_work_memory_is_fixed_and_reserved_by_the_plan():
    """At 224 px from a 256 px store: ~120 MB, where gathering the batch's full squares in
    float32 took ~400 MB at batch 512. The plan leaves it free beside the store on CUDA."""
    work = ResizedCrops.work_bytes(256, 224)
    assert 100e6 < work < 250e6
    photos = DatasetFacts(train_count=20_000, largest_side=500, jpeg_fraction=1.0,
                          num_classes=10, val_count=500)
    planned = plan(TrainConfig(data="d", image_size=224), photos, PRESETS["h200"])
    assert planned["pipeline"].value == "resident"
    store = photos.resident_bytes(224)
    assert planned.batch_search.reserve_bytes == store + work
    cifar = DatasetFacts(train_count=50_000, largest_side=32, jpeg_fraction=0.0,
                         num_classes=10, val_count=10_000)
    small = plan(TrainConfig(data="d"), cifar, PRESETS["h200"])  # pad-and-crop: no resize
    assert small.batch_search.reserve_bytes == cifar.resident_bytes(32)


@pytest.mark.cuda
def test_device_path_on_the_gpu_matches_the_cpu_path():
    store = _store()
    cpu_crops = ResizedCrops(store, 24, threads=1)
    gpu_crops = ResizedCrops(store.cuda(), 24, threads=1)
    try:
        indices, boxes = _boxes(3 * DEVICE_CHUNK, 2)
        cpu = cpu_crops(indices, boxes).int()
        gpu = gpu_crops(indices.cuda(), boxes.cuda()).cpu().int()
    finally:
        cpu_crops.close()
        gpu_crops.close()
    assert (cpu - gpu).abs().max() <= TOLERANCE
