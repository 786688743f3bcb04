"""--time-budget keeps time when the machine's pace changes mid-run (run_length.RunLength).

A run on a simulated clock: each step takes the pace the test sets, each epoch ends in an
evaluation, and the trainer's calls into RunLength are made as the trainer makes them. The
2-core box's own runs went 93 -> 65 -> 95 ms a step as other processes came and went; one
sizing from the first seconds then missed a 60 s budget by 15 %."""
from __future__ import annotations

import types

import pytest
import torch

from turbotrain.train.config.config import TrainConfig
from turbotrain.train.engine import run_length
from turbotrain.train.engine.run_length import RunLength
from turbotrain.train.engine.trainer_state import Counters
from turbotrain.train.plan.budget import FINISH_SECONDS
from turbotrain.train.step.distributed import DistEnv
from turbotrain.train.step.schedule import LRSchedule

STEPS_PER_EPOCH = 23
EVAL_SECONDS = 0.15
START_SECONDS = 3.0  # start-up before the first step


class Clock:
    def __init__(self):
        self.now = START_SECONDS

    def __call__(self) -> float:
        return self.now


def fake_run(budget: float, schedule: str = "cosine") -> types.SimpleNamespace:
    config = TrainConfig(data="DATA", time_budget=budget, epochs=1000, schedule=schedule)
    total = 1000 * STEPS_PER_EPOCH
    return types.SimpleNamespace(
        config=config, total_steps=total, steps_per_epoch=STEPS_PER_EPOCH, global_batch=128,
        env=DistEnv(), device=torch.device("cpu"), val_pipeline=None,
        engine=types.SimpleNamespace(schedule=LRSchedule(total=total, warmup=total // 20,
                                                         kind=schedule)),
        decisions={"warmup_steps": "auto"})


def simulate(monkeypatch, budget: float, pace, *, keep_time: bool = True,
             schedule: str = "cosine"):
    """Trains on the clock until the run's length is reached; returns (the run's end in
    seconds, the LR of each step, the counters, the run)."""
    clock = Clock()
    monkeypatch.setattr(run_length, "time", types.SimpleNamespace(perf_counter=clock))
    run = fake_run(budget, schedule)
    length, c = RunLength(run, warmup_steps=1), Counters()
    lrs = []
    while c.step < run.total_steps:
        lrs.append(run.engine.schedule.lr(c.step))
        clock.now += pace(clock.now)
        c.step += 1
        length.step_done(c, c.step, clock, lambda: None)
        if not keep_time and c.budget_total_steps >= 0:
            c.budget_next_check = -1  # sized once only
        if c.step % STEPS_PER_EPOCH == 0:
            clock.now += EVAL_SECONDS
            c.eval_seconds += EVAL_SECONDS
            c.epoch += 1
    if c.step % STEPS_PER_EPOCH:
        clock.now += EVAL_SECONDS  # the partial last epoch's evaluation
    return clock.now + FINISH_SECONDS, lrs, c, run


def burst(now: float) -> float:
    """A 120 s run on the 2-core box: 5x slower for 40 s while another process ran."""
    return 0.4 if 45 <= now < 85 else 0.075


def slows_down(now: float) -> float:
    return 0.065 if now < 20 else 0.095


def speeds_up(now: float) -> float:
    return 0.095 if now < 12 else 0.065


@pytest.mark.parametrize("pace,budget", [(slows_down, 60), (speeds_up, 60), (burst, 120)])
def test_the_run_ends_on_time_when_the_pace_changes(monkeypatch, pace, budget):
    end, _, c, _ = simulate(monkeypatch, budget, pace)
    assert 0.97 * budget <= end <= 1.02 * budget, end
    assert c.budget_resizes >= 1
    # The sizing from the first seconds alone misses by more than 10 %: what the test guards.
    once, *_ = simulate(monkeypatch, budget, pace, keep_time=False)
    assert abs(once - budget) > 0.1 * budget, once


@pytest.mark.parametrize("schedule", ["cosine", "linear", "onecycle"])
def test_the_learning_rate_never_jumps_and_ends_on_the_last_step(monkeypatch, schedule):
    _, lrs, c, _ = simulate(monkeypatch, 60, slows_down, schedule=schedule)
    assert len(lrs) == c.budget_total_steps
    peak = max(lrs)
    # From the first timed step on (the warm-up step and the first timing cannot know the
    # pace), the LR moves by at most two of the warm-up's own steps.
    jumps = [abs(b - a) for a, b in zip(lrs[2:], lrs[3:])]
    ramp = peak / max(1, lrs.index(peak) + 1)
    assert max(jumps) <= 2 * ramp, (max(jumps), ramp)
    assert lrs[-1] < 0.02 * peak  # the decay's end, not a cut-off


def test_a_steady_pace_is_sized_once(monkeypatch):
    end, _, c, _ = simulate(monkeypatch, 30, lambda now: 0.08)
    assert 0.97 * 30 <= end <= 1.01 * 30, end
    assert c.budget_resizes <= 1  # the evaluations' measured cost may move it by a step


def test_a_resumed_run_keeps_its_schedule(monkeypatch):
    """The anchor and warm-up the budget set are in the Counters: `apply` (a resume) builds
    the same schedule."""
    _, _, c, trained = simulate(monkeypatch, 60, slows_down, schedule="onecycle")
    assert c.budget_resizes >= 1 and c.lr_anchor_step > 0
    resumed = fake_run(60, schedule="onecycle")
    RunLength(resumed, warmup_steps=1).apply(c)
    assert resumed.total_steps == trained.total_steps == c.budget_total_steps
    assert resumed.engine.schedule == trained.engine.schedule
