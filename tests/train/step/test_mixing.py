"""--mixup / --cutmix (train/step/mixing.py): plans are pure functions of the position, the
images and targets are mixed as timm does, the loss is soft-target cross-entropy; and the new
settings' validation (--scale, --ratio, --clip-grad, ...)."""
from __future__ import annotations

import argparse

import numpy as np
import pytest
import torch
from torch import nn

from turbotrain.pipeline import augment
from turbotrain.train.config.config import TrainConfig
from turbotrain.train.config.config_files import config_from_namespace
from turbotrain.train.config.config_flags import add_config_arguments
from turbotrain.train.errors import TrainError
from turbotrain.train.models.models import InputStem
from turbotrain.train.step.mixing import (CUTMIX, MIXUP, NONE, Mixer, MixSettings, mix_plan,
                                          smoothed_one_hot, soft_target_cross_entropy)

BOTH = MixSettings(mixup=0.2, cutmix=1.0)
SHAPE = dict(batch=16, height=24, width=20)


def images_and_labels(batch=16, size=(24, 20), classes=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (batch, 3, *size), dtype=torch.uint8, generator=g)
    labels = torch.randint(0, classes, (batch,), generator=g)
    return images.contiguous(memory_format=torch.channels_last), labels


def same(a, b) -> bool:
    return a.kind == b.kind and a.lam == b.lam and a.box == b.box and np.array_equal(a.perm,
                                                                                      b.perm)


def test_plan_is_a_pure_function_of_seed_epoch_rank_and_micro_batch():
    plans = {micro: mix_plan(BOTH, seed=3, epoch=2, rank=0, micro=micro, **SHAPE)
             for micro in range(40)}
    again = {micro: mix_plan(BOTH, seed=3, epoch=2, rank=0, micro=micro, **SHAPE)
             for micro in reversed(range(40))}  # another order: no hidden state
    assert all(same(plans[m], again[m]) for m in plans)
    for other in (dict(seed=4, epoch=2, rank=0), dict(seed=3, epoch=3, rank=0),
                  dict(seed=3, epoch=2, rank=1)):
        assert not same(plans[0], mix_plan(BOTH, micro=0, **other, **SHAPE))
    # Every micro-batch draws anew (CutMix lambdas are box areas: a few coincide).
    assert len({tuple(plans[m].perm) for m in plans}) == 40
    assert len({plans[m].lam for m in plans}) >= 35
    assert {plans[m].kind for m in plans} == {MIXUP, CUTMIX}  # switch_prob 0.5
    assert all(sorted(p.perm.tolist()) == list(range(16)) for p in plans.values())


def test_plans_do_not_use_or_move_the_global_generators():
    np_state, torch_state = np.random.get_state()[1].copy(), torch.get_rng_state()
    images, labels = images_and_labels()
    Mixer(BOTH, num_classes=10, label_smoothing=0.1, seed=0)(images, labels, epoch=0, micro=0)
    assert np.array_equal(np.random.get_state()[1], np_state)
    assert torch.equal(torch.get_rng_state(), torch_state)


def test_switch_and_mix_prob():
    def kinds(settings):
        return {mix_plan(settings, seed=0, epoch=0, rank=0, micro=m, **SHAPE).kind
                for m in range(30)}
    assert kinds(MixSettings(mixup=0.2, cutmix=1.0, switch_prob=1.0)) == {CUTMIX}
    assert kinds(MixSettings(mixup=0.2, cutmix=1.0, switch_prob=0.0)) == {MIXUP}
    assert kinds(MixSettings(cutmix=1.0)) == {CUTMIX}
    assert kinds(MixSettings(mixup=0.2, prob=0.0)) == {NONE}
    assert kinds(MixSettings(mixup=0.2, prob=0.5)) == {NONE, MIXUP}


def test_cutmix_pastes_the_box_and_lambda_is_the_kept_area():
    images, labels = images_and_labels()
    mixer = Mixer(MixSettings(cutmix=1.0), num_classes=10, label_smoothing=0.0, seed=1)
    checked = 0
    for micro in range(20):
        plan = mixer.plan(images, epoch=0, micro=micro)
        mixed, targets = mixer(images, labels, epoch=0, micro=micro)
        assert mixed.dtype == torch.uint8  # CutMix alone copies pixels: no float batch
        top, bottom, left, right = plan.box
        area = (bottom - top) * (right - left)
        assert plan.lam == pytest.approx(1 - area / (24 * 20))
        perm = torch.from_numpy(plan.perm)
        expected = images.clone()
        expected[:, :, top:bottom, left:right] = images[perm][:, :, top:bottom, left:right]
        assert torch.equal(mixed, expected)
        one_hot = nn.functional.one_hot(labels, 10).float()
        torch.testing.assert_close(targets, plan.lam * one_hot + (1 - plan.lam) * one_hot[perm])
        checked += 0 < area < 24 * 20
    assert checked >= 10


def test_mixup_blends_in_float_and_the_stem_sees_the_blend():
    images, labels = images_and_labels()
    mixer = Mixer(MixSettings(mixup=1.0), num_classes=10, label_smoothing=0.1, seed=2)
    plan = mixer.plan(images, epoch=1, micro=5)
    mixed, targets = mixer(images, labels, epoch=1, micro=5)
    perm, lam = torch.from_numpy(plan.perm), plan.lam
    assert plan.kind == MIXUP and 0 < lam < 1 and mixed.dtype == torch.float32
    x = images.float()
    torch.testing.assert_close(mixed, lam * x + (1 - lam) * x[perm])
    assert not torch.equal(mixed, mixed.round())  # not rounded back to uint8 levels
    stem = InputStem(mean=(100.0, 110.0, 120.0), std=(50.0, 60.0, 70.0))
    torch.testing.assert_close(stem(mixed), lam * stem(images) + (1 - lam) * stem(images[perm]))
    soft = smoothed_one_hot(labels, 10, 0.1)
    torch.testing.assert_close(targets, lam * soft + (1 - lam) * soft[perm])
    torch.testing.assert_close(targets.sum(dim=1), torch.ones(16))
    # With --mixup on, unmixed micro-batches are float too (one input dtype for a compiled model).
    off = Mixer(MixSettings(mixup=1.0, prob=0.0), num_classes=10, label_smoothing=0.1, seed=2)
    plain, _ = off(images, labels, epoch=1, micro=5)
    assert plain.dtype == torch.float32 and torch.equal(plain, images.float())


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_soft_target_loss_equals_the_hard_loss_when_nothing_is_mixed(smoothing):
    logits = torch.randn(16, 10, generator=torch.Generator().manual_seed(0))
    _, labels = images_and_labels()
    soft = soft_target_cross_entropy(logits, smoothed_one_hot(labels, 10, smoothing))
    hard = nn.functional.cross_entropy(logits, labels, label_smoothing=smoothing)
    torch.testing.assert_close(soft, hard)
    # bf16 logits (autocast): the loss is still computed in float32
    assert soft_target_cross_entropy(logits.bfloat16(), smoothed_one_hot(labels, 10, 0)).dtype \
        == torch.float32


def test_lambda_one_mixes_nothing():
    images, labels = images_and_labels()
    mixer = Mixer(MixSettings(mixup=1.0, prob=0.0), num_classes=10, label_smoothing=0.0, seed=0)
    _, targets = mixer(images, labels, epoch=0, micro=0)
    assert torch.equal(targets, nn.functional.one_hot(labels, 10).float())


# ---------------------------------------------------------------------------- settings

def parse(*argv):
    parser = argparse.ArgumentParser()
    add_config_arguments(parser, pipeline_choices=["pytorch"])
    return config_from_namespace(parser.parse_args(["--data", "d", *map(str, argv)]))


def test_defaults_leave_training_unchanged():
    config = TrainConfig()
    assert config.scale == augment.RESIZED_CROP_SCALE
    assert config.ratio == augment.RESIZED_CROP_RATIO
    assert config.mixup == config.cutmix == config.clip_grad == 0.0 and config.mix_prob == 1.0


def test_pairs_parse_from_flags_and_yaml(tmp_path):
    config = parse("--scale", "0.25", "1", "--ratio", "0.5", "2")
    assert config.scale == (0.25, 1.0) and config.ratio == (0.5, 2.0)
    path = tmp_path / "run.yaml"
    path.write_text("data: d\nscale: [0.3, 0.9]\nratio: 0.6 1.5\n")
    config = config_from_namespace(argparse.Namespace(config=str(path)))
    assert config.scale == (0.3, 0.9) and config.ratio == (0.6, 1.5)


@pytest.mark.parametrize("argv, message", [
    (("--scale", "0", "1"), "--scale needs 0 < LO <= HI <= 1"),
    (("--scale", "0.6", "0.5"), "--scale needs 0 < LO <= HI <= 1"),
    (("--scale", "0.5", "1.5"), "--scale needs 0 < LO <= HI <= 1"),
    (("--ratio", "-1", "2"), "--ratio needs 0 < LO <= HI"),
    (("--ratio", "2", "1"), "--ratio needs 0 < LO <= HI"),
    (("--ratio", "1", "inf"), "--ratio needs 0 < LO <= HI"),
    (("--mixup", "-0.1"), "--mixup must be a number >= 0"),
    (("--cutmix", "nan"), "--cutmix must be a number >= 0"),
    (("--clip-grad", "-1"), "--clip-grad must be a number >= 0"),
    (("--mix-prob", "1.5"), "--mix-prob must be in"),
    (("--mix-switch-prob", "-0.5"), "--mix-switch-prob must be in"),
])
def test_bad_values_are_one_line_errors_naming_the_flag(argv, message):
    with pytest.raises(TrainError, match=message) as exc:
        parse(*argv)
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("text", ["scale: [0.3]\n", "scale: [[0.3, 1], 1]\n", "scale: x y\n",
                                  "scale: {a: 1}\n", "ratio: [true, 2]\n"])
def test_bad_yaml_pairs_are_refused(tmp_path, text):
    path = tmp_path / "bad.yaml"
    path.write_text("data: d\n" + text)
    with pytest.raises(TrainError, match="(--scale|--ratio): expected two numbers LO HI|"
                                         "must be a single value"):
        config_from_namespace(argparse.Namespace(config=str(path)))
