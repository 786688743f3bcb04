"""The batch contract, for every registered pipeline (dali/ffcv join automatically)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tests import expect
from turbotrain.pipeline.order import SampleOrder

from .conftest import build, product_pipelines, run_epoch

pytestmark = pytest.mark.timeout(120)

NAMES = product_pipelines()


def options(image_size: int, **overrides):
    base = dict(train=True, batch_size=8, image_size=image_size, seed=3, workers=2)
    base.update(overrides)
    return base


def test_builtin_pipelines_are_registered():
    assert {"pytorch", "resident"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("train", [True, False])
def test_batches_have_the_contract_layout(name, train, split):
    _, dataset, size = split
    with build(name, dataset, **options(size, train=train)) as pipeline:
        batches = run_epoch(pipeline)
    assert len(batches) == len(pipeline) > 0
    for images, labels in batches:
        assert images.dtype == torch.uint8 and labels.dtype == torch.int64
        assert images.shape[1:] == (3, size, size) and labels.shape == (images.shape[0],)
        assert images.is_contiguous(memory_format=torch.channels_last)
        assert images.max() > images.min()  # real pixels, not an untouched buffer


@pytest.mark.parametrize("name", NAMES)
def test_labels_follow_the_shared_order(name, split):
    """Labels are sample indices: every pipeline yields SampleOrder's batches exactly."""
    _, dataset, size = split
    opts = options(size, drop_last=False)
    with build(name, dataset, **opts) as pipeline:
        for epoch in (0, 1):
            got = [labels.numpy() for _, labels in run_epoch(pipeline, epoch)]
            order = SampleOrder(len(dataset), batch_size=8, seed=3, shuffle=True, drop_last=False)
            expected = [dataset.labels[b] for b in order.batches(epoch)]
            assert [g.tolist() for g in got] == [e.tolist() for e in expected]
    everything = np.concatenate(got)
    assert sorted(everything.tolist()) == list(range(len(dataset)))  # each sample once


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("drop_last", [True, False])
def test_rank_shards_are_disjoint_and_equal(name, drop_last, split):
    _, dataset, size = split
    world = 3
    shards = []
    for rank in range(world):
        with build(name, dataset, **options(size, rank=rank, world_size=world,
                                            drop_last=drop_last)) as pipeline:
            batches = run_epoch(pipeline, epoch=2)
            assert len(batches) == len(pipeline)
            shards.append(np.concatenate([labels.numpy() for _, labels in batches]))
    assert len({len(s) for s in shards}) == 1
    union = np.concatenate(shards)
    if drop_last:
        assert len(set(union.tolist())) == len(union)  # disjoint
        assert all(len(s) % 8 == 0 for s in shards)
    else:  # padded with the first entries of the order to equal size: all samples covered
        assert set(union.tolist()) == set(range(len(dataset)))
        assert len(union) - len(dataset) < world


@pytest.mark.parametrize("name", NAMES)
def test_output_does_not_depend_on_worker_count(name, split):
    _, dataset, size = split
    runs = []
    for workers in (1, 2):
        with build(name, dataset, **options(size, workers=workers)) as pipeline:
            runs.append(run_epoch(pipeline, epoch=1))
    for (a_img, a_lab), (b_img, b_lab) in zip(*runs):
        assert torch.equal(a_lab, b_lab)
        assert torch.equal(a_img, b_img)


@pytest.mark.parametrize("name", NAMES)
def test_epochs_differ_and_repeat(name, split):
    _, dataset, size = split
    with build(name, dataset, **options(size)) as pipeline:
        first = run_epoch(pipeline, epoch=0)
        second = run_epoch(pipeline, epoch=1)
        again = run_epoch(pipeline, epoch=0)
    assert not torch.equal(first[0][1], second[0][1])
    for (a_img, a_lab), (b_img, b_lab) in zip(first, again):
        assert torch.equal(a_lab, b_lab) and torch.equal(a_img, b_img)


@pytest.mark.parametrize("name", NAMES)
def test_mid_epoch_state_round_trip(name, split):
    _, dataset, size = split
    opts = options(size)
    with build(name, dataset, **opts) as pipeline:
        full = run_epoch(pipeline, epoch=4)
    with build(name, dataset, **opts) as pipeline:
        head = run_epoch(pipeline, epoch=4, limit=2)
        state = pipeline.state_dict()
    assert state["epoch"] == 4 and state["batch_index"] == 2
    with build(name, dataset, **opts) as resumed:
        resumed.load_state_dict(state)
        tail = []
        for images, labels in resumed:  # no set_epoch: the state says where we are
            tail.append((images.cpu().clone(), labels.cpu().clone()))
        assert resumed.state_dict()["batch_index"] == 0  # a finished epoch starts over
    assert len(head) + len(tail) == len(full)
    for (a_img, a_lab), (b_img, b_lab) in zip(head + tail, full):
        assert torch.equal(a_lab, b_lab) and torch.equal(a_img, b_img)


@pytest.mark.parametrize("name", NAMES)
def test_other_crop_ranges_keep_the_contract(name, photo_path):
    """train --scale / --ratio: the same layout and order, and a mid-epoch resume still yields
    the very same crops (the boxes stay a function of (seed, epoch, index))."""
    from turbotrain.datasets import open_dataset
    dataset = open_dataset(photo_path)
    opts = options(32, drop_last=False, scale=(0.3, 0.6), ratio=(0.5, 2.0))
    with build(name, dataset, **opts) as pipeline:
        full = run_epoch(pipeline, epoch=1)
    with build(name, dataset, **opts) as pipeline:
        head = run_epoch(pipeline, epoch=1, limit=2)
        state = pipeline.state_dict()
    with build(name, dataset, **opts) as resumed:
        resumed.load_state_dict(state)
        tail = [(images.cpu().clone(), labels.cpu().clone()) for images, labels in resumed]
    order = SampleOrder(len(dataset), batch_size=8, seed=3, shuffle=True, drop_last=False)
    assert [labels.tolist() for _, labels in full] == \
        [dataset.labels[b].tolist() for b in order.batches(1)]
    assert len(head) + len(tail) == len(full)
    for (a_img, a_lab), (b_img, b_lab) in zip(head + tail, full):
        assert a_img.shape[1:] == (3, 32, 32) and a_img.dtype == torch.uint8
        assert torch.equal(a_lab, b_lab) and torch.equal(a_img, b_img)


@pytest.mark.parametrize("name", NAMES)
def test_small_eval_images_are_the_stored_pixels(name, small_path):
    """Evaluation of small images is the identity: bytes in, bytes out."""
    from turbotrain.datasets import open_dataset
    dataset = open_dataset(small_path)
    with build(name, dataset, **options(16, train=False)) as pipeline:
        for images, labels in run_epoch(pipeline):
            for image, label in zip(images, labels.tolist()):
                assert torch.equal(image.permute(1, 2, 0), torch.from_numpy(dataset.image(label)))


@pytest.mark.parametrize("name", NAMES)
def test_photo_eval_is_a_centre_crop(name, photo_path):
    """Eval = resize the shorter side to S / crop_ratio, centre crop S (within resize noise)."""
    import cv2
    from turbotrain.datasets import open_dataset
    dataset = open_dataset(photo_path)
    size, ratio = 32, 0.875
    with build(name, dataset, **options(size, train=False, crop_ratio=ratio)) as pipeline:
        images, labels = run_epoch(pipeline)[0]
    for image, i in zip(images, labels.tolist()):
        source = dataset.image(i)
        short = min(source.shape[:2])
        scale = round(size / ratio) / short
        resized = cv2.resize(source, (round(source.shape[1] * scale),
                                      round(source.shape[0] * scale)),
                             interpolation=cv2.INTER_AREA)
        top, left = (resized.shape[0] - size) // 2, (resized.shape[1] - size) // 2
        expected = resized[top:top + size, left:left + size].astype(np.float32)
        got = image.permute(1, 2, 0).numpy().astype(np.float32)
        assert np.abs(got - expected).mean() < 6, f"sample {i}"


@pytest.mark.cuda
@pytest.mark.parametrize("name", NAMES)
def test_each_pipeline_delivers_the_contract_on_cuda(name, split):
    """On the GPU: the same layout, on the device, with the CPU path's labels in its order and
    its pixels within a few grey levels (GPU decoders and resamplers round differently; 6, the
    tolerance test_parity allows any pipeline against the stored image)."""
    from turbotrain.pipeline import PipelineUnavailable, build_pipeline
    _, dataset, size = split
    batches = {}
    for device in (torch.device("cuda"), torch.device("cpu")):
        try:
            pipeline = build_pipeline(name, dataset, device=device, **options(size, train=False))
        except PipelineUnavailable as e:  # with a GPU, only a missing engine (FFCV, DALI)
            if name not in expect.INSTALLS:
                raise
            expect.missing(name, f"{name} cannot run here: {e}")
        with pipeline:
            pipeline.set_epoch(0)
            batches[device.type] = []
            for images, labels in pipeline:
                assert images.device.type == labels.device.type == device.type
                assert images.dtype == torch.uint8 and labels.dtype == torch.int64
                assert images.shape[1:] == (3, size, size)
                assert images.is_contiguous(memory_format=torch.channels_last)
                batches[device.type].append((images.cpu().float(), labels.cpu()))
    assert len(batches["cuda"]) == len(batches["cpu"]) > 0
    for (gpu_images, gpu_labels), (cpu_images, cpu_labels) in zip(batches["cuda"],
                                                                   batches["cpu"]):
        assert torch.equal(gpu_labels, cpu_labels)
        assert (gpu_images - cpu_images).abs().mean() < 6


@pytest.mark.parametrize("name", NAMES)
def test_closed_pipelines_give_cv2_its_threads_back(name, split):
    """cv2's thread count is the whole process's (turbotrain may be a library in someone's
    program): a pipeline whose threads decode sets one cv2 thread while it lives, and the last
    one closed gives the process's own count back."""
    import cv2
    kind, dataset, size = split
    # cv2 in threads for the pipeline's life, on the Python decode path only (the native kernel
    # does not use cv2): pytorch's decode threads, resident's photo crops on the CPU.
    from turbotrain.pipeline import kernel
    holds = kernel.NATIVE is None and (name == "pytorch" or (name == "resident" and
                                                             kind == "photo"))
    before = cv2.getNumThreads()
    cv2.setNumThreads(3)  # the user's setting
    try:
        with build(name, dataset, **options(size)) as train:
            with build(name, dataset, **options(size, train=False)) as val:
                run_epoch(train, limit=1)
                run_epoch(val, limit=1)
            assert cv2.getNumThreads() == (1 if holds else 3)  # train still open
        assert cv2.getNumThreads() == 3
    finally:
        cv2.setNumThreads(before)
