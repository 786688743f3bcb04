"""Training-step speed of the trainer's precision and memory-format choices, side by side.

    .venv/bin/python bench/bench_train_precision.py [--models resnet18:64,compact28:28]
        [--batch-size 64] [--steps 10] [--rounds 2] [--threads 2]

Each (model, image size) is timed in four settings: fp32 contiguous (the naive baseline),
fp32 channels_last, bf16 autocast contiguous and bf16 autocast channels_last (the trainer's
CPU default where the CPU has native bf16). A step is exactly the trainer's: `StepEngine`
(uint8 input stem, forward and label-smoothed loss under autocast, backward, Nesterov SGD,
LR schedule), on random uint8 images already in memory, so only compute is timed; freed host
memory is kept for reuse as in the trainer (turbotrain/train/step/host_memory.py). Two untimed
warm-up steps per setting, then `--steps` timed ones; settings run `--rounds` times interleaved
and the best round counts (the machine is shared). Writes bench/results/train_precision.json.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results" / "train_precision.json"
sys.path.insert(0, str(ROOT.parent))
sys.path.insert(0, str(ROOT))

import common  # noqa: E402

SETTINGS = [("fp32", False), ("fp32", True), ("bf16", False), ("bf16", True)]


def build_engine(model_name: str, precision: str, channels_last: bool, num_classes: int):
    import torch
    from turbotrain.train.step.device import make_grad_scaler
    from turbotrain.train.step.loop import StepEngine, StepSettings
    from turbotrain.train.models.models import build_model, get_model_spec
    from turbotrain.train.step.schedule import LRSchedule, build_optimizer

    torch.manual_seed(0)
    model = build_model(get_model_spec(model_name), num_classes)
    model.to(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    optimizer = build_optimizer(model, name="sgd", lr=0.05, weight_decay=5e-4, momentum=0.9)
    schedule = LRSchedule(total=1000, warmup=10, kind="cosine")
    cpu = torch.device("cpu")
    settings = StepSettings(device=cpu, precision=precision, channels_last=channels_last,
                            label_smoothing=0.1)
    return StepEngine(model, optimizer, make_grad_scaler(cpu, precision), settings,
                      schedule=schedule)


def label(model_name: str, precision: str, channels_last: bool) -> str:
    return f"{model_name} {precision} {'channels_last' if channels_last else 'contiguous'}"


def time_setting(model_name, size, batch, precision, channels_last, steps) -> dict:
    """{"images_per_second": ...} of `steps` training steps after 2 warm-up steps."""
    import torch
    engine = build_engine(model_name, precision, channels_last, num_classes=10)
    images = torch.randint(0, 256, (batch, 3, size, size), dtype=torch.uint8)
    images = images.contiguous(memory_format=torch.channels_last)  # what pipelines hand over
    labels = torch.randint(0, 10, (batch,))
    for step in range(2):
        engine.micro_step(images, labels, True)
        engine.optimizer_step(step)
    start = time.perf_counter()
    for step in range(2, 2 + steps):
        engine.micro_step(images, labels, True)
        engine.optimizer_step(step)
    return {"images_per_second": batch * steps / (time.perf_counter() - start)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--models", default="resnet18:64,compact28:28",
                        help="comma-separated NAME:IMAGE_SIZE (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                        help="torch intra-op threads (default: all cores, no loader runs)")
    args = parser.parse_args(argv)

    import torch
    torch.set_num_threads(args.threads)
    from turbotrain.train.plan.hardware import cpu_native_bf16
    from turbotrain.train.step.host_memory import keep_freed_memory
    # As the trainer does: otherwise glibc's adaptive mmap threshold makes each setting's speed
    # depend on what the settings before it happened to allocate and free.
    host_memory_kept, _ = keep_freed_memory()

    results = []
    for entry in args.models.split(","):
        name, size = entry.split(":")
        runs = common.interleaved(args.rounds, {
            label(name, precision, channels_last): (
                lambda precision=precision, channels_last=channels_last: time_setting(
                    name, int(size), args.batch_size, precision, channels_last, args.steps))
            for precision, channels_last in SETTINGS})
        best = {setting: common.best(runs[label(name, *setting)]) for setting in SETTINGS}
        base = best[("fp32", False)]
        for (precision, channels_last), rate in best.items():
            results.append({"model": name, "image_size": int(size), "precision": precision,
                            "channels_last": channels_last, "images_per_second": rate,
                            "speedup_vs_fp32_contiguous": rate / base})
            print(f"{name:10s} {size:>4s} px  {precision}  "
                  f"{'channels_last' if channels_last else 'contiguous   '}  "
                  f"{rate:8.1f} img/s  x{rate / base:.2f}", flush=True)
    common.write_results(RESULTS, {
        "command": common.command_line(__file__, argv),
        "cpu_native_bf16": cpu_native_bf16(), "threads": args.threads,
        "batch_size": args.batch_size, "steps": args.steps, "rounds": args.rounds,
        "host_memory_kept": host_memory_kept,
        "results": results})
    print(f"wrote {RESULTS}")
    return 0


def markdown(result: dict) -> str:
    return common.markdown(
        f"The trainer's step (uint8 stem, label-smoothed loss, Nesterov SGD) on data already in "
        f"memory: {result['threads']} torch threads, batch {result['batch_size']}, "
        f"{result['steps']} timed steps, best of {result['rounds']} rounds; CPU with native "
        f"bf16: {result['cpu_native_bf16']}. No numeric goal: these numbers are why `train` "
        "picks bf16 + channels_last on such CPUs.",
        common.md_table(["model", "px", "precision", "memory format", "images/s",
                         "vs fp32 contiguous"],
                        [[r["model"], r["image_size"], r["precision"],
                          "channels_last" if r["channels_last"] else "contiguous",
                          common.decimal(r["images_per_second"]),
                          common.times(r["speedup_vs_fp32_contiguous"])]
                         for r in result["results"]]))


if __name__ == "__main__":
    sys.exit(main())
