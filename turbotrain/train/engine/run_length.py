"""How long a run lasts beyond --epochs and --max-steps: `--time-budget`, `--target-accuracy`
and `--early-stop` (the rule: plan/early_stop.py), and what the learning curve says at the end.

The budget: the steps after the warm-up ones are timed one by one (for 8 % of the budget, 2 s
at least, 5 to 200 steps; intervals that hold an evaluation left out), `budget.fit_budget`
turns their typical time into the run's length, and the run is re-planned: its total steps,
its epochs and the LR schedule (a warm-up of 5% of the new length when the warm-up was
automatic), so the schedule ends on time. The pace of the first seconds is not the pace of the
run on a shared machine, so every 10 % of the budget the steps left are sized again from the
pace since the last sizing (evaluations and checkpoints measured, not predicted) and the rest
of the LR decay is stretched or shrunk to end there (`LRSchedule.resized`: no jump in the LR).
Every rank sizes with the slowest rank's numbers, at the same steps, so all agree. The fitted
length, its schedule and its cap are kept in the Counters (checkpoint), so a resumed run keeps
them and goes on keeping time.

The target: checked at each evaluation; the run stops at the first one that reaches it, and
the summary says so and that the schedule was cut there. Early stopping: checked after each
epoch's evaluation, from the counters alone (the best val accuracy's step, the LR now), so a
resumed run decides the same. Each stop is written to metrics.jsonl (a `stop` record), which
curves.png and timeline.png mark.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

from ..plan import early_stop, recipe
from ..plan.budget import (MEASURED_SECONDS, MEASURED_SHARE, correction_steps, eval_seconds,
                           fit_budget, measure_checks, measured_enough, pixel_cost,
                           typical_step_seconds)
from ..plan.resolution import schedule_of
from ..plan.eval_rules import eval_work
from ..step.distributed import max_over_ranks
from ..step.schedule import LRSchedule
from .builder import Run
from .trainer_state import Counters


@dataclass(frozen=True)
class _Mark:
    """Where the run was when it was last sized: the pace since is measured from here."""
    elapsed: float
    eval_seconds: float
    step: int
    epoch: int


class RunLength:
    """One Trainer's --time-budget and --target-accuracy; `run.config` must be the trainer's."""

    def __init__(self, run: Run, warmup_steps: int):
        self.run = run
        self.warmup_steps = warmup_steps  # the process's untimed first steps
        self._last: tuple[float, float] | None = None  # (clock, eval_seconds) at the last step
        self._intervals: list[float] = []  # seconds between consecutive timed steps
        self._costs: list[float] = []  # ... and each one's step_cost (1.0 at one size)
        self._checks = frozenset(measure_checks())
        self._mark: _Mark | None = None
        self._eval_s = 0.0  # the evaluation's predicted seconds, until one is measured
        self._provisional_steps: int | None = None
        self.fit_reason: str | None = None
        self.early_stop_reason: str | None = None  # None after a resume: the counters say when
        # Progressive resizing: a step of epoch e costs step_cost(e) final-size steps, so the
        # pace is measured per final-size step and each epoch predicted at its own size.
        schedule = schedule_of(run.config)
        self.step_cost = (None if schedule is None else
                          lambda epoch: pixel_cost(schedule.size(epoch), schedule.max_res))

    @property
    def budget(self) -> float | None:
        return self.run.config.time_budget

    @property
    def target(self) -> float | None:
        return self.run.config.target_accuracy

    # ------------------------------------------------------------------ the budget

    def step_done(self, c: Counters, process_steps: int, elapsed: Callable[[], float],
                  sync: Callable[[], None]) -> str | None:
        """After each optimizer step: times the steps after warm-up and, once enough are timed,
        sizes the run (returning the line that says how), then keeps it on time. `elapsed`: the
        run's seconds so far, read after `sync` (the device's queue drained)."""
        if self.budget is None or process_steps < self.warmup_steps:
            return None
        if c.budget_total_steps >= 0:
            self._keep_on_time(c, elapsed, sync)
            return None
        sync()
        now = time.perf_counter()
        if self._last is not None and c.eval_seconds == self._last[1]:
            # An interval that held an evaluation (and the epoch's checkpoint) is no step's time.
            self._intervals.append(now - self._last[0])
            self._costs.append(self._cost(c.epoch))
        self._last = (now, c.eval_seconds)
        timed = len(self._intervals)
        last_step = timed > 0 and self.run.total_steps - c.step <= 1
        if timed not in self._checks and not last_step:
            return None
        env, device = self.run.env, self.run.device
        timed_seconds = max_over_ranks(sum(self._intervals), env, device)
        # In final-size steps: each timed step divided by its epoch's pixel share.
        final_size = [t / cost for t, cost in zip(self._intervals, self._costs)]
        step_s = max_over_ranks(typical_step_seconds(final_size), env, device)
        if not (last_step or measured_enough(timed_seconds, timed, self.budget)):
            self._provisional(c, step_s, elapsed())
            return None
        return self._fit(c, step_s, elapsed())

    def _sized(self, c: Counters, step_s: float, elapsed: float):
        self._eval_s = eval_seconds(self._val_images(), step_s, self.run.global_batch)
        return fit_budget(budget_s=self.budget, elapsed_s=elapsed, step_s=step_s,
                          steps_done=c.step, steps_per_epoch=self.run.steps_per_epoch,
                          eval_s=self._eval_s, max_steps=self.run.total_steps,
                          step_cost=self.step_cost)

    def _cost(self, epoch: int) -> float:
        return 1.0 if self.step_cost is None else self.step_cost(epoch)

    def _weighted_steps(self, first: int, end: int) -> float:
        """Steps first .. end - 1 counted in final-size steps (each epoch at its cost)."""
        if self.step_cost is None:
            return float(end - first)
        spe = max(1, self.run.steps_per_epoch)
        total, step = 0.0, first
        while step < end:
            stop = min(end, (step // spe + 1) * spe)
            total += (stop - step) * self.step_cost(step // spe)
            step = stop
        return total

    def _provisional(self, c: Counters, step_s: float, elapsed: float) -> None:
        """While the pace is being measured, the schedule of the length it points to so far:
        the run's own (--epochs, or the 1,000 epochs a budget allows) would hold the LR near
        0 in a warm-up planned for 1,000 epochs, then jump to the peak at the sizing."""
        total = self._provisional_steps = self._sized(c, step_s, elapsed).total_steps
        config = self.run.config
        warmup = config.warmup_steps
        if "warmup_steps" in self.run.decisions:
            warmup = recipe.warmup_steps(total, from_weights=config.from_weights).value
        self.run.engine.schedule = LRSchedule(total=total, warmup=warmup, kind=config.schedule)

    def _measuring(self, c: Counters) -> bool:
        """Whether the budget's pace is still being measured, on a provisional schedule."""
        return c.budget_total_steps < 0 and self._provisional_steps is not None

    def shown_steps(self, c: Counters) -> int:
        """The run's length as the progress line shows it: while a budget's pace is being
        measured, the length it points to so far (not the 1,000 epochs a budget allows)."""
        return self._provisional_steps if self._measuring(c) else self.run.total_steps

    def _fit(self, c: Counters, step_s: float, elapsed: float) -> str:
        run = self.run
        fit = self._sized(c, step_s, elapsed)
        c.budget_max_steps = run.total_steps
        c.budget_total_steps = fit.total_steps
        self._next_check(c, step_s, elapsed)
        self._mark = _Mark(elapsed, c.eval_seconds, c.step, c.epoch)
        self.fit_reason = fit.reason
        self.apply(c)
        line = (f"time budget {self.budget:g} s: {fit.reason}; the run is now "
                f"{fit.total_steps} steps ({_epochs(fit.epochs)}), its LR schedule re-planned "
                f"to end there")
        if c.lr_warmup_steps >= fit.total_steps and run.config.schedule != "onecycle":
            # A warm-up asked for, or saved by a config.yaml written before budget_sized
            # (2,000 steps planned for the 1,000-epoch cap): said, not a silent low LR.
            line += (f"; --warmup-steps {c.lr_warmup_steps} outlasts the run, so its LR never "
                     "reaches the peak: leave it out (auto: 5% of the sized run)")
        return line

    def _next_check(self, c: Counters, step_s: float, elapsed: float) -> None:
        c.budget_step_seconds = step_s
        c.budget_next_check = c.step + correction_steps(self.budget - elapsed, step_s)

    def _keep_on_time(self, c: Counters, elapsed: Callable[[], float],
                      sync: Callable[[], None]) -> None:
        """At `budget_next_check`: the steps left sized again from the pace since the last
        sizing, the rest of the schedule stretched or shrunk to end with them. Every rank
        reaches the same step with the same (slowest rank's) pace, so all agree."""
        if c.step != c.budget_next_check or c.step >= c.budget_total_steps:
            return
        sync()
        now = elapsed()
        mark, self._mark = self._mark, _Mark(now, c.eval_seconds, c.step, c.epoch)
        if mark is None or c.step <= mark.step:  # resumed: the pace is measured from here
            self._next_check(c, c.budget_step_seconds, now)
            return
        run = self.run
        evaluating = c.eval_seconds - mark.eval_seconds
        step_s = max(1e-6, (now - mark.elapsed - evaluating)
                     / self._weighted_steps(mark.step, c.step))
        if c.epoch > mark.epoch:
            self._eval_s = evaluating / (c.epoch - mark.epoch)
        elif self._eval_s == 0.0:
            self._eval_s = eval_seconds(self._val_images(), step_s, run.global_batch)
        step_s = max_over_ranks(step_s, run.env, run.device)
        eval_s = max_over_ranks(self._eval_s, run.env, run.device)
        fit = fit_budget(budget_s=self.budget, elapsed_s=now, step_s=step_s, steps_done=c.step,
                         steps_per_epoch=run.steps_per_epoch, eval_s=eval_s,
                         max_steps=c.budget_max_steps, step_cost=self.step_cost)
        self._next_check(c, step_s, now)
        if fit.total_steps == c.budget_total_steps:
            return
        schedule = run.engine.schedule.resized(fit.total_steps, c.step)
        c.budget_total_steps = fit.total_steps
        c.budget_resizes += 1
        c.lr_warmup_steps = schedule.warmup
        c.lr_anchor_step, c.lr_anchor_progress = schedule.anchor
        self.apply(c)

    def apply(self, c: Counters) -> None:
        """The fitted length and its schedule (just fitted, or restored from a checkpoint) made
        the run's."""
        if c.budget_total_steps < 0:
            return
        run = self.run
        total = c.budget_total_steps
        config = run.config.replace(epochs=math.ceil(total / run.steps_per_epoch))
        if c.lr_warmup_steps < 0:  # the first sizing: an automatic warm-up follows the length
            c.lr_warmup_steps = config.warmup_steps
            if "warmup_steps" in run.decisions:
                warmup = recipe.warmup_steps(total, from_weights=config.from_weights)
                c.lr_warmup_steps = warmup.value
                run.decisions["warmup_steps"] = (f"{warmup.value}: {warmup.reason} fitted to "
                                                 "the time budget")
        config = config.replace(warmup_steps=c.lr_warmup_steps)
        # A resized onecycle schedule is linear with its ramp fixed (LRSchedule.resized).
        kind = "linear" if config.schedule == "onecycle" and c.budget_resizes else config.schedule
        run.config, run.total_steps = config, total
        run.engine.schedule = LRSchedule(total=total, warmup=c.lr_warmup_steps, kind=kind,
                                         anchor=(c.lr_anchor_step, c.lr_anchor_progress))

    def _val_images(self) -> int:
        """The images of one evaluation, weighted by their work (eval resolution, flip TTA)."""
        pipeline, config = self.run.val_pipeline, self.run.config
        if pipeline is None:
            return 0
        try:
            count = len(pipeline) * config.batch_size * self.run.env.world_size
        except TypeError:  # a pipeline without a length: no evaluation cost predicted
            return 0
        return round(count * eval_work(config.image_size, config.eval_res, config.tta))

    # ------------------------------------------------------------------ the target

    def reached(self, c: Counters) -> bool:
        """Whether the last evaluation reached --target-accuracy (noted once, in `c`)."""
        if self.target is None or not c.val:
            return False
        if c.target_epoch < 0 and c.val.get("val_accuracy", 0.0) >= self.target:
            # Checked after an epoch's evaluation, when `c.epoch` already counts the next one.
            ended = c.epoch - 1 if c.micro_in_epoch == 0 and c.epoch > 0 else c.epoch
            c.target_epoch, c.target_step = ended, c.last_eval_step
        return c.target_epoch >= 0

    # ------------------------------------------------------------------ early stopping

    def _best_epoch(self, c: Counters) -> int:
        """The 1-based epoch whose evaluation gave the best val accuracy (0: none yet)."""
        if c.best_step < 0:
            return 0
        return max(1, math.ceil(c.best_step / max(1, self.run.steps_per_epoch)))

    def plateaued(self, c: Counters) -> bool:
        """Whether --early-stop ends the run after the epoch just evaluated (noted once)."""
        if c.early_stop_epoch >= 0:
            return True
        config = self.run.config
        if not config.early_stop or c.micro_in_epoch != 0 or c.epoch >= config.epochs:
            return False
        schedule = self.run.engine.schedule
        why = early_stop.stop_reason(
            epochs_done=c.epoch, best_epoch=self._best_epoch(c),
            best_accuracy=c.best_val_accuracy,
            lr_share=1.0 if schedule is None else schedule.lr(c.step))
        if why is not None:
            c.early_stop_epoch = c.epoch
            self.early_stop_reason = why
        return why is not None

    def curve_advice(self, c: Counters) -> str | None:
        """The end-of-run line that reads the learning curve (plan/early_stop.py)."""
        last = (c.val or {}).get("val_accuracy")
        gain = (last - c.previous_val_accuracy
                if last is not None and c.previous_val_accuracy >= 0 else None)
        return early_stop.curve_advice(best_epoch=self._best_epoch(c),
                                       best_accuracy=c.best_val_accuracy,
                                       epochs_done=c.epoch, epochs_planned=self.run.config.epochs,
                                       last_gain=gain)

    # ------------------------------------------------------------------ the record

    def stop_record(self, c: Counters, outcome: str, epoch_float: float) -> dict | None:
        """metrics.jsonl's `stop` record for a run the budget or the target ended."""
        if outcome not in ("target_accuracy", "time_budget", "early_stop"):
            return None
        return {"kind": "stop", "reason": outcome, "step": c.step, "epoch_float": epoch_float}

    def _unfitted(self, c: Counters) -> str:
        """Why a budgeted run has no sizing of its own to report."""
        if c.budget_total_steps >= 0:
            return "sized by the run this one resumed"
        if self._measuring(c):  # a --target-accuracy ended it this early
            return ("the run ended while its pace was still being measured (the budget's first "
                    f"{MEASURED_SHARE:.0%}, {MEASURED_SECONDS:g} s at least)")
        return "the run ended before its steps could be timed (fewer steps than the warm-up)"

    def _schedule_length(self, c: Counters) -> str:
        """The length the LR schedule had when the run stopped: while a budget's pace was
        being measured, the provisional one (not the 1,000 epochs a budget allows)."""
        if self._measuring(c):
            return f"{self.shown_steps(c)} steps so far, the budget's pace still measured"
        return f"{self.run.total_steps} steps"

    def summary(self, c: Counters, outcome: str, wall_seconds: float) -> dict:
        """summary.json's entries, and the lines printed at the end."""
        out: dict = {}
        lines = []
        if self.budget is not None:
            used = wall_seconds / self.budget
            out.update(time_budget_seconds=self.budget, budget_used_fraction=round(used, 4),
                       budget_reason=self.fit_reason or self._unfitted(c),
                       budget_resizes=c.budget_resizes)
            kept = (f"; kept on time by {c.budget_resizes} later sizing"
                    + ("" if c.budget_resizes == 1 else "s") + f" (now {c.budget_total_steps} "
                    "steps)" if c.budget_resizes else "")
            lines.append(f"time budget {self.budget:g} s: used {wall_seconds:.1f} s "
                         f"({used:.0%}); {out['budget_reason']}{kept}")
        if self.target is not None:
            reached = c.target_epoch >= 0
            out.update(target_accuracy=self.target,
                       target_reached_epoch=c.target_epoch + 1 if reached else None,
                       target_reached_step=c.target_step if reached else None)
            if reached:
                cut = outcome == "target_accuracy"
                out["schedule_cut"] = cut
                lines.append(f"target accuracy {self.target:.2%} reached at epoch "
                             f"{c.target_epoch + 1} (step {c.target_step})"
                             + (f": stopped there, the LR schedule ({self._schedule_length(c)}"
                                ") cut short" if cut else ""))
            else:
                lines.append(f"target accuracy {self.target:.2%} not reached "
                             f"(best {max(c.best_val_accuracy, 0.0):.2%})")
        if c.early_stop_epoch >= 0:
            why = self.early_stop_reason or "decided before the resume"
            out.update(early_stop_epoch=c.early_stop_epoch, early_stop_reason=why)
            lines.append(f"early stop after epoch {c.early_stop_epoch} of "
                         f"{self.run.config.epochs}: {why} (--no-early-stop trains them all)")
        advice = self.curve_advice(c)
        out["curve_advice"] = advice
        if advice is not None:
            lines.append(advice)
        return {"entries": out, "lines": lines}


def _epochs(count: int) -> str:
    return f"{count} epoch" + ("" if count == 1 else "s")
