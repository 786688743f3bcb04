"""What a `--resume` with other settings does, said at its start (issue 46, item 4).

Another `--epochs`: the LR is a function of the step over the run's length (schedule.py), so
the resumed run follows, from where it stopped, the schedule of the new length (same peak,
same warm-up): 3 -> 5 epochs of a finished cosine run brings the LR back up from 0 to the
5-epoch cosine's value at epoch 3 (a warm restart), then decays it to 0 at epoch 5; fewer
epochs shrink it. Stretching only the rest of the decay from the LR it stopped at (what
--time-budget does mid-run, LRSchedule.resized) would continue a finished run at an LR of 0
and teach it nothing. What else the plan resolved from the old length stays as config.yaml
holds it (a progressive-resizing ramp's epochs). One line says it (`length_change`), with the
LR before and after.

A run that stopped at its --target-accuracy stops there however many epochs it is given, so
asking it for more is refused in one line saying what to pass (`check_target_stop`): a run
that does nothing and reprints "done" answers a question the user did not ask.

Any other setting changed: one line lists them (`changed_settings`); the optimizer's own
(--lr, --weight-decay, --momentum), which its restored state would silently bring back, are
carried over to the new values (`carry_optimizer_settings`); another --optimizer is refused
(`check_same_optimizer`).

All read the checkpoint as the trainer saved it (`state["config"]`: the settings the run had,
`state["counters"]`: where it stopped), each value checked before use.
"""
from __future__ import annotations

from pathlib import Path

from ..config.config import TrainConfig
from ..config.duration import BUDGET_MAX_EPOCHS
from ..errors import TrainError
from ..step.schedule import PEAK_LR, SCHEDULES, LRSchedule


def _epochs_given(config: TrainConfig) -> bool:
    """Whether the run's --epochs is a length (not the cap a --time-budget without --epochs
    plans with: the checkpoint then holds the epochs the budget sized, which no flag changed)."""
    return config.time_budget is None or config.epochs < BUDGET_MAX_EPOCHS


def _int(value) -> int | None:
    return value if type(value) is int else None


def _saved(state: dict) -> tuple[dict, dict]:
    """(the checkpoint's settings, its counters), {} for what it does not hold as a mapping."""
    config, counters = state.get("config"), state.get("counters")
    return (config if isinstance(config, dict) else {},
            counters if isinstance(counters, dict) else {})


def _accuracy(counters: dict) -> float | None:
    val = counters.get("val")
    accuracy = val.get("val_accuracy") if isinstance(val, dict) else None
    return accuracy if type(accuracy) in (int, float) else None


def check_target_stop(state: dict, config: TrainConfig, run_dir: Path) -> None:
    """TrainError when this resume asks for more epochs than the run trained (`--epochs` other
    than the saved run's) but the run's last evaluation meets its --target-accuracy: the
    resumed run would stop before its first step (RunLength.reached)."""
    saved, counters = _saved(state)
    done, accuracy = _int(counters.get("epoch")), _accuracy(counters)
    budget_steps = _int(counters.get("budget_total_steps"))
    sized = budget_steps is not None and budget_steps >= 0  # --epochs changes nothing then
    if (sized or not _epochs_given(config) or done is None or accuracy is None
            or config.target_accuracy is None
            or accuracy < config.target_accuracy or config.epochs == saved.get("epochs")
            or config.epochs <= done):
        return
    higher = f" (or one above {accuracy:.2%})" if accuracy < 1.0 else ""
    raise TrainError(f"--epochs {config.epochs}: the run in {run_dir} stopped after epoch "
                     f"{done}, whose val_accuracy {accuracy:.2%} reached --target-accuracy "
                     f"{config.target_accuracy:.2%}, and it stops there whatever --epochs "
                     f"says; to train on to epoch {config.epochs}, also pass "
                     f"--target-accuracy none{higher}")


def forget_unmet_target(counters, target: float | None) -> None:
    """A target the run reached, forgotten when this resume's target is higher (or none), so
    that the run trains on towards it (`counters`: trainer_state.Counters)."""
    accuracy = (counters.val or {}).get("val_accuracy", 0.0)
    if counters.target_epoch >= 0 and (target is None or accuracy < target):
        counters.target_epoch = counters.target_step = -1


def check_same_optimizer(state: dict, config: TrainConfig, run_dir: Path) -> None:
    """TrainError when this resume names another --optimizer: the saved state (momentum
    buffers, or AdamW's moments) belongs to the one the run trained with."""
    saved, _ = _saved(state)
    was = saved.get("optimizer")
    if isinstance(was, str) and was != config.optimizer:
        raise TrainError(f"--optimizer {config.optimizer}: the run in {run_dir} trained with "
                         f"{was}, whose state does not carry over to {config.optimizer}; "
                         f"resume with --optimizer {was}, or start a new run from its weights: "
                         f"--out NEWDIR --init-from {run_dir} --optimizer {config.optimizer}")


def carry_optimizer_settings(optimizer, state: dict, config: TrainConfig) -> None:
    """The restored optimizer's groups given this resume's --lr, --weight-decay and
    --momentum: load_state_dict brought back the saved run's, which would silently outrank the
    flags. Each group keeps its share (layer decay, a fine-tuned head's own rate, no decay on
    norms and biases): its peak LR and decay are scaled by new / saved."""
    saved, _ = _saved(state)
    for name, key in (("lr", PEAK_LR), ("weight_decay", "weight_decay")):
        was, now = saved.get(name), getattr(config, name)
        if type(was) in (int, float) and was > 0 and now is not None and now != was:
            for group in optimizer.param_groups:
                group[key] *= now / was
    was = saved.get("momentum")
    if type(was) in (int, float) and config.momentum != was:
        for group in optimizer.param_groups:
            if "betas" in group:
                group["betas"] = (config.momentum, group["betas"][1])
            else:
                group["momentum"] = config.momentum


# Said by `length_change`, or sized by --time-budget (its checkpoint holds the sized values), or
# where the run is (--out): no setting this resume changes.
_NOT_COMPARED = ("epochs", "warmup_steps", "out")


def changed_settings(state: dict, config: TrainConfig) -> str | None:
    """The line naming what this resume changes of the saved run's settings (a flag or a
    --config over config.yaml), each as `name old -> new`; None when nothing. --epochs has a
    line of its own (`length_change`)."""
    saved, _ = _saved(state)
    now = config.to_saved_dict()
    changed = [f"{name.replace('_', '-')} {_shown(saved[name])} -> {_shown(now[name])}"
               for name in now if name in saved and name not in _NOT_COMPARED
               and saved[name] != now[name]]
    return ("this resume changes the saved run's " + ", ".join(changed)) if changed else None


def _shown(value) -> str:
    if isinstance(value, tuple):
        return " ".join(f"{v:g}" for v in value)
    return "none" if value is None else str(value)[:60]


def length_change(state: dict, config: TrainConfig, *, schedule: LRSchedule, total_steps: int,
                  steps_per_epoch: int, step: int, budget_sized: bool, peak: float) -> str | None:
    """The line a resume with another --epochs prints at its start, None when they are the
    saved run's. `schedule`, `total_steps`: the resumed run's; `step`: the steps done;
    `budget_sized`: --time-budget fitted the run's length (the checkpoint keeps it); `peak`:
    the first parameter group's peak LR."""
    saved, _ = _saved(state)
    was, now = _int(saved.get("epochs")), config.epochs
    if was is None or was == now or not _epochs_given(config):
        return None
    head = f"--epochs {now} (was {was})"
    if budget_sized:
        return (f"{head}: no change: --time-budget sized this run to {total_steps} steps "
                "and keeps that length on resume")
    if step >= total_steps:
        return (f"{head}: the run has already trained {step} steps (epoch "
                f"{-(-step // steps_per_epoch)}): nothing left to train")
    old_total = was * steps_per_epoch
    max_steps = _int(saved.get("max_steps"))
    if max_steps is not None:
        old_total = min(old_total, max_steps)
    if old_total == total_steps:
        return f"{head}: the --max-steps {max_steps} cap holds, the LR schedule is unchanged"
    warmup, kind = _int(saved.get("warmup_steps")), saved.get("schedule")
    old = LRSchedule(total=old_total, warmup=schedule.warmup if warmup is None else warmup,
                     kind=kind if kind in SCHEDULES else schedule.kind)
    before, after = (old.lr(step - 1, peak) if step > 0 else 0.0), schedule.lr(step, peak)
    verb = "stretched" if total_steps > old_total else "shrunk"
    # The ramp's epochs were resolved when the run was planned (config.yaml): they stay.
    ramp = (f"; progressive resizing keeps its ramp (epochs {config.res_ramp[0]:g}-"
            f"{config.res_ramp[1]:g})" if config.progressive and config.res_ramp else "")
    return (f"{head}: the {schedule.kind} LR schedule is {verb} to end at epoch {now} (step "
            f"{total_steps}): the LR goes from {before:.4g}, where it stopped (step {step}), "
            f"{'up' if after > before else 'down'} to {after:.4g}, the {now}-epoch schedule's "
            f"LR there, then to 0{ramp}")
