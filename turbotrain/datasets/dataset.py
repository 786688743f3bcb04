"""A prepared dataset: `OUT/dataset.json` plus one `.beton` per split.

`open_dataset(OUT, split="train")` is the one entry point; it also opens a bare `.beton` (for
example one written by FFCV itself), whose class names are then unknown.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from . import format as fmt
from .reader import BetonFile, DatasetError

# Version of `dataset.json` (ours; the `.beton` inside has FFCV's own version number).
DATASET_FORMAT_VERSION = 1
DATASET_JSON = "dataset.json"
SPLITS = ("train", "val")


def split_filename(split: str) -> str:
    return f"{split}.beton"


def file_sha256(path: Path) -> str:
    """The SHA-256 of a split file, as dataset.json records it (read in 4 MiB blocks)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def read_dataset_json(root: Path) -> dict:
    path = root / DATASET_JSON
    try:
        info = json.loads(path.read_text())
    except FileNotFoundError:
        raise DatasetError(f"{root}: not a prepared dataset (no {DATASET_JSON}); "
                           f"run `prepare-dataset SOURCE {root}` first") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DatasetError(f"{path}: unreadable ({e}); re-run prepare-dataset") from e
    if not isinstance(info, dict) or info.get("format_version") != DATASET_FORMAT_VERSION:
        found = info.get("format_version") if isinstance(info, dict) else None
        raise DatasetError(f"{path}: dataset format version {found!r}, this turbotrain reads "
                           f"version {DATASET_FORMAT_VERSION}; re-run prepare-dataset")
    return info


class PreparedSplit:
    """One split of a prepared dataset: labels, class names, stats and random access to images."""

    def __init__(self, beton: BetonFile, split: str, info: dict | None):
        self.beton = beton
        self.split = split
        self.info = info
        self.path = beton.path
        self.labels = beton.labels
        self.modes, self.heights, self.widths = beton.modes, beton.heights, beton.widths
        self.classes: list[str] | None = info["classes"] if info else None
        stats = (info or {}).get("pixel_stats")
        self.mean = tuple(stats["mean"]) if stats else None
        self.std = tuple(stats["std"]) if stats else None
        if len(beton) and self.classes is not None and (
                self.labels.min() < 0 or self.labels.max() >= len(self.classes)):
            raise DatasetError(f"{self.path}: labels outside 0..{len(self.classes) - 1}")

    @property
    def num_classes(self) -> int:
        if self.classes is not None:
            return len(self.classes)
        return int(self.labels.max()) + 1 if len(self.labels) else 0

    def __len__(self) -> int:
        return len(self.beton)

    def read(self, i: int) -> tuple[np.ndarray, int]:
        """(stored JPEG bytes as a uint8 array, or the raw HWC uint8 image; label) — no decode."""
        i = int(i)
        if self.beton.modes[i] == fmt.MODE_RAW:
            return self.beton.raw_image(i), int(self.labels[i])
        return self.beton.payload(i), int(self.labels[i])

    def image(self, i: int) -> np.ndarray:
        """Sample i decoded to an HWC uint8 RGB array."""
        from .images import ImageError, decode_stored
        i = int(i)
        b = self.beton
        try:
            return decode_stored(int(b.modes[i]), int(b.heights[i]), int(b.widths[i]),
                                 b.payload(i))
        except ImageError as e:
            raise DatasetError(f"{self.path}: sample {i} does not decode ({e})") from e


def open_dataset(path: str | os.PathLike, split: str = "train") -> PreparedSplit:
    """Opens split `split` of the prepared dataset at `path` (a folder), or a bare `.beton`."""
    root = Path(path)
    if root.is_file():
        return PreparedSplit(BetonFile(root), root.stem, None)
    if not root.exists():
        raise DatasetError(f"{root}: no such dataset; run `prepare-dataset SOURCE {root}` first")
    info = read_dataset_json(root)
    splits = info.get("splits", {})
    if split not in splits:
        raise DatasetError(f"{root}: has no {split!r} split (it has: {', '.join(splits) or 'none'})")
    beton_path = root / splits[split]["file"]
    beton = BetonFile(beton_path)
    expected = splits[split].get("bytes")
    if expected is not None and expected != beton.file_size:
        raise DatasetError(f"{beton_path}: {beton.file_size} bytes, dataset.json says {expected}: "
                           f"the file was truncated or replaced; run `turbotrain verify {root}`")
    return PreparedSplit(beton, split, info)
