"""The lines a run prints about itself: at its start (trainer.Trainer.fit) and at its end."""
from __future__ import annotations

from pathlib import Path

from ..config.config import TrainConfig
from ..step.schedule import PEAK_LR
from .builder import Run
from .resume_changes import changed_settings, length_change
from .trainer_state import Counters


def startup_lines(run: Run, config: TrainConfig, counters: Counters) -> list[str]:
    """What a run prints at its start: its length, batch and LR, each decision with its
    reason, and on a resume what the command changes of the saved run."""
    verb = "resuming" if run.resume_state is not None else "training"
    length = f"{config.epochs} epochs ({run.total_steps} steps)"
    if config.time_budget is not None and counters.budget_total_steps < 0:
        length = (f"at most {length}, sized to the {config.time_budget:g} s time "
                  "budget after its first steps")
    lines = [f"{verb} {run.config.model} on {run.config.data} -> {run.run_dir}: "
             f"{run.steps_per_epoch} steps/epoch x {length}, global batch "
             f"{run.global_batch}, lr {config.lr:.4g}, {run.num_classes} classes"]
    lines += [f"  {what}: {why}" for what, why in run.decisions.items()]
    if run.resume_state is not None:
        c = counters
        change = length_change(run.resume_state, config, schedule=run.engine.schedule,
                               total_steps=run.total_steps,
                               steps_per_epoch=run.steps_per_epoch, step=c.step,
                               budget_sized=c.budget_total_steps >= 0,
                               peak=run.engine.optimizer.param_groups[0][PEAK_LR])
        changed = changed_settings(run.resume_state, config)
        lines += [line for line in (changed, change) if line is not None]
    return lines


def evaluation_line(summary: dict) -> str:
    """What the evaluations cost: their resolution, flip TTA (2 forward passes per image) and
    time, against the run's."""
    tta = ", flip TTA (2 forward passes per image)" if summary["tta"] else ", no TTA"
    share = summary["eval_seconds"] / max(summary["wall_seconds"], 1e-9)
    return (f"evaluation: at {summary['eval_res']} px (training {summary['image_size']} px)"
            f"{tta}: {summary['eval_seconds']:.1f} s in all, {share:.0%} of the run")


def done_line(step: int, val: dict | None, summary: dict, run_dir: Path) -> str:
    rate = summary["images_per_second"]
    return (f"done: {step} steps, val_accuracy "
            + (f"{val['val_accuracy']:.2%}" if val else "n/a")
            + (f", {rate:,.0f} images/s" if rate is not None else "")
            + f", {summary['wall_seconds']:.0f} s; results in {run_dir}")
