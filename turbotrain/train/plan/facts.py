"""What a plan needs to know about the data and the starting weights, computed once from the
opened splits and the weights' card, then passed as plain values."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import torch

from turbotrain.datasets.beton.layout import MODE_JPEG, SMALL_IMAGE_MAX_SIDE
from turbotrain.pipeline.base import PipelineOptions
from turbotrain.pipeline.order import stored_bytes
from turbotrain.pipeline.resident import crop_work_bytes, resident_bytes


def jpeg_fraction(dataset) -> float:
    """The share of a split's samples stored as JPEG (the thread rule weighs decode work by it)."""
    modes = np.asarray(dataset.modes)
    return float((modes == MODE_JPEG).mean()) if modes.size else 0.0


def largest_side(dataset) -> int:
    heights, widths = np.asarray(dataset.heights), np.asarray(dataset.widths)
    return int(max(heights.max(initial=0), widths.max(initial=0)))


@dataclass(frozen=True)
class DatasetFacts:
    train_count: int  # images in the train split
    largest_side: int  # of the stored images, px (0: an empty split)
    jpeg_fraction: float  # share of the train split stored as JPEG (the rest raw pixels)
    num_classes: int
    class_names: tuple[str, ...] = ()
    val_count: int | None = None  # None: no val split, for the reason in `val_missing`
    val_missing: str = ""
    # The prepared folder a single-file --data is a split of, when it has a val split: the
    # folder the user likely meant (the plan warns; "" otherwise).
    val_meant: str = ""
    stored_bytes: int = 0  # the train split on disk (dataset.json's total)
    # A remote split's local shard cache limit in bytes (None: local data, or no limit).
    cache_limit: int | None = None
    # Share of neighbouring train samples with the same label: ~1/classes for a shuffled
    # split, ~1 for one stored in class order (ImageFolder sources are).
    same_label_neighbours: float = 0.0

    @classmethod
    def of(cls, train, val=None, val_missing: str = "no val split",
           val_meant: str = "") -> DatasetFacts:
        """From opened splits (datasets.open_dataset); `val_missing`: why `val` is None;
        `val_meant`: as the field (train/engine/data.py open_val_split)."""
        labels = np.asarray(train.labels)
        same = float((labels[1:] == labels[:-1]).mean()) if len(labels) > 1 else 0.0
        return cls(train_count=len(train), largest_side=largest_side(train),
                   jpeg_fraction=jpeg_fraction(train), num_classes=train.num_classes,
                   class_names=tuple(train.class_names),
                   val_count=None if val is None else len(val), val_missing=val_missing,
                   val_meant=val_meant,
                   stored_bytes=stored_bytes(train),
                   cache_limit=getattr(train, "cache_limit", None),
                   same_label_neighbours=same)

    @property
    def small(self) -> bool:
        """Whole small pictures (CIFAR, MNIST): stored raw, padded and cropped, not resized."""
        return 0 < self.largest_side <= SMALL_IMAGE_MAX_SIDE

    def resident_bytes(self, image_size: int, *, train: bool = True) -> int:
        """Bytes of the resident pipeline's decoded store of the train split at `image_size`
        (its own StoreLayout, fed these facts instead of the split)."""
        options = PipelineOptions(train=train, batch_size=1, image_size=image_size,
                                  device=torch.device("cpu"))
        return resident_bytes(_Sizes(self), options)

    def resident_crop_bytes(self, image_size: int) -> int:
        """Device bytes the resident pipeline's CUDA photo crops work in beside its store."""
        options = PipelineOptions(train=True, batch_size=1, image_size=image_size,
                                  device=torch.device("cpu"))
        return crop_work_bytes(_Sizes(self), options)


class _Sizes:
    """The stored sizes StoreLayout reads, from the facts: only the largest side matters."""

    def __init__(self, facts: DatasetFacts):
        sides = [facts.largest_side] if facts.train_count else []
        self.heights = self.widths = np.asarray(sides, dtype=np.int64)
        self._count = facts.train_count

    def __len__(self) -> int:
        return self._count


@dataclass(frozen=True)
class WeightsFacts:
    """What the starting weights say (finetune.weights_facts reads them: --init-from's card,
    --pretrained's published metadata): the model, its arguments and image size they imply,
    and the classes they were trained for. `error`: reading them failed; the plan raises it
    only when it needs them (a resumed run does not)."""
    model: str | None = None
    model_kwargs: dict | None = None
    image_size: int | None = None
    reason: str = ""  # why `model`
    source_classes: int | None = None
    source_names: tuple[str, ...] | None = None
    error: str = ""
