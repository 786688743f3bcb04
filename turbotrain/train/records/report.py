"""What a run leaves in RUNDIR: metrics.jsonl, summary.json, curves.png, TensorBoard scalars.

metrics.jsonl has one JSON object a line: `{"kind": "step", ...}` every `--log-every` optimizer
steps and `{"kind": "epoch", ...}` after each evaluation. A resumed run first drops the lines
written after its checkpoint, so the file reads as one uninterrupted run.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

from turbotrain.files.safe_create import open_append, replacing_path, write_file
from turbotrain.os_failure import writing
from turbotrain.printable import printable

from .tensorboard_events import EventFile, TensorBoardUnavailable

METRICS_NAME = "metrics.jsonl"
SUMMARY_NAME = "summary.json"
CURVES_NAME = "curves.png"


def _clean(value):
    """JSON has no NaN/inf: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class MetricsLog:
    def __init__(self, run_dir: str | os.PathLike, *, enabled: bool = True,
                 tensorboard: bool = False):
        self.path = Path(run_dir) / METRICS_NAME
        self.enabled = enabled
        self.writer = _tensorboard_writer(run_dir) if (enabled and tensorboard) else None

    def truncate_after(self, step: int, epochs_done: int) -> None:
        """Keeps step lines up to `step` and epoch lines of the first `epochs_done` epochs."""
        if not (self.enabled and self.path.is_file()):
            return
        kept = []
        for line in self.path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:  # a line torn by kill -9
                continue
            if record.get("kind") == "epoch":
                if record["epoch"] < epochs_done:
                    kept.append(line)
            elif record.get("step", 0) <= step:
                kept.append(line)
        write_file(self.path, "".join(line + "\n" for line in kept))

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        line = json.dumps({k: _clean(v) for k, v in record.items()}) + "\n"
        # The write fails at close, through a descriptor: a full disk is named here.
        with writing(self.path, "the metrics log"), open_append(self.path) as f:
            f.write(line)  # a link planted at path is refused by open_append, not followed
        if self.writer is not None:
            step = record.get("step", 0)
            prefix = "train" if record.get("kind") == "step" else "val"
            for key, value in record.items():
                if isinstance(value, (int, float)) and key not in ("step", "epoch", "kind"):
                    self.writer.add_scalar(f"{prefix}/{key}", value, step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def _tensorboard_writer(run_dir):
    try:
        return EventFile(run_dir)
    except TensorBoardUnavailable as e:
        print(f"train: --tensorboard: {printable(str(e))}; writing metrics.jsonl only")
        return None


def read_metrics(run_dir: str | os.PathLike) -> list[dict]:
    """The records of RUNDIR/metrics.jsonl in order; [] when it is absent. A last line torn by
    kill -9 is left out, as `truncate_after` does."""
    path = Path(run_dir) / METRICS_NAME
    if not path.is_file():
        return []
    records = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def write_summary(run_dir: str | os.PathLike, summary: dict) -> None:
    write_file(Path(run_dir) / SUMMARY_NAME,
               json.dumps({k: _clean(v) for k, v in summary.items()}, indent=2) + "\n")


FEW_POINTS = 10  # train-loss points up to which each one is marked


def smoothed_loss_floor(label_smoothing: float, num_classes: int) -> float:
    """The lowest cross-entropy a model can reach on label-smoothed targets, their entropy:
    0.50 for 0.1 over 10 classes, where the val loss (hard labels) can go to 0. So a train
    loss above the val loss is no sign of underfitting."""
    if label_smoothing <= 0 or num_classes < 2:
        return 0.0
    off = label_smoothing / num_classes
    on = 1.0 - label_smoothing + off
    return -(on * math.log(on) + (num_classes - 1) * off * math.log(off))


def train_loss_note(label_smoothing: float, num_classes: int, mixed: bool) -> str:
    """What makes the train loss read differently from the val loss, for curves.png ("" when
    nothing does)."""
    notes = []
    if label_smoothing > 0:
        notes.append(f"train loss on label-smoothed targets ({label_smoothing:g}): it cannot "
                     f"go below {smoothed_loss_floor(label_smoothing, num_classes):.2f} "
                     "(dotted); the val loss (hard labels) can reach 0")
    if mixed:
        notes.append("train loss and accuracy on mixed images (--mixup / --cutmix)")
    return "; ".join(notes)


def plot_curves(run_dir: str | os.PathLike, *, label_smoothing: float = 0.0,
                num_classes: int = 0, mixed: bool = False) -> Path | None:
    """curves.png: train/val loss and train/val accuracy against wall time and against epoch
    (train accuracy: on the augmented training batches, per log window); a run without a val
    split has the train curves only, titled so. `label_smoothing`, `num_classes`, `mixed`:
    the training loss's settings, said in the title (train_loss_note) with the smoothed
    loss's floor drawn."""
    records = read_metrics(run_dir)
    steps = [r for r in records if r.get("kind") == "step" and r.get("loss") is not None]
    epochs = [r for r in records if r.get("kind") == "epoch"]
    stops = [r for r in records if r.get("kind") == "stop"]
    if not steps and not epochs:
        return None
    import matplotlib
    matplotlib.use("Agg")  # no display needed; safe in CI and under torchrun
    import matplotlib.pyplot as plt

    with_val = [r for r in epochs if r.get("val_loss") is not None]
    trained = [r for r in steps if r.get("train_accuracy") is not None]
    rows = 2 if with_val or trained else 1
    fig, axes = plt.subplots(rows, 2, figsize=(11, 3.5 * rows + 0.5),
                             constrained_layout=True, squeeze=False)
    titles = [] if with_val else [
        "train loss only: the run had no val split to measure accuracy on" if rows == 1
        else "the training curves only: the run had no val split to measure on"]
    note = train_loss_note(label_smoothing, num_classes, mixed)
    if titles or note:
        fig.suptitle("\n".join(titles + ([note] if note else [])), fontsize=10)
    floor = smoothed_loss_floor(label_smoothing, num_classes)
    for column, axis_key, label in ((0, "time", "wall time (s)"), (1, "epoch_float", "epoch")):
        loss_ax = axes[0][column]
        acc_ax = axes[1][column] if rows == 2 else None
        drawn = (loss_ax, acc_ax) if acc_ax is not None else (loss_ax,)
        # A short run logs one or two steps: a line through one point draws nothing, so its
        # points are marked (a 3-step run's curves.png was an empty frame with a legend).
        loss_ax.plot([r[axis_key] for r in steps], [r["loss"] for r in steps],
                     label="train loss", lw=1, marker="o" if len(steps) <= FEW_POINTS else None)
        if floor > 0:
            loss_ax.axhline(floor, color="C0", ls=":", lw=1,
                            label=f"train loss floor ({floor:.2f}, label smoothing)")
        if trained:
            acc_ax.plot([r[axis_key] for r in trained], [r["train_accuracy"] for r in trained],
                        label="train accuracy (augmented batches)", lw=1, color="C0",
                        marker="o" if len(trained) <= FEW_POINTS else None)
        if with_val:
            loss_ax.plot([r[axis_key] for r in with_val], [r["val_loss"] for r in with_val],
                         "o-", label="val loss")
            acc_ax.plot([r[axis_key] for r in with_val], [r["val_accuracy"] for r in with_val],
                        "o-", label="val accuracy", color="C2")
        for x, size in size_starts(epochs, axis_key):  # progressive resizing
            for ax in drawn:
                ax.axvline(x, color="0.5", ls="-.", lw=1)
                ax.annotate(f"{size} px", (x, 1), xycoords=("data", "axes fraction"),
                            xytext=(3, -12), textcoords="offset points", color="0.35")
        for stop in stops:  # --target-accuracy / --time-budget ended the run here
            for ax in drawn:
                # Black dashed: C1 (orange) is the val loss drawn beside it.
                ax.axvline(stop[axis_key], color="k", ls="--", lw=1.5,
                           label=f"stopped: {stop['reason'].replace('_', ' ')}")
        loss_ax.set(xlabel=label, ylabel="loss")
        loss_ax.legend()
        loss_ax.grid(alpha=0.3)
        if acc_ax is not None:
            acc_ax.set(xlabel=label, ylabel="accuracy", ylim=(0, 1))
            acc_ax.legend()
            acc_ax.grid(alpha=0.3)
    return save_figure(fig, Path(run_dir) / CURVES_NAME)


def size_starts(epochs: list[dict], axis_key: str) -> list[tuple[float, int]]:
    """(x, px) where each training size began, from the epoch records' `image_size`; [] for a
    run at one size. x on the `epoch_float` axis is the epoch's start; on `time`, the end of
    the epoch before (0 for the first)."""
    sized = [r for r in epochs if r.get("image_size") is not None]
    if len({r["image_size"] for r in sized}) < 2:
        return []
    starts, previous = [], None
    for k, record in enumerate(sized):
        if record["image_size"] != previous:
            if axis_key == "epoch_float":
                x = record["epoch_float"] - 1.0
            else:
                x = sized[k - 1][axis_key] if k else 0.0
            starts.append((x, record["image_size"]))
            previous = record["image_size"]
    return starts


def save_figure(fig, path: str | os.PathLike, *, overwrite: bool = True) -> Path:
    """`fig` as a PNG at `path`, written through replacing_path (no half-written file, no link
    at the name followed), and closed whatever happens; the run's curves, its timeline and
    eval's confusion matrix all go this way."""
    import matplotlib.pyplot as plt
    path = Path(path)
    try:
        with replacing_path(path, overwrite=overwrite) as tmp:
            fig.savefig(tmp, dpi=90)
    finally:
        plt.close(fig)
    return path
