"""What writing one shard produced, and the dataset.json built from all of them.

One function (`dataset_info`) turns the shards' results into dataset.json, whether they were
written by one `prepare-dataset` run or by N `--part` runs whose manifests `merge` reads back:
that, plus integer pixel-stat accumulators (whose sums do not depend on the order they are
added in), is what makes a merged dataset equal a one-machine one byte for byte.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from turbotrain import __version__
from turbotrain.datasets.beton import layout
from turbotrain.datasets.beton.dataset_json import DATASET_FORMAT_VERSION, SHARDED_FORMAT_VERSION
from turbotrain.printable import printable

# Pixel sums are kept as integers in units of 1/1024 (0..255 channel values): a sample's float
# sum of squares is at most 255**2 * 100 Mpx = 6.5e12, times 1024 = 6.7e15 < 2**53, so each
# rounds to an exact integer, and Python ints add without overflow or rounding in any order.
STATS_SCALE = 1024


@dataclass
class PixelTotals:
    """Per-channel sum and sum of squares (in 1/STATS_SCALE units) over `count` pixels."""
    sums: list[int] = field(default_factory=lambda: [0, 0, 0])
    squares: list[int] = field(default_factory=lambda: [0, 0, 0])
    count: int = 0

    def add_sample(self, pixel_sum: np.ndarray, pixel_sq_sum: np.ndarray, count: int) -> None:
        for c, v in enumerate(np.rint(np.asarray(pixel_sum) * STATS_SCALE).tolist()):
            self.sums[c] += int(v)
        for c, v in enumerate(np.rint(np.asarray(pixel_sq_sum) * STATS_SCALE).tolist()):
            self.squares[c] += int(v)
        self.count += int(count)

    def add(self, other: PixelTotals) -> None:
        self.sums = [a + b for a, b in zip(self.sums, other.sums)]
        self.squares = [a + b for a, b in zip(self.squares, other.squares)]
        self.count += other.count

    def stats(self) -> dict | None:
        """{"mean": [...], "std": [...]} rounded to 4 decimals; None without pixels."""
        if self.count == 0:
            return None
        scaled = self.count * STATS_SCALE
        mean = np.array([s / scaled for s in self.sums])  # int / int: correctly rounded
        var = np.maximum(np.array([q / scaled for q in self.squares]) - mean ** 2, 0.0)
        return {"mean": [round(float(v), 4) for v in mean],
                "std": [round(float(v), 4) for v in np.sqrt(var)]}

    def to_json(self) -> dict:
        return {"sums": self.sums, "squares": self.squares, "count": self.count}

    @classmethod
    def from_json(cls, data: dict) -> PixelTotals:
        return cls(list(data["sums"]), list(data["squares"]), data["count"])


@dataclass
class ShardResult:
    """One written shard file and what went into it."""
    split: str
    index: int
    file: str
    written: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)
    mode_counts: dict[str, int] = field(default_factory=lambda: {"jpeg": 0, "raw": 0})
    pixels: PixelTotals = field(default_factory=PixelTotals)
    bytes: int = 0
    sha256: str = ""

    def index_entry(self) -> dict:
        """The shard's entry in dataset.json's `shards` list."""
        return {"file": self.file, "num_samples": self.written, "bytes": self.bytes,
                "sha256": self.sha256}

    def to_json(self) -> dict:
        return {**self.index_entry(), "split": self.split, "index": self.index,
                "skipped": [list(item) for item in self.skipped],
                "encodings": self.mode_counts, "pixels": self.pixels.to_json()}

    @classmethod
    def from_json(cls, data: dict) -> ShardResult:
        return cls(data["split"], data["index"], data["file"], data["num_samples"],
                   [tuple(item) for item in data["skipped"]], dict(data["encodings"]),
                   PixelTotals.from_json(data["pixels"]), data["bytes"], data["sha256"])


def encoding_facts(options, shard_size: int | None) -> dict:
    facts = {"encoding": options.encoding, "max_side": options.max_side,
             "quality": options.quality, "page_size": layout.DEFAULT_PAGE_SIZE}
    if shard_size is not None:
        facts["shard_size"] = shard_size
    return facts


def dataset_info(source_facts: dict, encoding: dict, results: list[ShardResult],
                 sharded: bool) -> dict | None:
    """dataset.json from every shard's result (in split, then shard order); None when no image
    at all was written. `source_facts`: classes, path, kind, fingerprint, val_fraction and,
    with --classes present, dropped_classes."""
    by_split: dict[str, list[ShardResult]] = {}
    for r in results:
        by_split.setdefault(r.split, []).append(r)
    if not any(r.written for r in results):
        return None
    splits = {split: _split_entry(shards, sharded) for split, shards in by_split.items()}
    stats_split = "train" if "train" in by_split else next(iter(by_split))
    totals = PixelTotals()
    for r in by_split[stats_split]:
        totals.add(r.pixels)
    stats = totals.stats()
    if stats:
        stats["split"] = stats_split
    return {
        "format_version": SHARDED_FORMAT_VERSION if sharded else DATASET_FORMAT_VERSION,
        "turbotrain_version": __version__,
        "classes": list(source_facts["classes"]),
        "splits": splits,
        "pixel_stats": stats,
        "encoding": encoding,
        "source": {key: source_facts[key]
                   for key in ("path", "kind", "fingerprint", "val_fraction", "dropped_classes")
                   if key in source_facts},  # dropped_classes: only with --classes present
    }


def _split_entry(shards: list[ShardResult], sharded: bool) -> dict:
    encodings = {"jpeg": 0, "raw": 0}
    for r in shards:
        for kind, n in r.mode_counts.items():
            encodings[kind] = encodings.get(kind, 0) + n
    entry = {"num_samples": sum(r.written for r in shards),
             "skipped": sum(len(r.skipped) for r in shards), "encodings": encodings,
             "bytes": sum(r.bytes for r in shards)}
    if sharded:
        return {"shards": [r.index_entry() for r in shards], **entry}
    (only,) = shards
    return {"file": only.file, **entry, "sha256": only.sha256}


def skipped_lines(results: list[ShardResult]) -> str:
    """skipped.txt: one line per file, tab-separated. A name's own tabs, newlines and terminal
    escapes are written as escapes, so no name can forge a row or drive a terminal."""
    return "".join(f"{printable(name)}\t{printable(reason)}\n"
                   for r in results for name, reason in r.skipped)
