"""`turbotrain inspect OUT` and `turbotrain verify OUT`: what a prepared dataset holds, and
whether every byte of it is still what `prepare-dataset` wrote."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from turbotrain.datasets.errors import DatasetError
from turbotrain.printable import printable

from . import layout
from .class_presence import ClassPresence, listed
from .dataset_json import read_dataset_json
from .split import file_sha256, open_split, split_paths

# inspect shows the first few class names, each cut to this length: a name may be 1,000 chars.
_SHOWN_CLASSES = 12
_SHOWN_NAME_CHARS = 40
# verify lists this many undecodable samples per split, then counts the rest: a damaged
# million-image split must not become a million-line report held in memory.
_LISTED_SAMPLE_PROBLEMS = 20


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def _name(text: object) -> str:
    """A name from the dataset as inspect prints it: escaped (`printable`) and cut short."""
    text = str(text)
    if len(text) > _SHOWN_NAME_CHARS:
        text = text[:_SHOWN_NAME_CHARS - 3] + "..."
    return printable(text)


def describe(root: str | Path) -> str:
    """A human summary: splits, counts, classes, encoding mix, image sizes and bytes. Every
    string taken from the dataset goes through `printable`: a class name holding "\x1b]0;"
    must not drive the terminal that shows it."""
    root = Path(root)
    info = read_dataset_json(root)
    classes = info["classes"]
    lines = [f"{printable(root)}: {len(classes)} classes: "
             + ", ".join(_name(c) for c in classes[:_SHOWN_CLASSES])
             + (", ..." if len(classes) > _SHOWN_CLASSES else "")]
    source = info.get("source") or {}
    lines.append(f"  source: {printable(source.get('kind'))} at {printable(source.get('path'))}")
    enc = info.get("encoding") or {}
    lines.append(f"  encoding: {printable(enc.get('encoding'))}, max side {enc.get('max_side')}, "
                 f"quality {enc.get('quality')}")
    stats = info.get("pixel_stats")
    if stats:
        lines.append("  pixel mean " + ", ".join(f"{v:.1f}" for v in stats["mean"])
                     + " / std " + ", ".join(f"{v:.1f}" for v in stats["std"]))
    labels = {}
    for split in info["splits"]:
        ds = open_split(root, info, split)
        labels[split] = ds.labels
        counts = np.bincount(ds.labels, minlength=len(classes)) if len(ds) else np.zeros(1)
        jpeg = int((ds.modes == layout.MODE_JPEG).sum())
        data = sum(float(ds.shard(k).sizes.sum()) for k in range(ds.num_shards))
        files = (f"file {_human(ds.nbytes)}" if ds.num_shards == 1 else
                 f"{ds.num_shards} shards, {_human(ds.nbytes)}")
        # An empty split (a --val-fraction of classes with one sample each) has no sizes.
        sizes = (f"; per class {int(counts.min())}..{int(counts.max())}; "
                 f"size {int(ds.widths.min())}..{int(ds.widths.max())} x "
                 f"{int(ds.heights.min())}..{int(ds.heights.max())}") if len(ds) else ""
        lines.append(
            f"  {printable(split)}: {len(ds)} images ({jpeg} jpeg, {len(ds) - jpeg} raw), "
            f"{_human(data)} of image data, {files}{sizes}")
    return "\n".join(lines + _class_lines(ClassPresence.of(classes, labels), source))


def _class_lines(p: ClassPresence, source: dict) -> list[str]:
    """What inspect says of classes with no images (prepare-dataset warned of them too)."""
    lines = []
    if len(p.present) == 1:
        lines.append(f"  one class only: {p.names(p.present, _name)} has images; a classifier "
                     f"needs at least 2")
    if p.empty:
        lines.append(f"  empty classes: {len(p.empty)} of {len(p.classes)} have no images: "
                     f"{p.names(p.empty, _name)} (`prepare-dataset --classes present` leaves "
                     f"them out)")
    if p.without_train:
        lines.append(f"  no train images: {len(p.without_train)} of {len(p.classes)} classes "
                     f"have val images only: "
                     f"{p.names(p.without_train, _name)}")
    dropped = source.get("dropped_classes")
    if dropped:
        lines.append(f"  left out by --classes present: {len(dropped)} classes with no images: "
                     f"{listed(dropped, _name)}")
    return lines


def verify(root: str | Path, progress: bool = True) -> list[str]:
    """Checks every split's files (size and checksum; each shard of a sharded split) and decodes
    every image; returns the problems found, one printable line each. dataset.json itself must
    pass its schema (DatasetError)."""
    from tqdm import tqdm
    root = Path(root)
    info = read_dataset_json(root)
    problems = []
    for split, meta in info["splits"].items():
        try:
            ds = open_split(root, info, split)  # the size checks, before hashing the files
        except DatasetError as e:
            problems.append(str(e))
            continue
        entries = meta["shards"] if "shards" in meta else [meta]
        for path, entry in zip(split_paths(root, info, split), entries):
            problems += _file_problems(path, entry)
        if len(ds) != meta["num_samples"]:
            problems.append(f"{printable(ds.path)}: {len(ds)} samples, dataset.json says "
                            f"{meta['num_samples']}")
        failed = 0
        for i in tqdm(range(len(ds)), desc=f"verify {split}", unit="img", disable=not progress):
            try:
                ds.image(i)
            except DatasetError as e:
                failed += 1
                if failed <= _LISTED_SAMPLE_PROBLEMS:
                    problems.append(str(e))
        if failed > _LISTED_SAMPLE_PROBLEMS:
            problems.append(f"{printable(ds.path)}: {failed - _LISTED_SAMPLE_PROBLEMS} more "
                            f"samples do not decode ({failed} in all)")
    return problems


def _file_problems(path: Path, entry: dict) -> list[str]:
    """The checksum of one split file or shard against its dataset.json entry."""
    shown = printable(path)
    try:
        digest = file_sha256(path)
    except OSError as e:
        return [f"{shown}: unreadable ({e.strerror or e})"]
    if "sha256" not in entry:
        return [f"{shown}: dataset.json records no checksum for it"]
    if digest != entry["sha256"].lower():
        return [f"{shown}: checksum mismatch (the file changed after prepare-dataset)"]
    return []
