"""The augmentations after decode (--aa, --color-jitter, --reprob) in every pipeline: applied to
training batches only, the same per (seed, epoch, sample) whatever the pipeline, the batch
size or a mid-epoch resume. Labels are sample indices in these splits (conftest.py), so a
batch's labels say which samples it holds."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from turbotrain.augment_policy import policy
from turbotrain.pipeline import augment, rand_augment
from turbotrain.pipeline.after_decode import (ERASE_AREA, ERASE_DRAWS, JITTER_DRAWS,
                                              AfterDecode, erase_draws)

from .conftest import build, product_pipelines, run_epoch

pytestmark = pytest.mark.timeout(300)

NAMES = product_pipelines()
ALL_ON = policy(aa="rand-m9-mstd0.5", reprob=0.5, recount=2)
POLICIES = {"rand": ALL_ON, "trivial": policy(aa="trivial"),
            "jitter": policy(color_jitter=0.4), "erase-rand": policy(reprob=1.0, remode="rand")}


def options(image_size: int, augment_policy=ALL_ON, **overrides):
    base = dict(train=True, batch_size=8, image_size=image_size, seed=3, workers=2,
                augment=augment_policy)
    base.update(overrides)
    return base


def by_sample(batches) -> dict[int, torch.Tensor]:
    return {int(label): images[k] for images, labels in batches
            for k, label in enumerate(labels.tolist())}


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("which", sorted(POLICIES))
def test_each_pipeline_applies_the_stage_to_its_own_batches(name, which, split):
    """The augmented batch is AfterDecode(unaugmented batch, its sample indices): the stage runs
    on every pipeline's output, and changes it."""
    _, dataset, size = split
    stage = AfterDecode(POLICIES[which], seed=3, mean=dataset.mean, std=dataset.std)
    with build(name, dataset, **options(size, None)) as plain:
        clean = run_epoch(plain, epoch=1)
    with build(name, dataset, **options(size, POLICIES[which])) as pipeline:
        augmented = run_epoch(pipeline, epoch=1)
    changed = 0
    for (images, labels), (clean_images, clean_labels) in zip(augmented, clean):
        assert torch.equal(labels, clean_labels)
        assert images.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(images, stage(clean_images, labels.numpy(), 1))
        changed += int(not torch.equal(images, clean_images))
    assert changed > 0


def test_small_images_get_identical_augmentations_in_every_pipeline(small_path):
    """Small images are cropped bit-exactly by every pipeline, so augmented they stay equal."""
    from turbotrain.datasets import open_dataset
    dataset = open_dataset(small_path)
    results = {}
    for name in NAMES:
        with build(name, dataset, **options(16)) as pipeline:
            results[name] = run_epoch(pipeline, epoch=2)
    first = results[NAMES[0]]
    for name in NAMES[1:]:
        for (a, la), (b, lb) in zip(first, results[name]):
            assert torch.equal(la, lb) and torch.equal(a, b), name


@pytest.mark.parametrize("name", NAMES)
def test_a_sample_is_augmented_the_same_whatever_the_batch_size(name, small_path):
    from turbotrain.datasets import open_dataset
    dataset = open_dataset(small_path)
    with build(name, dataset, **options(16, batch_size=4, drop_last=False)) as small_batches:
        a = by_sample(run_epoch(small_batches, epoch=3))
    with build(name, dataset, **options(16, batch_size=10, drop_last=False)) as large_batches:
        b = by_sample(run_epoch(large_batches, epoch=3))
    assert a.keys() == b.keys() and all(torch.equal(a[i], b[i]) for i in a)


@pytest.mark.parametrize("name", NAMES)
def test_mid_epoch_resume_sees_the_same_augmentations(name, split):
    _, dataset, size = split
    with build(name, dataset, **options(size)) as pipeline:
        full = run_epoch(pipeline, epoch=4)
    with build(name, dataset, **options(size)) as pipeline:
        head = run_epoch(pipeline, epoch=4, limit=2)
        state = pipeline.state_dict()
    with build(name, dataset, **options(size)) as resumed:
        resumed.load_state_dict(state)
        tail = [(images.cpu().clone(), labels.cpu().clone()) for images, labels in resumed]
    assert len(head) + len(tail) == len(full)
    for (a_img, a_lab), (b_img, b_lab) in zip(head + tail, full):
        assert torch.equal(a_lab, b_lab) and torch.equal(a_img, b_img)


def test_epochs_and_seeds_draw_other_augmentations(split):
    _, dataset, size = split
    with build("pytorch", dataset, **options(size, None)) as plain:
        clean = run_epoch(plain, epoch=0)[0]
    images, labels = clean
    stage = AfterDecode(ALL_ON, seed=3, mean=dataset.mean, std=dataset.std)
    one = stage(images, labels.numpy(), 0)
    assert torch.equal(one, stage(images, labels.numpy(), 0))
    assert not torch.equal(one, stage(images, labels.numpy(), 1))
    other_seed = AfterDecode(ALL_ON, seed=4, mean=dataset.mean, std=dataset.std)
    assert not torch.equal(one, other_seed(images, labels.numpy(), 0))


@pytest.mark.parametrize("name", NAMES)
def test_evaluation_batches_are_not_augmented(name, split):
    _, dataset, size = split
    with build(name, dataset, **options(size, None, train=False)) as plain:
        clean = run_epoch(plain)
    with build(name, dataset, **options(size, train=False)) as pipeline:
        assert pipeline.after_decode is None
        for (a, _), (b, _) in zip(run_epoch(pipeline), clean):
            assert torch.equal(a, b)


def test_the_stage_never_writes_to_the_batch_it_is_given():
    images = torch.randint(0, 256, (6, 3, 20, 20), dtype=torch.uint8)
    before = images.clone()
    out = AfterDecode(ALL_ON, seed=0)(images, np.arange(6), 0)
    assert torch.equal(images, before) and not torch.equal(out, images)


# -- the draws --------------------------------------------------------------------------------
def test_draw_numbers_are_apart_from_the_crops_and_each_other():
    assert augment._DRAWS_PER_SAMPLE <= JITTER_DRAWS
    assert JITTER_DRAWS + 4 <= rand_augment.RAND_DRAWS
    assert rand_augment.RAND_DRAWS + 8 * rand_augment._PER_LAYER <= ERASE_DRAWS


def test_rand_augment_magnitudes_follow_timm():
    """m9 without noise: each op's argument at level 0.9 (timm's level_to_arg table)."""
    spec = policy(aa="rand-m9").aa
    indices = np.arange(4000)
    op, args = rand_augment.layer_draws(spec, seed=0, epoch=0, indices=indices, layer=0)
    applied = op >= 0
    assert 0.45 < applied.mean() < 0.55  # each op with probability 1/2
    names = np.array(rand_augment.RAND_OPS)[op[applied]]
    assert set(names) == set(rand_augment.RAND_OPS)  # uniform choice reaches every op
    expected = {"Rotate": 27.0, "Posterize": 3.0, "Solarize": 230.0, "SolarizeAdd": 99.0,
                "Color": 1.72, "Contrast": 1.72, "Brightness": 1.72, "Sharpness": 1.72,
                "ShearX": 0.27, "ShearY": 0.27, "TranslateX": 0.405, "TranslateY": 0.405}
    for name, value in expected.items():
        got = np.abs(args[applied][names == name])
        assert np.allclose(got, value), name
    signed = args[applied][names == "Rotate"]
    assert (signed < 0).any() and (signed > 0).any()


def test_magnitude_noise_and_increasing_ops():
    indices = np.arange(4000)
    noisy = policy(aa="rand-m9-mstd0.5").aa
    _, args = rand_augment.layer_draws(noisy, seed=0, epoch=0, indices=indices, layer=0)
    op, _ = rand_augment.layer_draws(noisy, seed=0, epoch=0, indices=indices, layer=0)
    rotate = np.abs(args[op == rand_augment.RAND_OPS.index("Rotate")])
    assert rotate.min() < 27 < rotate.max() <= 30  # m ~ N(9, 0.5), clipped at 10
    inc = policy(aa="rand-m9-inc1").aa
    op, args = rand_augment.layer_draws(inc, seed=0, epoch=0, indices=indices, layer=0)
    posterize = args[op == rand_augment.RAND_OPS.index("Posterize")]
    assert np.allclose(posterize, 1.0)  # 4 - int(3.6): stronger as m grows
    colour = args[op == rand_augment.RAND_OPS.index("Color")]
    assert np.allclose(np.abs(colour - 1.0), 0.81)


def test_trivial_augment_applies_one_op_always_with_uniform_bins():
    spec = policy(aa="trivial").aa
    assert spec.layers == 1
    op, args = rand_augment.layer_draws(spec, seed=1, epoch=0, indices=np.arange(4000),
                                        layer=0)
    assert (op >= 0).all() and set(op) == set(range(len(rand_augment.TRIVIAL_OPS)))
    rotate = np.abs(args[op == rand_augment.TRIVIAL_OPS.index("Rotate")])
    assert rotate.max() == pytest.approx(135.0) and rotate.min() == 0.0
    posterize = args[op == rand_augment.TRIVIAL_OPS.index("Posterize")]
    assert set(posterize) == {2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0}
    shift = args[op == rand_augment.TRIVIAL_OPS.index("TranslateX")]
    assert np.array_equal(shift, np.trunc(shift)) and np.abs(shift).max() == 32


def test_erasing_boxes_follow_timm_ranges():
    erase = policy(reprob=0.25, recount=1)
    boxes, _, _ = erase_draws(erase, seed=0, epoch=0, indices=np.arange(4000), height=40,
                              width=50)
    used = boxes[:, 0, 2] > 0
    assert 0.22 < used.mean() < 0.28
    top, left, h, w = boxes[used, 0].T
    area = h * w / (40 * 50)
    assert area.min() >= ERASE_AREA[0] * 0.8 and area.max() <= ERASE_AREA[1] * 1.1
    assert (top >= 0).all() and (top + h <= 40).all() and (left + w <= 50).all()
    assert (h < 40).all() and (w < 50).all()


# -- on the device ------------------------------------------------------------------------------
def test_the_stage_reads_nothing_on_the_host(monkeypatch):
    """On CUDA a tensor read on the host waits for the device: the stage makes its draws on
    the host with numpy and only sends parameters down."""
    from .test_no_hidden_sync import no_host_reads
    images = torch.randint(0, 256, (8, 3, 24, 24), dtype=torch.uint8)
    stages = [AfterDecode(p, seed=0) for p in (*POLICIES.values(), policy(reprob=1.0))]
    with no_host_reads(monkeypatch):
        for stage in stages:
            stage(images, np.arange(8), 0)


@pytest.mark.cuda
@pytest.mark.parametrize("which", sorted(POLICIES))
def test_on_cuda_without_a_sync_and_as_on_the_cpu(which):
    """The CUDA stage queues its work without a host sync, and agrees with the CPU's: the same
    draws, the same integer ops; bilinear resampling may round a pixel to the next level, and
    per-pixel noise comes from CUDA's generator (so --remode pixel is compared outside boxes
    only through the images that get none)."""
    cuda = torch.device("cuda")
    images = torch.randint(0, 256, (32, 3, 48, 48), dtype=torch.uint8)
    images = images.contiguous(memory_format=torch.channels_last)
    stage = AfterDecode(POLICIES[which], seed=5, mean=(120, 110, 100), std=(60, 60, 60))
    on_cpu = stage(images, np.arange(32), 2)
    device_images = images.to(cuda)
    stage(device_images, np.arange(32), 1)  # warm-up: kernels, the pinned-memory pool
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        on_gpu = stage(device_images, np.arange(32), 2)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    on_gpu = on_gpu.cpu()
    assert on_gpu.is_contiguous(memory_format=torch.channels_last)
    off = (on_gpu.int() - on_cpu.int()).abs()
    if which == "rand":  # pixel noise in the erased boxes differs by generator
        boxes, _, _ = erase_draws(POLICIES[which], seed=5, epoch=2, indices=np.arange(32),
                                  height=48, width=48)
        off = off[torch.from_numpy(~(boxes[:, :, 2] > 0).any(axis=1))]
    assert off.float().mean() < 0.05 and off.max() <= 2


# -- the stage against a plain loop over images ------------------------------------------------
IMAGES = torch.randint(0, 256, (24, 3, 20, 28), dtype=torch.uint8)
MEAN = (120.0, 110.0, 100.0)


@pytest.mark.parametrize("aa", ["rand-m9-n1-mstd0.5", "trivial"])
def test_each_image_gets_its_own_op_and_argument(aa):
    from turbotrain.pipeline import image_ops
    spec = policy(aa=aa).aa
    indices = np.arange(50, 74)
    got = AfterDecode(policy(aa=aa), seed=2, mean=MEAN)(IMAGES, indices, 7)
    op, args = rand_augment.layer_draws(spec, seed=2, epoch=7, indices=indices, layer=0)
    ops = rand_augment.ops_of(spec)
    for i in range(len(indices)):
        image = IMAGES[i:i + 1]
        if op[i] < 0:
            want = image
        elif ops[op[i]] in rand_augment.GEOMETRIC:
            m = rand_augment.affine_matrices(np.array([ops[op[i]]]), args[i:i + 1], height=20,
                                             width=28, relative=spec.kind == "rand")
            want = image_ops.affine(image, torch.tensor(m, dtype=torch.float32),
                                    torch.tensor(MEAN))
        else:
            want = rand_augment.apply_op(ops[op[i]], image, torch.tensor([args[i]],
                                                                         dtype=torch.float32))
        assert torch.equal(got[i:i + 1], want), (i, ops[op[i]] if op[i] >= 0 else "skipped")


def test_colour_jitter_applies_three_factors_in_each_images_order():
    from turbotrain.pipeline import after_decode
    indices = np.arange(24)
    got = AfterDecode(policy(color_jitter=0.4), seed=2)(IMAGES, indices, 0)
    u = augment.sample_uniforms(2, 0, indices, draws=np.arange(JITTER_DRAWS, JITTER_DRAWS + 4))
    factors = 0.6 + 0.8 * u[:, :3]
    for i in range(24):
        image = IMAGES[i:i + 1]
        for k in after_decode._ORDERS[int(u[i, 3] * 6)]:
            image = after_decode._JITTER_OPS[k](image, torch.tensor([factors[i, k]],
                                                                   dtype=torch.float32))
        assert torch.equal(got[i:i + 1], image), i


def test_const_erasing_writes_the_mean_in_the_drawn_boxes():
    erase = policy(reprob=0.6, recount=2, remode="const")
    got = AfterDecode(erase, seed=1, mean=MEAN, std=(50, 50, 50))(IMAGES, np.arange(24), 3)
    boxes, _, _ = erase_draws(erase, seed=1, epoch=3, indices=np.arange(24), height=20,
                              width=28)
    assert (boxes[:, :, 2] > 0).any(axis=1).sum() > 5
    for i in range(24):
        want = IMAGES[i].clone()
        for top, left, h, w in boxes[i]:
            want[:, top:top + h, left:left + w] = torch.tensor([120, 110, 100]).view(3, 1, 1)
        assert torch.equal(got[i], want), i
