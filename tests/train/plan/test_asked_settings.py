"""What the plan does with settings a user asked for (issue 36): a precision that is emulated and
slow on this machine is said as a warning, `--warmup-epochs` becomes steps, and the image size's
reason names no model (the model is its own decision, possibly one asked for)."""
from __future__ import annotations

import pytest

from turbotrain.train.config.config import TrainConfig
from turbotrain.train.plan import PRESETS, DatasetFacts, plan
from turbotrain.train.plan.device_choice import pick_precision

CPU2 = PRESETS["cpu2"]  # native bf16 (AVX-512 bf16)
NO_BF16 = PRESETS["cpu2-avx2"]  # AVX2 only: bf16 emulated
H200 = PRESETS["h200"]
CIFAR = DatasetFacts(train_count=50_000, largest_side=32, jpeg_fraction=0.0, num_classes=10,
                     val_count=10_000)
PHOTOS = DatasetFacts(train_count=2_000, largest_side=500, jpeg_fraction=1.0, num_classes=10,
                      val_count=500)


@pytest.mark.parametrize("machine, asked, slow", [
    (NO_BF16, "bf16", True), (NO_BF16, "fp16", True), (CPU2, "fp16", True),
    (CPU2, "bf16", False), (NO_BF16, "fp32", False), (H200, "bf16", False),
    (H200, "fp16", False),
])
def test_a_precision_asked_for_that_is_emulated_here_is_a_warning(machine, asked, slow):
    decision = plan(TrainConfig(data="d", precision=asked), None, machine)["precision"]
    assert decision.value == asked  # asked for: kept, never changed behind the user's back
    if slow:
        assert decision.warning.startswith(f"--precision {asked} is 3-6x slower than fp32 here")
        assert "--precision auto or fp32" in decision.warning
        assert decision.warning in decision.reason  # the printed decision says it too
    else:
        assert decision.warning == "" and decision.reason == "asked for"


def test_auto_precision_never_warns():
    for machine in (CPU2, NO_BF16, H200):
        assert plan(TrainConfig(data="d"), None, machine)["precision"].warning == ""
    assert pick_precision("auto", "cpu", None, cpu_bf16=False).value == "fp32"


def test_warmup_epochs_become_steps_and_only_steps_are_saved():
    # CIFAR on cpu2: batch 128 -> 390 steps per epoch (test_plan.py's cpu2-cifar row).
    p = plan(TrainConfig(data="d", batch_size=128, warmup_epochs=1.5), CIFAR, CPU2)
    assert p.steps_per_epoch == 390
    assert p.config.warmup_steps == 585 and p.config.warmup_epochs is None
    assert p["warmup"].line() == "585 steps: --warmup-epochs 1.5 x 390 steps per epoch"
    assert "warmup_steps" not in p.decisions  # not the automatic warm-up (run_length.py)
    assert "warmup_epochs" not in p.config.to_saved_dict()


@pytest.mark.parametrize("machine, model", [(CPU2, "resnet18"), (CPU2, "auto"),
                                            (H200, "resnet50"), (H200, "auto")])
def test_the_image_size_reason_names_no_model(machine, model):
    p = plan(TrainConfig(data="d", model=model), PHOTOS, machine)
    assert p.config.image_size == 64
    reason = p["image_size"].reason
    assert "airbench" not in reason and "resnet" not in reason.lower(), reason
    assert p.config.model == ("airbench" if model == "auto" else model)
