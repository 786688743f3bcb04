"""Progressive resizing in every registered pipeline: two sizes in one run, the same crop boxes
and order as a run at one size, and an exact resume across the change."""
from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch

from turbotrain.datasets import open_dataset
from turbotrain.pipeline.order import SampleOrder
from turbotrain.pipeline.resolution import ResolutionSchedule, resize_batch

from .conftest import build, product_pipelines, run_epoch

pytestmark = pytest.mark.timeout(180)

NAMES = product_pipelines()
# Epoch 0 at 16 px, epoch 1 at 24 -> rounded to 16 or 32, epoch 2 on at 32 (the final size).
SCHEDULE = ResolutionSchedule(min_res=16, max_res=32, start_ramp=0, end_ramp=2, step=16)


def options(image_size: int = 32, **overrides):
    base = dict(train=True, batch_size=8, image_size=image_size, seed=3, workers=2,
                drop_last=False)
    base.update(overrides)
    return base


def test_the_schedule_gives_two_sizes():
    assert [SCHEDULE.size(e) for e in (0, 2, 3, 9)] == [16, 32, 32, 32]


@pytest.mark.parametrize("name", NAMES)
def test_each_epoch_has_its_size_and_the_fixed_size_crops(name, photo_path):
    """Epochs 0 and 2 of one pipeline: the sizes of the schedule, the shared order, and the
    pixels of a run at that one size (the boxes are the same; only the resize target differs,
    so the kernel's DCT scale too: a 16 px epoch equals a 16 px run to the byte)."""
    dataset = open_dataset(photo_path)
    with build(name, dataset, **options(resolution=SCHEDULE)) as pipeline:
        small, final = run_epoch(pipeline, 0), run_epoch(pipeline, 2)
    order = SampleOrder(len(dataset), batch_size=8, seed=3, shuffle=True, drop_last=False)
    for epoch, batches, size in ((0, small, 16), (2, final, 32)):
        assert [labels.tolist() for _, labels in batches] == \
            [dataset.labels[b].tolist() for b in order.batches(epoch)]
        assert all(images.shape[1:] == (3, size, size) for images, _ in batches)
        assert all(images.is_contiguous(memory_format=torch.channels_last)
                   for images, _ in batches)
    with build(name, dataset, **options(32)) as fixed:
        assert _equal(run_epoch(fixed, 2), final)
        fixed_final_size_epoch0 = run_epoch(fixed, 0)
    if name == "resident":
        # Its store is the final size's (the boxes are drawn on it): epoch 0 is those crops
        # resized to 16 px, within resampling noise.
        for (a, _), (b, _) in zip(small, fixed_final_size_epoch0):
            shrunk = np.stack([cv2.resize(img.permute(1, 2, 0).numpy(), (16, 16),
                                          interpolation=cv2.INTER_AREA) for img in b])
            assert np.abs(a.permute(0, 2, 3, 1).float().numpy() - shrunk).mean() < 6
    else:
        with build(name, dataset, **options(16)) as fixed_small:
            assert _equal(run_epoch(fixed_small, 0), small)


@pytest.mark.parametrize("name", NAMES)
def test_resume_mid_epoch_across_the_size_change(name, photo_path):
    """A state saved two batches into the 16 px epoch resumes there at 16 px, and the next
    epoch is the 32 px one: the same batches as the run that was never stopped."""
    dataset = open_dataset(photo_path)
    opts = options(resolution=SCHEDULE)
    with build(name, dataset, **opts) as pipeline:
        whole = run_epoch(pipeline, 0) + run_epoch(pipeline, 2)
    head, tail = _stopped_and_resumed(name, dataset, opts, then_epoch=2)
    assert [images.shape[-1] for images, _ in head + tail] == \
        [images.shape[-1] for images, _ in whole]
    assert _equal(head + tail, whole)


@pytest.mark.parametrize("name", NAMES)
def test_evaluation_stays_at_the_image_size(name, photo_path):
    dataset = open_dataset(photo_path)
    with build(name, dataset, **options(train=False, resolution=SCHEDULE)) as pipeline:
        assert all(images.shape[1:] == (3, 32, 32) for images, _ in run_epoch(pipeline, 0))


# Small images: 16 px pad-crops, epoch 0 resized to 12 px, epoch 2 on at 16 (the final size).
SMALL_SCHEDULE = ResolutionSchedule(min_res=12, max_res=16, start_ramp=0, end_ramp=2, step=4)


@pytest.mark.parametrize("name", NAMES)
def test_small_images_are_the_fixed_size_crops_resized(name, small_path):
    """Small images under a schedule: each epoch's size; the final-size epoch is the fixed-size
    run's to the byte, the small epoch is the fixed-size run's pad-crops resized (the same
    boxes and order), and a resume inside the small epoch continues it exactly."""
    dataset = open_dataset(small_path)
    opts = options(16, resolution=SMALL_SCHEDULE)
    with build(name, dataset, **opts) as pipeline:
        small, final = run_epoch(pipeline, 0), run_epoch(pipeline, 2)
    with build(name, dataset, **options(16)) as fixed:
        fixed_small, fixed_final = run_epoch(fixed, 0), run_epoch(fixed, 2)
    assert _equal(final, fixed_final)
    assert all(images.shape[1:] == (3, 12, 12) for images, _ in small)
    assert all(images.is_contiguous(memory_format=torch.channels_last) for images, _ in small)
    assert [labels.tolist() for _, labels in small] == \
        [labels.tolist() for _, labels in fixed_small]
    for (a, _), (b, _) in zip(small, fixed_small):
        assert torch.equal(a, resize_batch(b, 12))
    head, tail = _stopped_and_resumed(name, dataset, opts)
    assert _equal(head + tail, small)


def test_resize_batch_shrinks_on_the_device_and_keeps_the_layout():
    """An area-like shrink: a batch of flat colours stays those colours, any size in any size
    out, channels_last uint8; the final size is the batch itself."""
    flat = torch.arange(4, dtype=torch.uint8).mul(60).view(4, 1, 1, 1).expand(4, 3, 28, 28)
    flat = flat.contiguous(memory_format=torch.channels_last)
    out = resize_batch(flat, 20)
    assert out.shape == (4, 3, 20, 20) and out.dtype == torch.uint8
    assert out.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(out, flat[:, :, :20, :20])
    assert resize_batch(flat, 28) is flat


def test_a_schedule_must_end_at_the_image_size():
    from turbotrain.pipeline import PipelineOptions
    with pytest.raises(ValueError, match="must be the same"):
        PipelineOptions(train=True, batch_size=8, image_size=48, device=torch.device("cpu"),
                        resolution=SCHEDULE)


def _stopped_and_resumed(name: str, dataset, opts: dict, then_epoch: int | None = None):
    """(the first 2 batches of epoch 0, the rest of it from a pipeline resumed from the state
    saved there, plus epoch `then_epoch` of that resumed pipeline when given)."""
    with build(name, dataset, **opts) as pipeline:
        head = run_epoch(pipeline, 0, limit=2)
        state = pipeline.state_dict()
    with build(name, dataset, **opts) as resumed:
        resumed.load_state_dict(state)
        tail = [(images.cpu().clone(), labels.cpu().clone()) for images, labels in resumed]
        if then_epoch is not None:
            tail += run_epoch(resumed, then_epoch)
    return head, tail


def _equal(a: list, b: list) -> bool:
    return len(a) == len(b) and all(torch.equal(x_img, y_img) and torch.equal(x_lab, y_lab)
                                    for (x_img, x_lab), (y_img, y_lab) in zip(a, b))


@pytest.mark.cuda
@pytest.mark.parametrize("name", NAMES)
def test_two_sizes_on_cuda(name, photo_path):
    """On the GPU (resident and dali resize there): each epoch's size, on the device, with the
    CPU path's labels and its pixels within a few grey levels (test_contract's tolerance)."""
    from turbotrain.pipeline import PipelineUnavailable, build_pipeline
    dataset = open_dataset(photo_path)
    batches = {}
    for device in ("cuda", "cpu"):
        try:
            pipeline = build_pipeline(name, dataset, device=torch.device(device),
                                      **options(resolution=SCHEDULE))
        except PipelineUnavailable as e:  # with a GPU, only a missing engine (FFCV, DALI)
            pytest.skip(f"{name} cannot run here: {e}")
        with pipeline:
            batches[device] = []
            for epoch in (0, 2):
                pipeline.set_epoch(epoch)
                for images, labels in pipeline:
                    assert images.device.type == labels.device.type == device
                    assert images.shape[1:] == (3, SCHEDULE.size(epoch), SCHEDULE.size(epoch))
                    batches[device].append((images.cpu().float(), labels.cpu()))
    assert len(batches["cuda"]) == len(batches["cpu"]) > 0
    for (gpu_images, gpu_labels), (cpu_images, cpu_labels) in zip(batches["cuda"],
                                                                   batches["cpu"]):
        assert torch.equal(gpu_labels, cpu_labels)
        assert (gpu_images - cpu_images).abs().mean() < 6


@pytest.mark.cuda
def test_resize_batch_on_cuda_matches_the_cpu():
    """CUDA has no uint8 antialiased resize: the float32 path there gives the CPU's uint8
    kernel's pixels within one grey level."""
    images = torch.randint(0, 256, (8, 3, 28, 28), dtype=torch.uint8).contiguous(
        memory_format=torch.channels_last)
    on_cpu = resize_batch(images, 20)
    on_gpu = resize_batch(images.cuda(), 20)
    assert on_gpu.device.type == "cuda" and on_gpu.dtype == torch.uint8
    assert on_gpu.is_contiguous(memory_format=torch.channels_last)
    assert (on_gpu.cpu().int() - on_cpu.int()).abs().max() <= 1
