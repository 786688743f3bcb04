"""tune and the batch search run the model eager; train compiles on CUDA. Where they differ,
the output says so (issue 41): the batch decision and tune's report."""
from __future__ import annotations

from turbotrain.train.config.config import TrainConfig
from turbotrain.train.engine.batch_finder import BatchFit
from turbotrain.train.plan import PRESETS, DatasetFacts, Observed, plan
from turbotrain.train.tools.tune import eager_note
from turbotrain.train.tools.tune_report import format_report

PHOTOS = DatasetFacts(train_count=20_000, largest_side=500, jpeg_fraction=1.0, num_classes=10,
                      val_count=2_000)


def test_the_batch_decision_says_its_trial_steps_were_eager_where_the_run_compiles():
    fit = Observed(batch_fit=BatchFit(256, 256, "1 trial step pair(s) on cuda:0"))
    compiled = plan(TrainConfig(data="d"), PHOTOS, PRESETS["h200"], fit)
    assert compiled.config.compile is True
    assert "trial steps eager, the run's compiled" in compiled["batch_size"].reason
    eager = plan(TrainConfig(data="d", compile=False), PHOTOS, PRESETS["h200"], fit)
    assert "eager" not in eager["batch_size"].reason
    cpu = plan(TrainConfig(data="d"), PHOTOS, PRESETS["cpu2"], fit)
    assert cpu.config.compile is False and "eager" not in cpu["batch_size"].reason


def test_tunes_report_says_the_step_was_not_timed_compiled():
    assert eager_note(False) is None
    result = {"data": "d", "images": 10, "model": "resnet50", "image_size": 224,
              "precision": "bf16", "device": "cuda:0", "cores": 16, "seconds": 5,
              "budget_seconds": 90, "past_budget": None, "largest_fitting": 256,
              "search_limit": 256, "how": "1 trial", "rows": [], "best": None,
              "train_pick": {"pipeline": "dali", "reason": "r"}, "differs": None,
              "command": "turbotrain train --data d", "eager_note": eager_note(True)}
    text = format_report(result)
    assert ("note: the model step and the batch search ran eager; train compiles its step "
            "(torch.compile), not timed here") in text
    assert "note:" not in format_report({**result, "eager_note": eager_note(False)})
