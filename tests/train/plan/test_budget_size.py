"""--time-budget with --image-size and --model auto on a CPU picks what the budget can train
enough epochs of (plan/budget_size.py), through `plan` as `train` asks it."""
from __future__ import annotations

import pytest

from turbotrain.train.config.config import TrainConfig
from turbotrain.train.plan import DatasetFacts, Machine, plan
from turbotrain.train.plan.budget_size import MIN_BUDGET_EPOCHS, budget_size

PHOTOS = DatasetFacts(train_count=3000, largest_side=256, jpeg_fraction=1.0, num_classes=10,
                      val_count=500)


def picked(**changes):
    settings = dict(budget_s=80.0, train_count=3000, largest_side=256, cores=2, fast_bf16=True)
    size, model = budget_size(**{**settings, **changes})
    return size.value, model.value, size.reason


def test_a_long_budget_keeps_the_usual_64_px_airbench():
    size, model, why = picked(budget_s=3600)
    assert (size, model) == (64, "airbench") and "fits ~" in why


@pytest.mark.parametrize("budget_s,expected", [(400, (64, "airbench")), (80, (32, "airbench")),
                                               (30, (32, "compact28"))])
def test_a_shorter_budget_trains_smaller(budget_s, expected):
    assert picked(budget_s=budget_s)[:2] == expected


def test_fp32_on_a_cpu_without_native_bf16_goes_smaller_sooner():
    assert picked(budget_s=60, fast_bf16=False)[:2] == (32, "compact28")
    assert picked(budget_s=60, fast_bf16=True)[:2] == (32, "airbench")


def test_more_cores_or_fewer_images_afford_the_larger_choice():
    assert picked(budget_s=80, cores=16)[:2] == (64, "airbench")
    assert picked(budget_s=80, train_count=300)[:2] == (64, "airbench")


def test_a_budget_too_short_for_anything_says_so():
    size, model, why = picked(budget_s=1, train_count=1_000_000)
    assert (size, model) == (32, "compact28") and f"fewer than {MIN_BUDGET_EPOCHS}" in why


def test_small_images_keep_their_own_size():
    assert budget_size(budget_s=10, train_count=60_000, largest_side=28, cores=2,
                       fast_bf16=True) is None


def test_the_plan_asks_the_rule_only_when_size_and_model_are_auto():
    cpu = Machine(cores=2, ram_bytes=8 * 2**30, cpu_bf16=True, name="cpu2")
    budgeted = plan(TrainConfig(data="D", time_budget=30, precision="bf16"), PHOTOS, cpu)
    assert (budgeted.config.image_size, budgeted.config.model) == (32, "compact28")
    assert "--time-budget" in budgeted.lines["image_size"]
    unbudgeted = plan(TrainConfig(data="D", precision="bf16"), PHOTOS, cpu)
    assert (unbudgeted.config.image_size, unbudgeted.config.model) == (64, "airbench")
    asked = plan(TrainConfig(data="D", time_budget=30, model="resnet18"), PHOTOS, cpu)
    assert asked.config.image_size == 64 and asked.config.model == "resnet18"
    sized = plan(TrainConfig(data="D", time_budget=30, image_size=48), PHOTOS, cpu)
    assert sized.config.image_size == 48
