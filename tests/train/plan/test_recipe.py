"""The optimisation recipe's rules (plan/recipe.py): the peak LR, the warm-up, the weight decay."""
from __future__ import annotations

import pytest

from turbotrain.train.models.models import get_model_spec
from turbotrain.train.plan import WeightsFacts, recipe


def test_lr_scales_with_the_global_batch():
    assert recipe.scaled_lr(0.1, 512, "sgd") == pytest.approx(0.2)
    assert recipe.scaled_lr(1e-3, 1024, "adamw") == pytest.approx(2e-3)  # square root for AdamW


def test_the_peak_lr_is_the_models_rate_scaled_then_the_fine_tuning_factor():
    spec = get_model_spec("resnet18")
    plain = recipe.learning_rate("sgd", spec, 512, (1.0, ""))
    assert plain.value == pytest.approx(spec.sgd_lr * 2)
    assert "resnet18's" in plain.reason and "x 512/256" in plain.reason
    same_task = recipe.learning_rate("sgd", spec, 512, (0.1, ", x0.1"))
    assert same_task.value == float(f"{spec.sgd_lr * 2 * 0.1:.6g}")
    adamw = recipe.learning_rate("adamw", spec, 1024, (1.0, ""))
    assert adamw.value == pytest.approx(recipe.ADAMW_LR_PER_256 * 2)


def test_the_fine_tuning_factor_follows_what_the_weights_learnt():
    names = ("a", "b")
    def factor(weights, freeze=False):
        return recipe.lr_factor(weights, freeze_backbone=freeze, num_classes=2,
                                class_names=names)[0]
    assert factor(None) == 1.0  # random weights (or a resumed run)
    assert factor(WeightsFacts(source_classes=2, source_names=names)) == \
        recipe.SAME_TASK_LR_FACTOR
    assert factor(WeightsFacts(source_classes=2, source_names=("x", "y"))) == \
        recipe.NEW_TASK_LR_FACTOR
    assert factor(WeightsFacts(source_classes=None)) == recipe.NEW_TASK_LR_FACTOR
    assert factor(WeightsFacts(source_classes=2, source_names=names), freeze=True) == 1.0


def test_warmup_is_5_percent_from_scratch_and_2_from_weights():
    assert recipe.scratch_warmup_steps(10) == 1 and recipe.scratch_warmup_steps(1000) == 50
    assert recipe.scratch_warmup_steps(10**6) == 2000
    assert recipe.warmup_steps(1000, from_weights=False).value == 50
    assert recipe.warmup_steps(1000, from_weights=True).value == 20
    assert recipe.warmup_steps(10, from_weights=True).value == 1


def test_weight_decay():
    spec = get_model_spec("resnet18")
    assert recipe.weight_decay("sgd", spec).value == spec.weight_decay
    assert recipe.weight_decay("adamw", spec).value == recipe.ADAMW_WEIGHT_DECAY
