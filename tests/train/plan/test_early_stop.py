"""plan/early_stop.py: how long a run without --epochs trains, when early stopping ends it, and
what the end of a run says about its learning curve (described state in, decision out)."""
from __future__ import annotations

import pytest

from turbotrain.train.config.config import TrainConfig
from turbotrain.train.plan import PRESETS, DatasetFacts, plan
from turbotrain.train.plan.early_stop import (DEFAULT_EPOCHS, LATE_LR, PATIENCE, curve_advice,
                                             run_length, stop_reason)

PHOTOS = DatasetFacts(train_count=3_000, largest_side=160, jpeg_fraction=1.0, num_classes=10,
                      val_count=600)


def test_without_epochs_the_run_stops_early_and_given_epochs_are_trained_whole():
    assert run_length(None, None, has_val=True, time_budget=None)[0] == DEFAULT_EPOCHS
    assert run_length(None, None, has_val=True, time_budget=None)[1].value is True
    epochs, given = run_length(4, None, has_val=True, time_budget=None)
    assert epochs == 4 and given.value is False and "--epochs 4 given" in given.reason
    steps = run_length(None, None, has_val=True, time_budget=None, max_steps=50)[1]
    assert steps.value is False and "--max-steps 50 given" in steps.reason
    assert run_length(None, None, has_val=False, time_budget=None)[1].value is False
    assert run_length(None, None, has_val=True, time_budget=60.0)[1].value is False
    # Asked for either way: kept, with --epochs too.
    assert run_length(4, True, has_val=True, time_budget=None)[1].value is True
    assert run_length(None, False, has_val=True, time_budget=None)[1].value is False


def test_the_plan_decides_and_says_why():
    p = plan(TrainConfig(data="DATA"), PHOTOS, PRESETS["cpu2"])
    assert p.config.epochs == DEFAULT_EPOCHS and p.config.early_stop is True
    assert "early_stop" in p.lines and "no --epochs" in p.lines["early_stop"]
    given = plan(TrainConfig(data="DATA", epochs=3), PHOTOS, PRESETS["cpu2"])
    assert given.config.epochs == 3 and given.config.early_stop is False
    assert "--epochs 3 given" in given.lines["early_stop"]


def test_100_percent_stops_at_once():
    why = stop_reason(epochs_done=3, best_epoch=3, best_accuracy=1.0, lr_share=0.9)
    assert why is not None and "100 %" in why and "epoch 3" in why


@pytest.mark.parametrize("lr_share", [1.0, 0.5, LATE_LR + 0.01])
def test_a_plateau_while_the_lr_is_high_goes_on(lr_share):
    """Mid-schedule the LR's fall still lifts a flat curve: a plateau there is no stop."""
    assert stop_reason(epochs_done=6, best_epoch=2, best_accuracy=0.8, lr_share=lr_share) is None


def test_a_late_plateau_stops_after_the_patience():
    assert stop_reason(epochs_done=8, best_epoch=8 - PATIENCE + 1, best_accuracy=0.8,
                       lr_share=0.1) is None  # not yet PATIENCE epochs old
    why = stop_reason(epochs_done=8, best_epoch=8 - PATIENCE, best_accuracy=0.8, lr_share=0.1)
    assert why is not None and f"epoch {8 - PATIENCE}'s 80.00%" in why and "10% of its peak" in why


def test_the_advice_reads_the_curve():
    line = curve_advice(best_epoch=3, best_accuracy=0.97254, epochs_done=10, epochs_planned=10,
                        last_gain=0.0)
    assert line == ("val accuracy reached its best (97.25%) at epoch 3 of 10: `--epochs 3` or "
                    "`--target-accuracy 0.972` ends the next run there")
    rising = curve_advice(best_epoch=10, best_accuracy=0.9, epochs_done=10, epochs_planned=10,
                          last_gain=0.012)
    assert rising is not None and "still rose in the last epoch (+1.20%)" in rising
    # Best at the end, flat or perfect: nothing to say.
    assert curve_advice(best_epoch=10, best_accuracy=0.9, epochs_done=10, epochs_planned=10,
                        last_gain=0.0) is None
    assert curve_advice(best_epoch=4, best_accuracy=1.0, epochs_done=4, epochs_planned=10,
                        last_gain=0.1) is None
