"""Time to 90 % on Fashion-MNIST: `turbotrain train` with its defaults against the plain PyTorch
script a user would write (issue #5; goal: >= GOAL = 3x faster to the same accuracy).

    .venv/bin/python bench/bench_time_to_accuracy.py [--epochs 2] [--rounds 1]
    .venv/bin/python bench/bench_time_to_accuracy.py --quick     # smoke: a 2,000-image slice, ~30 s

Data: the real Fashion-MNIST idx files (Debian's dataset-fashion-mnist, /usr/share/datasets/
fashion-mnist): 60,000 train images, evaluated on the 10,000 test images after every epoch.

* turbotrain: `python -m turbotrain prepare SRC OUT`, then `python -m turbotrain train --data OUT
  --out RUN --epochs E`, nothing else set (it picks compact28, bf16 autocast, channels_last, the
  resident pipeline, batch 128 and the thread budget, and keeps freed host memory for reuse:
  see turbotrain/train/step/host_memory.py). The time to target is read from RUN/metrics.jsonl.
* plain PyTorch (the `plain_pytorch` section below): a custom `Dataset` over the idx.gz files
  read with numpy, per-sample torchvision transforms (the trainer's 28 px augmentation: reflect
  pad 2 + random crop + flip), `DataLoader(batch_size=128, shuffle=True, num_workers=2)`, the
  same compact28 net, fp32, eager, contiguous, default torch threads, and the same recipe
  (Nesterov SGD at compact28's LR, label smoothing 0.1, 5 % linear warm-up then cosine, E
  epochs): only the engineering differs, not the maths. The goal is judged against it.
* plain PyTorch with a user's recipe (`plain_pytorch_user_recipe`; skip with --no-user-recipe):
  the same script with what users' scripts commonly do instead: Adam at lr 1e-3, constant, plain
  cross-entropy. Shown beside the goal, to say what turbotrain's recipe is worth; when it does
  not reach the target within the epochs, its speedup is a lower bound (its whole training time
  over turbotrain's time to the target).

Timing, the same on both sides: `seconds_to_target` is the wall time from the start of training
(after the imports: loading the data, building the model, every epoch's training and evaluation)
to the end of the first evaluation at or above `--target`. Also recorded: `process_seconds`
(process start to exit, imports and the trainer's end-of-run report included) and, for
turbotrain, `prepare_seconds` (the one-off conversion, its own process). `speedup` leaves
prepare out; `speedup_with_prepare` counts it; `speedup_per_epoch` compares one epoch's wall
time (training + evaluation) after the first, which does not jump by a whole epoch when an
evaluation lands a hair under the target. `images_per_second` is training throughput (evaluation
excluded; turbotrain's also leaves out its first, warm-up step).

Both run as separate processes; with `--rounds N` they alternate (a busy neighbour on this
shared machine hurts both alike) and each side's fastest round counts. Writes
bench/results/time_to_accuracy.json (per-epoch curves included, for the plot in BENCHMARKS.md)
and prints a one-line summary. `--quick` writes bench/.cache/time_to_accuracy.quick.json
instead, so a smoke run never replaces a measurement.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent
REPO = ROOT.parent
RESULTS = ROOT / "results" / "time_to_accuracy.json"
QUICK_RESULTS = ROOT / ".cache" / "time_to_accuracy.quick.json"
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(ROOT))

import common  # noqa: E402
from turbotrain.train.records.report import read_metrics  # noqa: E402  (after the path insert)

GOAL = 3.0  # plain PyTorch's seconds to the target over turbotrain's (issue #5)

SOURCE = Path("/usr/share/datasets/fashion-mnist")  # Debian package dataset-fashion-mnist
TARGET = 0.90
# Two epochs: the target is then met at the schedule's end, where the LR has decayed to 0, on
# both sides. Four seeds of `train --epochs 2` ended at 90.62-91.04 %. An evaluation mid-schedule
# is a coin toss instead: with 3 epochs compact28 stood at 89.7-90.5 % after epoch 2 (LR still at
# a quarter of its peak), so the time to 90 % jumped by a whole epoch from one seed to the next.
DEFAULT_EPOCHS = 2
BATCH_SIZE = 128  # what `train` picks for 28 px images on CPU; the baseline uses the same
LOADER_WORKERS = 2  # a user's usual DataLoader setting, one per core of this machine
# --quick: a slice of the same files, short enough for the test suite. One epoch of 2,000
# images (15 steps) gets compact28 to ~50-65 %, so the smoke target is 50 %.
QUICK = {"train": 2000, "t10k": 1000, "epochs": 1, "target": 0.5}

# The plain script's two recipes. "turbotrain" gives it the trainer's maths, so that only the
# engineering differs: the goal is judged against it. "user" is what a user's script commonly
# does instead (Adam at its usual 1e-3, constant, plain cross-entropy; model, data, augmentation,
# batch, workers and epochs unchanged): shown beside it, to say what the recipe is worth.
RECIPES = {"turbotrain": "the trainer's: Nesterov SGD, warm-up + cosine, label smoothing 0.1",
           "user": "a user's usual: Adam lr 1e-3, constant, plain cross-entropy"}

IDX_FILES = {("train", "images"): "train-images-idx3-ubyte.gz",
             ("train", "labels"): "train-labels-idx1-ubyte.gz",
             ("t10k", "images"): "t10k-images-idx3-ubyte.gz",
             ("t10k", "labels"): "t10k-labels-idx1-ubyte.gz"}
IDX_HEADER = {"images": 16, "labels": 8}  # bytes: magic + dims (big-endian u32 each)


# == Reading a run's per-epoch records (shared by both sides) ====================================
def epoch_records(run_dir: str | os.PathLike) -> list[dict]:
    """The `{"kind": "epoch", ...}` records of RUNDIR/metrics.jsonl, in order; the trainer and
    the baseline both write `epoch`, `val_accuracy` and `time` (seconds since training
    started)."""
    return [record for record in read_metrics(run_dir)
            if record.get("kind") == "epoch" and record.get("val_accuracy") is not None]


def first_reaching(records: list[dict], target: float) -> tuple[float | None, int | None]:
    """(seconds, epochs) at the first evaluation with val_accuracy >= target; (None, None) when
    no epoch reached it."""
    for record in records:
        if record["val_accuracy"] >= target:
            return record["time"], record["epoch"] + 1
    return None, None


def curve(records: list[dict]) -> list[list[float]]:
    """[[seconds, val_accuracy], ...]: what BENCHMARKS.md plots."""
    return [[record["time"], record["val_accuracy"]] for record in records]


def seconds_per_epoch(records: list[dict]) -> float | None:
    """Wall seconds of one epoch (training + evaluation) after the first, start-up left out; the
    first epoch's time when there is only one. Unlike seconds-to-target it does not jump by a
    whole epoch when an evaluation lands a hair under the target."""
    if len(records) >= 2:
        return (records[-1]["time"] - records[0]["time"]) / (len(records) - 1)
    return records[0]["time"] if records else None


# == The baseline: the plain PyTorch script a user would write ===================================
# Deliberately ordinary: a numpy idx reader, a map-style Dataset returning PIL images through
# torchvision transforms one sample at a time, a DataLoader with worker processes, an fp32 eager
# model in the default memory format. Only the net and the recipe are taken from turbotrain, so
# that both sides do the same maths.
FASHION_MNIST_MEAN, FASHION_MNIST_STD = 0.2860, 0.3530  # of the train split, on the 0..1 scale


def read_idx_images(path: Path) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        pixels = np.frombuffer(f.read(), dtype=np.uint8, offset=IDX_HEADER["images"])
    return pixels.reshape(-1, 28, 28)


def read_idx_labels(path: Path) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        labels = np.frombuffer(f.read(), dtype=np.uint8, offset=IDX_HEADER["labels"])
    return labels.astype(np.int64)


def plain_pytorch(source: Path, epochs: int, run_dir: Path, recipe: str = "turbotrain") -> None:
    """Trains and evaluates; writes run_dir/metrics.jsonl (epoch lines in the trainer's keys)
    and run_dir/summary.json. `recipe`: "turbotrain" (the trainer's maths, the goal's baseline)
    or "user" (USER_RECIPE)."""
    import torch
    from PIL import Image
    from torch import nn
    from torch.utils.data import DataLoader, Dataset
    from torchvision import transforms

    from turbotrain.pipeline.augment import SMALL_IMAGE_PADDING
    from turbotrain.train.models.models import get_model_spec

    started = time.perf_counter()  # as train(): the clock starts after the imports
    torch.manual_seed(0)

    class FashionMNIST(Dataset):
        def __init__(self, root: Path, train: bool, transform):
            prefix = "train" if train else "t10k"
            self.images = read_idx_images(root / f"{prefix}-images-idx3-ubyte.gz")
            self.labels = read_idx_labels(root / f"{prefix}-labels-idx1-ubyte.gz")
            self.transform = transform

        def __len__(self):
            return len(self.labels)

        def __getitem__(self, index):
            image = Image.fromarray(self.images[index])  # 28x28 uint8 -> mode "L"
            return self.transform(image), int(self.labels[index])

    # compact28 takes 3 channels (turbotrain stores grey images as RGB), so both sides feed it
    # the same input: the grey channel three times.
    normalize = transforms.Normalize([FASHION_MNIST_MEAN] * 3, [FASHION_MNIST_STD] * 3)
    train_transform = transforms.Compose([
        transforms.RandomCrop(28, padding=SMALL_IMAGE_PADDING, padding_mode="reflect"),
        transforms.RandomHorizontalFlip(),
        transforms.Grayscale(num_output_channels=3),
        transforms.ToTensor(),
        normalize,
    ])
    test_transform = transforms.Compose([transforms.Grayscale(num_output_channels=3),
                                         transforms.ToTensor(), normalize])
    train_loader = DataLoader(FashionMNIST(source, True, train_transform), batch_size=BATCH_SIZE,
                              shuffle=True, num_workers=LOADER_WORKERS)
    test_loader = DataLoader(FashionMNIST(source, False, test_transform), batch_size=1000,
                             num_workers=LOADER_WORKERS)

    spec = get_model_spec("compact28")
    model = spec.build(10)  # the bare net: float input, no uint8 stem
    # The trainer's recipe for compact28 at batch 128: its LR per 256 images scaled linearly,
    # Nesterov momentum 0.9, label smoothing 0.1, 5 % linear warm-up then cosine to 0. A user
    # would decay every parameter (the trainer spares norms and biases): 3 epochs cannot tell.
    if recipe == "user":  # see USER_RECIPE: Adam at its usual 1e-3, constant, plain loss
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        scheduler = None
        criterion = nn.CrossEntropyLoss()
    else:
        lr = spec.sgd_lr * BATCH_SIZE / 256
        optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, nesterov=True,
                                    weight_decay=spec.weight_decay)
        total_steps = epochs * len(train_loader)
        warmup = max(1, round(0.05 * total_steps))
        scheduler = torch.optim.lr_scheduler.SequentialLR(optimizer, [
            torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=1 / warmup,
                                              total_iters=warmup),
            torch.optim.lr_scheduler.CosineAnnealingLR(optimizer,
                                                       T_max=max(1, total_steps - warmup)),
        ], milestones=[warmup])
        criterion = nn.CrossEntropyLoss(label_smoothing=0.1)

    def evaluate() -> float:
        model.eval()
        correct = seen = 0
        with torch.no_grad():
            for images, labels in test_loader:
                correct += (model(images).argmax(1) == labels).sum().item()
                seen += len(labels)
        return correct / seen

    run_dir.mkdir(parents=True, exist_ok=True)
    train_images, train_seconds, accuracy = 0, 0.0, None
    with open(run_dir / "metrics.jsonl", "w") as metrics:
        for epoch in range(epochs):
            model.train()
            epoch_started = time.perf_counter()
            for images, labels in train_loader:
                loss = criterion(model(images), labels)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                if scheduler is not None:
                    scheduler.step()
                train_images += len(labels)
            train_seconds += time.perf_counter() - epoch_started
            accuracy = evaluate()
            elapsed = time.perf_counter() - started
            print(f"epoch {epoch + 1}: val_accuracy {accuracy:.2%} at {elapsed:.1f} s", flush=True)
            metrics.write(json.dumps({"kind": "epoch", "epoch": epoch, "val_accuracy": accuracy,
                                      "time": elapsed}) + "\n")
            metrics.flush()
    (run_dir / "summary.json").write_text(json.dumps({
        "val_accuracy": accuracy, "images_per_second": train_images / train_seconds,
        "wall_seconds": time.perf_counter() - started, "model": spec.name,
        "pipeline": "torchvision transforms + DataLoader", "precision": "fp32",
        "channels_last": False, "compiled": False, "batch_size": BATCH_SIZE,
        "workers": LOADER_WORKERS, "torch_threads": torch.get_num_threads(),
        "recipe": RECIPES[recipe]}, indent=2) + "\n")


# == Data =========================================================================================
def idx_count(path: Path) -> int:
    """The sample count in an idx file's header (big-endian u32 after the 4-byte magic)."""
    with gzip.open(path, "rb") as f:
        return int.from_bytes(f.read(8)[4:8], "big")


def quick_source(train: int, test: int) -> Path:
    """The first `train`/`test` samples of each split, as idx.gz files (cached)."""
    # "fashion" in the folder name: prepare names the classes as it does for the full set.
    folder = ROOT / ".cache" / f"fashion-mnist-quick-{train}-{test}"
    if all((folder / name).is_file() for name in IDX_FILES.values()):
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    for (split, what), name in IDX_FILES.items():
        with gzip.open(SOURCE / name, "rb") as f:
            raw = f.read()
        header = bytearray(raw[:IDX_HEADER[what]])
        count = train if split == "train" else test
        header[4:8] = count.to_bytes(4, "big")  # the sample count: first dimension after magic
        per_sample = 28 * 28 if what == "images" else 1
        body = raw[IDX_HEADER[what]:IDX_HEADER[what] + count * per_sample]
        tmp = folder / (name + ".tmp")
        with gzip.open(tmp, "wb", compresslevel=1) as f:
            f.write(bytes(header) + body)
        tmp.rename(folder / name)
    return folder


# == Running each side in its own process =========================================================
def timed_process(command: list[str], log: Path, timeout: float) -> float:
    """Runs `command` with its output in `log`; returns its wall seconds. Raises with the log's
    tail when it fails."""
    started = time.perf_counter()
    with open(log, "w") as out:
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, timeout=timeout,
                              cwd=REPO)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        tail = "\n".join(log.read_text().strip().splitlines()[-5:])
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode}:\n{tail}")
    return seconds


# What each side's summary.json says of how it trained, copied into the result.
SETTINGS = ("model", "pipeline", "precision", "channels_last", "compiled", "batch_size", "lr",
            "workers", "torch_threads", "recipe")


def summarise(run_dir: Path, target: float, process_seconds: float) -> dict:
    records = epoch_records(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    seconds, epochs = first_reaching(records, target)
    return {"seconds_to_target": seconds, "epochs_to_target": epochs,
            "final_accuracy": records[-1]["val_accuracy"] if records else None,
            "images_per_second": summary.get("images_per_second"),
            "seconds_per_epoch": seconds_per_epoch(records),
            "process_seconds": process_seconds, "curve": curve(records),
            "settings": {key: summary[key] for key in SETTINGS if key in summary}}


def run_turbotrain(source: Path, work: Path, epochs: int, target: float, timeout: float) -> dict:
    prepared, run_dir = work / "prepared", work / "turbotrain-run"
    shutil.rmtree(prepared, ignore_errors=True)
    shutil.rmtree(run_dir, ignore_errors=True)
    prepare = timed_process([sys.executable, "-m", "turbotrain", "prepare", str(source),
                             str(prepared)], work / "prepare.log", timeout)
    train = timed_process([sys.executable, "-m", "turbotrain", "train", "--data", str(prepared),
                           "--out", str(run_dir), "--epochs", str(epochs)],
                          work / "turbotrain.log", timeout)
    return {**summarise(run_dir, target, train), "prepare_seconds": prepare}


def run_plain_pytorch(source: Path, work: Path, epochs: int, target: float,
                      timeout: float, recipe: str = "turbotrain") -> dict:
    run_dir = work / f"plain-{recipe}-run"
    shutil.rmtree(run_dir, ignore_errors=True)
    seconds = timed_process([sys.executable, __file__, "--child-plain", "--source", str(source),
                             "--epochs", str(epochs), "--run-dir", str(run_dir),
                             "--child-recipe", recipe],
                            work / f"plain-{recipe}.log", timeout)
    return summarise(run_dir, target, seconds)


def fastest(runs: list[dict]) -> dict:
    """The round that reached the target soonest (else the last one), with every round's
    seconds kept."""
    best = common.best_run(runs, "seconds_to_target", lowest=True) or runs[-1]
    return {**best, "rounds_seconds_to_target": [r["seconds_to_target"] for r in runs]}


def user_recipe_speedup(user: dict, ours_seconds: float | None) -> dict:
    """The speedup over the user-recipe script: exact when it reached the target; when it did
    not within the epochs, a lower bound (its whole training time over ours to the target)."""
    if ours_seconds is None:
        return {"speedup_vs_user_recipe": None, "speedup_vs_user_recipe_is_lower_bound": False}
    if user["seconds_to_target"] is not None:
        return {"speedup_vs_user_recipe": user["seconds_to_target"] / ours_seconds,
                "speedup_vs_user_recipe_is_lower_bound": False}
    last = user["curve"][-1][0] if user["curve"] else None
    return {"speedup_vs_user_recipe": common.ratio(last, ours_seconds),
            "speedup_vs_user_recipe_is_lower_bound": True}


def summary_line(report: dict) -> str:
    ours, plain, target = report["turbotrain"], report["plain_pytorch"], report["target"]

    def side(name: str, result: dict) -> str:
        if result["seconds_to_target"] is None:
            return (f"{name} did not reach {target:.0%} in {report['epochs']} epochs "
                    f"(final {result['final_accuracy']:.2%})")
        epochs = result["epochs_to_target"]
        return (f"{name} {result['seconds_to_target']:.1f} s ({epochs} "
                f"epoch{'' if epochs == 1 else 's'}, final {result['final_accuracy']:.2%})")
    speedup = report["speedup"]
    verdict = (f"speedup {speedup:.2f}x (goal >= {GOAL:g}x, "
               f"{'met' if speedup >= GOAL else 'NOT MET'}); "
               f"with the {ours['prepare_seconds']:.1f} s prepare: "
               f"{report['speedup_with_prepare']:.2f}x" if speedup else "speedup n/a")
    per_epoch = report.get("speedup_per_epoch")
    user = report.get("plain_pytorch_user_recipe")
    versus_user = ""
    if user is not None:
        versus_user = f"; {side('plain PyTorch with a user recipe', user)}"
        if report.get("speedup_vs_user_recipe"):
            bound = ">= " if report.get("speedup_vs_user_recipe_is_lower_bound") else ""
            versus_user += f": speedup {bound}{report['speedup_vs_user_recipe']:.2f}x"
    return ("[--quick smoke run, not a measurement] " * bool(report.get("quick"))
            + f"time to {target:.0%}: {side('turbotrain', ours)}; "
            f"{side('plain PyTorch', plain)}; {verdict}"
            + (f"; per epoch {per_epoch:.2f}x" if per_epoch else "") + versus_user)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--epochs", type=int, default=None,
                        help=f"epochs for both sides (default {DEFAULT_EPOCHS}; "
                             f"--quick: {QUICK['epochs']})")
    parser.add_argument("--rounds", type=int, default=1, help="alternating repeats; the "
                        "fastest of each side counts (default 1)")
    parser.add_argument("--target", type=float, default=None,
                        help=f"val accuracy to reach (default {TARGET}; --quick: "
                             f"{QUICK['target']})")
    parser.add_argument("--source", type=Path, default=SOURCE, help="Fashion-MNIST idx folder")
    parser.add_argument("--quick", action="store_true",
                        help=f"smoke run: {QUICK['train']:,} train / {QUICK['t10k']:,} test "
                             "images, 1 epoch")
    parser.add_argument("--json", type=Path, default=None,
                        help=f"output (default {RESULTS.relative_to(REPO)}; --quick: "
                             f"{QUICK_RESULTS.relative_to(REPO)})")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per process")
    parser.add_argument("--no-user-recipe", action="store_true",
                        help="skip the plain script with a user's usual recipe (Adam 1e-3)")
    parser.add_argument("--child-plain", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--child-recipe", choices=sorted(RECIPES), default="turbotrain",
                        help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    epochs = args.epochs or (QUICK["epochs"] if args.quick else DEFAULT_EPOCHS)
    if args.child_plain:
        plain_pytorch(args.source, epochs, args.run_dir, args.child_recipe)
        return 0

    target = args.target or (QUICK["target"] if args.quick else TARGET)
    out = args.json or (QUICK_RESULTS if args.quick else RESULTS)
    missing = [name for name in IDX_FILES.values() if not (args.source / name).is_file()]
    if missing:
        print(f"bench_time_to_accuracy: {args.source} lacks {', '.join(missing)}; install "
              "Debian's dataset-fashion-mnist or pass --source", file=sys.stderr)
        return 2
    source = quick_source(QUICK["train"], QUICK["t10k"]) if args.quick else args.source
    with tempfile.TemporaryDirectory(prefix="bench-tta-") as tmp:
        work = Path(tmp)
        sides = {
            "turbotrain": lambda: run_turbotrain(source, work, epochs, target, args.timeout),
            "plain_pytorch": lambda: run_plain_pytorch(source, work, epochs, target,
                                                       args.timeout)}
        if not args.no_user_recipe:
            sides["plain_pytorch_user_recipe"] = lambda: run_plain_pytorch(
                source, work, epochs, target, args.timeout, recipe="user")
        try:
            runs = common.interleaved(args.rounds, sides, show=lambda r: (
                f"{r['seconds_to_target']} s to {target:.0%}"))
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            print(f"bench_time_to_accuracy: {e}", file=sys.stderr)
            return 1
    ours, plain, user = (runs["turbotrain"], runs["plain_pytorch"],
                         runs.get("plain_pytorch_user_recipe"))
    report = {
        "command": common.command_line(__file__, argv),
        "source": str(source), "quick": args.quick, "target": target, "epochs": epochs,
        "train_images": idx_count(source / IDX_FILES["train", "labels"]),
        "test_images": idx_count(source / IDX_FILES["t10k", "labels"]),
        "rounds": args.rounds,
        "turbotrain": fastest(ours), "plain_pytorch": fastest(plain),
    }
    report["speedup"] = common.ratio(report["plain_pytorch"]["seconds_to_target"],
                                     report["turbotrain"]["seconds_to_target"])
    report["speedup_per_epoch"] = common.ratio(report["plain_pytorch"]["seconds_per_epoch"],
                                               report["turbotrain"]["seconds_per_epoch"])
    ours_best = report["turbotrain"]
    report["speedup_with_prepare"] = common.ratio(
        report["plain_pytorch"]["seconds_to_target"],
        None if ours_best["seconds_to_target"] is None
        else ours_best["seconds_to_target"] + ours_best["prepare_seconds"])
    if user:
        report["plain_pytorch_user_recipe"] = fastest(user)
        report.update(user_recipe_speedup(report["plain_pytorch_user_recipe"],
                                          ours_best["seconds_to_target"]))
    report["goals"] = [common.ratio_goal(f"seconds to {target:.0%}: plain / turbotrain",
                                         report["speedup"], GOAL)]
    if plot(report, out.with_suffix(".png")):  # beside the JSON; markdown links it
        report["plot"] = out.with_suffix(".png").name
    common.write_results(out, report)
    print(summary_line(report))
    print(f"wrote {out}")
    return 0


def plot(report: dict, path: Path) -> Path | None:
    """Val accuracy against wall time, each side's curve; None when no side has one."""
    sides = [(key, name, (report.get(key) or {}).get("curve") or []) for key, name in
             (("turbotrain", "turbotrain (defaults)"), ("plain_pytorch", "plain PyTorch"),
              ("plain_pytorch_user_recipe", "plain PyTorch, a user's recipe (Adam)"))]
    if not any(points for _, _, points in sides):
        return None
    plt = common.pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2), constrained_layout=True)
    target = report["target"]
    for colour, (key, name, points) in zip(("C0", "C1", "C2"), sides):
        if not points:
            continue
        ax.plot([p[0] for p in points], [p[1] for p in points], "o-", color=colour, label=name)
        reached = report[key].get("seconds_to_target")
        if reached is not None:
            ax.axvline(reached, color=colour, ls=":", lw=1)
            ax.annotate(f"{reached:.0f} s", (reached, target), textcoords="offset points",
                        xytext=(4, -12), color=colour, fontsize=8)
    ax.axhline(target, color="C3", ls="--", lw=1, label=f"target {target:.0%}")
    ax.set(xlabel="wall seconds since training started", ylabel="val accuracy",
           title="Fashion-MNIST: val accuracy after each epoch")
    ax.set_xlim(left=0)
    ax.grid(alpha=0.3)
    ax.legend(loc="best")  # where it hides the fewest points
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def markdown(result: dict) -> str:
    target, epochs = result["target"], result["epochs"]
    user = result.get("plain_pytorch_user_recipe") or {}

    def settings(side: dict) -> str:
        s = side.get("settings") or {}
        parts = [s.get("precision"), "channels_last" if s.get("channels_last") else "contiguous",
                 s.get("pipeline") and f"{s['pipeline']} pipeline",
                 s.get("batch_size") and f"batch {s['batch_size']}",
                 s.get("torch_threads") and f"{s['torch_threads']} torch threads"]
        return ", ".join(p for p in parts if p)

    def row(name: str, r: dict) -> list:
        return [name, common.decimal(r.get("seconds_to_target")) or "not reached",
                r.get("epochs_to_target"), common.percent(r.get("final_accuracy")),
                common.decimal(r.get("seconds_per_epoch")), common.rate(r.get("images_per_second")),
                common.decimal(r.get("process_seconds")), common.decimal(r.get("prepare_seconds"))]
    runs = [row("turbotrain", result["turbotrain"]), row("plain PyTorch", result["plain_pytorch"])]
    reached = "did not reach" if user.get("seconds_to_target") is None else "reached"
    bound = "at least " if result.get("speedup_vs_user_recipe_is_lower_bound") else ""
    return common.markdown(
        "**Smoke run (--quick) on a slice of the data: not a measurement.**"
        if result.get("quick") else None,
        f"Fashion-MNIST ({result['train_images']:,} train, {result['test_images']:,} test "
        f"images), {epochs} epoch{'' if epochs == 1 else 's'} each, compact28 on both sides; "
        f"`turbotrain train` with its defaults ({settings(result['turbotrain'])}) against a "
        f"plain PyTorch script ({settings(result['plain_pytorch'])}, per-sample torchvision "
        "transforms, DataLoader workers). Seconds to target: from the start of training, data "
        "loading and evaluation included, to the end of the first evaluation at the target.",
        common.md_table(["run", f"seconds to {target:.0%}", "epochs", "final accuracy",
                         "s per epoch", "train images/s", "process s", "prepare s"],
                        runs + ([row("plain PyTorch, a user's recipe", user)] if user else [])),
        f"Speedup: **{common.times(result['speedup']) or 'n/a'}** (goal >= {GOAL:g}x); counting "
        f"the one-off prepare: {common.times(result['speedup_with_prepare']) or 'n/a'}; per "
        f"epoch (after the first): {common.times(result['speedup_per_epoch']) or 'n/a'}. The "
        "plain script runs the trainer's recipe, so that only the engineering differs.",
        None if not user else (
            f"With a user's recipe instead ({user['settings'].get('recipe', 'Adam')}), the same "
            f"plain script {reached} {target:.0%} in {epochs} epochs (final "
            f"{common.percent(user.get('final_accuracy'))}): turbotrain is {bound}"
            f"{common.times(result.get('speedup_vs_user_recipe')) or 'n/a'} faster to the target "
            "(no goal: this is what the recipe is worth on top)."),
        f"![val accuracy against wall time](bench/results/{result['plot']})"
        if result.get("plot") else None)


if __name__ == "__main__":
    sys.exit(main())
