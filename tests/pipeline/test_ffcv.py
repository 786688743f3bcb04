"""`ffcv` beyond the shared contract (test_contract.py): FFCV's own order vs ours, the shared
boxes in its compiled decoder, and failures that must reach the caller instead of hanging."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch

from tests import expect
from turbotrain.datasets import open_dataset
from turbotrain.pipeline import PipelineError, PipelineOptions, PipelineUnavailable, augment
from turbotrain.pipeline.order import SampleOrder

from .conftest import run_epoch
from .test_parity import reference, write_mixed_split

# make install and CI install FFCV: missing there, this module fails (tests/expect.py).
expect.module("ffcv")
from turbotrain.pipeline.ffcv import FfcvPipeline  # noqa: E402

pytestmark = [pytest.mark.timeout(180), pytest.mark.usefixtures("child_processes")]

CPU = torch.device("cpu")


def opts(image_size=32, **overrides) -> PipelineOptions:
    base = dict(train=True, batch_size=8, image_size=image_size, device=CPU, seed=5, workers=2)
    base.update(overrides)
    return PipelineOptions(**base)


def test_missing_ffcv_says_how_to_install(monkeypatch, photo_path):
    monkeypatch.setitem(sys.modules, "ffcv", None)  # makes `import ffcv` fail
    with pytest.raises(PipelineUnavailable, match=r"pip install 'turbotrain\[ffcv\]'"):
        FfcvPipeline(open_dataset(photo_path), opts())


def test_follows_the_shared_order_not_ffcvs_own(photo_path):
    """FFCV's RANDOM order is default_rng(seed + epoch).permutation: not the contract's. The
    pipeline feeds FFCV our order instead; what FFCV's own orders guarantee (each sample once
    per epoch; DistributedSampler shards) is what the shared order guarantees too."""
    dataset = open_dataset(photo_path)
    with FfcvPipeline(dataset, opts(drop_last=False)) as pipeline:
        got = np.concatenate([labels.numpy() for _, labels in run_epoch(pipeline, epoch=1)])
    ours = SampleOrder(len(dataset), batch_size=8, seed=5, drop_last=False).samples(1)
    ffcv_random = np.random.default_rng(5 + 1).permutation(len(dataset))
    assert got.tolist() == ours.tolist()
    assert got.tolist() != ffcv_random.tolist()
    assert sorted(got.tolist()) == list(range(len(dataset)))


def test_train_crops_are_the_shared_boxes(photo_path):
    """FFCV's decoder with our boxes: same crops as the cv2 reference, up to FFCV's fast IDCT."""
    dataset = open_dataset(photo_path)
    with FfcvPipeline(dataset, opts()) as pipeline:
        images, labels = run_epoch(pipeline, epoch=3)[0]
    expected = reference(dataset, augment.RESIZED_CROP, labels.numpy(), seed=5, epoch=3, size=32)
    per_image = np.abs(images.permute(0, 2, 3, 1).numpy().astype(np.float32) - expected)
    assert per_image.mean(axis=(1, 2, 3)).max() < 3


@pytest.mark.parametrize("train", [True, False])
def test_small_images_are_exact(train, small_path):
    dataset = open_dataset(small_path)
    family = augment.PAD_CROP if train else augment.IDENTITY
    with FfcvPipeline(dataset, opts(16, train=train)) as pipeline:
        for images, labels in run_epoch(pipeline, epoch=1):
            expected = reference(dataset, family, labels.numpy(), seed=5, epoch=1, size=16)
            assert np.array_equal(images.permute(0, 2, 3, 1).numpy(), expected)


def test_mixed_jpeg_and_raw_split(tmp_path):
    dataset = open_dataset(write_mixed_split(tmp_path / "mixed.beton"))
    with FfcvPipeline(dataset, opts(train=False)) as pipeline:
        for images, labels in run_epoch(pipeline):
            expected = reference(dataset, augment.CENTRE_CROP, labels.numpy(), seed=5, epoch=0,
                                 size=32)
            diff = np.abs(images.permute(0, 2, 3, 1).numpy().astype(np.float32) - expected)
            assert diff.mean(axis=(1, 2, 3)).max() < 3


def test_batches_stay_valid_after_later_batches(photo_path):
    """FFCV reuses its buffers batches_ahead + 2 batches later; ours are clones."""
    dataset = open_dataset(photo_path)
    with FfcvPipeline(dataset, opts(train=False, batch_size=4)) as pipeline:
        kept = list(pipeline)  # 10 batches, no copies taken by the caller
        copied = run_epoch(pipeline)
    for (a_img, a_lab), (b_img, b_lab) in zip(kept, copied):
        assert torch.equal(a_lab, b_lab) and torch.equal(a_img, b_img)


def test_torch_threads_are_left_alone(photo_path):
    """FFCV's Compiler.set_num_threads also sets torch's; the trainer's budget must stand."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with FfcvPipeline(open_dataset(photo_path), opts(workers=2)) as pipeline:
            run_epoch(pipeline)
            assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_two_loaders_in_one_process(photo_path, small_path):
    """Train and eval loaders side by side (FFCV's numba type mutation would break this)."""
    train = FfcvPipeline(open_dataset(photo_path), opts())
    evaluation = FfcvPipeline(open_dataset(small_path), opts(16, train=False))
    for epoch in range(2):
        assert len(run_epoch(train, epoch)) == len(train)
        assert len(run_epoch(evaluation, epoch)) == len(evaluation)


def test_corrupt_jpeg_names_the_sample(corrupt_path):
    """FFCV ignores libjpeg-turbo's return code; our decoder records it per sample."""
    with FfcvPipeline(open_dataset(corrupt_path), opts(train=False, batch_size=4)) as pipeline:
        with pytest.raises(PipelineError) as error:
            run_epoch(pipeline)
    message = str(error.value)
    assert "sample 13" in message and corrupt_path in message and "\n" not in message


class _Exploding(FfcvPipeline):
    """Raises inside FFCV's loader thread on the third batch."""

    def box_rows(self, epoch, indices):
        if int(indices[0]) == 16:  # eval order: batches start at 0, 8, 16, ...
            raise RuntimeError("boom in the loader thread")
        return super().box_rows(epoch, indices)


class _Stalling(FfcvPipeline):
    """FFCV's thread stops producing (stands in for a deadlock in compiled code)."""

    def box_rows(self, epoch, indices):
        if int(indices[0]) >= 8:
            time.sleep(3)
        return super().box_rows(epoch, indices)


@pytest.mark.timeout(60)
def test_exception_in_ffcvs_thread_reaches_the_caller(photo_path):
    dataset = open_dataset(photo_path)
    with _Exploding(dataset, opts(train=False)) as pipeline:
        started = time.monotonic()
        with pytest.raises(PipelineError, match="boom in the loader thread"):
            run_epoch(pipeline)
        assert time.monotonic() - started < 30
        assert pipeline.state_dict()["batch_index"] == 2  # batches 0 and 1 were delivered


@pytest.mark.timeout(60)
def test_a_stalled_ffcv_thread_times_out(photo_path):
    dataset = open_dataset(photo_path)
    with _Stalling(dataset, opts(train=False)) as pipeline:
        run_epoch(pipeline, limit=1)  # numba compiles during batch 0: seconds
        pipeline.batch_timeout_s = 1.0
        started = time.monotonic()
        with pytest.raises(PipelineError, match="no batch within 1 s"):
            run_epoch(pipeline)
        assert time.monotonic() - started < 10


@pytest.mark.timeout(120)
def test_normalize_after_to_tensor_is_an_error_not_a_hang(photo_path):
    """FFCV #350/#396: a compiled op after ToTensor makes the Loader constructor loop forever.
    Run in a child process: the stuck thread cannot be killed, only abandoned."""
    script = textwrap.dedent(f"""
        import numpy as np, torch
        from turbotrain.datasets import open_dataset
        from turbotrain.pipeline import PipelineError, PipelineOptions
        from turbotrain.pipeline import ffcv as tt_ffcv

        class Normalising(tt_ffcv.FfcvPipeline):
            def _image_ops(self, to_device):
                from ffcv.transforms import NormalizeImage, ToTensor
                return [ToTensor(), NormalizeImage(np.zeros(3), np.ones(3), np.float32)]

        tt_ffcv.BUILD_TIMEOUT_S = 5
        options = PipelineOptions(train=False, batch_size=4, image_size=32,
                                  device=torch.device("cpu"), workers=1)
        try:
            Normalising(open_dataset({str(photo_path)!r}), options)
        except PipelineError as e:
            print("ERROR:", e, flush=True)
            raise SystemExit(3)
        print("built", flush=True)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=100)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "#350" in done.stdout


@pytest.mark.cuda
def test_cuda_to_device(photo_path):
    dataset = open_dataset(photo_path)
    with FfcvPipeline(dataset, opts(device=torch.device("cuda"))) as pipeline:
        gpu = run_epoch(pipeline, epoch=1)
    with FfcvPipeline(dataset, opts()) as pipeline:
        cpu = run_epoch(pipeline, epoch=1)
    for (g_img, g_lab), (c_img, c_lab) in zip(gpu, cpu):
        assert torch.equal(g_lab, c_lab) and torch.equal(g_img, c_img)
