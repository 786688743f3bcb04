"""Tiny prepared datasets written straight with the dataset writer (no prepare-dataset run):
class k is a bright square at a class-specific place on noise, learnable in a few steps."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from turbotrain.datasets.beton import layout
from turbotrain.datasets.beton.dataset_json import DATASET_FORMAT_VERSION, DATASET_JSON
from turbotrain.datasets.beton.split import split_filename
from turbotrain.datasets.beton.writer import BetonWriter


def tiny_images(count: int, size: int, num_classes: int, seed: int):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, num_classes, size=count)
    images = rng.integers(0, 90, size=(count, size, size, 3), dtype=np.uint8)
    cell = max(2, size // 4)
    for i, label in enumerate(labels):
        row, col = divmod(int(label) % 9, 3)
        images[i, row * cell:(row + 1) * cell, col * cell:(col + 1) * cell] = 230
    return images, labels.astype(np.int64)


def write_tiny_dataset(root: Path, *, train: int = 96, val: int | None = 32, size: int = 16,
                       num_classes: int = 4, seed: int = 0) -> Path:
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    splits = {"train": train} if val is None else {"train": train, "val": val}
    info_splits = {}
    for offset, (split, count) in enumerate(splits.items()):
        images, labels = tiny_images(count, size, num_classes, seed + offset)
        path = root / split_filename(split)
        with BetonWriter(path, count, page_size=layout.MIN_PAGE_SIZE) as writer:
            for image, label in zip(images, labels):
                writer.append(layout.MODE_RAW, size, size, image.tobytes(), int(label))
        info_splits[split] = {"file": path.name, "num_samples": count,
                              "bytes": path.stat().st_size}
    info = {"format_version": DATASET_FORMAT_VERSION,
            "classes": [f"class{k}" for k in range(num_classes)],
            "splits": info_splits,
            "pixel_stats": {"mean": [70.0, 70.0, 70.0], "std": [60.0, 60.0, 60.0]}}
    (root / DATASET_JSON).write_text(json.dumps(info))
    return root
