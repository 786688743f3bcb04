"""The device kernels of `resident`, checked on the CPU against plain numpy/cv2 references.
(The CUDA path runs `_on_device`; comparing it with the cv2 path here checks its maths.)"""
from __future__ import annotations

import numpy as np
import torch

import pytest

from turbotrain.pipeline.batched_crops import ResizedCrops, ShiftedCrops


def test_shifted_crops_match_slicing_and_flipping():
    rng = np.random.default_rng(0)
    images = torch.from_numpy(rng.integers(0, 256, size=(6, 12, 12, 3), dtype=np.uint8))
    crops = ShiftedCrops(torch.cat([images, images.flip(2)]), 6, 8, mirrored=True)
    indices = torch.tensor([4, 0, 4, 2, 5])
    top, left = torch.tensor([0, 4, 2, 1, 4]), torch.tensor([3, 0, 4, 2, 4])
    flip = torch.tensor([False, True, True, False, True])
    out = crops(indices, top, left, flip)
    assert out.shape == (5, 8, 8, 3) and out.is_contiguous()
    for k in range(5):
        expected = images[indices[k], top[k]:top[k] + 8, left[k]:left[k] + 8]
        if flip[k]:
            expected = expected.flip(1)
        assert torch.equal(out[k], expected)


def test_shifted_crops_refuse_a_flip_without_mirrors():
    crops = ShiftedCrops(torch.zeros(2, 10, 10, 3, dtype=torch.uint8), 2, 8, mirrored=False)
    assert crops(torch.tensor([1]), torch.tensor([1]), torch.tensor([2]),
                 torch.tensor([False])).shape == (1, 8, 8, 3)
    with pytest.raises(ValueError, match="mirrored"):
        crops(torch.tensor([1]), torch.tensor([1]), torch.tensor([2]), torch.tensor([True]))


def test_grid_sample_path_matches_the_cv2_path(monkeypatch):
    """The CPU store's crops: the compiled kernel's raw-sample path (the default), cv2 (the
    Python decode path) and the device path (CUDA's, test_resident_device_crops.py) agree."""
    from turbotrain.pipeline import kernel
    y, x = np.mgrid[0:64, 0:64].astype(np.float32)
    smooth = np.stack([x * 4, y * 4, (x + y) * 2], axis=-1).clip(0, 255).astype(np.uint8)
    store = torch.from_numpy(np.stack([smooth, smooth[::-1].copy()]))
    indices = torch.tensor([0, 1, 0])
    # (top, left, height, width, flip): shrink, enlarge with flip, whole image
    boxes = torch.tensor([[5, 7, 40, 36, 0], [10, 2, 16, 20, 1], [0, 0, 64, 64, 0]])
    crops = ResizedCrops(store, 24, threads=1)
    try:
        assert crops.native is not None
        native = crops(indices, boxes).float()
        sampled = crops._on_device(indices, boxes).float()
    finally:
        crops.close()
    monkeypatch.setattr(kernel, "NATIVE", None)
    crops = ResizedCrops(store, 24, threads=1)
    try:
        reference = crops(indices, boxes).float()  # cv2
    finally:
        crops.close()
    assert (native - reference).abs().max() <= 1  # the kernel's resize: within a grey level
    assert sampled.shape == reference.shape == (3, 24, 24, 3)
    # cv2's fixed-point filters and the device path's float ones agree to a grey level or two
    # on smooth images (only at the whole-image 64 -> 24 shrink does cv2 switch to INTER_AREA).
    assert (sampled - reference)[:2].abs().mean() < 1.0
    assert (sampled - reference)[2].abs().mean() < 3.0
