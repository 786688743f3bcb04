"""Tiny splits written with BetonWriter in tmp_path. Every label is the sample's own index, so a
batch's labels say exactly which samples it holds, in which order."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from turbotrain.datasets import open_dataset
from turbotrain.datasets.beton import layout
from turbotrain.datasets.beton.writer import BetonWriter
from turbotrain.pipeline import PipelineUnavailable, build_pipeline, pipeline_names


def product_pipelines() -> list[str]:
    """The registered pipelines, without the in-test ones tests/train registers ("test-*"),
    which exist only when those tests are collected in the same session."""
    return [name for name in pipeline_names() if not name.startswith("test-")]

torch.set_num_threads(1)

PHOTO_SIZES = [(72, 96), (96, 72), (80, 80), (70, 110), (100, 66)]  # (h, w), all > 64: photos


def photo_image(i: int, height: int, width: int) -> np.ndarray:
    """Smooth colour gradients plus a little noise: JPEG-friendly and position-revealing."""
    rng = np.random.default_rng(i)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    image = np.stack([x / width * 255, y / height * 255,
                      np.full_like(x, (i * 37) % 256)], axis=-1)
    image += rng.normal(0, 4, size=image.shape)
    return np.clip(image, 0, 255).astype(np.uint8)


def write_photo_split(path, count: int = 40, corrupt: tuple[int, ...] = ()) -> str:
    import simplejpeg
    with BetonWriter(path, count, page_size=layout.MIN_PAGE_SIZE) as writer:
        for i in range(count):
            h, w = PHOTO_SIZES[i % len(PHOTO_SIZES)]
            payload = simplejpeg.encode_jpeg(photo_image(i, h, w), quality=90)
            if i in corrupt:  # right length and sizes, garbage entropy data: fails on decode
                payload = payload[:20] + bytes(len(payload) - 20)
            writer.append(layout.MODE_JPEG, h, w, payload, i)
    return str(path)


def small_images(count: int, side: int) -> np.ndarray:
    rng = np.random.default_rng(7)
    return rng.integers(0, 256, size=(count, side, side, 3), dtype=np.uint8)


def write_small_split(path, count: int = 50, side: int = 16) -> str:
    images = small_images(count, side)
    with BetonWriter(path, count, page_size=layout.MIN_PAGE_SIZE) as writer:
        for i in range(count):
            writer.append(layout.MODE_RAW, side, side, images[i].tobytes(), i)
    return str(path)


@pytest.fixture(scope="session")
def photo_path(tmp_path_factory):
    return write_photo_split(tmp_path_factory.mktemp("photo") / "train.beton")


@pytest.fixture(scope="session")
def small_path(tmp_path_factory):
    return write_small_split(tmp_path_factory.mktemp("small") / "train.beton")


@pytest.fixture(scope="session")
def corrupt_path(tmp_path_factory):
    return write_photo_split(tmp_path_factory.mktemp("corrupt") / "train.beton", count=24,
                             corrupt=(13,))


# Output sides used with each split: photos are cropped and resized, small images padded/cropped.
IMAGE_SIZE = {"photo": 32, "small": 16}


@pytest.fixture(params=["photo", "small"])
def split(request, photo_path, small_path):
    """(kind, opened split, image_size) for both augmentation families."""
    path = photo_path if request.param == "photo" else small_path
    return request.param, open_dataset(path), IMAGE_SIZE[request.param]


def build(name: str, dataset, **options):
    """build_pipeline, where "unavailable" fails the test: every registered pipeline runs on a
    CPU, and a test that asks for CUDA is marked `cuda` (skipped without a GPU). An error that
    merely mentions CUDA (a broken DALI import) is a failure too, not a skip."""
    options.setdefault("device", torch.device("cpu"))
    try:
        return build_pipeline(name, dataset, **options)
    except PipelineUnavailable as e:
        pytest.fail(f"registered pipeline {name!r} is unavailable on this machine: {e}")


def run_epoch(pipeline, epoch: int = 0, limit: int | None = None):
    """[(images, labels)] of one epoch (CPU copies), at most `limit` batches."""
    pipeline.set_epoch(epoch)
    out = []
    for images, labels in pipeline:
        out.append((images.cpu().clone(), labels.cpu().clone()))
        if limit is not None and len(out) == limit:
            break
    return out
