"""The compiled batch kernel (pipeline/csrc, loaded by pipeline/kernel.py) against the Python
decode path it replaces: the same crops, pixels within one grey level (the resize's rounding;
the decode itself is bit-exact), the same one-line errors, no GIL held while it decodes, and the
visible fallback when it is missing."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import simplejpeg
import torch

from turbotrain.datasets import open_dataset
from turbotrain.datasets.beton import layout
from turbotrain.datasets.beton.writer import BetonWriter
from turbotrain.pipeline import augment, build_pipeline, kernel
from turbotrain.pipeline.cpu_decode import BatchDecoder, DecodeAhead, SampleDecodeError

from .conftest import photo_image

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("child_processes")]

# (height, width): photo-sized ones (landscape, portrait, 4:2:0 iMCU-unaligned) and small ones.
PHOTO_SIZES = [(375, 500), (500, 375), (333, 499), (240, 320), (90, 130)]


def test_the_kernel_is_built_here():
    """Our own machines (and CI) build it in `make install`: no silent fallback."""
    assert kernel.NATIVE is not None, kernel.STATUS
    assert kernel.STATUS.startswith("native batch kernel (libjpeg-turbo ")


def write_split(path, sizes, *, raw_every: int = 4, subsampling: str = "420") -> str:
    with BetonWriter(path, len(sizes), page_size=layout.MIN_PAGE_SIZE) as writer:
        for i, (h, w) in enumerate(sizes):
            image = photo_image(i, h, w)
            if i % raw_every == raw_every - 1:
                writer.append(layout.MODE_RAW, h, w, image.tobytes(), i)
            else:
                jpeg = simplejpeg.encode_jpeg(image, quality=90, colorsubsampling=subsampling)
                writer.append(layout.MODE_JPEG, h, w, jpeg, i)
    return str(path)


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    sizes = [PHOTO_SIZES[i % len(PHOTO_SIZES)] for i in range(24)]
    return open_dataset(write_split(tmp_path_factory.mktemp("native") / "train.beton", sizes))


def both_paths(dataset, indices, epoch, **options):
    """(native batch, Python-path batch) for the same decoder settings."""
    decoder = BatchDecoder(dataset, **options)
    size = options["image_size"]
    native = np.zeros((len(indices), size, size, 3), np.uint8)
    python = np.zeros_like(native)
    decoder.decode(indices, epoch, native)
    decoder.native = False
    decoder.decode(indices, epoch, python)
    return native, python


@pytest.mark.parametrize("size", [224, 64, 24])
@pytest.mark.parametrize("train", [True, False])
def test_native_matches_the_python_path(photos, size, train):
    """RandomResizedCrop and centre crops, JPEG and raw, with and without DCT scaling (64 and 24
    px boxes are >= 2x and 4x the output): every pixel within one grey level."""
    indices = np.arange(len(photos))
    native, python = both_paths(photos, indices, 3, image_size=size, train=train, seed=5)
    diff = np.abs(native.astype(np.int16) - python)
    assert diff.max() <= 1, diff.max()
    assert diff.mean() < 0.25, diff.mean()


@pytest.mark.parametrize("subsampling", ["444", "422", "420", "411", "Gray"])
def test_region_decode_is_bit_exact(tmp_path, subsampling):
    """Boxes exactly the output's size (no resize), anywhere in the image, at every chroma
    subsampling: the kernel's region decode (skipped rows, cropped iMCU columns) equals a full
    simplejpeg decode of the same bytes, sliced, to the bit."""
    sizes = [(240, 333), (181, 250)] * 3
    dataset = open_dataset(write_split(tmp_path / "train.beton", sizes, raw_every=10**6,
                                       subsampling=subsampling))
    size = 48
    decoder = BatchDecoder(dataset, image_size=size, train=True, seed=0)
    indices = np.arange(len(dataset))
    table, keep = decoder.sample_table(indices, 0)
    rng = np.random.default_rng(1)
    table["top"], table["left"] = rng.integers(0, 181 - size, 6), rng.integers(0, 250 - size, 6)
    table["box_h"], table["box_w"] = size, size
    table["flip"] = [0, 1, 0, 1, 0, 1]
    out = np.zeros((len(indices), size, size, 3), np.uint8)
    assert kernel.NATIVE.Worker().run(table, size, False, out) == []
    for k, i in enumerate(indices):
        full = simplejpeg.decode_jpeg(np.asarray(dataset.payload(i)), colorspace="rgb",
                                      fastdct=True)
        t, left = int(table["top"][k]), int(table["left"][k])
        expected = full[t:t + size, left:left + size]
        assert np.array_equal(out[k], expected[:, ::-1] if table["flip"][k] else expected), k


@pytest.mark.parametrize("train", [True, False])
def test_small_images_are_bit_exact(tmp_path, train):
    """Pad-crop + flip (train) and identity (eval) on raw and JPEG small images at the output
    size: the same bytes as the Python path."""
    sizes = [(16, 16)] * 12
    dataset = open_dataset(write_split(tmp_path / "train.beton", sizes, raw_every=2))
    native, python = both_paths(dataset, np.arange(12), 4, image_size=16, train=train, seed=2)
    assert np.array_equal(native, python)


def test_small_images_resized_first(tmp_path):
    """A small image of another size is resized to S before the pad-crop, as the Python path
    does it (within the resize's one grey level)."""
    dataset = open_dataset(write_split(tmp_path / "train.beton", [(28, 28), (20, 30)] * 4))
    native, python = both_paths(dataset, np.arange(8), 0, image_size=32, train=True, seed=9)
    assert np.abs(native.astype(np.int16) - python).max() <= 1


def test_sharded_splits_gather_their_payloads(tmp_path):
    """payload_addresses finds each sample's shard: a batch across three shards decodes to what
    the unsharded split gives."""
    from turbotrain.datasets.beton.split import PreparedSplit
    from turbotrain.datasets.beton.shards import LocalShard
    sizes = [PHOTO_SIZES[i % 3] for i in range(12)]
    whole = open_dataset(write_split(tmp_path / "whole.beton", sizes))
    parts = []
    for k, chunk in enumerate((range(0, 5), range(5, 7), range(7, 12))):
        path = tmp_path / f"part{k}.beton"
        with BetonWriter(path, len(chunk), page_size=layout.MIN_PAGE_SIZE) as writer:
            for i in chunk:
                mode = int(whole.modes[i])
                writer.append(mode, int(whole.heights[i]), int(whole.widths[i]),
                              bytes(whole.payload(i)), i)
        parts.append(LocalShard(path))
    sharded = PreparedSplit(parts, "train", None, root=tmp_path)
    indices = np.array([11, 0, 6, 5, 3, 9, 1, 7])
    options = dict(image_size=64, train=True, seed=1)
    a = np.zeros((8, 64, 64, 3), np.uint8)
    b = np.zeros_like(a)
    BatchDecoder(whole, **options).decode(indices, 2, a)
    BatchDecoder(sharded, **options).decode(indices, 2, b)
    assert np.array_equal(a, b)


def test_simd_and_scalar_resamplers_give_the_same_bytes(tmp_path, photos):
    """The SSSE3/AVX2 horizontal pass and the scalar one (non-x86 machines; -DTT_SCALAR here)
    do the same integer arithmetic: the same batches, to the bit, linear and area filters."""
    from tests.native_build import LOAD_BUILD, build_extension
    scalar = build_extension(tmp_path, "-O2", "-DTT_SCALAR")
    code = LOAD_BUILD + (
        "import numpy as np\n"
        "from turbotrain.datasets import open_dataset\n"
        "from turbotrain.pipeline.cpu_decode import BatchDecoder\n"
        "ds = open_dataset(sys.argv[2])\n"
        "out = {}\n"
        "for size in (224, 64, 24):\n"
        "    for train in (True, False):\n"
        "        d = BatchDecoder(ds, image_size=size, train=train, seed=4)\n"
        "        a = np.zeros((len(ds), size, size, 3), np.uint8)\n"
        "        d.decode(np.arange(len(ds)), 1, a)\n"
        "        out[f'{size}-{train}'] = a\n"
        "np.savez(sys.argv[3], **out)\n")
    done = subprocess.run([sys.executable, "-c", code, str(scalar), str(photos.path),
                           str(tmp_path / "scalar.npz")], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    expected = np.load(tmp_path / "scalar.npz")
    for key in expected.files:
        size, train = int(key.split("-")[0]), key.endswith("True")
        decoder = BatchDecoder(photos, image_size=size, train=train, seed=4)
        batch = np.zeros_like(expected[key])
        decoder.decode(np.arange(len(photos)), 1, batch)
        assert np.array_equal(batch, expected[key]), key


def test_full_and_region_decodes_give_the_same_batch(photos):
    """Pool(region=False), bench_kernel's comparison, decodes whole images and then crops: the
    same bytes as the region decode the pipelines use."""
    decoder = BatchDecoder(photos, image_size=64, train=True, seed=8)
    indices = np.arange(len(photos))
    batches = []
    for region in (True, False):
        pool = kernel.NATIVE.Pool(2, region=region)
        out = np.zeros((len(indices), 64, 64, 3), np.uint8)
        decoder.submit(pool, indices, 1, out).result()
        pool.close()
        batches.append(out)
    assert np.array_equal(*batches)


def test_payload_views_locate_every_shard(tmp_path):
    """DALI's feed gathers a batch's payloads in one step: the same bytes as payload(i)."""
    from turbotrain.datasets.beton.split import PreparedSplit
    from turbotrain.datasets.beton.shards import LocalShard
    sizes = [PHOTO_SIZES[i % 3] for i in range(9)]
    whole = open_dataset(write_split(tmp_path / "whole.beton", sizes))
    parts = []
    for k, chunk in enumerate((range(0, 4), range(4, 9))):
        path = tmp_path / f"part{k}.beton"
        with BetonWriter(path, len(chunk), page_size=layout.MIN_PAGE_SIZE) as writer:
            for i in chunk:
                writer.append(int(whole.modes[i]), int(whole.heights[i]), int(whole.widths[i]),
                              bytes(whole.payload(i)), i)
        parts.append(LocalShard(path))
    sharded = PreparedSplit(parts, "train", None, root=tmp_path)
    indices = np.array([8, 0, 4, 3, 5])
    for split in (whole, sharded):
        views = split.payload_views(indices)
        assert [bytes(v) for v in views] == [bytes(whole.payload(i)) for i in indices]
    with pytest.raises(IndexError):
        sharded.payload_views(np.array([9]))


# -- errors -----------------------------------------------------------------------------------------
def broken_split(tmp_path, damage: dict) -> str:
    """Photo split of 10 samples; damage[i](payload) replaces sample i's JPEG bytes."""
    path = tmp_path / "train.beton"
    with BetonWriter(path, 10, page_size=layout.MIN_PAGE_SIZE) as writer:
        for i in range(10):
            h, w = PHOTO_SIZES[i % 2]
            jpeg = simplejpeg.encode_jpeg(photo_image(i, h, w), quality=90)
            writer.append(layout.MODE_JPEG, h, w, damage.get(i, lambda b: b)(jpeg), i)
    return str(path)


def truncated(jpeg: bytes) -> bytes:
    return jpeg[:len(jpeg) * 2 // 3]


def garbage_scan(jpeg: bytes) -> bytes:
    return jpeg[:700] + bytes(range(256)) * ((len(jpeg) - 702) // 256) + b"\xff\xd9"


def lying(jpeg: bytes) -> bytes:
    """The SOF0 height field says 600 rows instead of 375 (or 500)."""
    at = jpeg.index(b"\xff\xc0")
    return jpeg[:at + 5] + (600).to_bytes(2, "big") + jpeg[at + 7:]


@pytest.mark.parametrize("damage, reason", [
    (truncated, "Premature end of JPEG file"),
    (garbage_scan, "Corrupt JPEG data"),
    (lambda b: b"\x00" * len(b), "Not a JPEG file"),
    (lying, "its JPEG header declares"),
])
def test_a_bad_jpeg_is_one_line_naming_the_first_bad_sample(tmp_path, damage, reason):
    """Damage at batch positions 2 and 7: the error names sample 2 (the first in the batch,
    whichever thread met which first), on one line, with libjpeg's reason."""
    path = broken_split(tmp_path, {7: damage, 2: damage})
    dataset = open_dataset(path)
    decoder = BatchDecoder(dataset, image_size=32, train=True, seed=0)
    out = np.zeros((10, 32, 32, 3), np.uint8)
    with pytest.raises(SampleDecodeError) as error:
        decoder.decode(np.arange(10), 0, out)
    message = str(error.value)
    assert message.startswith(f"{path}: sample 2 does not decode as a JPEG (") and \
        reason in message and "\n" not in message, message
    failures = decoder.decode_all(np.arange(10), 0, out)  # predict: every bad one, in order
    assert [position for position, _ in failures] == [2, 7]
    assert all(reason in why for _, why in failures)
    ahead = DecodeAhead(decoder, threads=2)
    try:
        with pytest.raises(SampleDecodeError, match="sample 2 does not"):
            for _ in ahead.run(0, [np.arange(10)], lambda indices: torch.empty(
                    (len(indices), 32, 32, 3), dtype=torch.uint8)):
                pass
    finally:
        ahead.close()


def without_segment(jpeg: bytes, marker: bytes) -> bytes:
    """`jpeg` with every `marker` segment before its first scan left out."""
    kept, at = bytearray(jpeg[:2]), 2
    while jpeg[at:at + 2] != b"\xff\xda":
        length = int.from_bytes(jpeg[at + 2:at + 4], "big")
        if jpeg[at:at + 2] != marker:
            kept += jpeg[at:at + 2 + length]
        at += 2 + length
    return bytes(kept + jpeg[at:])


def test_a_sample_decodes_alike_whatever_its_thread_decoded_before(tmp_path):
    """libjpeg keeps an image's tables for the next one: sample 1, a JPEG that lost its DQT
    segment, decoded with sample 0's tables after it (a silently wrong image) but failed on a
    fresh thread, so inline and pooled runs disagreed (the ASan fuzz saw it 1 run in 6)."""
    path = broken_split(tmp_path, {1: lambda b: without_segment(b, b"\xff\xdb")})
    decoder = BatchDecoder(open_dataset(path), image_size=32, train=False, seed=0)
    alone, after_sample_0 = (decoder.decode_all(np.asarray(ix), 0, np.zeros(
        (len(ix), 32, 32, 3), np.uint8)) for ix in ([1], [0, 1]))
    assert alone == [(0, "Quantization table 0x00 was not defined")], alone
    assert after_sample_0 == [(1, "Quantization table 0x00 was not defined")], after_sample_0


def test_truncation_is_seen_whatever_the_box(tmp_path):
    """A crop decode stops at the box's last row; a file that does not end in an EOI marker is
    decoded to its end anyway, so its truncation fails the sample even when the box is above the
    cut (here every box lies in the top half, the cut at 90 %)."""
    path = broken_split(tmp_path, {0: lambda b: b[:len(b) * 9 // 10]})
    decoder = BatchDecoder(open_dataset(path), image_size=32, train=True, seed=0)
    table, keep = decoder.sample_table(np.arange(1), 0)
    table["top"], table["box_h"], table["left"], table["box_w"] = 0, 64, 0, 64
    failures = kernel.NATIVE.Worker().run(table, 32, False, np.zeros((1, 32, 32, 3), np.uint8))
    assert len(failures) == 1 and "Premature end of JPEG file" in failures[0][1], failures


def test_out_must_hold_the_batch(photos):
    decoder = BatchDecoder(photos, image_size=32, train=False, seed=0)
    with pytest.raises(ValueError, match="the output buffer has"):
        decoder.decode(np.arange(4), 0, np.zeros((3, 32, 32, 3), np.uint8))


# -- threads ---------------------------------------------------------------------------------------
def test_the_gil_is_free_while_a_batch_decodes(photos):
    """A Python thread keeps counting while the main thread is inside one decode call: the call
    holds the GIL for none of its samples. (On the Python path the counter also moves, but only
    between the ~15 Python steps per sample; here the kernel gets ~50 ms of work per call.)"""
    decoder = BatchDecoder(photos, image_size=224, train=True, seed=0)
    indices = np.tile(np.arange(len(photos)), 4)
    out = np.zeros((len(indices), 224, 224, 3), np.uint8)
    decoder.decode(indices[:4], 0, out)  # warm: the worker handle and its buffers exist
    counts, stop, running = [0], threading.Event(), threading.Event()

    def count():
        running.set()
        while not stop.is_set():
            counts[0] += 1
    spinner = threading.Thread(target=count)
    spinner.start()
    running.wait()
    sys.setswitchinterval(1.0)  # the main thread would keep a held GIL for a whole second
    try:
        before = counts[0]
        decoder.decode(indices, 0, out)
        during = counts[0] - before
    finally:
        sys.setswitchinterval(0.005)
        stop.set()
        spinner.join()
    # A held GIL would give the spinner no turn at all during the call (the 1 s switch
    # interval); free, it counts millions a second. 1,000 leaves room for a loaded machine.
    assert during > 1_000, during


def test_a_pool_cancels_and_closes_with_batches_in_flight(photos):
    """Stopping early cancels what is queued and waits for the samples already running, so the
    pool never writes into a buffer nobody holds; closing twice is harmless."""
    decoder = BatchDecoder(photos, image_size=64, train=True, seed=0)
    pool = kernel.NATIVE.Pool(2)
    jobs = [decoder.submit(pool, np.arange(len(photos)), e, np.zeros((24, 64, 64, 3), np.uint8))
            for e in range(6)]
    jobs[0].result()
    for job in jobs[1:]:
        job.cancel()
    pool.close()
    pool.close()
    with pytest.raises(RuntimeError, match="closed"):
        decoder.submit(pool, np.arange(2), 0, np.zeros((2, 64, 64, 3), np.uint8))


def epoch_batches(n: int, epoch: int, batch: int = 4) -> list[np.ndarray]:
    order = np.random.default_rng(epoch).permutation(n)
    return [order[i:i + batch] for i in range(0, n, batch)]


def decoded(ahead, epoch, batches, upcoming=None) -> list[np.ndarray]:
    return [images.numpy().copy() for _, images in ahead.run(
        epoch, batches, lambda idx: torch.zeros((len(idx), 32, 32, 3), dtype=torch.uint8),
        upcoming)]


def test_the_next_epochs_first_boxes_are_drawn_ahead_and_used_only_if_they_fit(photos,
                                                                               monkeypatch):
    """DecodeAhead draws the next epoch's first group of crop boxes while this epoch ends (on
    its helper thread: beside a Python-busy thread a draw by the consumer took up to 290 ms,
    longer than the batches in flight). The primed boxes serve only a run that starts with the
    very batches they were drawn for: resumed mid-epoch, or another order, they are redrawn,
    and every batch equals a fresh decoder's."""
    decoder = BatchDecoder(photos, image_size=32, train=True, seed=0)
    drawn = []
    real_boxes = BatchDecoder.boxes

    def counting(self, indices, epoch):
        drawn.append((epoch, len(indices)))
        return real_boxes(self, indices, epoch)
    monkeypatch.setattr(BatchDecoder, "boxes", counting)
    n = len(photos)
    ahead = DecodeAhead(decoder, 2)
    try:
        decoded(ahead, 0, epoch_batches(n, 0), lambda: epoch_batches(n, 1))
        assert drawn == [(0, n), (1, n)]  # epoch 1's first (and only) group: primed
        primed = decoded(ahead, 1, epoch_batches(n, 1), lambda: epoch_batches(n, 2))
        assert drawn == [(0, n), (1, n), (2, n)]  # used: not drawn again
        resumed = decoded(ahead, 2, epoch_batches(n, 2)[3:])  # mid-epoch: primed set unused
        assert drawn[-1] == (2, n - 12)
    finally:
        ahead.close()
    fresh = DecodeAhead(BatchDecoder(photos, image_size=32, train=True, seed=0), 2)
    try:
        for got, want in zip(primed + resumed, decoded(fresh, 1, epoch_batches(n, 1))
                             + decoded(fresh, 2, epoch_batches(n, 2)[3:])):
            np.testing.assert_array_equal(got, want)
    finally:
        fresh.close()


def test_a_pool_counts_the_time_its_threads_wait_for_work(photos):
    """Pool.idle: the seconds its threads sat with nothing to decode (bench_kernel.py reports it
    to tell a starved pool from a slow one)."""
    decoder = BatchDecoder(photos, image_size=32, train=True, seed=0)
    pool = kernel.NATIVE.Pool(1)
    try:
        time.sleep(0.2)  # nothing queued: the thread waits
        waited = pool.idle
        assert 0.0 <= waited
        decoder.submit(pool, np.arange(len(photos)), 0,
                       np.zeros((len(photos), 32, 32, 3), np.uint8)).result()
        time.sleep(0.2)
        assert pool.idle >= waited + 0.1  # the idle spells are summed once each ends
    finally:
        pool.close()
    assert pool.idle == 0.0  # closed: nothing to ask


def test_worker_processes_decode_with_the_kernel(photos):
    """processes mode forks workers after the parent may have started pools: each worker uses
    its own decoder handle and gets the same batches as threads mode."""
    options = dict(train=True, batch_size=8, image_size=32, device=torch.device("cpu"), seed=3,
                   workers=2)
    batches = {}
    for mode in ("threads", "processes"):
        with build_pipeline("pytorch", photos, worker_mode=mode, **options) as pipeline:
            pipeline.set_epoch(1)
            batches[mode] = [images.clone() for images, _ in pipeline]
    assert all(torch.equal(a, b) for a, b in zip(batches["threads"], batches["processes"]))


# -- the fallback -----------------------------------------------------------------------------------
def test_the_python_path_runs_and_says_so_when_forced(tmp_path, photos):
    """TURBOTRAIN_NATIVE=0: `info` and the pipeline's start-up line say the Python path runs,
    and it delivers the same labels."""
    env = {**os.environ, kernel.DISABLE_VARIABLE: "0"}
    code = ("import json, logging, numpy, torch\n"
            "logging.basicConfig(level=logging.INFO)\n"
            "from turbotrain.datasets import open_dataset\n"
            "from turbotrain.pipeline import build_pipeline, kernel\n"
            f"ds = open_dataset({str(photos.path)!r})\n"
            "with build_pipeline('pytorch', ds, train=False, batch_size=8, image_size=32, "
            "device=torch.device('cpu'), workers=1) as p:\n"
            "    p.set_epoch(0)\n"
            "    labels = torch.cat([l for _, l in p]).tolist()\n"
            "print(json.dumps({'native': kernel.NATIVE is not None, 'labels': labels}))\n")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result == {"native": False, "labels": list(range(24))}
    assert "Python decode path (TURBOTRAIN_NATIVE=0)" in done.stderr
    info = subprocess.run([sys.executable, "-m", "turbotrain", "info"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert info.returncode == 0, info.stderr[-2000:]
    line, = [line for line in info.stdout.splitlines() if "decode kernel" in line]
    assert line.split() == ["decode", "kernel", "Python", "decode", "path",
                            "(TURBOTRAIN_NATIVE=0)"], line


def test_a_missing_kernel_is_one_line_with_the_fix(monkeypatch):
    """An import failure (not built: no libjpeg headers at install) becomes the status line."""
    import turbotrain.pipeline as package
    # Not bound when datasets/beton/map_guard.py loaded the extension from its file first.
    monkeypatch.delattr(package, "_native", raising=False)
    monkeypatch.setitem(sys.modules, "turbotrain.pipeline._native", None)  # import fails
    native, dtype, status = kernel._load()
    assert native is None and dtype is None
    assert status.startswith("Python decode path: the compiled kernel is missing (")
    assert "apt-get install libjpeg-dev" in status and "\n" not in status


def test_sample_records_match_the_kernels_layout():
    """The numpy record the tables are built with has the C struct's offsets and size."""
    assert kernel.SAMPLE_DTYPE.itemsize == kernel.NATIVE.SAMPLE_SIZE
    assert {name: kernel.SAMPLE_DTYPE.fields[name][1] for name in kernel.SAMPLE_DTYPE.names} \
        == kernel.NATIVE.SAMPLE_FIELDS
    assert augment.SMALL_IMAGE_PADDING == 2  # csrc/sample.c's SMALL_PADDING
    assert (layout.MODE_JPEG, layout.MODE_RAW) == (kernel.NATIVE.MODE_JPEG, kernel.NATIVE.MODE_RAW)
