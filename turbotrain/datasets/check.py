"""`turbotrain inspect OUT` and `turbotrain verify OUT`: what a prepared dataset holds, and
whether every byte of it is still what `prepare-dataset` wrote."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from . import format as fmt
from .dataset import file_sha256, open_dataset, read_dataset_json
from .reader import DatasetError


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def describe(root: str | Path) -> str:
    """A human summary: splits, counts, classes, encoding mix, image sizes and bytes."""
    root = Path(root)
    info = read_dataset_json(root)
    classes = info["classes"]
    lines = [f"{root}: {len(classes)} classes: {', '.join(classes[:12])}"
             + (", ..." if len(classes) > 12 else "")]
    source = info.get("source", {})
    lines.append(f"  source: {source.get('kind')} at {source.get('path')}")
    enc = info.get("encoding", {})
    lines.append(f"  encoding: {enc.get('encoding')}, max side {enc.get('max_side')}, "
                 f"quality {enc.get('quality')}")
    stats = info.get("pixel_stats")
    if stats:
        lines.append("  pixel mean " + ", ".join(f"{v:.1f}" for v in stats["mean"])
                     + " / std " + ", ".join(f"{v:.1f}" for v in stats["std"]))
    for split in info["splits"]:
        ds = open_dataset(root, split)
        counts = np.bincount(ds.labels, minlength=len(classes)) if len(ds) else np.zeros(1)
        jpeg = int((ds.modes == fmt.MODE_JPEG).sum())
        sizes = ds.beton.sizes
        lines.append(
            f"  {split}: {len(ds)} images ({jpeg} jpeg, {len(ds) - jpeg} raw), "
            f"{_human(float(sizes.sum()))} of image data, file {_human(ds.beton.file_size)}; "
            f"per class {int(counts.min())}..{int(counts.max())}; "
            f"size {int(ds.widths.min())}..{int(ds.widths.max())} x "
            f"{int(ds.heights.min())}..{int(ds.heights.max())}")
    return "\n".join(lines)


def verify(root: str | Path, progress: bool = True) -> list[str]:
    """Checks every split's checksum and decodes every image; returns the problems found."""
    from tqdm import tqdm
    root = Path(root)
    info = read_dataset_json(root)
    problems = []
    for split, meta in info["splits"].items():
        path = root / meta["file"]
        try:
            digest = file_sha256(path)
        except OSError as e:
            problems.append(f"{path}: unreadable ({e.strerror or e})")
            continue
        if digest != meta.get("sha256"):
            problems.append(f"{path}: checksum mismatch (the file changed after prepare-dataset)")
        try:
            ds = open_dataset(root, split)
        except DatasetError as e:
            problems.append(str(e))
            continue
        if len(ds) != meta.get("num_samples"):
            problems.append(f"{path}: {len(ds)} samples, dataset.json says {meta.get('num_samples')}")
        for i in tqdm(range(len(ds)), desc=f"verify {split}", unit="img", disable=not progress):
            try:
                ds.image(i)
            except DatasetError as e:
                problems.append(str(e))
    return problems
