"""tune under progressive resizing: a model row stands for the whole run, timed at each size of
the plan's schedule and weighed by the epochs at it (tune.py's docstring, step 3)."""
from __future__ import annotations

import pytest

from turbotrain.pipeline.resolution import ResolutionSchedule
from turbotrain.train.tools.tune_sweeps import run_rate
from turbotrain.train.tools.tune_report import format_report

# 96 px for epochs 0-4, 112 at 5, 128 from 6 on (the photos' default ramp of an 8-epoch run).
RAMP = ResolutionSchedule(min_res=96, max_res=128, start_ramp=3, end_ramp=7, step=16)


def test_each_size_weighs_by_its_share_of_the_epochs():
    assert RAMP.shares(8) == {96: 5 / 8, 112: 1 / 8, 128: 2 / 8}
    assert [RAMP.first_epoch_at(size, 8) for size in (96, 112, 128)] == [0, 5, 6]
    with pytest.raises(ValueError):
        RAMP.first_epoch_at(104, 8)


def test_the_run_rate_is_the_harmonic_mean_weighed_by_the_images():
    # Half the images at 300 images/s and half at 100: 1/600 + 1/200 s an image -> 150/s,
    # not the 200 an arithmetic mean says; the wait weighs by the seconds (1/4 and 3/4).
    rate, wait = run_rate([(0.5, 300.0, 0.4), (0.5, 100.0, 0.0)])
    assert rate == pytest.approx(150.0)
    assert wait == pytest.approx(0.1)
    assert run_rate([(1.0, 250.0, 0.2)]) == pytest.approx((250.0, 0.2))


def test_the_report_names_the_sizes_a_row_was_timed_at():
    result = {"data": "d", "images": 10, "model": "resnet18", "image_size": 128,
              "precision": "bf16", "device": "cpu", "cores": 2, "seconds": 5,
              "budget_seconds": 90, "past_budget": None, "largest_fitting": 64,
              "search_limit": 64, "how": "estimate", "rows": [], "best": None,
              "train_pick": {"pipeline": "resident", "reason": "r"}, "differs": None,
              "command": "turbotrain train --data d", "eager_note": None,
              "size_shares": RAMP.shares(8)}
    text = format_report(result)
    assert "timed at 96 px (62% of the epochs), 112 px (12% of the epochs), 128 px (25%" in text
    one_size = format_report({**result, "size_shares": {128: 1.0}})
    assert "timed at" not in one_size


def test_a_model_row_is_timed_at_each_size_of_the_plans_schedule(tmp_path):
    """Photos trained at 128 px for train's default epochs: the plan ramps them
    (plan/resolution.py), and a model row's steps run at each size of the schedule, in the
    pipeline train would use."""
    import argparse

    from tests.train.tiny_data import write_tiny_dataset
    from turbotrain.train.tools.tune import Sweep
    from turbotrain.train.tools.tune_report import Row

    data = write_tiny_dataset(tmp_path / "ds", train=64, val=None, size=144)
    args = argparse.Namespace(data=data, model="auto", image_size=128, device="cpu",
                              precision="fp32", optimizer="sgd", global_batch_size=None,
                              pipeline=None, workers=None, budget_seconds=60.0)
    sweep = Sweep(args)
    assert sweep.schedule is not None and len(sweep.size_shares) > 1
    assert sum(sweep.size_shares.values()) == pytest.approx(1.0)

    class Engine:  # the step's shapes, not its arithmetic
        def __init__(self):
            self.sizes = []

        def micro_step(self, images, labels, will_step):
            self.sizes.append(images.shape[-1])

        def optimizer_step(self, step):
            pass

    engine, row = Engine(), Row(sweep.pick, 1, 1)
    sweep.train_rate(row, engine, batch=8, seconds=0.05)
    assert sorted(set(engine.sizes)) == sorted(sweep.size_shares)
    assert row.train_images_per_second > 0 and 0 <= row.data_wait_fraction <= 1
