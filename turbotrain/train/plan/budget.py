"""`--time-budget`: how long a run may be, as a pure function of what its first steps measured.

A budget cannot be planned before the run starts: the step time depends on the machine, the
pipeline, the model and the precision, and a guess off by 2x (bf16 against fp32 on the same
CPU) would end the run at half the budget or twice it. So the trainer measures a few steps
after the warm-up ones (compile, allocator and oneDNN plans stay out of it) and calls
`fit_budget` once; the schedule is then re-planned for the run's new length, so the learning
rate reaches its end on time instead of being cut off mid-cosine. The result is saved in the
checkpoint, so a resumed run keeps the same length and schedule.

    fit = fit_budget(budget_s=90, elapsed_s=12.0, step_s=0.30, steps_done=6,
                     steps_per_epoch=23, eval_s=0.8, max_steps=2300)
    fit.total_steps, fit.epochs, fit.reason
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Callable

# Steps timed after the warm-up ones before the run is sized: for 8 % of the budget (2 s at
# least), at least 5 and at most 200 steps. bench/bench_demo.py on the 2-core box: the median of
# 20 steps (~2 s) was 62 ms where the run then averaged 75 ms (the 80 s budget took 92 s), and
# 88-94 ms where it averaged 83 ms (budgets used 85-91 %): a short window misjudges the pace by
# 15 %, a longer one averages the machine's own variation in; yet it stays a small share of
# the run, planned in its first seconds.
MEASURED_STEPS = 5
MAX_MEASURED_STEPS = 200
MEASURED_SECONDS = 2.0
MEASURED_SHARE = 0.08
# After the fit the run is kept on time: the steps left are sized again from the pace since
# the last sizing, after 10 % of the time left (1 s at least), and the rest of the LR decay is
# stretched or shrunk to match (schedule.LRSchedule.resized: the LR stays continuous). One
# sizing from the first seconds cannot hold +-10 %: on the 2-core box a 60 s run's step time
# went 93 -> 65 -> 95 ms as other processes came and went (bench/bench_demo.py: 85 % used),
# and a 120 s run's went 5x slower for 40 s, then back. Sizing again after a share of the time
# *left* looks more often near the end, where a burst that has passed must be made up for.
CORRECT_SHARE = 0.10
MIN_CORRECT_SECONDS = 1.0
# A timed step this many times the median is a burst of load from another process (5-10x,
# seen on the 2-core box), not the run's pace: left out of the mean.
BURST_FACTOR = 4.0
# Seconds kept for the end of a run: the last checkpoint, best/final.safetensors, summary.json
# and the two figures (matplotlib draws curves.png and timeline.png in ~1-2 s on the 2-core box).
FINISH_SECONDS = 3.0
# An evaluation pass over N images costs about this share of N training images' step time (a
# forward pass without backward and optimizer step: ~1/3, rounded up for the loss and top-k).
EVAL_COST = 0.4

def typical_step_seconds(intervals: list[float]) -> float:
    """The mean of the timed steps, bursts of outside load (BURST_FACTOR x the median) left out:
    the mean, not the median, because the run pays for its own slower steps (an allocator
    trim, a Python GC pass) as well."""
    median = statistics.median(intervals)
    kept = [t for t in intervals if t <= BURST_FACTOR * median]
    return sum(kept) / len(kept)


def measure_checks() -> tuple[int, ...]:
    """The counts of timed steps at which the pace is looked at (every rank at the same step,
    so that ranks agree on when to size the run): 1 to 4 (a provisional schedule from the
    first steps), then every 5th up to MAX_MEASURED_STEPS. Doubling counts (5, 10, 20, 40)
    sized a 12 s run at 40 timed steps, 3.6 s, where its 2 s window ended at 22: with 7 s of
    start-up on a loaded box it then ran 16 s."""
    return tuple(range(1, MEASURED_STEPS)) + tuple(
        range(MEASURED_STEPS, MAX_MEASURED_STEPS + 1, MEASURED_STEPS))


def measured_enough(timed_seconds: float, timed_steps: int, budget_s: float) -> bool:
    """Whether the timed steps are a long enough share of the budget to size the run from."""
    window = max(MEASURED_SECONDS, MEASURED_SHARE * budget_s)
    return timed_steps >= MEASURED_STEPS and (timed_seconds >= window
                                              or timed_steps >= MAX_MEASURED_STEPS)


def correction_steps(left_s: float, step_s: float) -> int:
    """Steps until the next sizing of the run, `left_s` seconds before the budget's end."""
    wait = max(MIN_CORRECT_SECONDS, CORRECT_SHARE * left_s)
    return max(1, round(wait / max(step_s, 1e-6)))


def eval_seconds(val_images: int, step_s: float, images_per_step: int) -> float:
    """The predicted time of one evaluation pass, from the measured training step time."""
    return EVAL_COST * step_s * val_images / max(1, images_per_step)


@dataclass(frozen=True)
class BudgetFit:
    total_steps: int  # optimizer steps of the whole run (the schedule's length)
    epochs: int  # epochs begun (the last may be partial)
    reason: str


def pixel_cost(size: int, final_size: int) -> float:
    """A step's time at `size` px as a share of one at `final_size`: the pixel count's ratio
    (convolutions' FLOPs scale with it; what it leaves out, a fixed cost per step, is made up
    for by the run's later sizings, which measure the pace at the sizes it trains at)."""
    return (size / final_size) ** 2


def fit_budget(*, budget_s: float, elapsed_s: float, step_s: float, steps_done: int,
               steps_per_epoch: int, eval_s: float, max_steps: int,
               finish_s: float = FINISH_SECONDS,
               step_cost: Callable[[int], float] | None = None) -> BudgetFit:
    """The most optimizer steps that end within `budget_s` of the run's start.

    `elapsed_s`: the run's time so far (start-up, warm-up and `steps_done` steps); `step_s`:
    the measured time of one step (data wait included); `eval_s`: one evaluation pass, run at
    every epoch's end and once at the end of a partial last epoch; `max_steps`: the length the
    run had before (--epochs, --max-steps), never exceeded. At least one step more than done.
    `step_cost(epoch)`: under progressive resizing, a step of that epoch as a share of
    `step_s` (pixel_cost: `step_s` is then a final-size step's time); None: every step alike."""
    if step_cost is not None:
        return _fit_by_epoch(budget_s=budget_s, elapsed_s=elapsed_s, step_s=step_s,
                             steps_done=steps_done, steps_per_epoch=steps_per_epoch,
                             eval_s=eval_s, max_steps=max_steps, finish_s=finish_s,
                             step_cost=step_cost)
    left = budget_s - elapsed_s - finish_s
    spe = max(1, steps_per_epoch)
    epoch_s = spe * step_s + eval_s
    # Epochs already evaluated: an epoch's evaluation follows its last step, so at a multiple
    # of `spe` that epoch's is still to come.
    evaluated = max(0, math.ceil(steps_done / spe) - 1)
    # Whole epochs E such that (E * spe - steps_done) steps and E - evaluated evaluations fit.
    whole = (max(0, math.floor((left + steps_done * step_s + evaluated * eval_s) / epoch_s))
             if epoch_s > 0 else 0)
    total = whole * spe
    # Then the steps of a partial epoch, with its own evaluation at the end.
    spare = left - (total - steps_done) * step_s - max(0, whole - evaluated) * eval_s - eval_s
    if spare > 0 and step_s > 0:
        total += min(spe - 1, math.floor(spare / step_s))
    total = max(steps_done + 1, min(total, max_steps))
    epochs = math.ceil(total / spe)
    if total >= max_steps:
        why = (f"the run's {max_steps} steps fit in the {budget_s:g} s budget "
               f"({step_s * 1000:.0f} ms a step measured)")
    else:
        why = (f"{total} steps ({total / spe:.3g} epochs) fit in the {budget_s:g} s budget: "
               f"{step_s * 1000:.0f} ms a step measured, {eval_s:.1f} s an evaluation, "
               f"{elapsed_s:.0f} s spent before")
    return BudgetFit(total_steps=total, epochs=epochs, reason=why)


def _fit_by_epoch(*, budget_s: float, elapsed_s: float, step_s: float, steps_done: int,
                  steps_per_epoch: int, eval_s: float, max_steps: int, finish_s: float,
                  step_cost: Callable[[int], float]) -> BudgetFit:
    """fit_budget for steps whose time depends on their epoch: the epochs left are walked one
    by one (at most max_steps / steps_per_epoch of them), each at its own step time. With
    step_cost = 1 it gives fit_budget's closed form (tests/train/plan/test_budget_ramp.py)."""
    left = budget_s - elapsed_s - finish_s
    spe = max(1, steps_per_epoch)
    # The epoch just finished (steps_done a multiple of spe) has its evaluation still to come.
    spent = eval_s if steps_done > 0 and steps_done % spe == 0 else 0.0
    total, epoch = steps_done, steps_done // spe
    while total < max_steps:
        cost = step_s * step_cost(epoch)
        end = (epoch + 1) * spe
        need = (end - total) * cost + eval_s
        if spent + need > left:
            spare = left - spent - eval_s  # a partial epoch, with its own evaluation
            if spare > 0 and cost > 0:
                total += min(end - total - 1, math.floor(spare / cost))
            break
        spent += need
        total, epoch = end, epoch + 1
    total = max(steps_done + 1, min(total, max_steps))
    epochs = math.ceil(total / spe)
    if total >= max_steps:
        why = (f"the run's {max_steps} steps fit in the {budget_s:g} s budget "
               f"({step_s * 1000:.0f} ms a final-size step measured)")
    else:
        why = (f"{total} steps ({total / spe:.3g} epochs) fit in the {budget_s:g} s budget: "
               f"{step_s * 1000:.0f} ms a final-size step measured, each epoch's steps scaled "
               f"by its pixel count, {eval_s:.1f} s an evaluation, {elapsed_s:.0f} s spent "
               "before")
    return BudgetFit(total_steps=total, epochs=epochs, reason=why)
