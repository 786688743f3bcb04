"""`turbotrain demo` (and `make demo`): the main job, end to end, on an embedded sample dataset.

1. writes a deterministic photo-like dataset (ten classes of textured shapes, JPEGs),
2. converts it with `prepare-dataset`,
3. trains with the demo's settings for this machine (plan/demo_plan.py: image size, model,
   precision and a `--time-budget` that sizes the epochs to the measured step time), and
   prints the run report with the training time apart from the total.

Nothing is downloaded: the images are generated (turbotrain/datasets/synthetic.py), so the demo
runs on a machine without internet, and a rerun reuses the images already written.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from .arg_parser import CommandParser
from .cli import main as turbotrain_main


def add_demo_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="demo-data",
                   help="folder for the sample images, the prepared dataset and the run "
                        "(default: demo-data)")
    p.add_argument("--train-per-class", type=int, default=None,
                   help="training images per class (10 classes; default 300)")
    p.add_argument("--val-per-class", type=int, default=None,
                   help="validation images per class (default 50)")
    p.add_argument("--size", default=None,
                   help="generated image size WxH (default: the machine's, 64x64)")
    p.add_argument("--epochs", type=int, default=None,
                   help="training epochs (default: until the target accuracy, at most as "
                        "many as the time budget fits)")
    p.add_argument("--time-budget", default=None, metavar="DURATION",
                   help="train --time-budget (default: the machine's: 80s on a native-bf16 CPU, "
                        "90s on an AVX2-only one, 60s on a GPU)")
    p.add_argument("--target-accuracy", default=None, metavar="A",
                   help="train --target-accuracy: stop at the first evaluation reaching A "
                        "(default 0.98; 1 trains the whole time budget unless it reaches 100 %%)")
    p.add_argument("--machine", default=None, metavar="NAME",
                   help="print the demo's settings for a preset machine (cpu2, cpu2-avx2, "
                        "h200, ...) and exit")
    p.add_argument("--train-arg", action="append", default=[], metavar="FLAG",
                   help="extra `train` flag, repeatable, e.g. --train-arg=--pipeline=pytorch")


def _parse_size(text: str) -> tuple[int, int]:
    try:
        width, height = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise SystemExit(f"turbotrain demo: error: --size must look like 320x240, not {text!r}")
    return width, height


def _settings(machine_name: str | None):
    # lazy: the plan imports torch (~1 s), not wanted for `demo --help`
    from .train.plan.demo_plan import demo_settings
    from .train.plan.hardware import detect_machine
    from .train.plan.machine import Machine
    from .train.step.distributed import dist_env_from_environ
    if machine_name is None:
        return demo_settings(detect_machine(dist_env_from_environ()))
    try:
        return demo_settings(Machine.preset(machine_name))
    except ValueError as exc:
        raise SystemExit(f"turbotrain demo: error: --machine: {exc}")


def run_demo(args: argparse.Namespace) -> int:
    # lazy: PIL (+110 ms) loads when the demo runs, not for `demo --help`
    from .datasets.synthetic import write_shapes_imagefolder

    settings = _settings(args.machine)
    if args.machine is not None:
        print(f"turbotrain demo settings for {args.machine}:")
        print("\n".join(settings.lines()) + f"\n  train flags: {' '.join(settings.train_flags())}")
        return 0
    out = Path(args.out)
    source, prepared, run_dir = out / "source", out / "prepared", out / "run"
    side = settings.source_side
    size = _parse_size(args.size or f"{side}x{side}")
    train_per_class = args.train_per_class or settings.train_per_class
    val_per_class = args.val_per_class or settings.val_per_class
    started = time.perf_counter()
    print("demo settings for this machine:\n" + "\n".join(settings.lines()), flush=True)
    print(f"1/3 writing the sample dataset to {source} "
          f"({10 * (train_per_class + val_per_class)} JPEGs, {size[0]}x{size[1]})",
          flush=True)
    write_shapes_imagefolder(source, train_per_class=train_per_class,
                             val_per_class=val_per_class, size=size)
    print(f"2/3 prepare-dataset {source} {prepared}", flush=True)
    code = turbotrain_main(["prepare", str(source), str(prepared), "--overwrite"])
    if code:
        return code
    train_args = ["train", "--data", str(prepared), "--out", str(run_dir),
                  *_train_flags(settings.train_flags(), args)]
    if (run_dir / "summary.json").exists() or (run_dir / "config.yaml").exists():
        import shutil
        shutil.rmtree(run_dir)  # a demo always starts a fresh run
    print(f"3/3 {' '.join(train_args)}", flush=True)
    code = turbotrain_main(train_args)
    if code:
        return code
    return _report(run_dir, time.perf_counter() - started)


def _train_flags(planned: list[str], args: argparse.Namespace) -> list[str]:
    """The plan's train flags, with the demo's --time-budget / --target-accuracy / --epochs in
    place of the plan's, then each --train-arg (given later, it overrides both)."""
    flags = list(planned)
    for flag, value in (("--time-budget", args.time_budget),
                        ("--target-accuracy", args.target_accuracy)):
        if value is not None:
            flags = [f for f in flags if not f.startswith(f"{flag}=")] + [f"{flag}={value}"]
    if args.epochs is not None:
        flags += ["--epochs", str(args.epochs)]
    return flags + args.train_arg


def _report(run_dir: Path, seconds: float) -> int:
    summary = json.loads((run_dir / "summary.json").read_text())
    diagnosis = summary.get("diagnosis") or {}
    lines = [
        "",
        "turbotrain demo: done",
        f"  val accuracy   {100 * summary['val_accuracy']:.1f} %",
        f"  training time  {summary['wall_seconds']:.1f} s{_why_it_ended(summary)}",
        f"  throughput     {summary['images_per_second']:.0f} images/s "
        f"({summary['pipeline']} pipeline, {summary['precision']}, {summary['device']})",
        f"  data wait      {100 * summary['data_wait_fraction']:.0f} % of training time",
    ]
    if diagnosis:
        lines.append(f"  verdict        {diagnosis.get('headline') or diagnosis.get('verdict')}")
        lines += [f"                 next: {step}" for step in diagnosis.get("next_steps", [])[:2]]
    lines += [f"  curves         {run_dir / 'curves.png'}",
              f"  run folder     {run_dir} (config.yaml, metrics.jsonl, summary.json)",
              f"  total time     {seconds:.0f} s (writing and preparing the images "
              "included; install not)"]
    print("\n".join(lines))
    return 0


def _why_it_ended(summary: dict) -> str:
    """' (...)' after the training time: the target reached, the time budget, or nothing."""
    budget = summary.get("time_budget_seconds")
    of_budget = f"; time budget {budget:g} s" if budget else ""
    if summary.get("outcome") == "target_accuracy":
        return (f" (stopped at epoch {summary['target_reached_epoch']}: val accuracy reached "
                f"the {100 * summary['target_accuracy']:g} % target{of_budget})")
    return f" (time budget {budget:g} s)" if budget else ""


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(prog="turbotrain demo", description=__doc__.split("\n\n")[0])
    add_demo_arguments(parser)
    return run_demo(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
