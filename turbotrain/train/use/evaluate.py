"""`turbotrain eval`: a trained model's accuracy on a prepared split, measured as `train` does.

    turbotrain eval --run RUNDIR                          # the run's own val split
    turbotrain eval --weights FILE --data DS [--split val] [--batch-size N] [--pipeline P]

The split goes through the trainer's own val pipeline (`data.open_pipeline`, train=False, at
the card's evaluation resolution or `--eval-res`: the centre crop for photos, the resize-only
path for small images) and the model runs in eval mode under the trainer's autocast, with the
run's flip TTA unless --tta / --no-tta says otherwise. With `--run`, the run's config.yaml gives
the defaults (data, batch size, pipeline, precision, channels_last), so on the run's val split
the top-1 accuracy is the val_accuracy the run logged for those weights, to the last digit
(best.safetensors is saved at the evaluation that measured it; tests/train/use/test_use.py checks).

Writes `eval.json` (RUNDIR/eval.json, beside a --weights file, or --out FILE): top-1, top-5
(above 5 classes; with fewer the five best guesses hold every class, so it is left out and
`top_k` is null), mean cross-entropy (no label smoothing: the trainer's val_loss), per-class
precision, recall and accuracy with the class names, the confusion matrix (rows: true class,
columns: predicted; up to MAX_CONFUSION_CLASSES classes) and each image's top-1 class; and
`confusion.png` beside it (labelled up to LABELLED_CLASSES classes).
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import torch

from turbotrain.datasets.remote.urls import is_url, shown_url
from turbotrain.files.safe_create import existing_refusal, write_file
from turbotrain.pipeline import pipeline_names
from turbotrain.printable import printable

from ..engine.data import open_pipeline, open_split
from ..errors import TrainError
from ..plan.facts import jpeg_fraction
from ..records.report import save_figure
from .inference import (LoadedModel, add_model_arguments, apply_thread_plan, at_least, describe,
                        load_model, run_command)

PROG = "turbotrain eval"
TOP_K = 5
DEFAULT_BATCH = 256  # without a run: inference holds no gradients, so a large batch fits
# A C x C matrix of counts: 1,000 classes (ImageNet) is 1 M numbers, ~5 MB of JSON. Beyond that
# eval.json keeps the per-class numbers only.
MAX_CONFUSION_CLASSES = 1000
# Up to this many classes the picture names each row and column (readable at the figure sizes
# below); above, it shows the pattern without names.
LABELLED_CLASSES = 50
ANNOTATED_CLASSES = 20  # counts written in the cells up to this many classes


def add_eval_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--data", metavar="DS",
                        help="prepared dataset folder (default: the run's --data)")
    parser.add_argument("--split", default="val", help="split to evaluate (default: val)")
    parser.add_argument("--batch-size", type=at_least(1), default=None, metavar="N",
                        help=f"images per batch (default: the run's, else {DEFAULT_BATCH})")
    parser.add_argument("--pipeline", choices=("auto", *pipeline_names()), default=None,
                        help="input pipeline (default: the run's, else auto); every pipeline "
                             "gives the same pixels")
    parser.add_argument("--workers", type=at_least(0), default=None, metavar="N",
                        help="pipeline worker threads (default: train's thread budget)")
    parser.add_argument("--out", metavar="FILE",
                        help="where eval.json goes (default: RUNDIR/eval.json, or beside the "
                             "--weights file); confusion.png is written beside it")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing eval.json and confusion.png (refused by "
                             "default)")


def run_eval(args: argparse.Namespace) -> int:
    return run_command(PROG, _run, args)


def _run(args: argparse.Namespace) -> int:
    loaded = load_model(args, prog=PROG)
    out = Path(args.out) if args.out else (loaded.run_dir or loaded.path.parent) / "eval.json"
    if not args.overwrite:  # before the evaluation, not after it
        check_not_there(out)
    data = data_to_evaluate(args.data, loaded)
    split = open_split(data, args.split)
    result = evaluate_split(loaded, split, batch_size=args.batch_size,
                            pipeline=args.pipeline, workers=args.workers)
    result["data"] = str(data)
    written = write_results(result, out, loaded.card.classes, overwrite=args.overwrite)
    print(printable(describe(loaded)))
    for line in summary_lines(result, loaded, same_data=_is_run_val(loaded, data, args.split)):
        print(printable(line))
    print(printable(f"wrote {', '.join(str(p) for p in written)}"))
    return 0


def check_classes(split, card) -> None:
    """The split's labels must mean the model's classes: same names in the same order."""
    if split.classes is not None and tuple(split.classes) != tuple(card.classes):
        shown = [f"{a!r} vs {b!r}" for a, b in zip(split.classes, card.classes) if a != b][:2]
        raise TrainError(
            f"{split.path}: its classes are not the model's ({len(split.classes)} vs "
            f"{card.num_classes}" + (f"; first differences: {', '.join(shown)}" if shown else "")
            + "): evaluate on a dataset prepared with the same classes")
    if split.classes is None and split.num_classes > card.num_classes:
        raise TrainError(f"{split.path}: labels go up to {split.num_classes - 1}, the model has "
                         f"{card.num_classes} classes")


def evaluate_split(loaded: LoadedModel, split, *, batch_size: int | None = None,
                   pipeline: str | None = None, workers: int | None = None) -> dict:
    """Runs the model over the whole split with the trainer's val pipeline; returns the
    numbers eval.json holds (without the per-class names' file paths)."""
    check_classes(split, loaded.card)
    settings, card = loaded.settings, loaded.card
    batch_size = batch_size or settings.get("batch_size") or DEFAULT_BATCH
    name = pipeline or settings.get("pipeline") or "auto"
    plan = apply_thread_plan(loaded.device, workers=workers, jpeg=jpeg_fraction(split) > 0.1)
    options = dict(batch_size=batch_size, image_size=loaded.input_size, device=loaded.device,
                   seed=settings.get("seed", 0), workers=plan.workers,
                   worker_mode=settings.get("worker_mode"))
    source, name, _ = open_pipeline(name, split, train=False, **options)
    classes = card.num_classes
    k = min(TOP_K, classes)  # with <= 5 classes top-k holds them all: not reported (top_k None)
    confusion = torch.zeros(classes * classes if classes <= MAX_CONFUSION_CLASSES else 0,
                            dtype=torch.int64)
    support = torch.zeros(classes, dtype=torch.int64)
    predicted = torch.zeros(classes, dtype=torch.int64)
    correct = torch.zeros(classes, dtype=torch.int64)
    correct_k = torch.zeros(classes, dtype=torch.int64)
    loss_sum, predictions = 0.0, []
    started = time.perf_counter()
    try:
        for images, labels in source:
            logits = loaded.logits(images)
            labels = labels.to(logits.device)
            loss_sum += float(torch.nn.functional.cross_entropy(logits.float(), labels,
                                                                reduction="sum"))
            # As loop.evaluate: argmax for top-1 (the first of tied maxima), topk for top-k.
            first = logits.argmax(dim=1)
            top = logits.topk(k, dim=1).indices
            hit = first == labels
            hit_k = (top == labels[:, None]).any(dim=1)
            labels, first = labels.cpu(), first.cpu()
            support += torch.bincount(labels, minlength=classes)
            predicted += torch.bincount(first, minlength=classes)
            correct += torch.bincount(labels[hit.cpu()], minlength=classes)
            correct_k += torch.bincount(labels[hit_k.cpu()], minlength=classes)
            if confusion.numel():
                confusion += torch.bincount(labels * classes + first,
                                            minlength=classes * classes)
            predictions.append(first)
    finally:
        source.close()
    seconds = time.perf_counter() - started
    count = int(support.sum())
    if count == 0:
        raise TrainError(f"{split.path}: the split holds no images")
    per_class = []
    for c, class_name in enumerate(card.classes):
        n, p, ok = int(support[c]), int(predicted[c]), int(correct[c])
        per_class.append({
            "class": class_name, "support": n, "predicted": p, "correct": ok,
            "precision": ok / p if p else None, "recall": ok / n if n else None,
            # Top-1 accuracy on this class's images (= recall), and top-k on them.
            "accuracy": ok / n if n else None,
            **({f"top{k}": int(correct_k[c]) / n if n else None} if classes > TOP_K else {})})
    return {
        "model": card.model, "weights": str(loaded.path), "split": split.split,
        "images": count, "classes": classes,
        "top1": int(correct.sum()) / count,
        **({f"top{k}": int(correct_k.sum()) / count} if classes > TOP_K else {}),
        "top_k": k if classes > TOP_K else None, "loss": loss_sum / count,
        "pipeline": name, "batch_size": batch_size, "image_size": card.image_size,
        "eval_res": loaded.input_size, "tta": loaded.tta,
        "precision": loaded.precision, "device": str(loaded.device),
        "seconds": seconds, "images_per_second": count / seconds if seconds > 0 else None,
        "run_logged": {key: card.info[key] for key in ("val_accuracy", "step", "epoch")
                       if key in card.info},
        "per_class": per_class,
        "confusion": (confusion.view(classes, classes).tolist() if confusion.numel() else None),
        "predictions": torch.cat(predictions).tolist() if predictions else [],
    }


def data_to_evaluate(given: str | None, loaded: LoadedModel) -> str:
    """--data, else the dataset the run's config.yaml names. A run folder may be a stranger's
    (docs/SECURITY.md): what it names is printed before it is read, and a URL in it is never
    fetched (that takes --data URL, typed by the user); a local path is read as any dataset
    is, through every check of dataset.json and the .beton files."""
    if given:
        return given
    data = loaded.settings.get("data")
    if not data:
        raise TrainError("--data DS is needed: the prepared dataset to evaluate on")
    where = loaded.run_dir / "config.yaml"
    if is_url(data):
        raise TrainError(f"{where} names the dataset {shown_url(data)}: a URL from a run folder "
                         f"is not fetched; pass --data {shown_url(data)} to evaluate on it")
    print(printable(f"data: {data} (from {where}; --data chooses another)"))
    return data


def check_not_there(out: Path) -> None:
    """eval.json and confusion.png may not replace existing files (without --overwrite)."""
    for path in (out, out.with_name("confusion.png")):
        if os.path.lexists(path):
            raise TrainError(existing_refusal(path, "--overwrite"))


def write_results(result: dict, out: Path, classes, *, overwrite: bool = False) -> list[Path]:
    """eval.json at `out` and confusion.png beside it (when the matrix was kept); each written
    under a fresh name and renamed (safe_create), so a reader never sees half a file and
    nothing planted in the folder is written through; without overwrite, an existing file is
    refused."""
    out.parent.mkdir(parents=True, exist_ok=True)
    if not overwrite:
        check_not_there(out)
    written = []
    picture = out.with_name("confusion.png")
    try:
        if result["confusion"] is not None:
            result["confusion_png"] = str(picture)
            written.append(plot_confusion(np.asarray(result["confusion"]), classes, picture,
                                          overwrite=overwrite))
        else:
            result["confusion_png"] = None
            result["confusion_note"] = (f"{result['classes']:,} classes: the confusion matrix "
                                        f"is kept up to {MAX_CONFUSION_CLASSES:,}")
        write_file(out, json.dumps(result, indent=1) + "\n", overwrite=overwrite)
    except FileExistsError as exc:  # one that appeared while we evaluated
        raise TrainError(existing_refusal(Path(exc.filename or out), "--overwrite")) from None
    return [out, *written]


def plot_confusion(matrix: np.ndarray, classes, path: Path, *, overwrite: bool = True) -> Path:
    """Rows normalised to the share of each true class; names on both axes up to
    LABELLED_CLASSES classes, counts in the cells up to ANNOTATED_CLASSES."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    n = len(matrix)
    rows = matrix.sum(axis=1, keepdims=True)
    share = np.divide(matrix, rows, out=np.zeros(matrix.shape), where=rows > 0)
    side = min(4.0 + 0.3 * min(n, LABELLED_CLASSES), 20.0)
    fig, ax = plt.subplots(figsize=(side + 1.5, side), constrained_layout=True)
    image = ax.imshow(share, cmap="Blues", vmin=0.0, vmax=1.0, interpolation="nearest")
    fig.colorbar(image, ax=ax, shrink=0.8, label="share of the true class")
    title = f"confusion: {n} classes, {int(matrix.sum()):,} images"
    if n <= LABELLED_CLASSES:
        names = [_short(c) for c in classes]
        ax.set_xticks(range(n), names, rotation=90, fontsize=8)
        ax.set_yticks(range(n), names, fontsize=8)
    else:
        ax.set_xticks([])
        ax.set_yticks([])
        title += " (too many to name: see eval.json, per_class and confusion)"
    if n <= ANNOTATED_CLASSES:
        for i in range(n):
            for j in range(n):
                if matrix[i, j]:
                    ax.text(j, i, str(matrix[i, j]), ha="center", va="center", fontsize=7,
                            color="white" if share[i, j] > 0.5 else "black")
    ax.set(xlabel="predicted class", ylabel="true class", title=title)
    return save_figure(fig, path, overwrite=overwrite)


def _short(name: str, width: int = 18) -> str:
    name = printable(name)
    return name if len(name) <= width else name[:width - 1] + "\u2026"


def _is_run_val(loaded: LoadedModel, data, split: str) -> bool:
    """Whether this is the split the run itself evaluated, the way it evaluated it (then its
    logged accuracy must match)."""
    trained_on = loaded.settings.get("data")
    as_run = loaded.input_size == loaded.card.input_size and loaded.tta == loaded.card.tta
    return (loaded.run_dir is not None and split == "val" and trained_on is not None and as_run
            and Path(trained_on).resolve() == Path(data).resolve())


def summary_lines(result: dict, loaded: LoadedModel, *, same_data: bool) -> list[str]:
    k = result["top_k"]
    lines = [f"{result['data']}/{result['split']}: {result['images']:,} images, "
             f"{result['pipeline']} pipeline, batch {result['batch_size']}: "
             f"top-1 {result['top1']:.2%}, "
             + (f"top-{k} {result[f'top{k}']:.2%}, " if k else "") +
             f"loss {result['loss']:.4f} ({result['images_per_second'] or 0:,.0f} images/s)"]
    logged = result["run_logged"].get("val_accuracy")
    if same_data and isinstance(logged, (int, float)):
        verdict = ("the same" if logged == result["top1"] else
                   f"differs by {result['top1'] - logged:+.4%}")
        lines.append(f"the run logged val_accuracy {logged:.2%} for these weights: {verdict}")
    worst = sorted((c for c in result["per_class"] if c["recall"] is not None),
                   key=lambda c: c["recall"])[:3]
    if len(result["per_class"]) > 1 and worst:
        lines.append("lowest recall: " + ", ".join(f"{c['class']} {c['recall']:.1%}"
                                                   for c in worst))
    return lines
