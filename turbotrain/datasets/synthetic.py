"""Deterministic synthetic datasets, because no dataset can be downloaded here.

* `write_shapes_imagefolder`: a photo-like source dataset, ten classes of textured shapes on
  varied backgrounds written as an ImageFolder of JPEGs; what `make demo` and the benchmarks
  convert and train on. The images are built to cost what photos cost: smooth lighting,
  mid-frequency texture and sensor-like noise make a 500x375 q90 JPEG about 60-70 KB, like an
  ImageNet photo, so decode and conversion speeds measured on it carry over.
* `write_random_raw_dataset`: an already prepared folder of random raw 32x32 samples, train in
  shards; exact pixels to compare after a round trip (object storage, the shard cache), and
  nothing to decode, so a benchmark of the data path measures the data path.
"""
from __future__ import annotations

import hashlib
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from turbotrain.datasets.beton import layout
from turbotrain.datasets.beton.dataset_json import DATASET_JSON
from turbotrain.datasets.beton.shards import shard_filename
from turbotrain.datasets.beton.writer import BetonWriter
from turbotrain.files.safe_create import write_file

CLASSES = ("circle", "square", "triangle", "star", "ring",
           "cross", "ellipse", "hexagon", "diamond", "stripes")


def _background(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    import cv2

    # Muted lighting (a grey level plus a mild colour cast), mid-frequency texture and per-pixel
    # noise: busy enough to cost what a photo costs to encode, calm enough that the shape is the
    # signal (saturated backgrounds made ResNet-18 need ~10x more steps to start learning).
    grey = rng.uniform(70, 185)
    cast = rng.uniform(-25, 25, size=(3, 4, 3)).astype(np.float32)
    image = grey + cv2.resize(cast, (width, height), interpolation=cv2.INTER_CUBIC)
    texture = rng.normal(0, 1, size=(height // 8 + 1, width // 8 + 1, 1)).astype(np.float32)
    texture = cv2.resize(texture, (width, height), interpolation=cv2.INTER_LINEAR)[..., None]
    image += texture * rng.uniform(8, 20) + rng.normal(0, 6, size=(height, width, 1))
    return image


def _shape_colour(rng: np.random.Generator, background_level: float) -> tuple:
    """A saturated colour whose brightness stands out from the background's."""
    import colorsys
    value = rng.uniform(0.05, 0.3) if background_level > 128 else rng.uniform(0.8, 1.0)
    r, g, b = colorsys.hsv_to_rgb(rng.uniform(0, 1), rng.uniform(0.6, 1.0), value)
    return (r * 255, g * 255, b * 255)


def _polygon(center, radius, sides, angle, star=False) -> np.ndarray:
    count = sides * 2 if star else sides
    theta = angle + np.arange(count) * 2 * np.pi / count
    r = np.where(np.arange(count) % 2, radius * 0.45, radius) if star else np.full(count, radius)
    points = np.stack([center[0] + r * np.cos(theta), center[1] + r * np.sin(theta)], axis=1)
    return points.astype(np.int32)


def _draw_shape(image: np.ndarray, label: int, rng: np.random.Generator) -> None:
    import cv2
    height, width = image.shape[:2]
    # Large and near the middle: a RandomResizedCrop or a centre crop keeps most of the shape,
    # so the label stays true after augmentation and a short CPU run can learn it.
    radius = rng.uniform(0.22, 0.34) * min(height, width)
    jitter = 0.5 * (min(height, width) / 2 - radius)
    center = (width / 2 + rng.uniform(-jitter, jitter), height / 2 + rng.uniform(-jitter, jitter))
    c = (int(center[0]), int(center[1]))
    color = _shape_colour(rng, float(image.mean()))
    angle = rng.uniform(0, 2 * np.pi)
    name = CLASSES[label]
    if name == "circle":
        cv2.circle(image, c, int(radius), color, -1, cv2.LINE_AA)
    elif name == "ring":
        cv2.circle(image, c, int(radius), color, max(4, int(radius * 0.25)), cv2.LINE_AA)
    elif name == "ellipse":
        axes = (int(radius), int(radius * 0.45))
        cv2.ellipse(image, c, axes, np.degrees(angle), 0, 360, color, -1, cv2.LINE_AA)
    elif name == "cross":
        t = max(4, int(radius * 0.3))
        for a in (angle, angle + np.pi / 2):
            d = (radius * np.cos(a), radius * np.sin(a))
            p1 = (int(center[0] - d[0]), int(center[1] - d[1]))
            p2 = (int(center[0] + d[0]), int(center[1] + d[1]))
            cv2.line(image, p1, p2, color, t, cv2.LINE_AA)
    elif name == "stripes":
        t = max(3, int(radius * 0.12))
        for k in range(-2, 3):
            off = (k * radius * 0.4 * -np.sin(angle), k * radius * 0.4 * np.cos(angle))
            d = (radius * np.cos(angle), radius * np.sin(angle))
            p1 = (int(center[0] + off[0] - d[0]), int(center[1] + off[1] - d[1]))
            p2 = (int(center[0] + off[0] + d[0]), int(center[1] + off[1] + d[1]))
            cv2.line(image, p1, p2, color, t, cv2.LINE_AA)
    else:
        sides = {"square": 4, "triangle": 3, "star": 5, "hexagon": 6, "diamond": 4}[name]
        if name == "diamond":  # a square stretched along one axis, so it differs from "square"
            pts = _polygon((0, 0), radius, 4, 0).astype(np.float64)
            pts[:, 0] *= 0.55
            rot = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
            pts = (pts @ rot.T + center).astype(np.int32)
        else:
            pts = _polygon(center, radius, sides, angle, star=name == "star")
        cv2.fillPoly(image, [pts], color, cv2.LINE_AA)


def shape_image(seed: int, index: int, label: int, size=(500, 375)) -> np.ndarray:
    """One HWC uint8 RGB image of class `label`, a pure function of (seed, index)."""
    width, height = size
    rng = np.random.default_rng([seed, index, label])
    image = _background(rng, height, width)
    _draw_shape(image, label, rng)
    image += rng.normal(0, 3, size=image.shape).astype(np.float32)  # shape texture / noise
    return np.clip(image, 0, 255).astype(np.uint8)


def write_shapes_imagefolder(root: str | Path, *, train_per_class: int, val_per_class: int,
                             size=(500, 375), quality: int = 90, seed: int = 0,
                             threads: int = 2) -> Path:
    """Writes `root/{train,val}/<class>/<index>.jpg`; skips files that already exist."""
    import simplejpeg
    root = Path(root)
    jobs = []
    for split, per_class, offset in (("train", train_per_class, 0),
                                     ("val", val_per_class, 10_000_000)):
        if per_class == 0:
            continue  # an empty class folder is an error for prepare-dataset
        for label, name in enumerate(CLASSES):
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for k in range(per_class):
                jobs.append((folder / f"{k:06d}.jpg", offset + label * 1_000_000 + k, label))

    def write(job):
        path, index, label = job
        if not path.exists():
            data = simplejpeg.encode_jpeg(shape_image(seed, index, label, size), quality=quality,
                                          colorsubsampling="420")
            write_file(path, data)

    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(write, jobs))
    return root


RAW_SIDE = 32  # raw 32x32 RGB samples: 3 KiB each
RAW_CLASSES = 5


def write_random_raw_dataset(out: str | Path, *, shards: int = 4, per_shard: int = 40,
                             val: int = 20, seed: int = 0,
                             page_size: int = layout.MIN_PAGE_SIZE) -> Path:
    """Writes a prepared folder `out` (which must not exist): train in `shards` shards of
    `per_shard` samples (contract 1), val unsharded, labels cycling through 5 classes. With
    the default 2 MiB pages a shard of 40 samples is ~4 MiB (a metadata page, a data page)."""
    out = Path(out)
    rng = np.random.default_rng(seed)
    n = shards * per_shard
    images = rng.integers(0, 256, (n + val, RAW_SIDE, RAW_SIDE, 3), dtype=np.uint8)
    labels = np.arange(n + val) % RAW_CLASSES

    def write(path: Path, start: int, stop: int) -> dict:
        with BetonWriter(path, stop - start, page_size=page_size) as writer:
            for image, label in zip(images[start:stop], labels[start:stop]):
                writer.append(layout.MODE_RAW, RAW_SIDE, RAW_SIDE, image.tobytes(), int(label))
        return {"file": path.name, "num_samples": stop - start, "bytes": path.stat().st_size,
                "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}

    out.mkdir(parents=True)
    entries = [write(out / shard_filename("train", k, shards), k * per_shard, (k + 1) * per_shard)
               for k in range(shards)]
    val_entry = write(out / "val.beton", n, n + val)
    info = {"format_version": 2, "classes": [f"c{k}" for k in range(RAW_CLASSES)],
            "splits": {"train": {"num_samples": n, "skipped": 0,
                                 "bytes": sum(e["bytes"] for e in entries), "shards": entries},
                       "val": {**val_entry, "skipped": 0}},
            "pixel_stats": None}
    write_file(out / DATASET_JSON, json.dumps(info))
    return out
