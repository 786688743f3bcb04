"""A prepared dataset: `OUT/dataset.json` plus one `.beton` per split.

`open_dataset(OUT, split="train")` is the one entry point; it also opens a bare `.beton` (for
example one written by FFCV itself), whose class names are then unknown.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

from turbotrain.printable import printable

from . import format as fmt
from .reader import BetonFile, DatasetError
from .schema import DATASET_FORMAT_VERSION, DATASET_JSON, SPLITS, read_dataset_json
from .untrusted import UnsafeInput, open_regular

__all__ = ["DATASET_FORMAT_VERSION", "DATASET_JSON", "SPLITS", "PreparedSplit", "file_sha256",
           "open_dataset", "read_dataset_json", "split_filename"]


def split_filename(split: str) -> str:
    return f"{split}.beton"


def file_sha256(path: Path) -> str:
    """The SHA-256 of a split file, as dataset.json records it (read in 4 MiB blocks). Only a
    regular file is read (`open_regular`): /dev/zero or a named pipe would never end."""
    digest = hashlib.sha256()
    try:
        f = open_regular(path)
    except UnsafeInput as e:
        raise DatasetError(f"{printable(path)}: {e}") from None
    with f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


class PreparedSplit:
    """One split of a prepared dataset: labels, class names, stats and random access to images.

    `info` is a dataset.json that passed `schema.check_dataset_info` (None for a bare .beton);
    the BetonFile has checked every sample's metadata, so labels lie in 0..MAX_CLASSES - 1."""

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
        if len(beton) and self.classes is not None and self.labels.max() >= len(self.classes):
            first = int(np.argmax(self.labels >= len(self.classes)))
            raise DatasetError(f"{printable(self.path)}: sample {first} has label "
                               f"{int(self.labels[first])}, but dataset.json lists "
                               f"{len(self.classes)} classes (labels 0..{len(self.classes) - 1})")

    @property
    def num_classes(self) -> int:
        """len(classes); for a bare .beton, the largest label + 1 (at most fmt.MAX_CLASSES)."""
        if self.classes is not None:
            return len(self.classes)
        return int(self.labels.max()) + 1 if len(self.labels) else 0

    @property
    def class_names(self) -> list[str]:
        """classes; for a bare .beton (no names stored), "0", "1", ... up to num_classes."""
        if self.classes is not None:
            return list(self.classes)
        return [str(k) for k in range(self.num_classes)]

    def __len__(self) -> int:
        return len(self.beton)

    def read(self, i: int) -> tuple[np.ndarray, int]:
        """(stored JPEG bytes as a uint8 array, or the raw HWC uint8 image; label) — no decode."""
        i = int(i)
        if self.beton.modes[i] == fmt.MODE_RAW:
            return self.beton.raw_image(i), int(self.labels[i])
        return self.beton.payload(i), int(self.labels[i])

    def image(self, i: int) -> np.ndarray:
        """Sample i decoded to an HWC uint8 RGB array (a JPEG whose header disagrees with the
        metadata is refused before it is decoded)."""
        from .images import ImageError, decode_stored
        i = int(i)
        b = self.beton
        try:
            return decode_stored(int(b.modes[i]), int(b.heights[i]), int(b.widths[i]),
                                 b.payload(i))
        except ImageError as e:
            raise DatasetError(f"{printable(self.path)}: sample {i} does not decode ({e})") from e


def split_path(root: Path, info: dict, split: str) -> Path:
    """The .beton of `split` in a checked dataset.json (`schema` keeps it a file inside root)."""
    splits = info["splits"]
    if split not in splits:
        raise DatasetError(f"{printable(root)}: has no {printable(repr(split))} split "
                           f"(it has: {', '.join(splits)})")
    return Path(root) / splits[split]["file"]


def open_split(root: Path, info: dict, split: str) -> PreparedSplit:
    """Split `split` of the dataset at root whose checked dataset.json is info."""
    beton_path = split_path(root, info, split)
    beton = BetonFile(beton_path)
    expected = info["splits"][split].get("bytes")
    if expected is not None and expected != beton.file_size:
        raise DatasetError(f"{printable(beton_path)}: {beton.file_size} bytes, dataset.json says "
                           f"{expected}: the file was truncated or replaced; run "
                           f"`turbotrain verify {printable(root)}`")
    return PreparedSplit(beton, split, info)


def open_dataset(path: str | os.PathLike, split: str = "train") -> PreparedSplit:
    """Opens split `split` of the prepared dataset at `path` (a folder), or a bare `.beton`."""
    root = Path(path)
    if not root.exists():
        raise DatasetError(f"{printable(root)}: no such dataset; run "
                           f"`prepare-dataset SOURCE {printable(root)}` first")
    if not root.is_dir():  # BetonFile refuses anything but a regular file
        return PreparedSplit(BetonFile(root), root.stem, None)
    return open_split(root, read_dataset_json(root), split)
