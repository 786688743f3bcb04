"""The evaluation rules (plan/eval_rules.py) as pure functions, and as the plan applies them to
described machines and datasets (the facts of tests/train/plan/test_plan.py)."""
from __future__ import annotations

import pytest

from turbotrain.pipeline import augment
from turbotrain.train.config.config import TrainConfig
from turbotrain.train.errors import TrainError
from turbotrain.train.plan import PRESETS, plan
from turbotrain.train.plan.eval_rules import (eval_resolution, eval_work, flip_tta,
                                              eval_size_for)

from .test_plan import CIFAR, FASHION, FEW_PHOTOS, IMAGENET, PHOTOS

CPU2, H200 = PRESETS["cpu2"], PRESETS["h200"]


@pytest.mark.parametrize("train, want", [
    # 1.3 x train to the nearest 16: the anchors' pairs come out (FFCV 192 -> 256, timm and
    # FixRes 224 -> 288, Composer 176 -> 224), and the benchmark's 112 / 128 px.
    (64, 80), (112, 144), (128, 160), (160, 208), (176, 224), (192, 256), (224, 288),
    (256, 336), (8, 16)])
def test_the_eval_size_is_1_3x_rounded_to_16(train, want):
    assert eval_size_for(train) == want
    assert 1.2 <= want / train <= 1.4 or train < 16


def test_photos_evaluate_above_the_training_size_small_images_and_fixed_models_at_it():
    photos = eval_resolution(None, train_size=192, small=False, any_size=True)
    assert photos.value == 256 and "1.3x the 192 px" in photos.reason
    small = eval_resolution(None, train_size=28, small=True, any_size=True)
    assert small.value == 28 and "never zoomed" in small.reason
    vit = eval_resolution(None, train_size=224, small=False, any_size=False)
    assert vit.value == 224 and "one input size" in vit.reason


def test_an_asked_eval_res_wins_and_is_shown_when_it_differs():
    asked = eval_resolution(300, train_size=224, small=False, any_size=True)
    assert (asked.value, asked.reason, asked.shown) == (300, "asked for", True)
    assert not eval_resolution(28, train_size=28, small=True, any_size=True).shown


def test_flip_tta_follows_the_training_flips():
    assert augment.draws_flips(augment.RESIZED_CROP) and augment.draws_flips(augment.PAD_CROP)
    assert not augment.draws_flips(augment.CENTRE_CROP)
    assert flip_tta(None, train_family=augment.RESIZED_CROP, image_size=128).value is True
    assert flip_tta(None, train_family=augment.PAD_CROP, image_size=32).value is True
    assert flip_tta(None, train_family=augment.IDENTITY, image_size=32).value is False
    off = flip_tta(False, train_family=augment.PAD_CROP, image_size=32)
    assert (off.value, off.reason, off.shown) == (False, "asked for", True)
    assert "no flips" in flip_tta(True, train_family=augment.IDENTITY, image_size=32).reason


def test_no_flip_tta_on_mnist_size_images_where_it_does_not_pay():
    """Fashion-MNIST (28 px, pad-cropped): TTA's gain cost as much time as training buys it
    with; CIFAR (32 px) and photos of any size keep it, and --tta still turns it on."""
    tiny = flip_tta(None, train_family=augment.PAD_CROP, image_size=28)
    assert tiny.value is False and "28 px" in tiny.reason and "Fashion-MNIST" in tiny.reason
    assert flip_tta(None, train_family=augment.RESIZED_CROP, image_size=28).value is True
    asked = flip_tta(True, train_family=augment.PAD_CROP, image_size=28)
    assert (asked.value, asked.shown) == (True, True)
    assert not flip_tta(False, train_family=augment.PAD_CROP, image_size=28).shown


def test_eval_work_counts_passes_and_pixels():
    assert eval_work(128, None, False) == 1.0
    assert eval_work(128, 128, True) == 2.0
    assert eval_work(128, 160, True) == pytest.approx(2 * (160 / 128) ** 2)


@pytest.mark.parametrize("machine, facts, want", [
    (H200, PHOTOS, (224, 288, True)),      # 224 px photos on CUDA: 288 (1.29x), flips: TTA
    (H200, IMAGENET, (224, 288, True)),
    (CPU2, FEW_PHOTOS, (64, 80, True)),    # 64 px on a CPU: 80
    (CPU2, CIFAR, (32, 32, True)),         # pad-cropped small images: the training size
    (CPU2, FASHION, (28, 28, False)),      # 28 px: no TTA (it does not pay there)
    (H200, FASHION, (28, 28, False)),
])
def test_plan_decides_eval_res_and_tta(machine, facts, want):
    p = plan(TrainConfig(data="DATA"), facts, machine)
    assert (p.config.image_size, p.config.eval_res, p.config.tta) == want
    assert p["eval_res"].reason and p["tta"].reason
    assert "eval_res" in p.lines and "tta" in p.lines


def test_plan_keeps_asked_eval_settings_and_the_training_size_for_a_vit():
    p = plan(TrainConfig(data="DATA", eval_res=256, tta=False), PHOTOS, H200)
    assert (p.config.eval_res, p.config.tta) == (256, False)
    vit = plan(TrainConfig(data="DATA", model="vit_b_16", image_size=224), PHOTOS, H200)
    assert vit.config.eval_res == 224
    with pytest.raises(TrainError, match="--eval-res 288: model vit_b_16 is built for 224 px"):
        plan(TrainConfig(data="DATA", model="vit_b_16", image_size=224, eval_res=288), PHOTOS,
             H200)
