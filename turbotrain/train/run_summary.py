"""The end-of-run summary: the dict `train()` returns and report.write_summary saves as
RUNDIR/summary.json.

One flat record of the run: the last evaluation (and the EMA weights' with --ema), the weights
files, how far it got and why it stopped, throughput with the data wait apart from compute
(warm-up and evaluation kept out), the settings it resolved and the reasons, peak memory and the
bottleneck verdict (doctor.py via monitor.py).
"""
from __future__ import annotations

from .builder import Run
from .device import peak_memory_bytes
from .doctor import Diagnosis
from .monitor import RunMonitor
from .trainer_state import Counters


def run_summary(run: Run, c: Counters, *, outcome: str, wall_seconds: float, ema_result: dict,
                weights: dict, monitor: RunMonitor, diagnosis: Diagnosis) -> dict:
    """`ema_result`: the EMA weights' val numbers ({} without --ema); `weights`: the keeper's
    entries about best/final.safetensors; `diagnosis`: the finished monitor's verdict."""
    config = run.config
    val = c.val or {}
    timed = c.timed_seconds
    return {
        "val_accuracy": val.get("val_accuracy"), "val_loss": val.get("val_loss"),
        "val_top5": val.get("val_top5"), **ema_result, **weights,
        "epochs": round(c.epoch + (c.micro_in_epoch / (run.steps_per_epoch
                                                       * config.accum_steps)), 4),
        "steps": c.step, "images": c.images, "outcome": outcome,
        "images_per_second": c.timed_images / timed if timed else None,
        "data_wait_fraction": c.timed_data_wait / timed if timed else None,
        "data_wait_seconds": c.timed_data_wait, "compute_seconds": timed - c.timed_data_wait,
        "warmup_seconds": c.warmup_seconds, "eval_seconds": c.eval_seconds,
        "wall_seconds": wall_seconds,
        "pipeline": run.pipeline_name, "precision": run.precision, "compiled": run.compiled,
        "channels_last": run.channels_last, "device": str(run.device),
        "world_size": run.env.world_size, "global_batch_size": run.global_batch,
        "peak_memory_bytes": peak_memory_bytes(run.device),
        "model": config.model, "image_size": config.image_size,
        "batch_size": config.batch_size, "accum_steps": config.accum_steps,
        "lr": config.lr, "optimizer": config.optimizer,
        "workers": run.threads.workers, "torch_threads": run.threads.torch_threads,
        "decisions": run.decisions,
        **monitor.memory(), "diagnosis": diagnosis.as_dict(),
    }
