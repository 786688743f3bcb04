"""pipeline/image_ops.py: each op's effect on known images, and against PIL's ImageOps /
ImageEnhance (what timm's RandAugment calls) on a photo-like image."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image, ImageEnhance, ImageOps

from turbotrain.pipeline import image_ops

from .conftest import photo_image


def batch(*images: np.ndarray) -> torch.Tensor:
    """uint8 HWC arrays as a (n, 3, H, W) channels_last batch (the pipelines' layout)."""
    return torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2)


def hwc(x: torch.Tensor, k: int = 0) -> np.ndarray:
    return x[k].permute(1, 2, 0).numpy()


PHOTO = photo_image(3, 40, 56)
FLAT = np.full((8, 8, 3), 77, dtype=np.uint8)


def test_pixel_lookups_on_known_values():
    levels = np.arange(256, dtype=np.uint8).reshape(16, 16, 1).repeat(3, axis=2)
    x = batch(levels)
    assert np.array_equal(hwc(image_ops.invert(x)), 255 - levels)
    assert np.array_equal(hwc(image_ops.posterize(x, torch.tensor([3]))), levels & 0b11100000)
    assert np.array_equal(hwc(image_ops.posterize(x, torch.tensor([8]))), levels)
    solar = hwc(image_ops.solarize(x, torch.tensor([128.0])))
    assert np.array_equal(solar, np.where(levels >= 128, 255 - levels, levels))
    assert np.array_equal(hwc(image_ops.solarize(x, torch.tensor([256.0]))), levels)
    added = hwc(image_ops.solarize_add(x, torch.tensor([50.0])))
    expected = np.where(levels < 128, np.minimum(levels.astype(int) + 50, 255), levels)
    assert np.array_equal(added, expected)


@pytest.mark.parametrize("name", ["invert", "equalize", "auto_contrast"])
def test_lookups_match_pil(name):
    pil = {"invert": ImageOps.invert, "equalize": ImageOps.equalize,
           "auto_contrast": ImageOps.autocontrast}[name]
    low_contrast = (PHOTO // 2 + 40).astype(np.uint8)
    for image in (PHOTO, low_contrast, FLAT):
        ours = hwc(getattr(image_ops, name)(batch(image)))
        theirs = np.asarray(pil(Image.fromarray(image)))
        assert np.abs(ours.astype(int) - theirs).max() <= 1, name


@pytest.mark.parametrize("name,enhancer", [("brightness", ImageEnhance.Brightness),
                                           ("color", ImageEnhance.Color),
                                           ("contrast", ImageEnhance.Contrast),
                                           ("sharpness", ImageEnhance.Sharpness)])
@pytest.mark.parametrize("factor", [0.1, 0.6, 1.0, 1.9])
def test_enhance_matches_pil(name, enhancer, factor):
    ours = hwc(getattr(image_ops, name)(batch(PHOTO), torch.tensor([factor])))
    theirs = np.asarray(enhancer(Image.fromarray(PHOTO)).enhance(factor))
    # PIL's greyscale and blends use fixed-point arithmetic: one level apart at most.
    assert np.abs(ours.astype(int) - theirs).max() <= 1


def test_enhance_extremes():
    x = batch(PHOTO)
    assert int(image_ops.brightness(x, torch.tensor([0.0])).max()) == 0
    grey = hwc(image_ops.color(x, torch.tensor([0.0])))
    assert np.array_equal(grey[..., 0], grey[..., 1]) and np.array_equal(grey[..., 1],
                                                                         grey[..., 2])
    flat = hwc(image_ops.contrast(x, torch.tensor([0.0])))
    assert len(np.unique(flat)) == 1
    for op in (image_ops.brightness, image_ops.color, image_ops.contrast, image_ops.sharpness):
        assert torch.equal(op(x, torch.tensor([1.0])), x)


def test_translate_moves_pixels_and_fills_the_rest():
    """PIL's AFFINE data (1, 0, 5, 0, 1, 0): output x reads input x + 5, so the image moves 5
    px left and the right edge is the fill."""
    x = batch(PHOTO)
    fill = torch.tensor([10.0, 20.0, 30.0])
    moved = hwc(image_ops.affine(x, torch.tensor([[1.0, 0, 5, 0, 1, 0]]), fill))
    assert np.array_equal(moved[:, :-5], PHOTO[:, 5:])
    assert (moved[:, -5:] == [10, 20, 30]).all()


def test_rotate_quarter_turn_is_counter_clockwise():
    square = photo_image(5, 32, 32)
    a = -np.pi / 2  # PIL's rotate(90) matrix, about the centre (16, 16)
    cos, sin = np.cos(a), np.sin(a)
    m = torch.tensor([[cos, sin, 16 - cos * 16 - sin * 16, -sin, cos, 16 + sin * 16 - cos * 16]],
                     dtype=torch.float32)
    turned = hwc(image_ops.affine(batch(square), m, torch.zeros(3)))
    assert np.abs(turned.astype(int) - np.rot90(square).astype(int)).max() <= 1
    pil = np.asarray(Image.fromarray(square).rotate(90, resample=Image.BILINEAR))
    assert np.abs(turned.astype(int) - pil).max() <= 1


def test_erase_fills_boxes_only():
    x = batch(PHOTO, PHOTO)
    boxes = torch.tensor([[[2, 3, 4, 5]], [[0, 0, 0, 0]]])  # the second image: no box
    out = image_ops.erase(x, boxes, torch.zeros_like(x))
    first = hwc(out, 0)
    assert (first[2:6, 3:8] == 0).all()
    first[2:6, 3:8] = PHOTO[2:6, 3:8]
    assert np.array_equal(first, PHOTO) and np.array_equal(hwc(out, 1), PHOTO)


def test_each_image_uses_its_own_parameter():
    x = batch(PHOTO, PHOTO, PHOTO)
    out = image_ops.brightness(x, torch.tensor([0.0, 1.0, 0.5]))
    assert int(out[0].max()) == 0 and torch.equal(out[1], x[1])
    assert torch.equal(out[2], image_ops.brightness(x[2:], torch.tensor([0.5]))[0])
