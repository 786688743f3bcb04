"""Progressive resizing: the schedule (a pure function of the epoch, FFCV's get_resolution) and
the plan's decision on described datasets and machines."""
from __future__ import annotations

import numpy as np
import pytest

from turbotrain.pipeline.resolution import ResolutionSchedule, resolution_for_epoch
from turbotrain.train.config.config import TrainConfig
from turbotrain.train.errors import TrainError
from turbotrain.train.plan import PRESETS, plan
from turbotrain.train.plan.resolution import OFF, progressive, schedule_of

from .test_plan import CIFAR, CPU2, FASHION, H200, IMAGENET, NODE, PHOTOS


def ffcv_get_resolution(epoch, min_res, max_res, end_ramp, start_ramp):
    """ffcv-imagenet's train_imagenet.py, as published (step 32)."""
    assert min_res <= max_res
    if epoch <= start_ramp:
        return min_res
    if epoch >= end_ramp:
        return max_res
    interp = np.interp([epoch], [start_ramp, end_ramp], [min_res, max_res])
    return int(np.round(interp[0] / 32)) * 32


# FFCV's rn50 configs (ffcv-imagenet rn50_configs/): 160 -> 192 px; 16 epochs: ramp 11-13,
# 88 epochs: ramp 65-76; and a wider ramp where the rounding shows.
@pytest.mark.parametrize("min_res, max_res, start, end, epochs", [
    (160, 192, 11, 13, 16), (160, 192, 65, 76, 88), (160, 256, 10, 30, 40)])
def test_the_schedule_is_ffcvs(min_res, max_res, start, end, epochs):
    for epoch in range(epochs):
        assert resolution_for_epoch(epoch, min_res=min_res, max_res=max_res, start_ramp=start,
                                    end_ramp=end, step=32) == \
            ffcv_get_resolution(epoch, min_res, max_res, end, start), epoch


def test_sizes_are_few_steady_and_within_the_ends():
    schedule = ResolutionSchedule(min_res=100, max_res=224, start_ramp=3, end_ramp=12)
    sizes = schedule.sizes(20)
    assert schedule.step == 32  # from 160 px on
    assert sizes[0] == 100 and sizes[-1] == 224  # clamped: the ends are those asked for
    assert sizes == sorted(sizes) and len(set(sizes)) <= 6
    assert all(s % 32 == 0 for s in sizes if s not in (100, 224))
    assert ResolutionSchedule(min_res=96, max_res=128, start_ramp=0, end_ramp=1).step == 16


def test_a_ramp_of_no_length_switches_at_its_epoch():
    schedule = ResolutionSchedule(min_res=96, max_res=128, start_ramp=5, end_ramp=5)
    assert schedule.sizes(7) == [96] * 5 + [128] * 2


@pytest.mark.parametrize("bad", [dict(min_res=200, max_res=128), dict(min_res=4, max_res=128),
                                 dict(start_ramp=5, end_ramp=2), dict(step=-1)])
def test_impossible_schedules_are_refused(bad):
    settings = dict(min_res=96, max_res=128, start_ramp=1, end_ramp=2, step=16) | bad
    with pytest.raises(ValueError):
        ResolutionSchedule(**settings)


# -- the decision --------------------------------------------------------------------------------
PHOTO = dict(small_images=False, fixed_input=False)


def test_on_for_a_conv_net_on_photos_with_enough_epochs():
    decision = progressive(None, image_size=224, epochs=16, **PHOTO)
    # 3/4 of 224 = 168, down to the 32 px step: 160 (FFCV's min_res); ramp round(6.4), 13.6.
    assert decision.value == ResolutionSchedule(min_res=160, max_res=224, start_ramp=6,
                                                end_ramp=14, step=32)
    assert "128" in decision.reason and "8" in decision.reason
    small = progressive(None, image_size=128, epochs=10, **PHOTO).value
    assert (small.min_res, small.step, small.start_ramp, small.end_ramp) == (96, 16, 4, 8)


@pytest.mark.parametrize("kwargs, words", [
    (dict(image_size=32, epochs=30, small_images=True, fixed_input=False), "32 px (> 28)"),
    (dict(image_size=28, epochs=30, small_images=True, fixed_input=False), "Fashion-MNIST"),
    (dict(image_size=64, epochs=30, **PHOTO), "64 px"),
    (dict(image_size=224, epochs=5, **PHOTO), "5 epochs"),
    (dict(image_size=224, epochs=30, small_images=False, fixed_input=True), "one input size"),
    (dict(image_size=224, epochs=1000, epochs_measured=True, **PHOTO), "--res-ramp"),
])
def test_off_where_it_cannot_pay(kwargs, words):
    decision = progressive(None, **kwargs)
    assert decision.value == OFF and words in decision.reason


def test_asked_for_it_runs_where_the_rule_would_not_and_is_refused_where_it_cannot():
    asked = progressive(True, image_size=128, epochs=4, **PHOTO)
    assert asked.reason == "asked for" and asked.value.sizes(4) == [96, 96, 96, 128]  # ramp 2-3
    nothing_below = progressive(True, image_size=64, epochs=10, **PHOTO)  # 64 px: the floor
    assert nothing_below.value == OFF and "nothing to ramp" in nothing_below.reason
    ramp = progressive(None, image_size=224, epochs=1000, epochs_measured=True,
                       res_ramp=(10, 20), **PHOTO).value
    assert (ramp.start_ramp, ramp.end_ramp) == (10, 20)
    cifar = progressive(True, image_size=32, epochs=30, small_images=True, fixed_input=False)
    # Asked for on CIFAR-size images: 3/4 of 32 = 24 px ramping over epochs 0-8, 4 px steps.
    assert cifar.reason == "asked for"
    assert (cifar.value.min_res, cifar.value.end_ramp, cifar.value.step) == (24, 8, 4)
    with pytest.raises(TrainError, match="one input size"):
        progressive(None, image_size=224, epochs=30, min_res=160, small_images=False,
                    fixed_input=True)
    with pytest.raises(TrainError, match="--res-ramp"):
        progressive(True, image_size=224, epochs=1000, epochs_measured=True, **PHOTO)
    with pytest.raises(TrainError, match="above"):
        progressive(None, image_size=128, epochs=10, min_res=160, **PHOTO)
    assert progressive(False, image_size=224, epochs=30, **PHOTO).value == OFF


@pytest.mark.parametrize("machine, facts, settings, expected", [
    # ImageNet on an 8-GPU node: 224 px, resnet50, 16 epochs: on, FFCV-like.
    (NODE, IMAGENET, dict(epochs=16), (160, (6.0, 14.0))),
    # 20,000 photos on one H200: 224 px resnet18 for the default 10 epochs: on.
    (H200, PHOTOS, dict(), (160, (4.0, 8.0))),
    # The same photos on the 2-core CPU: 64 px by default: off (no room to shrink).
    (CPU2, PHOTOS, dict(), None),
    # ... but asked for at 128 px there, with --min-res: the user's schedule.
    (CPU2, PHOTOS, dict(image_size=128, min_res=96, res_ramp=(2.0, 5.0)), (96, (2.0, 5.0))),
    # --max-res sets the final size (--image-size's fact).
    (CPU2, PHOTOS, dict(max_res=160, progressive=True), (96, (4.0, 8.0))),
    # CIFAR (32 px): small images not measured to pay, off on any machine.
    (H200, CIFAR, dict(epochs=30), None),
    # Fashion-MNIST (28 px): measured not to pay, off; asked for, the measured ramp over the
    # first quarter: 20 px ramping to 28 over epochs 0-2 (round(2.5)) of the default 10.
    (CPU2, FASHION, dict(), None),
    (CPU2, FASHION, dict(progressive=True), (20, (0.0, 2.0))),
])
def test_the_plan_decides(machine, facts, settings, expected):
    planned = plan(TrainConfig(data="D", **settings), facts, machine)
    schedule = schedule_of(planned.config)
    if expected is None:
        assert schedule is None and planned.config.progressive is False
        assert planned["progressive"].value == OFF
        return
    assert (schedule.min_res, (schedule.start_ramp, schedule.end_ramp)) == expected
    assert schedule.max_res == planned.config.image_size
    assert planned.config.res_ramp == expected[1] and planned.config.min_res == expected[0]
    assert "progressive" in planned.lines


def test_mnist_size_images_ramp_only_when_asked_with_the_measured_ramp():
    """28 px pad-cropped images: off by the rule (measured not to pay on Fashion-MNIST); asked
    for, 3/4 of the size (20 px, 4 px steps) ramping over the first quarter of the run, the rest
    at 28 px (the ramp that measured best)."""
    small = dict(small_images=True, fixed_input=False)
    assert progressive(None, image_size=28, epochs=4, **small).value == OFF
    four = progressive(True, image_size=28, epochs=4, **small)
    assert four.value.sizes(4) == [20, 28, 28, 28] and four.value.step == 4
    assert four.reason == "asked for"
    assert progressive(True, image_size=28, epochs=10, **small).value.sizes(10) == \
        [20, 24] + [28] * 8
    # Nothing below 16 px, and a final size whose 3/4 rounds to itself has no ramp.
    assert progressive(True, image_size=16, epochs=10, **small).value == OFF


def test_no_progressive_is_kept_and_not_printed():
    planned = plan(TrainConfig(data="D", progressive=False), IMAGENET, PRESETS["8xh200"])
    assert schedule_of(planned.config) is None and "progressive" not in planned.lines
