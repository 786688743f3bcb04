"""A prepared dataset: `OUT/dataset.json` plus one `.beton` per split, or numbered shards of
it (shards.py).

`open_dataset(OUT, split="train")` is the one entry point; it also opens a bare `.beton` (for
example one written by FFCV itself), whose class names are then unknown.
"""
from __future__ import annotations

import bisect
import hashlib
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from turbotrain.datasets.errors import DatasetError, NotPrepared
from turbotrain.files.untrusted import UnsafeInput, open_regular
from turbotrain.printable import printable

from . import layout
from .dataset_json import read_dataset_json
from .reader import BetonFile
from .shards import LocalShard, ShardSource


def split_filename(split: str) -> str:
    return f"{split}.beton"


def file_sha256(path: Path, *, follow_symlinks: bool = True) -> str:
    """The SHA-256 of a split file, as dataset.json records it (read in 4 MiB blocks). Only a
    regular file is read (`open_regular`): /dev/zero or a named pipe would never end."""
    digest = hashlib.sha256()
    try:
        f = open_regular(path, follow_symlinks=follow_symlinks)
    except UnsafeInput as e:
        raise DatasetError(f"{printable(path)}: {e}") from None
    with f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


class PreparedSplit:
    """One split of a prepared dataset: labels, class names, stats and random access to images.

    The samples live in one or more shards (`ShardSource`, shards.py), consecutive runs of the
    split: sample i is sample `i - shard_bounds[k]` of shard `k = shard_of(i)`. The metadata
    arrays (labels, modes, heights, widths) are the shards' concatenated; each shard's
    BetonFile is opened on the first read from it.

    `info` is a dataset.json that passed `dataset_json.check_dataset_info` (None for a bare .beton);
    each BetonFile has checked every sample's metadata, so labels lie in 0..MAX_CLASSES - 1.
    `root` is where the shards live (the dataset folder, or a URL) and names them in messages;
    `on_will_read`, if given, receives `will_read`'s hints (the remote shard cache).

    `split[i]` is (the decoded HWC uint8 RGB image, its label): a map-style dataset, so
    `torch.utils.data.DataLoader(split, batch_size=None)` iterates it (batches need images of
    one size: a collate_fn that resizes, or `turbotrain.Loader`, which crops and resizes in
    compiled code). It pickles without its maps, so DataLoader worker processes reopen them."""

    def __init__(self, shards: Sequence[ShardSource], split: str, info: dict | None, *,
                 root: str | os.PathLike | None = None,
                 on_will_read: Callable[[Sequence[int]], None] | None = None):
        if not shards:
            raise ValueError("a split needs at least one shard")
        self.shards = list(shards)
        self.split = split
        self.info = info
        self.root = root
        self._on_will_read = on_will_read
        counts = [shard.num_samples for shard in self.shards]
        self.shard_bounds = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=self.shard_bounds[1:])
        # The same bounds as a list: bisect on it finds one sample's shard in ~0.2 us, where
        # np.searchsorted on a scalar costs ~1 us (vectorised callers use shard_bounds).
        self._bounds = self.shard_bounds.tolist()
        self.shard_nbytes = np.array([shard.nbytes or 0 for shard in self.shards], dtype=np.int64)
        # An unsharded split is named by its file (messages say "OUT/train.beton: sample 3");
        # a sharded one by its folder, each sample by its shard file.
        single = len(self.shards) == 1
        self.path = self._shard_path(0) if single else root
        self._betons: list[BetonFile | None] = [None] * len(self.shards)
        # An unsharded split's one BetonFile once opened: read() then skips locate() (3.35 us
        # per read as before shards, against 3.6 us through locate(); measured on 32x32 raw).
        self._single: BetonFile | None = None
        self._open_lock = threading.Lock()
        self._load_metadata()
        self.classes: list[str] | None = info["classes"] if info else None
        stats = (info or {}).get("pixel_stats")
        self.mean = tuple(stats["mean"]) if stats else None
        self.std = tuple(stats["std"]) if stats else None
        if len(self) and self.classes is not None and self.labels.max() >= len(self.classes):
            first = int(np.argmax(self.labels >= len(self.classes)))
            raise DatasetError(f"{self.where(first)} has label {int(self.labels[first])}, but "
                               f"dataset.json lists {len(self.classes)} classes (labels "
                               f"0..{len(self.classes) - 1})")

    def _load_metadata(self) -> None:
        parts = [shard.metadata() for shard in self.shards]
        for k, (meta, shard) in enumerate(zip(parts, self.shards)):
            if not all(len(a) == shard.num_samples
                       for a in (meta.modes, meta.heights, meta.widths, meta.labels)):
                raise DatasetError(f"{printable(self._shard_path(k))}: its metadata does not "
                                   f"hold {shard.num_samples} samples as the index says")
        if len(parts) == 1:  # no copy: the arrays are views of the file's metadata table
            meta = parts[0]
            self.modes, self.heights, self.widths = meta.modes, meta.heights, meta.widths
            self.labels = meta.labels
            return
        self.modes = np.concatenate([m.modes for m in parts])
        self.heights = np.concatenate([m.heights for m in parts])
        self.widths = np.concatenate([m.widths for m in parts])
        self.labels = np.concatenate([m.labels for m in parts])

    def __getstate__(self) -> dict:
        # A worker process reopens the shards it reads (LocalShard pickles without its map).
        # The will_read hint is the parent's business (a remote cache's threads do not pickle).
        state = {**self.__dict__, "_betons": [None] * len(self.shards), "_on_will_read": None,
                 "_single": None}
        del state["_open_lock"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._open_lock = threading.Lock()

    # -- shards -------------------------------------------------------------------------------
    @property
    def num_shards(self) -> int:
        return len(self.shards)

    @property
    def nbytes(self) -> int:
        """Stored bytes of the whole split (the shard files' sizes)."""
        return int(self.shard_nbytes.sum())

    def shard_of(self, i: int) -> int:
        """The shard that holds sample i (np.searchsorted(shard_bounds, i, "right") - 1)."""
        return bisect.bisect_right(self._bounds, int(i)) - 1

    def locate(self, i: int) -> tuple[BetonFile, int]:
        """(the opened BetonFile holding sample i, i's index in it)."""
        if len(self.shards) == 1:  # unsharded: no search (0.3 us of a 1 us read)
            return self._betons[0] or self._open(0), i
        bounds = self._bounds
        if not 0 <= i < bounds[-1]:
            raise IndexError(f"sample {i} out of range for {self.where_split()} "
                             f"({len(self)} samples)")
        k = bisect.bisect_right(bounds, i) - 1
        return self._betons[k] or self._open(k), i - bounds[k]

    def shard(self, k: int) -> BetonFile:
        """Shard k, opened (the first time) and validated."""
        return self._betons[k] or self._open(k)

    def _open(self, k: int) -> BetonFile:
        with self._open_lock:  # decode threads may ask for one shard at once
            if self._betons[k] is None:
                self._betons[k] = self.shards[k].open()
                if len(self.shards) == 1:
                    self._single = self._betons[k]
            return self._betons[k]

    def close_shard(self, k: int) -> None:
        """Drops shard k's opened file (the remote cache needs its room); the next read from
        it opens it again. No lock: a reader holding the old file's views keeps them valid."""
        self._betons[k] = None

    def will_read(self, shard_ids: Sequence[int]) -> None:
        """A hint: this rank reads these shards next, in this order (from the sample order).
        Local shards ignore it; the remote shard cache prefetches and keeps them."""
        if self._on_will_read is not None:
            self._on_will_read(list(shard_ids))

    def _shard_path(self, k: int) -> str | Path:
        path = getattr(self.shards[k], "path", None)
        if path is not None:
            return path
        name = self.shards[k].name
        return Path(self.root) / name if isinstance(self.root, Path) else f"{self.root}/{name}"

    def where(self, i: int) -> str:
        """"OUT/train.beton: sample 3" (sharded: the shard file and the index in it)."""
        if len(self.shards) == 1:
            return f"{printable(self.path)}: sample {i}"
        k = self.shard_of(i)
        return (f"{printable(self._shard_path(k))}: sample {i - int(self.shard_bounds[k])} "
                f"(sample {i} of the {printable(self.split)} split)")

    def where_split(self) -> str:
        return printable(self.path if self.path is not None else self.split)

    # -- classes ------------------------------------------------------------------------------
    @property
    def num_classes(self) -> int:
        """len(classes); for a bare .beton, the largest label + 1 (at most layout.MAX_CLASSES)."""
        if self.classes is not None:
            return len(self.classes)
        return int(self.labels.max()) + 1 if len(self.labels) else 0

    @property
    def class_names(self) -> list[str]:
        """classes; for a bare .beton (no names stored), "0", "1", ... up to num_classes."""
        if self.classes is not None:
            return list(self.classes)
        return [str(k) for k in range(self.num_classes)]

    # -- samples ------------------------------------------------------------------------------
    @property
    def beton(self) -> BetonFile:
        """The one BetonFile of an unsharded split (FFCV's Loader, byte-level tools)."""
        if len(self.shards) != 1:
            raise DatasetError(f"{self.where_split()}: the {printable(self.split)} split is "
                               f"stored in {len(self.shards)} shards, not one .beton file")
        return self._betons[0] or self._open(0)

    def __len__(self) -> int:
        return int(self.shard_bounds[-1])

    def payload(self, i: int) -> np.ndarray:
        """The stored bytes of sample i (a read-only view of its shard's map, no copy)."""
        single = self._single
        if single is not None:
            return single.payload(i)
        beton, j = self.locate(int(i))
        return beton.payload(j)

    def payload_addresses(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray, list]:
        """Vectorised `payload` for the compiled decode kernel: the int64 memory addresses and
        sizes of samples `indices`, gathered shard by shard from the allocation tables (a shard
        is opened, or for a remote split fetched through the cache, the first time), and the
        memory maps they point into, which the caller holds until it has read them. A shard
        the cache closes meanwhile stays mapped for as long as that holds."""
        indices = np.asarray(indices, dtype=np.int64)
        single = self._single
        if single is not None or len(self.shards) == 1:
            addresses, sizes, mapped = (single or self.shard(0)).payload_addresses(indices)
            return addresses, sizes, [mapped]
        if len(indices) and (indices.min() < 0 or indices.max() >= len(self)):
            bad = int(indices[(indices < 0) | (indices >= len(self))][0])
            raise IndexError(f"sample {bad} out of range for {self.where_split()} "
                             f"({len(self)} samples)")
        shard = np.searchsorted(self.shard_bounds, indices, side="right") - 1
        addresses = np.empty(len(indices), dtype=np.int64)
        sizes = np.empty(len(indices), dtype=np.int64)
        keep = []
        for k in np.unique(shard).tolist():  # a batch touches a shard or two (order.py)
            rows = np.flatnonzero(shard == k)
            addresses[rows], sizes[rows], mapped = self.shard(k).payload_addresses(
                indices[rows] - self.shard_bounds[k])
            keep.append(mapped)
        return addresses, sizes, keep

    def payload_views(self, indices: np.ndarray) -> list[np.ndarray]:
        """Vectorised `payload`: the stored bytes of samples `indices`, in order, as views of
        their shards' maps."""
        indices = np.asarray(indices, dtype=np.int64)
        single = self._single
        if single is not None or len(self.shards) == 1:
            return (single or self.shard(0)).payload_views(indices)
        shard = np.searchsorted(self.shard_bounds, indices, side="right") - 1
        views: list = [None] * len(indices)
        for k in np.unique(shard).tolist():
            rows = np.flatnonzero(shard == k)
            local = indices[rows] - self.shard_bounds[k]
            for row, view in zip(rows.tolist(), self.shard(k).payload_views(local)):
                views[row] = view
        return views

    def raw_image(self, i: int) -> np.ndarray:
        """Sample i stored raw, as an HWC uint8 view (no copy)."""
        single = self._single
        if single is not None:
            return single.raw_image(i)
        beton, j = self.locate(int(i))
        return beton.raw_image(j)

    def read(self, i: int) -> tuple[np.ndarray, int]:
        """(stored JPEG bytes as a uint8 array, or the raw HWC uint8 image; label) — no decode."""
        i = int(i)
        beton = self._single
        if beton is None:
            beton, j = self.locate(i)
        else:
            j = i
        if beton.modes[j] == layout.MODE_RAW:
            return beton.raw_image(j), int(self.labels[i])
        return beton.payload(j), int(self.labels[i])

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        """(sample i decoded, as `image`, its label); i < 0 counts from the end, as a list's."""
        n = len(self)
        i = int(i) + n if int(i) < 0 else int(i)
        if not 0 <= i < n:
            raise IndexError(f"sample {i} out of range for {self.where_split()} ({n} samples)")
        return self.image(i), int(self.labels[i])

    def image(self, i: int) -> np.ndarray:
        """Sample i decoded to an HWC uint8 RGB array (a JPEG whose header disagrees with the
        metadata is refused before it is decoded)."""
        # lazy: cv2 and PIL (~0.2 s) load at the first decode, not for `inspect`
        from .sample_codec import ImageError, decode_stored
        i = int(i)
        beton, j = self.locate(i)
        try:
            return decode_stored(int(beton.modes[j]), int(beton.heights[j]), int(beton.widths[j]),
                                 beton.payload(j))
        except ImageError as e:
            raise DatasetError(f"{self.where(i)} does not decode ({e})") from e


def split_entry(root: Path, info: dict, split: str) -> dict:
    """The dataset.json entry of `split` (checked by `schema`)."""
    splits = info["splits"]
    if split not in splits:
        raise DatasetError(f"{printable(root)}: has no {printable(repr(split))} split "
                           f"(it has: {', '.join(splits)})")
    return splits[split]


def split_paths(root: Path, info: dict, split: str) -> list[Path]:
    """The .beton files of `split`, in order (`schema` keeps each a file inside root)."""
    meta = split_entry(root, info, split)
    if "shards" in meta:
        return [Path(root) / shard["file"] for shard in meta["shards"]]
    return [Path(root) / meta["file"]]


def split_path(root: Path, info: dict, split: str) -> Path:
    """The one .beton of an unsharded `split` (the first shard of a sharded one)."""
    return split_paths(root, info, split)[0]


def local_shards(root: Path, info: dict, split: str, *, verify: bool = False) -> list[LocalShard]:
    meta = split_entry(root, info, split)
    if "shards" in meta:
        return [LocalShard(Path(root) / shard["file"], shard, verify=verify)
                for shard in meta["shards"]]
    return [LocalShard(Path(root) / meta["file"], meta, verify=verify)]


def open_split(root: Path, info: dict, split: str, *, verify: bool = False) -> PreparedSplit:
    """Split `split` of the dataset at root whose checked dataset.json is info; `verify`: each
    file's SHA-256 checked against info once, when it is opened (LocalShard)."""
    return PreparedSplit(local_shards(root, info, split, verify=verify), split, info,
                         root=Path(root))


def open_local_dataset(path: str | os.PathLike, split: str = "train", *, verify: bool = False,
                       info: dict | None = None) -> PreparedSplit:
    """Split `split` of the prepared dataset folder at `path`, or a bare `.beton`;
    `open_dataset` (the package's) for a path or a URL. `verify`: as open_split's (a bare
    .beton records no checksum); `info`: the folder's checked dataset.json when the caller has
    it already (else it is read)."""
    root = Path(path)
    if not root.exists():
        raise NotPrepared(f"{printable(root)}: no such dataset: nothing exists at that path",
                          root)
    if not root.is_dir():  # BetonFile refuses anything but a regular file
        return PreparedSplit([LocalShard(root)], root.stem, None, root=root.parent)
    return open_split(root, read_dataset_json(root) if info is None else info, split,
                      verify=verify)
