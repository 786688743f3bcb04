"""--time-budget's sizing (plan/budget.py), a pure function of what the first steps measured,
and its duration text (config/duration.py)."""
from __future__ import annotations

import pytest

from turbotrain.train.config.duration import DurationError, parse_duration
from turbotrain.train.plan.budget import (FINISH_SECONDS, MAX_MEASURED_STEPS, MEASURED_STEPS,
                                         correction_steps, eval_seconds, fit_budget,
                                         measure_checks, measured_enough, typical_step_seconds)


def fit(**changes):
    settings = dict(budget_s=100.0, elapsed_s=10.0, step_s=0.5, steps_done=5,
                    steps_per_epoch=20, eval_s=2.0, max_steps=100_000, finish_s=0.0)
    return fit_budget(**{**settings, **changes})


def seconds_of(f, *, elapsed_s=10.0, step_s=0.5, steps_done=5, spe=20, eval_s=2.0):
    """What the fitted run costs from now: its remaining steps and one evaluation per epoch
    begun."""
    return elapsed_s + (f.total_steps - steps_done) * step_s + f.epochs * eval_s


def test_the_fitted_run_ends_within_the_budget_and_fills_it():
    f = fit()
    # 90 s left, 5 steps done: 8 whole epochs cost 155 x 0.5 + 8 x 2 = 93.5 s > 90; 7 cost
    # 81.5 s, and 13 more steps (6.5 s) plus their evaluation (2 s) make exactly 90 s.
    assert (f.total_steps, f.epochs) == (7 * 20 + 13, 8)
    assert 99.0 <= seconds_of(f) <= 100.0
    assert "fit in the 100 s budget" in f.reason and "500 ms a step" in f.reason


@pytest.mark.parametrize("step_s", [0.05, 0.2, 0.5, 1.3])
@pytest.mark.parametrize("budget_s", [30.0, 60.0, 120.0])
def test_any_step_time_fits_within_one_step_of_the_budget(budget_s, step_s):
    f = fit(budget_s=budget_s, step_s=step_s, eval_s=1.0)
    used = seconds_of(f, step_s=step_s, eval_s=1.0)
    assert used <= budget_s
    assert used > budget_s - step_s - 1.0  # one more step (and its evaluation) would not fit


@pytest.mark.parametrize("steps_done", [19, 20, 21, 65, 100, 141])
def test_evaluations_already_done_are_not_paid_again(steps_done):
    """Sized again mid-run (run_length keeps a budget on time), only the epochs not yet
    evaluated cost an evaluation: counting the past ones left 2-5 % of the budget unused."""
    spent = 10.0 + steps_done * 0.5 + (steps_done - 1) // 20 * 2.0  # steps and evaluations so far
    f = fit(elapsed_s=spent, steps_done=steps_done)
    evaluated = (steps_done - 1) // 20
    used = spent + (f.total_steps - steps_done) * 0.5 + (f.epochs - evaluated) * 2.0
    assert 100.0 - 0.5 - 2.0 < used <= 100.0


def test_the_pace_is_checked_at_the_same_counts_on_every_rank():
    checks = measure_checks()
    assert checks[:MEASURED_STEPS] == tuple(range(1, MEASURED_STEPS + 1))
    assert checks[-1] == MAX_MEASURED_STEPS and list(checks) == sorted(set(checks))
    assert not measured_enough(1.0, 10, 60.0) and measured_enough(4.8, 10, 60.0)
    assert not measured_enough(10.0, MEASURED_STEPS - 1, 60.0)  # too few, however slow
    assert measured_enough(0.5, MAX_MEASURED_STEPS, 60.0)  # a very fast step: enough counted


def test_the_run_is_sized_again_after_a_tenth_of_the_time_left():
    assert correction_steps(60.0, 0.075) == 80
    assert correction_steps(5.0, 0.1) == 10  # 1 s at least
    assert correction_steps(1.0, 5.0) == 1


def test_the_finish_is_kept_out_of_the_budget():
    assert fit(finish_s=FINISH_SECONDS).total_steps < fit(finish_s=0.0).total_steps


def test_a_slower_evaluation_leaves_fewer_steps():
    assert fit(eval_s=8.0).total_steps < fit(eval_s=0.5).total_steps


def test_never_longer_than_the_run_asked_for():
    f = fit(max_steps=60)
    assert (f.total_steps, f.epochs) == (60, 3)
    assert "the run's 60 steps fit" in f.reason


def test_a_budget_already_spent_still_ends_after_the_next_step():
    f = fit(elapsed_s=500.0)
    assert (f.total_steps, f.epochs) == (6, 1)


def test_eval_seconds_scales_with_the_val_split():
    assert eval_seconds(1000, 0.5, 100) == pytest.approx(2 * eval_seconds(500, 0.5, 100))
    assert eval_seconds(0, 0.5, 100) == 0.0


@pytest.mark.parametrize("text,seconds", [("90", 90.0), ("90s", 90.0), ("1.5m", 90.0),
                                          ("10min", 600.0), ("2h", 7200.0), (45, 45.0),
                                          (" 30 s ", 30.0)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "ten", "5d", "-3s", "0", "nan", True])
def test_bad_durations_name_the_flag(text):
    with pytest.raises(DurationError, match="--time-budget"):
        parse_duration(text)


def test_the_typical_step_is_the_mean_without_bursts_of_outside_load():
    assert typical_step_seconds([0.1, 0.1, 0.1, 0.1, 0.2]) == pytest.approx(0.12)
    assert typical_step_seconds([0.1, 0.1, 0.1, 0.1, 0.9]) == pytest.approx(0.1)
