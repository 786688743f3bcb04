"""Time to accuracy with the plan's levers against the same trainer with them off (issue 42).

    .venv/bin/python bench/bench_levers.py [--rounds 2] [--photo-epochs 8] [--fashion-epochs 4]
                                           # ~14 min on the quiet 2-core CPU box (FULL below)
    .venv/bin/python bench/bench_levers.py --quick     # smoke: tiny data, 1 epoch, ~1-2 min

The levers are what the plan turns on by itself: progressive resizing (when this trainer has it:
`train --help` lists `--no-progressive`), the test-time resolution (`--eval-res`, 1.3x the final
training size for photos) and flip TTA (`--tta`). The fixed arm is the same command with them
off: `--no-progressive` (when it exists), `--no-tta` and `--eval-res` = the training size.

Cases, each a whole `turbotrain train` process per arm, the arms alternating within a round
(common.interleaved, alternate: every other round in the reverse order, so a drift of the shared
machine's speed favours neither):

* photos: generated learnable photo-size JPEGs (datasets/synthetic.py shapes, 10 classes,
  PHOTO_SIZE px, prepared once and cached), resnet18 at `--image-size` 128;
* fashion: the real Fashion-MNIST (/usr/share/datasets/fashion-mnist), `train`'s default model.

The target of a round is what the fixed arm reached at its last epoch; the levers' time is the
wall time from the start of training to the end of its first evaluation at or above it (the
`time` of metrics.jsonl's epoch records: evaluations included, so TTA and the larger eval size
pay their cost here). Speedup = fixed seconds to its last evaluation / levers' seconds to the
target, the median over rounds; a levers arm that never reaches the target has no speedup.
Goals (issue 42): >= 1.5x on photos, >= 1.15x on Fashion-MNIST, final accuracy not lower by more
than 0.3 pt. Each arm's evaluation time (summary.json eval_seconds) is recorded too: the cost of
TTA and of the eval size.

Round r runs every arm with `--seed r`: a lever's accuracy cost on Fashion-MNIST (0.2 pt) is the
size of one seed's noise, so a single seed decided it. Beside the two arms, a third where a
default waits on a measurement: Fashion-MNIST's levers with `--progressive` (the plan leaves
small images at one size: this arm is why), and with `--blurpool-arm` the photos' levers plus
`--blurpool` (its default, off).

Also the per-epoch cost of resnet50 at each size of an ImageNet ramp (RESNET50_SIZES, 160-224 px):
`--steps` training steps of the trainer's StepEngine on random uint8 batches already on the
device (bf16 autocast and channels_last where the trainer would, torch.compile on CUDA with its
compile warm-up untimed), as images/s and seconds per ImageNet epoch (1,281,167 images), which
docs/RECIPES.md's arithmetic needs.

Writes bench/results/levers.json; `--quick` writes bench/.cache/levers.quick.json instead, so a
smoke run never replaces a measurement. `render` (below) is its BENCHMARKS.md section.
"""
from __future__ import annotations

import argparse
import itertools
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
REPO = ROOT.parent
RESULTS = ROOT / "results" / "levers.json"
QUICK_RESULTS = ROOT / ".cache" / "levers.quick.json"
CACHE = ROOT / ".cache"
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(ROOT))

import common  # noqa: E402

GOALS = {"photos": 1.5, "fashion": 1.15}  # levers' speedup to the fixed arm's final accuracy
MAX_ACCURACY_DROP = 0.003  # final accuracy may be at most 0.3 pt lower with the levers
FASHION = Path("/usr/share/datasets/fashion-mnist")
PHOTO_SIZE = (240, 180)  # width, height: the shorter side 180 >= 160, above 1.3 x 128 / 0.875
PHOTO_TRAIN_SIZE = 128
IMAGENET_TRAIN = 1_281_167
RESNET50_SIZES = (160, 176, 192, 208, 224)
# Defaults of a measurement, and of --quick (a smoke run that the code works, not a number).
# Sized so that `--rounds 2` takes ~14 min on the quiet 2-core CPU box: one round of 4,000
# photos took 389 s for the photos' two arms (207 s fixed, 182 s levers, 8 epochs) and 115 s for
# Fashion-MNIST's; 3,000 photos (still "several thousand") make the photos' arms ~290 s a round.
# resnet50's steps per size: a few hundred on a GPU (compiled, batch 256: seconds), 10 on a CPU
# (batch 16 at 160-224 px: ~1 s a step there, so 200 would take half an hour).
FULL = {"photo_per_class": (300, 100), "fashion_slice": None, "photo_epochs": 8,
        "fashion_epochs": 4, "steps": None}
RESNET50_STEPS = {"cuda": 200, "cpu": 10}
QUICK = {"photo_per_class": (12, 4), "fashion_slice": (1000, 500), "photo_epochs": 1,
         "fashion_epochs": 1, "steps": 2}


# == data ========================================================================================
def photo_dataset(per_class: tuple[int, int]) -> Path:
    """The generated shapes as an ImageFolder, prepared once (cached by size)."""
    from turbotrain.datasets.synthetic import write_shapes_imagefolder
    train, val = per_class
    source = CACHE / f"levers-shapes-{train}-{val}-{PHOTO_SIZE[0]}x{PHOTO_SIZE[1]}"
    prepared = source.with_name(source.name + "-prepared")
    if not (prepared / "dataset.json").is_file():
        write_shapes_imagefolder(source, train_per_class=train, val_per_class=val,
                                 size=PHOTO_SIZE)
        shutil.rmtree(prepared, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "turbotrain", "prepare", str(source),
                        str(prepared)], check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    return prepared


def fashion_dataset(slice_: tuple[int, int] | None) -> Path:
    """Fashion-MNIST prepared once (a slice of it with --quick: bench_time_to_accuracy's)."""
    import bench_time_to_accuracy as tta
    source = FASHION if slice_ is None else tta.quick_source(*slice_)
    prepared = CACHE / f"levers-{source.name}-prepared"
    if not (prepared / "dataset.json").is_file():
        shutil.rmtree(prepared, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "turbotrain", "prepare", str(source),
                        str(prepared)], check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    return prepared


# == the two arms ================================================================================
def has_progressive() -> bool:
    """Whether this trainer has progressive resizing (its --no-progressive flag)."""
    shown = subprocess.run([sys.executable, "-m", "turbotrain", "train", "--help"], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout
    return "--no-progressive" in shown


def fixed_flags(train_size: int, progressive: bool) -> list[str]:
    """The levers off: one training size, no TTA, evaluation at the training size."""
    return (["--no-progressive"] if progressive else []) + ["--no-tta", "--eval-res",
                                                            str(train_size)]


def run_arm(data: Path, out: Path, flags: list[str], timeout: float) -> dict:
    """One `train` process; its epoch curve, final accuracy and what its evaluations cost."""
    shutil.rmtree(out, ignore_errors=True)
    log = out.with_suffix(".log")
    command = [sys.executable, "-m", "turbotrain", "train", "--data", str(data), "--out",
               str(out), *flags]
    with open(log, "w") as sink:
        done = subprocess.run(command, cwd=REPO, stdout=sink, stderr=subprocess.STDOUT,
                              timeout=timeout)
    if done.returncode != 0:
        tail = " | ".join(log.read_text().strip().splitlines()[-3:])
        return {"error": f"train exited {done.returncode}: {tail}"[:400]}
    summary = json.loads((out / "summary.json").read_text())
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()
               if line.strip()]
    curve = [[r["time"], r["val_accuracy"], r.get("image_size")] for r in records
             if r.get("kind") == "epoch" and r.get("val_accuracy") is not None]
    return {"curve": curve, "final_accuracy": curve[-1][1] if curve else None,
            "eval_seconds": summary.get("eval_seconds"), "wall_seconds": summary.get("wall_seconds"),
            "images_per_second": summary.get("images_per_second"),
            "settings": {k: summary.get(k) for k in ("model", "image_size", "eval_res", "tta",
                                                     "pipeline", "precision", "batch_size")},
            "decisions": {k: v for k, v in summary.get("decisions", {}).items()
                          if k in ("eval_res", "tta", "progressive", "resolution")}}


def seconds_to(curve: list, target: float) -> float | None:
    for seconds, accuracy, _ in curve:
        if accuracy >= target:
            return seconds
    return None


def compare(fixed: dict, levers: dict) -> dict:
    """One round: the target (the fixed arm's last accuracy), both arms' seconds to it, the
    speedup and the final accuracy difference."""
    if "error" in fixed or "error" in levers or not fixed["curve"] or not levers["curve"]:
        return {"error": fixed.get("error") or levers.get("error") or "no evaluation"}
    target = fixed["final_accuracy"]
    ours = seconds_to(levers["curve"], target)
    theirs = fixed["curve"][-1][0]
    return {"target": target, "fixed_seconds": theirs, "levers_seconds": ours,
            "speedup": common.ratio(theirs, ours),
            "accuracy_difference": levers["final_accuracy"] - fixed["final_accuracy"]}


def run_case(name: str, data: Path, flags: list[str], train_size: int, epochs: int,
             rounds: int, progressive: bool, work: Path, timeout: float,
             extra: dict[str, list[str]] | None = None) -> dict:
    """Both arms (and each of `extra`, NAME: flags added to the levers' arm: the measurement
    a default waits for), alternating, round r with --seed r in every arm, and the paired
    comparison of each with the fixed arm of the same seed."""
    base = [*flags, "--epochs", str(epochs)]
    arms = {"levers": base, "fixed": [*base, *fixed_flags(train_size, progressive)],
            **{arm: [*base, *more] for arm, more in (extra or {}).items()}}
    seeds = {arm: itertools.count() for arm in arms}
    runs = common.interleaved(rounds, {
        arm: (lambda arm=arm: run_arm(data, work / f"{name}-{arm}",
                                      [*arms[arm], "--seed", str(next(seeds[arm]))], timeout))
        for arm in arms},
        show=lambda r: r.get("error") or f"final {r['final_accuracy']:.2%} in "
                                         f"{r['curve'][-1][0]:.1f} s", alternate=True)
    result = {"epochs": epochs, "train_size": train_size, "flags": flags,
              "fixed_flags": fixed_flags(train_size, progressive), **runs}
    for arm in arms:
        if arm == "fixed":
            continue
        pairs = [compare(f, other) for f, other in zip(runs["fixed"], runs[arm])]
        measured = [p for p in pairs if "error" not in p]
        speedups = [p["speedup"] for p in measured if p["speedup"] is not None]
        differences = [p["accuracy_difference"] for p in measured]
        prefix = "" if arm == "levers" else f"{arm}_"
        result.update({
            f"{prefix}rounds": pairs,
            # A round where the arm never reached the target counts as no speedup.
            f"{prefix}speedup": statistics.median(speedups)
            if speedups and len(speedups) == len(measured) else None,
            f"{prefix}accuracy_difference": statistics.median(differences)
            if differences else None})
    result["eval_seconds"] = {arm: _median([r.get("eval_seconds") for r in runs[arm]])
                              for arm in arms}
    return result


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


# == resnet50's cost per size ====================================================================
def resnet50_costs(sizes, steps: int | None, batch: int | None) -> list[dict]:
    """images/s of the trainer's step at each size (module docstring); `steps` None:
    RESNET50_STEPS of the device."""
    import torch
    from turbotrain.train.models.models import build_model, get_model_spec
    from turbotrain.train.plan.hardware import cpu_native_bf16
    from turbotrain.train.step.loop import StepSettings, make_engine
    from turbotrain.train.step.schedule import LRSchedule

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    precision = "bf16" if cuda or cpu_native_bf16() else "fp32"
    batch = batch or (256 if cuda else 16)
    model = build_model(get_model_spec("resnet50"), 1000).to(
        device, memory_format=torch.channels_last)
    train_model = torch.compile(model) if cuda else model
    settings = StepSettings(device=device, precision=precision, channels_last=True, lr=0.1,
                            weight_decay=5e-5, label_smoothing=0.1)
    engine = make_engine(model, settings, schedule=LRSchedule(total=10**6, warmup=10,
                                                                kind="cosine"),
                         train_model=train_model)
    steps = steps or RESNET50_STEPS[device.type]
    results, step = [], 0
    for size in sizes:
        images = torch.randint(0, 256, (batch, 3, size, size), dtype=torch.uint8,
                               device=device).contiguous(memory_format=torch.channels_last)
        labels = torch.randint(0, 1000, (batch,), device=device)
        for timed in (False, True):  # warm-up (a compile per size on CUDA), then timed
            count = steps if timed else 3
            if cuda:
                torch.cuda.synchronize()
            started = time.perf_counter()
            for _ in range(count):
                engine.micro_step(images, labels, True)
                engine.optimizer_step(step)
                step += 1
            if cuda:
                torch.cuda.synchronize()
            seconds = time.perf_counter() - started
        rate = batch * steps / seconds
        results.append({"image_size": size, "images_per_second": rate,
                        "imagenet_epoch_seconds": IMAGENET_TRAIN / rate})
        print(f"resnet50 {size} px: {rate:,.1f} images/s, ImageNet epoch "
              f"{IMAGENET_TRAIN / rate:,.0f} s", flush=True)
    largest = results[-1]["imagenet_epoch_seconds"]
    for r in results:
        r["cost_vs_largest"] = r["imagenet_epoch_seconds"] / largest
        r["pixels_vs_largest"] = (r["image_size"] / results[-1]["image_size"]) ** 2
    return [{**r, "device": str(device), "precision": precision, "batch_size": batch,
             "compiled": cuda} for r in results]


# == the section in BENCHMARKS.md ================================================================
EXTRA_ARMS = {  # an arm beside the two, its flags on top of the levers: what its words say
    "levers_blurpool": "--blurpool on top",
    "levers_progressive": "progressive resizing turned on (--progressive)"}


def markdown(data: dict) -> str:
    def points(diff: float | None) -> str:
        return "n/a" if diff is None else f"{100 * diff:+.2f} pt"
    rows, summary, extras = [], [], []
    for name in (n for n in ("photos", "fashion") if data.get(n)):
        case = data[name]
        for arm in (a for a in ("levers", "fixed", *EXTRA_ARMS) if a in case):
            for seed, run in enumerate(case[arm]):
                settings = run.get("settings", {})
                rows.append([name, arm, seed, case["epochs"], settings.get("model"),
                             f"{settings.get('image_size')} / {settings.get('eval_res')}",
                             settings.get("tta"), common.percent(run.get("final_accuracy")),
                             common.decimal(run.get("eval_seconds")),
                             common.decimal(run.get("wall_seconds"))])
        summary.append(f"{name}: **{common.times(case.get('speedup') or None) or 'n/a'}** sooner "
                       f"to the fixed arm's accuracy (goal >= {GOALS[name]:g}x), final accuracy "
                       f"{points(case.get('accuracy_difference'))}")
        extras += [f"{name}, {words}: {common.times(case.get(f'{arm}_speedup')) or 'n/a'} "
                   f"sooner, final accuracy {points(case.get(f'{arm}_accuracy_difference'))} (no "
                   "goal: the measurement behind its default)"
                   for arm, words in EXTRA_ARMS.items() if arm in case]
    costs = data.get("resnet50", [])
    return common.markdown(
        "**Smoke run (--quick) on tiny data: not a measurement.**" if data.get("quick") else None,
        "Each round is one seed (`--seed` = the round) and trains every arm once, alternating: "
        "the levers as the plan sets them (progressive resizing: "
        f"{'yes' if data.get('progressive') else 'not in this build'}, test-time resolution, "
        "flip TTA) and the same command with them off. Target: the fixed arm's last-epoch "
        "accuracy of the same seed; seconds from the start of training to the first evaluation "
        "at it (evaluations included); the median over the seeds, none if a seed never got "
        "there.",
        common.md_table(["case", "arm", "seed", "epochs", "model", "train / eval px", "TTA",
                         "final accuracy", "eval s", "run s"], rows), "; ".join(summary) + ".",
        "; ".join(extras) + "." if extras else None,
        *([f"resnet50 training step per size ({costs[0]['device']}, {costs[0]['precision']}, "
           f"batch {costs[0]['batch_size']}):",
           common.md_table(["px", "images/s", "ImageNet epoch s", "cost vs 224", "pixels vs 224"],
                           [[c["image_size"], f"{c['images_per_second']:,.1f}",
                             f"{c['imagenet_epoch_seconds']:,.0f}", f"{c['cost_vs_largest']:.2f}",
                             f"{c['pixels_vs_largest']:.2f}"] for c in costs])] if costs else []))


def goals(report: dict) -> list[dict]:
    found = []
    for name, goal in GOALS.items():
        case = report.get(name)
        if case is None:
            continue
        found.append(common.ratio_goal(f"{name}: seconds to the fixed arm's accuracy, fixed / "
                                       "levers", case.get("speedup"), goal))
        diff = case.get("accuracy_difference")
        # As a ratio >= 1: (1 + difference) / (1 - allowed drop), met when the drop <= 0.3 pt.
        found.append(common.ratio_goal(
            f"{name}: final accuracy with the levers, (1 + difference) / (1 - 0.003)",
            None if diff is None else (1 + diff) / (1 - MAX_ACCURACY_DROP), 1.0))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--photo-epochs", type=int, default=None)
    parser.add_argument("--fashion-epochs", type=int, default=None)
    parser.add_argument("--photo-size", type=int, default=PHOTO_TRAIN_SIZE,
                        help="resnet18's training size on the photos (112-128 in issue 42)")
    parser.add_argument("--steps", type=int, default=None,
                        help="resnet50 steps per size (default: 200 on a GPU, 10 on a CPU)")
    parser.add_argument("--only", choices=("photos", "fashion", "resnet50"), action="append",
                        help="run only these parts (repeatable; default: all)")
    parser.add_argument("--quick", action="store_true", help="smoke run on tiny data")
    parser.add_argument("--blurpool-arm", action="store_true",
                        help="photos: also the levers with --blurpool (a third arm)")
    parser.add_argument("--timeout", type=float, default=7200, help="seconds per train process")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    parts = set(args.only or ("photos", "fashion", "resnet50"))
    progressive = has_progressive()
    work = CACHE / "levers-runs"
    work.mkdir(parents=True, exist_ok=True)
    report = {"command": common.command_line(__file__, argv), "quick": args.quick,
              "rounds": args.rounds, "progressive": progressive}
    if "photos" in parts:
        size = args.photo_size
        report["photos"] = run_case(
            "photos", photo_dataset(sizes["photo_per_class"]),
            ["--model", "resnet18", "--image-size", str(size)], size,
            args.photo_epochs or sizes["photo_epochs"], args.rounds, progressive, work,
            args.timeout, {"levers_blurpool": ["--blurpool"]} if args.blurpool_arm else None)
    if "fashion" in parts:
        if not FASHION.is_dir():
            print(f"bench_levers: {FASHION} is missing: apt-get install dataset-fashion-mnist",
                  file=sys.stderr)
            return 2
        report["fashion"] = run_case(
            "fashion", fashion_dataset(sizes["fashion_slice"]), [], 28,
            args.fashion_epochs or sizes["fashion_epochs"], args.rounds, progressive, work,
            args.timeout, {"levers_progressive": ["--progressive"]} if progressive else None)
    if "resnet50" in parts:
        report["resnet50"] = resnet50_costs(RESNET50_SIZES, args.steps or sizes["steps"],
                                            4 if args.quick else None)
    report["goals"] = goals(report)
    out = args.json or (QUICK_RESULTS if args.quick else RESULTS)
    common.write_results(out, report)
    print(markdown(report))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
