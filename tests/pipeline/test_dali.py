"""`dali` beyond the shared contract (test_contract.py): its graph per augmentation family, mixed
JPEG/raw splits, pipeline reuse across passes, errors, threads. CPU-only DALI here; the CUDA
test runs where a GPU is present."""
from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from tests import expect
from turbotrain.datasets import open_dataset
from turbotrain.datasets.beton import layout
from turbotrain.datasets.beton.writer import BetonWriter
from turbotrain.pipeline import PipelineError, PipelineOptions, PipelineUnavailable, augment
from turbotrain.pipeline.order import SampleOrder

from .conftest import build, photo_image, run_epoch, small_images
from .test_parity import reference, write_mixed_split

# make install and CI install DALI: missing there, this module fails (tests/expect.py).
expect.module("nvidia.dali", install="dali")
from turbotrain.pipeline.dali import DaliPipeline  # noqa: E402
from turbotrain.pipeline.dali_graph import CROP_DALI  # noqa: E402

pytestmark = pytest.mark.timeout(120)

CPU = torch.device("cpu")


def opts(image_size=32, **overrides) -> PipelineOptions:
    base = dict(train=True, batch_size=8, image_size=image_size, device=CPU, seed=5, workers=1)
    base.update(overrides)
    return PipelineOptions(**base)


def write_small_mixed_split(path, count: int = 12, side: int = 16) -> str:
    import simplejpeg
    images = small_images(count, side)
    with BetonWriter(path, count, page_size=layout.MIN_PAGE_SIZE) as writer:
        for i in range(count):
            if i % 2:
                writer.append(layout.MODE_RAW, side, side, images[i].tobytes(), i)
            else:  # the reference decodes the same JPEG (libjpeg-turbo in both)
                writer.append(layout.MODE_JPEG, side, side,
                              simplejpeg.encode_jpeg(images[i], quality=100), i)
    return str(path)


def test_missing_dali_says_how_to_install(monkeypatch, photo_path):
    monkeypatch.setitem(sys.modules, "nvidia.dali", None)  # makes `import nvidia.dali` fail
    with pytest.raises(PipelineUnavailable, match=r"pip install 'turbotrain\[dali\]'"):
        DaliPipeline(open_dataset(photo_path), opts())


def test_train_crops_are_the_shared_boxes(photo_path):
    """Same boxes and flips as every other pipeline: only the resize filter differs (DALI's
    antialiased linear vs cv2 INTER_AREA: within 4 levels on average)."""
    dataset = open_dataset(photo_path)
    with DaliPipeline(dataset, opts()) as pipeline:
        images, labels = run_epoch(pipeline, epoch=3)[0]
    expected = reference(dataset, augment.RESIZED_CROP, labels.numpy(), seed=5, epoch=3, size=32)
    got = images.permute(0, 2, 3, 1).numpy()
    per_image = np.abs(got.astype(np.float32) - expected).mean(axis=(1, 2, 3))
    assert per_image.max() < 4, per_image


@pytest.mark.parametrize("train", [True, False])
def test_small_images_are_exact(train, small_path):
    """Pad-crop with reflect padding (train) and identity (eval) are pixel-exact."""
    dataset = open_dataset(small_path)
    family = augment.PAD_CROP if train else augment.IDENTITY
    with DaliPipeline(dataset, opts(16, train=train)) as pipeline:
        assert pipeline.family == family
        for images, labels in run_epoch(pipeline, epoch=1):
            expected = reference(dataset, family, labels.numpy(), seed=5, epoch=1, size=16)
            assert np.array_equal(images.permute(0, 2, 3, 1).numpy(), expected)


def test_small_images_are_resized_first(tmp_path):
    """16 px stored, 12 px asked for: resized, then pad-cropped. Smooth images, because
    resize filters disagree most on pixel noise (DALI linear+antialias vs cv2 INTER_AREA)."""
    path = tmp_path / "smooth16.beton"
    with BetonWriter(path, 16, page_size=layout.MIN_PAGE_SIZE) as writer:
        for i in range(16):
            writer.append(layout.MODE_RAW, 16, 16, photo_image(i, 16, 16).tobytes(), i)
    dataset = open_dataset(path)
    with DaliPipeline(dataset, opts(12)) as pipeline:
        images, labels = run_epoch(pipeline)[0]
    expected = reference(dataset, augment.PAD_CROP, labels.numpy(), seed=5, epoch=0, size=12)
    assert np.abs(images.permute(0, 2, 3, 1).numpy().astype(np.float32) - expected).mean() < 4


@pytest.mark.parametrize("train", [True, False])
def test_mixed_jpeg_and_raw_split(train, tmp_path):
    dataset = open_dataset(write_mixed_split(tmp_path / "mixed.beton"))
    family = augment.RESIZED_CROP if train else augment.CENTRE_CROP
    with DaliPipeline(dataset, opts(train=train, drop_last=False)) as pipeline:
        assert pipeline.spec.mixed
        batches = run_epoch(pipeline, epoch=2)
    order = SampleOrder(len(dataset), batch_size=8, seed=5, shuffle=train, drop_last=False)
    assert [b[1].tolist() for b in batches] == [o.tolist() for o in order.batches(2)]
    for images, labels in batches:
        expected = reference(dataset, family, labels.numpy(), seed=5, epoch=2, size=32)
        diff = np.abs(images.permute(0, 2, 3, 1).numpy().astype(np.float32) - expected)
        assert diff.mean(axis=(1, 2, 3)).max() < 4


def test_mixed_small_split(tmp_path):
    dataset = open_dataset(write_small_mixed_split(tmp_path / "small_mixed.beton"))
    with DaliPipeline(dataset, opts(16)) as pipeline:
        for images, labels in run_epoch(pipeline):
            expected = reference(dataset, augment.PAD_CROP, labels.numpy(), seed=5, epoch=0,
                                 size=16)
            assert np.array_equal(images.permute(0, 2, 3, 1).numpy(), expected)


def test_last_partial_batch_and_repeated_epochs(photo_path):
    dataset = open_dataset(photo_path)  # 40 samples: 8, 8, 8, 8, 8 / batch 12: 12, 12, 12, 4
    with DaliPipeline(dataset, opts(train=False, batch_size=12)) as pipeline:
        first, second = run_epoch(pipeline, 0), run_epoch(pipeline, 1)
    assert [len(labels) for _, labels in first] == [12, 12, 12, 4]
    assert torch.equal(torch.cat([l for _, l in first]), torch.arange(40))
    for (a, _), (b, _) in zip(first, second):  # eval: no randomness
        assert torch.equal(a, b)


def test_pipeline_is_reused_after_whole_passes_and_rebuilt_after_abandoned_ones(photo_path):
    dataset = open_dataset(photo_path)
    with DaliPipeline(dataset, opts()) as pipeline:
        full = run_epoch(pipeline, 0)
        graph = pipeline._pipe
        run_epoch(pipeline, 1)
        assert pipeline._pipe is graph  # reset(), not rebuilt
        run_epoch(pipeline, 2, limit=1)  # abandoned with batches in flight
        again = run_epoch(pipeline, 0)
        assert pipeline._pipe is not graph
    for (a_img, a_lab), (b_img, b_lab) in zip(full, again):
        assert torch.equal(a_lab, b_lab) and torch.equal(a_img, b_img)


@pytest.mark.timeout(60)
def test_corrupt_jpeg_names_the_sample_without_hanging(corrupt_path):
    dataset = open_dataset(corrupt_path)  # sample 13 has garbage entropy data
    with DaliPipeline(dataset, opts(train=False, batch_size=4)) as pipeline:
        for _ in range(2):  # and again: the failed DALI pipeline is replaced, not reused
            with pytest.raises(PipelineError) as error:
                run_epoch(pipeline)
            message = str(error.value)
            assert "sample 13" in message and corrupt_path in message and "\n" not in message
        # Batches before the bad one were delivered; the state points at the failing batch.
        assert pipeline.state_dict()["batch_index"] == 13 // 4


def test_threads_come_from_the_budget(photo_path):
    dataset = open_dataset(photo_path)
    assert DaliPipeline(dataset, opts(workers=1)).spec.num_threads == 1
    assert DaliPipeline(dataset, opts(workers=3)).spec.num_threads == 3
    assert DaliPipeline(dataset, opts(workers=0)).spec.num_threads == 1  # DALI needs one


def test_dali_own_random_crop_keeps_the_order(photo_path):
    """crop="dali" (DALI's RNG, for the benchmark) changes the pixels, never the order."""
    dataset = open_dataset(photo_path)
    with DaliPipeline(dataset, opts(), crop=CROP_DALI) as pipeline:
        assert "flip" not in pipeline.spec.inputs()
        batches = run_epoch(pipeline, epoch=1)
    order = SampleOrder(len(dataset), batch_size=8, seed=5)
    assert [b[1].tolist() for b in batches] == [o.tolist() for o in order.batches(1)]
    assert all(images.shape == (8, 3, 32, 32) for images, _ in batches)


def test_registered_and_built_by_name(photo_path):
    with build("dali", open_dataset(photo_path), **vars(opts())) as pipeline:
        assert isinstance(pipeline, DaliPipeline) and pipeline.spec.device_id is None


@pytest.mark.cuda
def test_cuda_mixed_decode_matches_the_cpu_path(photo_path):
    dataset = open_dataset(photo_path)
    with DaliPipeline(dataset, opts(device=torch.device("cuda"))) as pipeline:
        assert pipeline.spec.on_gpu
        gpu = run_epoch(pipeline, epoch=1)
    with DaliPipeline(dataset, opts()) as pipeline:
        cpu = run_epoch(pipeline, epoch=1)
    for (g_img, g_lab), (c_img, c_lab) in zip(gpu, cpu):
        assert torch.equal(g_lab, c_lab)
        # nvJPEG and libjpeg-turbo round the IDCT/colour conversion differently.
        assert (g_img.float() - c_img.float()).abs().mean() < 2
