"""augment.py: per-sample parameters depend on (seed, epoch, index, size) only."""
from __future__ import annotations

import numpy as np
import pytest

from turbotrain.pipeline import augment


def rrc(indices, h=375, w=500, seed=0, epoch=0):
    n = len(indices)
    return augment.random_resized_crop(seed, epoch, np.asarray(indices),
                                       np.full(n, h), np.full(n, w))


def test_parameters_do_not_depend_on_the_rest_of_the_batch():
    together = rrc([5, 9, 11])
    alone = rrc([9])
    assert together.row(1) == alone.row(0)


def test_parameters_change_with_seed_epoch_and_index():
    rows = {rrc([3], seed=s, epoch=e).row(0) for s in (0, 1) for e in (0, 1)}
    assert len(rows) == 4
    assert rrc([3]).row(0) != rrc([4]).row(0)


def test_resized_crop_follows_torchvision_ranges():
    boxes = rrc(np.arange(5000))
    area = boxes.height * boxes.width / (375 * 500)
    aspect = boxes.width / boxes.height
    assert (boxes.top >= 0).all() and (boxes.left >= 0).all()
    assert (boxes.top + boxes.height <= 375).all() and (boxes.left + boxes.width <= 500).all()
    assert area.min() > 0.07 and area.max() <= 1.0
    inside = (aspect > 0.74) & (aspect < 1.35)
    assert inside.mean() > 0.99  # the fallback (centre crop) may clamp slightly differently
    assert 0.45 < boxes.flip.mean() < 0.55


def test_resized_crop_fallback_on_extreme_aspect_ratio():
    boxes = augment.random_resized_crop(0, 0, np.arange(50), np.full(50, 10), np.full(50, 400))
    assert (boxes.left + boxes.width <= 400).all() and (boxes.height <= 10).all()


def test_centre_crop_box():
    box = augment.centre_crop(np.array([375]), np.array([500]), 0.875)
    assert box.row(0) == (23, 86, 328, 328, False)
    with pytest.raises(ValueError):
        augment.centre_crop(np.array([10]), np.array([10]), 1.5)


@pytest.mark.parametrize("size, h, w", [(224, 375, 500), (224, 600, 300), (64, 480, 640),
                                         (16, 90, 70)])
def test_the_stated_eval_rule_is_the_centre_crop(size, h, w):
    """The rule the card and the README state ("resize the shorter side to S / 0.875, then
    the centre S x S crop") is the box centre_crop takes: mapped back to the stored image, the
    S x S crop of the resized image is that box, within the rounding of S / 0.875 and a
    pixel."""
    from turbotrain.pipeline.base import PipelineOptions
    ratio = PipelineOptions.crop_ratio
    rule = augment.eval_rule(size, ratio)
    resized = round(size / ratio)
    assert f"resize the shorter side to {resized} px" in rule["photos"]
    assert f"centre {size}x{size} crop" in rule["photos"]
    assert f"at most {augment.SMALL_IMAGE_MAX_SIDE} px: resize to {size}x{size}, no crop" in \
        rule["small images"]
    scale = resized / min(h, w)  # resized image px per stored px
    side = size / scale
    close = 1 + side * 0.5 / resized
    box = augment.centre_crop(np.array([h]), np.array([w]), ratio)
    assert abs(box.height[0] - side) <= close and abs(box.width[0] - side) <= close
    assert abs(box.top[0] - (h - side) / 2) <= close
    assert abs(box.left[0] - (w - side) / 2) <= close


def test_pad_crop_offsets_stay_within_the_padding():
    boxes = augment.pad_crop(0, 0, np.arange(2000), 32, 4)
    assert boxes.top.min() == -4 and boxes.top.max() == 4
    assert boxes.left.min() == -4 and boxes.left.max() == 4
    assert (boxes.height == 32).all()


def test_family_choice():
    small, photo = np.array([32, 32]), np.array([375, 200])
    assert augment.choose_augmentation(small, small, train=True) == augment.PAD_CROP
    assert augment.choose_augmentation(small, small, train=False) == augment.IDENTITY
    assert augment.choose_augmentation(photo, photo, train=True) == augment.RESIZED_CROP
    assert augment.choose_augmentation(photo, photo, train=False) == augment.CENTRE_CROP
    with pytest.raises(ValueError, match="choose one of"):
        augment.crop_boxes("zoom", seed=0, epoch=0, indices=np.arange(1), heights=small[:1],
                           widths=small[:1], image_size=8)
