"""The shards a split is stored in, and the interface a split reads them through.

A sharded split is `OUT/<split>-00000-of-00012.beton` ... : consecutive runs of samples, each a
complete `.beton` that FFCV (or `BetonFile`) opens on its own. `dataset.json` lists them in
order (docs/FORMAT.md). An unsharded split is one shard, `OUT/<split>.beton`.

`PreparedSplit` (split.py) holds a list of `ShardSource`s: `LocalShard` here for files in the
dataset folder, `RemoteShard` (remote/split.py) for objects in a store. Every implementation must
pickle without open files or maps (CPU decode workers unpickle the split and reopen shards).
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from turbotrain.datasets.errors import DatasetError
from turbotrain.printable import printable

from .reader import BetonFile

# `<split>-00003-of-00012.beton`: a 5-digit index and total, so names sort in shard order.
SHARD_DIGITS = 5
_SHARD_NAME = re.compile(r"(?P<split>[a-z]+)-(?P<index>\d{5})-of-(?P<total>\d{5})\.beton")


def shard_filename(split: str, index: int, total: int) -> str:
    return f"{split}-{index:0{SHARD_DIGITS}d}-of-{total:0{SHARD_DIGITS}d}.beton"


def parse_shard_filename(name: str) -> tuple[str, int, int] | None:
    """(split, index, total) of a shard file name, or None if `name` is not one."""
    match = _SHARD_NAME.fullmatch(name)
    if not match:
        return None
    return match["split"], int(match["index"]), int(match["total"])


@dataclass(frozen=True)
class ShardMetadata:
    """One shard's per-sample metadata, each a numpy array of length num_samples: what a split
    needs before reading any sample (labels for the order, sizes for the augmentation)."""
    modes: np.ndarray    # uint8: layout.MODE_JPEG or MODE_RAW
    heights: np.ndarray  # uint16
    widths: np.ndarray   # uint16
    labels: np.ndarray   # int64, checked in 0..format.MAX_CLASSES - 1

    @classmethod
    def of(cls, beton: BetonFile) -> "ShardMetadata":
        return cls(beton.modes, beton.heights, beton.widths, beton.labels)


class ShardSource(Protocol):
    name: str          # the shard file name, e.g. "train-00003-of-00012.beton"
    num_samples: int
    nbytes: int        # file size from the index

    def metadata(self) -> ShardMetadata:
        """modes, heights, widths, labels (len num_samples) without needing the sample bytes."""

    def open(self) -> BetonFile:
        """The whole shard, validated (may download it first)."""


class LocalShard:
    """A shard file in the dataset folder. `entry` is its checked dataset.json entry (`file`,
    `num_samples`, `bytes`, ...), or None for a bare `.beton` (then the file says)."""

    def __init__(self, path: str | Path, entry: dict | None = None, *, verify: bool = False):
        self.path = Path(path)
        self.name = self.path.name
        self.entry = entry
        # Check the file's SHA-256 on the first open (train --verify-data). `verified` travels
        # with the pickled shard, so worker processes that reopen it do not hash it again.
        self.verify, self.verified = verify, False
        self._beton: BetonFile | None = None
        if entry is None:  # a bare .beton: its own header is the index
            beton = self.open()
            self.num_samples, self.nbytes = len(beton), beton.file_size
        else:
            self.num_samples, self.nbytes = int(entry["num_samples"]), entry.get("bytes")

    def metadata(self) -> ShardMetadata:
        # The metadata table lives in the file itself: opening it maps it (no sample is read).
        return ShardMetadata.of(self.open())

    def open(self) -> BetonFile:
        if self._beton is None:
            beton = BetonFile(self.path)
            check_against_index(beton, self.entry, self.path)
            if self.verify and not self.verified:
                check_checksum(beton, self.entry, self.path)
                self.verified = True
            self._beton = beton
        return self._beton

    def __getstate__(self) -> dict:
        # A worker process reopens the file: pickling the map would copy the whole shard.
        return {**self.__dict__, "_beton": None}

    def __repr__(self) -> str:
        return f"LocalShard({str(self.path)!r}, {self.num_samples} samples)"


def check_checksum(beton: BetonFile, entry: dict | None, shown: str | Path) -> None:
    """The mapped bytes must hash to the SHA-256 dataset.json records (when it records one):
    damage inside a stored JPEG's entropy data decodes without an error, into wrong pixels.
    Hashes the map itself (what the run will read; hashlib releases the GIL): ~1.1 GB/s."""
    expected = (entry or {}).get("sha256")
    if expected is None or beton.file_size == 0:
        return
    if hashlib.sha256(memoryview(beton.mapped_bytes())).hexdigest() != expected.lower():
        folder = printable(Path(shown).parent)
        raise DatasetError(f"{printable(shown)}: its SHA-256 is not the one dataset.json "
                           "records (the file was damaged or changed after prepare-dataset); "
                           f"run `turbotrain verify {folder}`, then prepare the dataset again "
                           "or restore the file (train --no-verify-data skips this check)")


def check_against_index(beton: BetonFile, entry: dict | None, shown: str | Path) -> None:
    """A shard must be the size and sample count its index entry records: anything else was
    truncated, replaced, or belongs to another dataset."""
    if entry is None:
        return
    expected = entry.get("bytes")
    if expected is not None and expected != beton.file_size:
        raise DatasetError(f"{printable(shown)}: {beton.file_size} bytes, dataset.json says "
                           f"{expected}: the file was truncated or replaced; run "
                           f"`turbotrain verify {printable(Path(shown).parent)}`")
    if len(beton) != entry["num_samples"]:
        raise DatasetError(f"{printable(shown)}: {len(beton)} samples, dataset.json says "
                           f"{entry['num_samples']}: the file was replaced; re-run "
                           f"prepare-dataset")
