"""How long a run without `--epochs` trains, and what the end of a run says about its learning
curve: pure functions of described state (a leaf: it imports only Decision).

* `run_length(epochs, ...)`: no `--epochs` means DEFAULT_EPOCHS with early stopping on (when
  there is a val split to watch and no --time-budget sizing the run); a given `--epochs` (or
  `--max-steps`) is trained whole unless `--early-stop` is asked for too.
* `stop_reason(...)`: after an epoch's evaluation, whether an early-stopping run ends there:
  at 100 % val accuracy (nothing left to gain), or when the best val accuracy is PATIENCE
  epochs old and the LR is already down to LATE_LR of its peak. A plateau while the LR is high
  is not enough: a cosine schedule's second half often lifts it (measured: docs/RUN_LENGTH.md,
  "Early stopping").
* `curve_advice(...)`: the end-of-run line that reads the curve ("reached its best at epoch 3
  of 10: `--epochs 3` or `--target-accuracy 0.97`"), whatever stopped the run.
"""
from __future__ import annotations

import math

from .decision import Decision

DEFAULT_EPOCHS = 10
# Epochs without a better val accuracy before an early-stopping run ends (Keras' and
# Lightning's EarlyStopping take the same kind of count; ours only counts late in the
# schedule, below).
PATIENCE = 2
# The plateau counts only once the LR is at or below this share of its peak (a cosine's past
# 70 % of its steps): before that, the measured curves (Fashion-MNIST, shapes) still gained when
# the LR came down.
LATE_LR = 0.2
PERFECT = 1.0  # val accuracy that cannot improve


def run_length(epochs: int | None, early_stop: bool | None, *, has_val: bool,
               time_budget: float | None, max_steps: int | None = None
               ) -> tuple[int, Decision]:
    """(the epochs to train, the early-stop decision). `epochs` None: not given."""
    count = DEFAULT_EPOCHS if epochs is None else epochs
    if early_stop is not None:
        return count, Decision(early_stop, "asked for (--early-stop / --no-early-stop)")
    if epochs is not None or max_steps is not None:
        given = f"--epochs {epochs}" if epochs is not None else f"--max-steps {max_steps}"
        return count, Decision(False, f"{given} given: the run trains that long "
                               "(--early-stop stops sooner when val accuracy stops improving)")
    if not has_val:
        return count, Decision(False, "no val split: nothing to watch")
    if time_budget is not None:
        return count, Decision(False, "--time-budget sizes the run")
    return count, Decision(True, f"no --epochs: up to {DEFAULT_EPOCHS} epochs, ending at 100 % "
                           f"val accuracy or when it has not improved for {PATIENCE} epochs "
                           f"with the LR below {LATE_LR:.0%} of its peak (--no-early-stop: "
                           "all of them)")


def stop_reason(*, epochs_done: int, best_epoch: int, best_accuracy: float,
                lr_share: float) -> str | None:
    """Why an early-stopping run ends after its `epochs_done`-th epoch (None: it goes on).
    `best_epoch`: 1-based epoch of the best val accuracy so far; `lr_share`: the LR now as a
    share of its peak (the schedule's, whatever its kind)."""
    if epochs_done < 1 or best_epoch < 1:
        return None
    if best_accuracy >= PERFECT:
        return f"val accuracy reached 100 % at epoch {best_epoch}: it cannot improve"
    stale = epochs_done - best_epoch
    if stale >= PATIENCE and lr_share <= LATE_LR:
        return (f"val accuracy has not improved on epoch {best_epoch}'s {best_accuracy:.2%} "
                f"for {stale} epochs, with the LR already at {lr_share:.0%} of its peak")
    return None


def curve_advice(*, best_epoch: int, best_accuracy: float, epochs_done: int,
                 epochs_planned: int, last_gain: float | None) -> str | None:
    """What the learning curve says about the run's length. `last_gain`: the last epoch's val
    accuracy less the one before it (None: fewer than two epochs)."""
    if best_epoch < 1 or epochs_done < 1:
        return None
    if best_epoch < epochs_done:
        target = math.floor(best_accuracy * 1000) / 1000
        return (f"val accuracy reached its best ({best_accuracy:.2%}) at epoch {best_epoch} of "
                f"{epochs_done}: `--epochs {best_epoch}` or `--target-accuracy {target:g}` "
                "ends the next run there")
    if epochs_done >= epochs_planned and last_gain is not None and last_gain > 0 \
            and best_accuracy < PERFECT:
        return (f"val accuracy still rose in the last epoch (+{last_gain:.2%}): more "
                f"`--epochs` than {epochs_planned} may gain")
    return None
