"""Where prepare-dataset cuts each split into shards, decided before anything is encoded.

The plan is a pure function of the source listing and `--shard-size`: every `--part i/N` of a
conversion, on any machine, computes the same plan, so part i knows which shards are its own
without talking to the others. A sample's stored size is only known after encoding, so the cut
uses an estimate the listing already has: the file's size for image files (one stat each, as
the source fingerprint already does), h*w*3 pixel bytes for arrays. A shard therefore holds
about --shard-size of *source* bytes; re-encoding (--max-side, --encoding raw) makes it smaller
or larger by the same factor.
"""
from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass

import numpy as np

from turbotrain.datasets.beton import layout
from turbotrain.datasets.beton.dataset_json import MAX_SHARDS
from turbotrain.datasets.beton.shards import shard_filename
from turbotrain.datasets.sources.source import ArraySplit, FileSplit, SplitSource
from turbotrain.printable import printable
from turbotrain.sizes import SizeError, parse_size

# A shard is at least one data page: anything smaller would hold a sample or two per file.
MIN_SHARD_BYTES = layout.DEFAULT_PAGE_SIZE


class ShardPlanError(ValueError):
    """A --shard-size or --part that cannot be used; one line naming the flag."""


def parse_shard_size(text: str) -> int:
    """--shard-size in bytes (turbotrain/sizes.py: '1GB', '512MB', '64MiB', '268435456'); at
    least one data page (8 MiB)."""
    try:
        size = parse_size(text, "--shard-size")
    except SizeError as e:
        raise ShardPlanError(str(e)) from None
    if size < MIN_SHARD_BYTES:
        raise ShardPlanError(f"--shard-size {text}: {size:,} bytes is smaller than one data page "
                             f"({MIN_SHARD_BYTES >> 20} MiB); use at least 8MiB")
    return size


def parse_part(text: str) -> tuple[int, int]:
    """'i/N' with 0 <= i < N <= MAX_SHARDS -> (i, N)."""
    # At most 6 digits each: int() of a 5,000-digit string raises (and N is <= 100,000).
    match = re.fullmatch(r"\s*(\d{1,6})\s*/\s*(\d{1,6})\s*", str(text))
    if not match or not 0 <= int(match[1]) < int(match[2]) <= MAX_SHARDS:
        raise ShardPlanError(f"--part {printable(repr(str(text)[:40]))}: expected i/N with "
                             f"0 <= i < N <= {MAX_SHARDS:,} (e.g. 0/4 ... 3/4)")
    return int(match[1]), int(match[2])


def estimated_sizes(split: SplitSource) -> np.ndarray:
    """Each sample's source bytes (int64), known without encoding it."""
    own = split.estimated_sizes()  # the tar index's member sizes, HF rows' value sizes
    if own is not None:
        return own
    if isinstance(split, ArraySplit):
        height, width = split.images.shape[1:3]
        return np.full(len(split), height * width * 3, dtype=np.int64)
    if isinstance(split, FileSplit):
        sizes = np.zeros(len(split), dtype=np.int64)
        for i, rel in enumerate(split.relpaths):
            try:
                sizes[i] = os.stat(os.path.join(split.root, rel)).st_size
            except OSError:
                pass  # unreadable: it will be skipped (or fail) when encoded; it weighs nothing
        return sizes
    raise TypeError(f"no size estimate for a {type(split).__name__}")


def cut(sizes: np.ndarray, shard_size: int) -> np.ndarray:
    """Shard bounds (int64, 0 ... len(sizes)): consecutive samples fill a shard until the next
    one would take it past shard_size; every shard holds at least one sample (an empty split:
    one empty shard, as an unsharded empty split is one empty file)."""
    bounds = [0]
    used = 0
    for i, size in enumerate(sizes.tolist()):
        if used and used + size > shard_size:
            bounds.append(i)
            used = 0
        used += size
    bounds.append(len(sizes))
    return np.array(bounds, dtype=np.int64)


@dataclass(frozen=True)
class SplitPlan:
    split: str
    bounds: np.ndarray  # int64, len num_shards + 1

    @property
    def num_shards(self) -> int:
        return len(self.bounds) - 1

    def file(self, k: int) -> str:
        return shard_filename(self.split, k, self.num_shards)

    def digest(self) -> str:
        """sha256 of the bounds: two parts agree on the plan iff their digests do."""
        return hashlib.sha256(self.bounds.astype("<i8").tobytes()).hexdigest()


def plan_split(split: str, source: SplitSource, shard_size: int | None) -> SplitPlan:
    """One shard of everything (unsharded) when shard_size is None."""
    if shard_size is None:
        return SplitPlan(split, np.array([0, len(source)], dtype=np.int64))
    plan = SplitPlan(split, cut(estimated_sizes(source), shard_size))
    if plan.num_shards > MAX_SHARDS:
        raise ShardPlanError(f"--shard-size {shard_size:,}: the {split} split would need "
                             f"{plan.num_shards:,} shards, more than {MAX_SHARDS:,}; use a larger "
                             f"--shard-size")
    return plan


def part_shards(num_shards: int, part: int, parts: int) -> range:
    """The shards of part i of N: a contiguous range, [i*S/N, (i+1)*S/N)."""
    return range(part * num_shards // parts, (part + 1) * num_shards // parts)
