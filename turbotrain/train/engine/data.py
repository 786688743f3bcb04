"""The trainer's view of the data: open the splits and the pipelines, and the facts the plan
reads from a split (plan/facts.py DatasetFacts)."""
from __future__ import annotations

from pathlib import Path

from turbotrain.datasets import open_dataset
from turbotrain.datasets.beton.dataset_json import prepared_folder_of, read_dataset_json
from turbotrain.datasets.remote.split import read_remote_dataset_json
from turbotrain.datasets.remote.urls import is_url
from turbotrain.pipeline import Pipeline, build_auto, build_pipeline

from ..plan import rules
from ..plan.facts import largest_side


def open_split(path: str, split: str, **cache):
    """The reader's `open_dataset`; DatasetError propagates (its message is one line).
    `cache`: cache_dir and cache_limit, for a URL (datasets/remote/split.py)."""
    return open_dataset(path, split=split, **cache)


def open_splits(path: str, **cache):
    """(train split, val split or None, why there is no val split, the folder `--data` likely
    meant): what a run trains and evaluates on, with dataset.json read once (for a URL:
    fetched once, where the train split, the question and the val split each fetched it)."""
    train = open_split(path, "train", **cache)
    return (train, *open_val_split(path, train, **cache))


def open_val_split(path: str, train=None, **cache):
    """(the val split, "", "") or (None, why there is none, the prepared folder `path` likely
    meant or ""): then the run does no evaluation.

    Only a split that dataset.json does not list counts as absent; a listed but damaged val
    split is an error like any other. `train`: the dataset's train split, already open: its
    dataset.json (`train.info`) answers and opens the val split, which reads it no more."""
    root = Path(path)
    if not is_url(path) and root.is_file():
        folder = prepared_folder_of(root)
        if folder is not None:
            return None, (f"{root} is one split of the prepared dataset {folder}, which has a "
                          f"val split: did you mean `--data {folder}`?"), str(folder)
        return None, f"{root} is a single .beton file (no val split beside it)", ""
    if train is not None and train.info is not None:
        info = train.info
    else:
        info = read_remote_dataset_json(path) if is_url(path) else read_dataset_json(root)
    if "val" not in info.get("splits", {}):
        return None, f"{path} has no val split (prepare-dataset --val-fraction carves one)", ""
    return open_split(path, "val", info=info, **cache), "", ""


def auto_image_size(dataset, device_type: str) -> tuple[int, str]:
    """`--image-size auto` for an open split (the rule: plan/rules.py image_size)."""
    decision = rules.image_size(largest_side(dataset), len(dataset), device_type)
    return decision.value, decision.reason


def open_pipeline(name: str, dataset, **options) -> tuple[Pipeline, str, str]:
    """Builds pipeline `name`, or for `auto` the first that can run here in the pipeline
    package's fallback order (`turbotrain.pipeline.build_auto`).

    Returns the pipeline, its name and a reason line."""
    if name != "auto":
        return build_pipeline(name, dataset, **options), name, "asked for"
    pipeline, reason = build_auto(dataset, **options)
    return pipeline, pipeline.name, reason
