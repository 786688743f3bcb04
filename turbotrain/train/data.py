"""The trainer's view of the data: open the splits, pick the pipeline, size the images."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from turbotrain.pipeline import Pipeline, build_auto, build_pipeline

SMALL_IMAGE_PX = 64  # at or below this, images train at their native size
# Fewer training images than this: photos train at 64 px on CUDA too, where `--model auto`
# picks the airbench net (measured on 2,000 photos: models.auto_model's comment).
SMALL_SET = 10_000


def open_split(path: str, split: str):
    """The reader's `open_dataset`; DatasetError propagates (its message is one line)."""
    from turbotrain.datasets import open_dataset
    return open_dataset(path, split=split)


def open_val_split(path: str):
    """(the val split, "") or (None, why there is none): then the run does no evaluation.

    Only a split that dataset.json does not list counts as absent; a listed but damaged val
    split is an error like any other."""
    from turbotrain.datasets.dataset import read_dataset_json
    root = Path(path)
    if root.is_file():
        return None, f"{root} is a single .beton file (no val split beside it)"
    if "val" not in read_dataset_json(root).get("splits", {}):
        return None, f"{root} has no val split (prepare-dataset --val-fraction carves one)"
    return open_split(path, "val"), ""


def jpeg_fraction(dataset) -> float:
    modes = np.asarray(dataset.modes)
    return float((modes == 0).mean()) if modes.size else 0.0


def largest_side(dataset) -> int:
    heights, widths = np.asarray(dataset.heights), np.asarray(dataset.widths)
    return int(max(heights.max(initial=0), widths.max(initial=0)))


def auto_image_size(dataset, device_type: str) -> tuple[int, str]:
    side = largest_side(dataset)
    if 0 < side <= SMALL_IMAGE_PX:
        # prepare-dataset stores images this small raw: nothing to decode, and upscaling
        # would only multiply the FLOPs.
        return side, f"native size of the {side} px images"
    if device_type == "cuda":
        if len(dataset) < SMALL_SET:
            return 64, (f"{len(dataset):,} train images (< {SMALL_SET:,}) on CUDA: a small set "
                        "learns best small, like a CPU run (64 px: the airbench net)")
        return 224, (f"224 px on CUDA for {len(dataset):,} train images, the standard ImageNet "
                     "training size")
    # A CPU run is a short run: what matters is accuracy per CPU-minute. On the demo's photos
    # (3,000 images of 256 px, 2-core dev box) ResNet-18 at 128 px reached 29 % val accuracy
    # after 230 steps; at 64 px `--model auto` picks the airbench net, which reached 83 % after
    # 138 steps.
    return 64, "64 px on CPU: short CPU runs learn fastest small (airbench net)"


def open_pipeline(name: str, dataset, **options) -> tuple[Pipeline, str, str]:
    """Builds pipeline `name`, or for `auto` the first that can run here in the pipeline
    package's fallback order (`turbotrain.pipeline.build_auto`).

    Returns the pipeline, its name and a reason line."""
    if name != "auto":
        return build_pipeline(name, dataset, **options), name, "asked for"
    pipeline, reason = build_auto(dataset, **options)
    return pipeline, pipeline.name, reason
