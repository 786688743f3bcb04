"""The trainer's state in a checkpoint: `Counters` (where the run is) and the dict written.

`checkpoint_state` assembles what checkpoint.save_atomic writes: the modules' state (model,
optimizer, scaler, EMA), every RNG state, the pipeline's position, the counters, the timing
ledger (ledger.py, under "timing"), the loss summed since the last log point, the saved config
and the world size. There is no scheduler state: the LR is a function of `Counters.step`
(schedule.lr_at), each parameter group's peak kept in the optimizer's state; a checkpoint
written before that holds a "scheduler" entry, which is not read. A checkpoint written before
the ledger has no "timing": its counters held the sums (timed_seconds, ...; ledger.
LEGACY_COUNTERS), which become the ledger. `restore_state` reads back what the modules do not
hold (builder.restore_modules restored those when the run was built): counters, timing, RNG,
loss window and pipeline position, each checked, so that a checkpoint that does not fit is one
TrainError line (checkpoint.damaged), not a failure steps later.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from ..records import checkpoint as ckpt
from ..records.ledger import LEGACY_COUNTERS, StepLedger
from ..step.schedule import PEAK_LR
from .builder import Run


@dataclass
class Counters:
    """Where the run is; saved in every checkpoint."""
    epoch: int = 0  # the epoch being trained
    micro_in_epoch: int = 0  # micro-batches of it already trained on
    step: int = 0  # optimizer steps done
    images: int = 0  # images trained on, all ranks
    wall_seconds: float = 0.0  # elapsed before this process started (resumed runs)
    eval_seconds: float = 0.0  # (the step timing is the ledger's: ledger.py)
    window_steps: int = 0  # steps in the current loss window
    epoch_loss_sum: float = 0.0
    epoch_steps: int = 0
    epoch_hits: int = 0  # top-1 hits on this epoch's training batches, all ranks
    epoch_images: int = 0  # the images they are out of (train_accuracy in the epoch record)
    bad_windows: int = 0
    last_checkpoint_step: int = -1
    last_eval_step: int = -1
    val: dict | None = None  # the latest evaluation
    best_val_accuracy: float = -1.0  # of the weights in best.safetensors (keep_best.py)
    best_step: int = -1
    budget_total_steps: int = -1  # the run's length fitted to --time-budget (-1: not yet)
    budget_max_steps: int = -1  # its length before the budget sized it: never exceeded
    budget_resizes: int = 0  # sizings after the first one (run_length.py keeps it on time)
    budget_next_check: int = -1  # the step at which the run is sized next
    budget_step_seconds: float = 0.0  # the pace of the last sizing
    lr_warmup_steps: int = -1  # the schedule's warm-up once the budget sized it
    lr_anchor_step: int = 0  # the LR schedule's anchor (schedule.LRSchedule.resized)
    lr_anchor_progress: float = 0.0
    target_epoch: int = -1  # the epoch (0-based) whose evaluation reached --target-accuracy
    target_step: int = -1
    early_stop_epoch: int = -1  # epochs done when --early-stop ended the run (-1: it did not)
    previous_val_accuracy: float = -1.0  # the evaluation's before the latest (the curve's slope)


def _saved_counters(saved: dict) -> Counters:
    """Counters from a checkpoint, each of its field's type (ints not negative): the loop
    would otherwise fail on a wrong one steps later, far from the cause."""
    counters = Counters(**saved)
    for f in dataclasses.fields(Counters):
        value = getattr(counters, f.name)
        if f.name == "val":  # the last evaluation's numbers, printed at the end
            # val_top5 is None with 5 classes or fewer (loop.evaluate).
            if value is not None and not (isinstance(value, dict) and all(
                    v is None or type(v) in (int, float) for v in value.values())):
                raise TypeError(f"counter 'val' is {value!r:.60}")
        elif isinstance(f.default, int):
            if type(value) is not int or (value < 0 and f.default >= 0):
                raise ValueError(f"counter {f.name!r} is {value!r}")
        elif type(value) not in (int, float):
            raise TypeError(f"counter {f.name!r} is {value!r}")
    return counters


def _check_peak_lrs(optimizer: torch.optim.Optimizer) -> None:
    """The schedule scales each group's peak LR, which the restored optimizer state brought
    (also in checkpoints from before the schedule was a function of the step: LambdaLR kept it
    under the same key); without one the first step would fail far from the cause."""
    for group in optimizer.param_groups:
        peak = group.get(PEAK_LR)
        if type(peak) not in (int, float) or not peak >= 0:
            raise ValueError(f"optimizer parameter group without a peak LR ({PEAK_LR} "
                             f"{peak!r:.40})")


def checkpoint_state(run: Run, counters: Counters, ledger: StepLedger,
                     loss_window: torch.Tensor, timeline: dict) -> dict:
    """Everything a resumed run needs, as checkpoint.save_atomic writes it (rank 0)."""
    engine = run.engine
    pipeline_state = {**run.train_pipeline.state_dict(), "epoch": counters.epoch,
                      "batch_index": counters.micro_in_epoch}
    return {
        "model": run.model.state_dict(),
        "optimizer": engine.optimizer.state_dict(),
        "scaler": engine.scaler.state_dict(),
        "ema": run.ema.state_dict() if run.ema is not None else None,
        "rng": ckpt.capture_rng(),
        "pipeline": pipeline_state,
        "counters": dataclasses.asdict(counters),
        "timing": ledger.state_dict(),
        "timeline": timeline,  # records/timeline.py: the picture covers the whole run
        "loss_window": loss_window.detach().cpu().clone(),
        "config": run.config.to_saved_dict(),
        "world_size": run.env.world_size,
        "classes": list(run.classes),  # a --resume on other data is refused (builder.py)
    }


def restore_state(run: Run, state: dict
                  ) -> tuple[Counters, StepLedger, torch.Tensor, dict | None]:
    """(counters, timing ledger, loss window on the run's device, pipeline position to load
    after set_epoch or None at an epoch's start) from a checkpoint's `state`; restores the RNG
    states. A state that does not fit is one TrainError line (checkpoint.damaged)."""
    try:
        saved = dict(state["counters"])
        legacy = {key: saved.pop(key) for key in LEGACY_COUNTERS if key in saved}
        counters = _saved_counters(saved)
        ledger = (StepLedger.from_state(state["timing"]) if "timing" in state
                  else StepLedger.from_legacy_counters(legacy))
        counters.last_checkpoint_step = counters.step
        _check_peak_lrs(run.engine.optimizer)
        loss_window = state["loss_window"]
        if loss_window.dim() != 0 or not loss_window.is_floating_point():
            raise ValueError(f"loss_window of shape {tuple(loss_window.shape)} and type "
                             f"{loss_window.dtype}, not a float scalar")
        loss_window = loss_window.to(run.device)
        ckpt.restore_rng(state["rng"])
        saved_position, pipeline_state = state["pipeline"], None
        if counters.micro_in_epoch > 0:
            # Loaded now so that a damaged position fails here; the trainer loads it again
            # after set_epoch.
            run.train_pipeline.load_state_dict(saved_position)
            pipeline_state = saved_position
    except ckpt.RESTORE_ERRORS as exc:
        raise ckpt.damaged(ckpt.checkpoint_path(run.run_dir), exc) from None
    return counters, ledger, loss_window, pipeline_state
