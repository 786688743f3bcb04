"""What a SOURCE path is read into: a `Source` of named `SplitSource`s, each a list of samples.

Two kinds of split here: `FileSplit` (one image file per sample: ImageFolder, CSV lists) and
`ArraySplit` (pixels already in memory: CIFAR, MNIST idx, .npz); WebDataset tar files and Hugging
Face Arrow/Parquet files have theirs beside their readers (webdataset.py, hf_splits.py). All are
plain data, no open handles, so prepare-dataset can hand them to worker processes by fork or
pickle. Array sources are small (CIFAR-10: 180 MB, MNIST: 55 MB) and are loaded once, up front.
"""
from __future__ import annotations

import hashlib
import os
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from turbotrain.files.untrusted import (Limits, UnsafeInput, open_regular, outside_root_reason,
                                        read_regular)

# The names of a split held out from training, in the order looked for: a `val/` folder, else a
# `test/` one (an ImageFolder's, a folder of WebDataset or Parquet files'), or files named
# `val-*`, else `test-*`, become the "val" split.
HELD_OUT_NAMES = ("val", "test")
# File suffixes read as images: an ImageFolder's and a CSV list's files, predict's inputs.
# .jfif and .jpe are JPEG under other names (Windows saves web JPEGs as .jfif): samples are
# decoded by their bytes, not their suffix.
IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".jfif", ".jpe", ".png", ".webp", ".bmp", ".gif",
                              ".tif", ".tiff"})
# A WebDataset member with one of these extensions is its sample's image: four of the above, as
# WebDataset writers name them. A sample's other members (a .tif mask, a .bmp) are not images
# to it, so a sample with KEY.jpg and KEY.tif has one image, not two.
WEBDATASET_IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")
# Bytes hashed at each end of a single-file source (an archive, an idx or npz file): enough to
# see a different file, without reading 160 MB of CIFAR every time.
FINGERPRINT_EDGE_BYTES = 1 << 20


def _encoded(text: str) -> bytes:
    """UTF-8, keeping a file name's undecodable bytes (os.fsdecode's surrogates) as they were."""
    return text.encode("utf-8", "surrogateescape")


class SourceError(ValueError):
    """A SOURCE that cannot be read; str(e) is one line naming the path and what to do."""


class SplitSource(ABC):
    """One split's samples, in a fixed order: labels[i] is the class index of sample i."""

    labels: np.ndarray  # int64 (N,)

    def __len__(self) -> int:
        return len(self.labels)

    @abstractmethod
    def name(self, i: int) -> str:
        """Where sample i comes from, for error messages: a path or 'data_batch_1[123]'."""

    @abstractmethod
    def load(self, i: int) -> bytes | np.ndarray:
        """Sample i's image: the file's bytes, or a uint8 (H, W[, C]) array."""

    @abstractmethod
    def subset(self, indices: np.ndarray) -> SplitSource:
        """The samples at `indices`, in that order (used to carve a val split)."""

    # A split that can only be read front to back (a .tar.gz stream) sets this: prepare's
    # parent then reads it with `read_in_order` and hands the bytes to the workers, instead of
    # each worker calling `load` on its own chunk.
    in_order_only = False

    def read_in_order(self, chunks: list[tuple[int, int]]):
        """Yields, per [start, stop) chunk (increasing, non-overlapping), a list with each
        sample's image bytes, or an UnsafeInput for a sample that must not be read. Raises
        SourceError when the source itself cannot be read any more."""
        for start, stop in chunks:
            yield [_loaded(self, i) for i in range(start, stop)]

    def estimated_sizes(self) -> np.ndarray | None:
        """Each sample's source bytes (int64) for the shard plan, when known without reading
        the images; None: shard_plan's own estimate for file and array splits."""
        return None

    def largest_heads(self, count: int, nbytes: int) -> list[tuple[str, bytes]]:
        """(name, first nbytes) of about the `count` largest samples, whose image headers
        bound a worker's memory (prepare/worker_memory.py); [] when unknown without reading them."""
        return []


def _loaded(split: SplitSource, i: int):
    try:
        return split.load(i)
    except UnsafeInput as e:
        return e


@dataclass(eq=False)
class FileSplit(SplitSource):
    """Image files under `root`; relpaths[i] may also be absolute (CSV lists, whose rows were
    checked when the list was read)."""
    root: str
    relpaths: list[str]
    labels: np.ndarray
    max_file_bytes: int = Limits.max_file_bytes
    # Relative paths that are symlinks, which must resolve inside root when read (empty when
    # the user passed --allow-outside-root).
    links: frozenset[str] = frozenset()

    def name(self, i: int) -> str:
        return os.path.join(self.root, self.relpaths[i])

    def load(self, i: int) -> bytes:
        """The file's bytes; UnsafeInput when it is a symlink leading outside root, is not a
        regular file (a pipe, /dev/zero) or is over the size cap. Links are resolved here, in
        the encoding worker, so the ~30 us of realpath per link runs in parallel."""
        path = self.name(i)
        if self.relpaths[i] in self.links:
            outside = outside_root_reason(path, self.root)
            if outside:
                raise UnsafeInput(outside)
        return read_regular(path, self.max_file_bytes)

    def subset(self, indices: np.ndarray) -> FileSplit:
        relpaths = [self.relpaths[i] for i in indices]
        return FileSplit(self.root, relpaths, self.labels[indices], self.max_file_bytes,
                         self.links.intersection(relpaths))

    def __repr__(self) -> str:
        return f"FileSplit({len(self)} files under {self.root})"


@dataclass(eq=False)
class ArraySplit(SplitSource):
    """Images stacked in one uint8 array (N, H, W[, C]).

    Sample i came from part part_of[i] (a file such as 'data_batch_1'), at index_in_part[i].
    """
    images: np.ndarray
    labels: np.ndarray
    part_names: tuple[str, ...]
    part_of: np.ndarray
    index_in_part: np.ndarray

    @classmethod
    def from_parts(cls, parts: list[tuple[str, np.ndarray, np.ndarray]]) -> ArraySplit:
        """parts: (name, images, labels) per source file, concatenated in the given order."""
        images = parts[0][1] if len(parts) == 1 else np.concatenate([p[1] for p in parts])
        labels = np.concatenate([np.asarray(p[2], dtype=np.int64) for p in parts])
        part_of = np.concatenate([np.full(len(p[2]), k, np.int32) for k, p in enumerate(parts)])
        index_in_part = np.concatenate([np.arange(len(p[2]), dtype=np.int64) for p in parts])
        return cls(images, labels, tuple(p[0] for p in parts), part_of, index_in_part)

    def name(self, i: int) -> str:
        return f"{self.part_names[self.part_of[i]]}[{self.index_in_part[i]}]"

    def load(self, i: int) -> np.ndarray:
        return self.images[i]

    def subset(self, indices: np.ndarray) -> ArraySplit:
        return ArraySplit(self.images[indices], self.labels[indices], self.part_names,
                          self.part_of[indices], self.index_in_part[indices])

    def __repr__(self) -> str:
        return f"ArraySplit({len(self)} images of {self.images.shape[1:]} from {self.part_names})"


@dataclass(eq=False)
class Source:
    """A detected SOURCE: its kind, classes and splits ('train' and/or 'val')."""
    kind: str                     # imagefolder, cifar10, cifar100, idx, npz, csv, webdataset, hf
    path: Path
    classes: list[str]
    splits: dict[str, SplitSource]
    # Files read whole (archives, idx, npz, the CSV list itself): fingerprinted by size, mtime
    # and their first and last MiB. Image files of FileSplits: by size and mtime only.
    content_files: tuple[Path, ...] = field(default=())
    # Classes the source declares but has no image of, left out by `--classes present`
    # (class_labels.py); the labels are then renumbered over the classes kept.
    dropped_classes: tuple[str, ...] = ()
    # (path, why) of each file or folder the listing passed over (an ImageFolder's README, a
    # .txt beside the images, a dot-file): written to skipped.txt with the unreadable images.
    passed_over: tuple[tuple[str, str], ...] = ()

    def fingerprint(self) -> str:
        """sha256 hex of what the samples are read from; changes when a file is added, removed,
        resized or touched. Cheap: stats, not reads (ImageNet's 1.33M files: one stat each).
        Carving a val split does not change it: the files are the same."""
        digest = hashlib.sha256(f"{self.kind}\n".encode())
        for path in self.content_files:
            stat = path.stat()
            digest.update(_encoded(f"{path.name}\0{stat.st_size}\0{stat.st_mtime_ns}\n"))
            with open_regular(path) as f:  # it was read whole already: a regular file
                digest.update(f.read(FINGERPRINT_EDGE_BYTES))
                if stat.st_size > FINGERPRINT_EDGE_BYTES:
                    f.seek(max(FINGERPRINT_EDGE_BYTES, stat.st_size - FINGERPRINT_EDGE_BYTES))
                    digest.update(f.read(FINGERPRINT_EDGE_BYTES))
        listed = sorted({(split.root, rel) for split in self.splits.values()
                         if isinstance(split, FileSplit) for rel in split.relpaths})
        for root, rel in listed:
            try:
                stat = os.stat(os.path.join(root, rel))
                facts = f"{stat.st_size}\0{stat.st_mtime_ns}"
            except OSError as e:  # a skipped file: gone, or a dangling link
                facts = f"unreadable {e.errno}"
            digest.update(_encoded(f"{rel}\0{facts}\n"))
        return digest.hexdigest()

    def __repr__(self) -> str:
        splits = ", ".join(f"{name}: {len(split)}" for name, split in self.splits.items())
        return f"Source({self.kind} at {self.path}, {len(self.classes)} classes, {splits})"
