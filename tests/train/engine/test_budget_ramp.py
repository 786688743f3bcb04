"""--time-budget with progressive resizing: each epoch's steps predicted from the measured pace
scaled by its pixel count, and corrected as the run goes, so a run whose steps get slower as
its size ramps up still ends within +-10 % of its budget (on test_budget_keeps_time's
simulated clock)."""
from __future__ import annotations

import pytest

from turbotrain.train.engine import run_length
from turbotrain.train.plan.budget import fit_budget, pixel_cost
from turbotrain.train.plan.resolution import schedule_of

from . import test_budget_keeps_time as keeps_time
from .test_budget_keeps_time import STEPS_PER_EPOCH, fake_run, simulate

# 96 px until epoch 2, ramping to 128 px at epoch 6 (steps of 16 px): 0.56x, 0.77x, 1x steps.
RAMP = dict(image_size=128, progressive=True, min_res=96, res_ramp=(2.0, 6.0))
FINAL_STEP_S = 0.1
FIXED_STEP_S = 0.01  # a per-step cost the pixel model does not know of: corrections find it


def ramped_run(monkeypatch, budget, *, scaled=True):
    base = fake_run

    def with_ramp(budget_s, schedule="cosine"):
        run = base(budget_s, schedule)
        run.config = run.config.replace(**RAMP)
        return run

    monkeypatch.setattr(keeps_time, "fake_run", with_ramp)  # what simulate() builds
    schedule = schedule_of(with_ramp(budget).config)
    state = {"step": 0}

    def pace(_now):  # the step being taken is in epoch step // STEPS_PER_EPOCH
        epoch = state["step"] // STEPS_PER_EPOCH
        state["step"] += 1
        return FIXED_STEP_S + FINAL_STEP_S * pixel_cost(schedule.size(epoch), 128)

    if not scaled:  # the budget as it was: every step priced at the pace first measured
        original = run_length.RunLength.__init__

        def unscaled(self, *args, **kwargs):
            original(self, *args, **kwargs)
            self.step_cost = None
        monkeypatch.setattr(run_length.RunLength, "__init__", unscaled)
    return simulate(monkeypatch, budget, pace)


@pytest.mark.parametrize("ramp", [(2.0, 6.0), (8.0, 10.0)])
@pytest.mark.parametrize("budget", [30.0, 60.0, 120.0])
def test_a_ramped_run_ends_within_ten_percent_of_its_budget(monkeypatch, budget, ramp):
    monkeypatch.setitem(RAMP, "res_ramp", ramp)
    end, _, c, _ = ramped_run(monkeypatch, budget)
    assert c.epoch > ramp[1]  # the run went through the ramp: its steps did get slower
    assert abs(end - budget) <= 0.10 * budget, (end, budget)


def first_sizing(monkeypatch, budget: float, *, scaled: bool) -> tuple[int, int]:
    """(the steps the first sizing planned the run for, the steps it made)."""
    planned = []
    fit = run_length.RunLength._fit

    def recording(self, c, step_s, elapsed):
        line = fit(self, c, step_s, elapsed)
        planned.append(c.budget_total_steps)
        return line
    monkeypatch.setattr(run_length.RunLength, "_fit", recording)
    _, _, c, _ = ramped_run(monkeypatch, budget, scaled=scaled)
    return planned[0], c.step


@pytest.mark.parametrize("budget", [30.0, 120.0])
def test_the_first_sizing_prices_the_ramp(monkeypatch, budget):
    """What the pixel scaling is for: the first sizing, made from 96 px steps, already plans
    about the steps the run makes, so its LR schedule is planned for the right length. Pricing
    every step at that first pace plans ~1.5x too many, and the later sizings (which keep
    either run on time) must shrink the schedule."""
    planned, made = first_sizing(monkeypatch, budget, scaled=True)
    assert abs(planned - made) <= 0.05 * made, (planned, made)
    planned, made = first_sizing(monkeypatch, budget, scaled=False)
    assert planned > 1.2 * made, (planned, made)


def test_a_constant_cost_gives_the_closed_form():
    """Within a step: the closed form and the walk round their float sums differently."""
    for done in (0, 5, 23, 46, 50):
        for left in (10.0, 37.5, 100.0, 800.0):
            kwargs = dict(budget_s=left + 5.0, elapsed_s=5.0, step_s=0.1, steps_done=done,
                          steps_per_epoch=23, eval_s=0.4, max_steps=23000, finish_s=0.0)
            walked = fit_budget(**kwargs, step_cost=lambda epoch: 1.0).total_steps
            assert abs(walked - fit_budget(**kwargs).total_steps) <= 1, (done, left)


def test_cheaper_early_epochs_fit_more_steps():
    kwargs = dict(budget_s=60.0, elapsed_s=0.0, step_s=0.125, steps_done=0, steps_per_epoch=23,
                  eval_s=0.0, max_steps=23000, finish_s=0.0)
    assert fit_budget(**kwargs).total_steps == 480
    ramped = fit_budget(**kwargs, step_cost=lambda epoch: 0.5 if epoch < 10 else 1.0)
    # 10 epochs (230 steps) at half price, 14.375 s; then 45.625 s at 0.125 s a step: 365.
    assert ramped.total_steps == 230 + 365
    assert "pixel count" in ramped.reason
