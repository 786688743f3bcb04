"""The end-of-run summary: the dict `train()` returns and report.write_summary saves as
RUNDIR/summary.json.

One flat record of the run: the last evaluation (and the EMA weights' with --ema), the weights
files, how far it got and why it stopped, throughput with the data wait apart from compute
(warm-up and evaluation kept out), the settings it resolved and the reasons, peak memory and the
bottleneck verdict (doctor.py via monitor.py). Throughput, data wait and the verdict are read
from the one timing ledger (ledger.py), so summary.json's data_wait_fraction is the verdict's.
"""
from __future__ import annotations

from ..records.doctor import Diagnosis
from ..records.ledger import StepLedger
from ..records.monitor import RunMonitor
from ..step.device import peak_memory_bytes
from .builder import Run
from .trainer_state import Counters


def run_summary(run: Run, c: Counters, ledger: StepLedger, *, outcome: str,
                wall_seconds: float, ema_result: dict, weights: dict, monitor: RunMonitor,
                diagnosis: Diagnosis | None) -> dict:
    """`ledger`: the run's step timing; `ema_result`: the EMA weights' val numbers ({} without
    --ema); `weights`: the keeper's entries about best/final.safetensors; `diagnosis`: the
    finished monitor's verdict on `ledger` (None on the ranks that write no files)."""
    config = run.config
    val = c.val or {}
    return {
        "val_accuracy": val.get("val_accuracy"), "val_loss": val.get("val_loss"),
        "val_top5": val.get("val_top5"), **ema_result, **weights,
        "epochs": round(c.epoch + (c.micro_in_epoch / (run.steps_per_epoch
                                                       * config.accum_steps)), 4),
        "steps": c.step, "images": c.images, "outcome": outcome,
        "images_per_second": ledger.images_per_second,
        "data_wait_fraction": ledger.data_wait_fraction,
        "timed_seconds": ledger.seconds, "data_wait_seconds": ledger.data_wait,
        "compute_seconds": ledger.compute,
        "warmup_seconds": ledger.warmup_seconds, "eval_seconds": c.eval_seconds,
        "wall_seconds": wall_seconds,
        "pipeline": run.pipeline_name, "precision": run.precision, "compiled": run.compiled,
        "channels_last": run.channels_last, "device": str(run.device),
        "world_size": run.env.world_size, "global_batch_size": run.global_batch,
        "peak_memory_bytes": peak_memory_bytes(run.device),
        "model": config.model, "image_size": config.image_size,
        # Each epoch's training size begun (progressive resizing: the schedule's sizes).
        "epoch_sizes": [run.train_pipeline.size_at(e) for e in range(
            c.epoch + (1 if c.micro_in_epoch else 0))],
        # How the evaluations ran (plan/eval_rules.py): eval_seconds above is their cost.
        "eval_res": config.eval_res, "tta": config.tta, "blurpool": config.blurpool,
        # The augmentations after decode (--aa, --color-jitter, --reprob), in words ("off").
        "augment": config.augment_policy().describe(),
        "batch_size": config.batch_size, "accum_steps": config.accum_steps,
        "lr": config.lr, "optimizer": config.optimizer,
        "workers": run.threads.workers, "torch_threads": run.threads.torch_threads,
        "decisions": run.decisions,
        **monitor.memory(),
        "diagnosis": diagnosis.as_dict() if diagnosis is not None else None,
    }
