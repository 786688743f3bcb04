"""How long a run lasts beyond --epochs and --max-steps: `--time-budget` and `--target-accuracy`.

The budget: the steps after the warm-up ones are timed one by one (for 8 % of the budget, 2 s
at least, 5 to 200 steps; intervals that hold an evaluation left out), `budget.fit_budget`
turns their typical time into the run's length, and the run is re-planned once: its total steps, its
epochs and the LR schedule (a warm-up of 5% of the new length when the warm-up was
automatic), so the schedule ends on time. Every rank sizes with the slowest rank's
step time, so all agree. The fitted length is kept in the Counters (checkpoint), so a resumed
run keeps it.

The target: checked at each evaluation; the run stops at the first one that reaches it, and
the summary says so and that the schedule was cut there. Both stops are written to
metrics.jsonl (a `stop` record), which curves.png and timeline.png mark.
"""
from __future__ import annotations

import math
import time

from ..plan import recipe
from ..plan.budget import (MAX_MEASURED_STEPS, MEASURED_SECONDS, MEASURED_SHARE, MEASURED_STEPS,
                           eval_seconds, fit_budget, typical_step_seconds)
from ..step.distributed import max_over_ranks
from ..step.schedule import LRSchedule
from .builder import Run
from .trainer_state import Counters


class RunLength:
    """One Trainer's --time-budget and --target-accuracy; `run.config` must be the trainer's."""

    def __init__(self, run: Run, warmup_steps: int):
        self.run = run
        self.warmup_steps = warmup_steps  # the process's untimed first steps
        self._last: tuple[float, float] | None = None  # (clock, eval_seconds) at the last step
        self._intervals: list[float] = []  # seconds between consecutive timed steps
        self.fit_reason: str | None = None

    @property
    def budget(self) -> float | None:
        return self.run.config.time_budget

    @property
    def target(self) -> float | None:
        return self.run.config.target_accuracy

    # ------------------------------------------------------------------ the budget

    def step_done(self, c: Counters, process_steps: int, elapsed: float, sync) -> str | None:
        """After each optimizer step: times the steps after warm-up and, once enough are timed,
        sizes the run; returns the line saying how (None until then, and after)."""
        if self.budget is None or c.budget_total_steps >= 0 or process_steps < self.warmup_steps:
            return None
        sync()
        now = time.perf_counter()
        if self._last is not None and c.eval_seconds == self._last[1]:
            # An interval that held an evaluation (and the epoch's checkpoint) is no step's time.
            self._intervals.append(now - self._last[0])
        self._last = (now, c.eval_seconds)
        timed = len(self._intervals)
        window = max(MEASURED_SECONDS, MEASURED_SHARE * self.budget)
        enough = timed >= MEASURED_STEPS and (sum(self._intervals) >= window
                                               or timed >= MAX_MEASURED_STEPS)
        if not enough and not (timed and self.run.total_steps - c.step <= 1):
            return None
        step_s = typical_step_seconds(self._intervals)
        step_s = max_over_ranks(step_s, self.run.env, self.run.device)
        return self._fit(c, step_s, elapsed)

    def _fit(self, c: Counters, step_s: float, elapsed: float) -> str:
        run = self.run
        val_images = self._val_images()
        fit = fit_budget(budget_s=self.budget, elapsed_s=elapsed, step_s=step_s,
                         steps_done=c.step, steps_per_epoch=run.steps_per_epoch,
                         eval_s=eval_seconds(val_images, step_s, run.global_batch),
                         max_steps=run.total_steps)
        c.budget_total_steps = fit.total_steps
        self.fit_reason = fit.reason
        self.apply(c)
        return (f"time budget {self.budget:g} s: {fit.reason}; the run is now "
                f"{fit.total_steps} steps ({_epochs(fit.epochs)}), its LR schedule re-planned "
                f"to end there")

    def apply(self, c: Counters) -> None:
        """The fitted length (just fitted, or restored from a checkpoint) made the run's."""
        if c.budget_total_steps < 0:
            return
        run = self.run
        total = c.budget_total_steps
        config = run.config.replace(epochs=math.ceil(total / run.steps_per_epoch))
        warmup = config.warmup_steps
        if "warmup_steps" in run.decisions:  # automatic: a share of the run's new length
            warmup = recipe.warmup_steps(total, from_weights=config.from_weights).value
            config = config.replace(warmup_steps=warmup)
        run.config, run.total_steps = config, total
        run.engine.schedule = LRSchedule(total=total, warmup=warmup, kind=config.schedule)

    def _val_images(self) -> int:
        pipeline = self.run.val_pipeline
        if pipeline is None:
            return 0
        try:
            return len(pipeline) * self.run.config.batch_size * self.run.env.world_size
        except TypeError:  # a pipeline without a length: no evaluation cost predicted
            return 0

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

    # ------------------------------------------------------------------ the record

    def stop_record(self, c: Counters, outcome: str, epoch_float: float) -> dict | None:
        """metrics.jsonl's `stop` record for a run the budget or the target ended."""
        if outcome not in ("target_accuracy", "time_budget"):
            return None
        return {"kind": "stop", "reason": outcome, "step": c.step, "epoch_float": epoch_float}

    def summary(self, c: Counters, outcome: str, wall_seconds: float) -> dict:
        """summary.json's entries, and the lines printed at the end."""
        out: dict = {}
        lines = []
        if self.budget is not None:
            used = wall_seconds / self.budget
            out.update(time_budget_seconds=self.budget, budget_used_fraction=round(used, 4),
                       budget_reason=self.fit_reason or _unfitted(c))
            lines.append(f"time budget {self.budget:g} s: used {wall_seconds:.1f} s "
                         f"({used:.0%}); {out['budget_reason']}")
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
                             + (f": stopped there, the LR schedule ({self.run.total_steps} "
                                "steps) cut short" if cut else ""))
            else:
                lines.append(f"target accuracy {self.target:.2%} not reached "
                             f"(best {max(c.best_val_accuracy, 0.0):.2%})")
        return {"entries": out, "lines": lines}


def _epochs(count: int) -> str:
    return f"{count} epoch" + ("" if count == 1 else "s")


def _unfitted(c: Counters) -> str:
    if c.budget_total_steps >= 0:
        return "sized by the run this one resumed"
    return "the run ended before its steps could be timed (fewer steps than the warm-up)"
