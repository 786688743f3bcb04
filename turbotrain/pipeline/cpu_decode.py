"""Decode, crop, resize and flip a batch on the CPU straight into a preallocated uint8 NHWC batch.

The CPU kernel behind the `pytorch` pipeline, `resident`'s first pass, `predict`, `eval` and
`bench`. A batch is one call into compiled code (csrc/, loaded by kernel.py):

    decoder = BatchDecoder(dataset, image_size=224, train=True, seed=0)
    decoder.decode(indices, epoch, out)             # one native call, the GIL released
    ahead = DecodeAhead(decoder, threads=2)         # batches decoded ahead on native threads
    for indices, images in ahead.run(epoch, batches, allocate): ...  # allocate(indices) -> tensor

What Python does per batch, vectorised (~40 us for 64 samples): the crop boxes and flips
(`augment`, pure functions of seed, epoch and index, so the output does not depend on which
thread decodes which sample; drawn 64 batches at a time, one group ahead, on a helper thread),
and the payload addresses gathered from the allocation tables
(`payload_addresses`, shard by shard), packed into one record table. What the kernel does per
sample, without the GIL: check the JPEG header against the metadata, decode only the box's rows
and iMCU columns at the DCT scale the box allows (libjpeg-turbo's jpeg_skip_scanlines /
jpeg_crop_scanline), resize with the Python path's filter rule (linear below 2x, area at or above,
in 14-bit fixed point: within a grey level of cv2's) and flip, into the batch's slot. A pool's
threads never touch Python, so a Python-busy training thread beside them costs them nothing;
only the consumer, which submits batches `depth` ahead, waits for the GIL.

Without the kernel (not built, or TURBOTRAIN_NATIVE=0) the same calls run the Python path
(python_decode.py) in a thread pool, and the pipelines' start-up line and `info` say so.
"""
from __future__ import annotations

import math
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Iterable, Iterator

import numpy as np

from turbotrain.datasets.beton.layout import MODE_JPEG
from turbotrain.held_setting import ONE_CV2_THREAD

from . import augment, kernel
from .base import PipelineError
from .python_decode import DECODE_OPTIONS, PythonSamples

__all__ = ["BatchDecoder", "DecodeAhead", "DECODE_OPTIONS", "ONE_CV2_THREAD",
           "SampleDecodeError"]


class SampleDecodeError(PipelineError):
    """One stored sample cannot be decoded; the message names the file and the sample."""


class BatchDecoder:
    """Turns sample indices into a uint8 (B, S, S, 3) batch for one split and one augmentation.

    S is the output's own size: `image_size` normally, an epoch's smaller size under
    progressive resizing (photo-sized images only; the crop boxes do not depend on S, and the
    kernel picks each sample's DCT scale from S, so a 160 px epoch decodes at 1/2 scale boxes
    that a 224 px one decodes whole). Thread-safe: each calling thread gets its own native
    decoder handle (or Python scratch buffers) on first use.
    """

    def __init__(self, dataset, *, image_size: int, train: bool, seed: int,
                 crop_ratio: float = 0.875,
                 scale: tuple[float, float] = augment.RESIZED_CROP_SCALE,
                 ratio: tuple[float, float] = augment.RESIZED_CROP_RATIO):
        # The split (or predict's StoredImages): payload_addresses(indices) and, for the
        # Python path, payload(i) / raw_image(i), by global index.
        self.dataset = dataset
        self.image_size = image_size
        self.seed = seed
        self.crop_ratio = crop_ratio
        self.scale, self.ratio = scale, ratio  # RandomResizedCrop's ranges (train --scale/--ratio)
        self.family = augment.choose_augmentation(dataset.heights, dataset.widths, train=train)
        self.small = self.family in (augment.PAD_CROP, augment.IDENTITY)
        self._modes = np.array(dataset.modes, dtype=np.uint8)
        self._heights = np.asarray(dataset.heights, dtype=np.int64)
        self._widths = np.asarray(dataset.widths, dtype=np.int64)
        self.native = kernel.NATIVE is not None
        self._python = PythonSamples(dataset, self._modes, self._heights, self._widths,
                                     image_size, self.small)
        self._local = threading.local()

    def __getstate__(self) -> dict:
        # The split pickles without its memory maps (PreparedSplit.__getstate__): a worker
        # process reopens each shard it reads, instead of receiving a copy of the whole split.
        state = dict(self.__dict__)
        del state["_local"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._local = threading.local()

    # -- public ---------------------------------------------------------------------------------
    def boxes(self, indices: np.ndarray, epoch: int) -> augment.CropBoxes:
        indices = np.asarray(indices, dtype=np.int64)
        return augment.crop_boxes(self.family, seed=self.seed, epoch=epoch, indices=indices,
                                  heights=self._heights[indices], widths=self._widths[indices],
                                  image_size=self.image_size, crop_ratio=self.crop_ratio,
                                  scale=self.scale, ratio=self.ratio)

    def decode(self, indices: np.ndarray, epoch: int, out: np.ndarray) -> None:
        """Writes sample ``indices[k]`` (augmented for `epoch`) into ``out[k]``; raises
        SampleDecodeError naming the first sample of the batch that does not decode."""
        indices = np.asarray(indices, dtype=np.int64)
        self.raise_failure(indices, self.decode_all(indices, epoch, out))

    def decode_all(self, indices: np.ndarray, epoch: int,
                   out: np.ndarray) -> list[tuple[int, str]]:
        """`decode` that goes on past bad samples (predict): [(position, reason)] of those that
        did not decode, whose slots hold no image."""
        indices = np.asarray(indices, dtype=np.int64)
        if not self.native:
            return self._decode_python(indices, epoch, out)
        worker = getattr(self._local, "worker", None)
        if worker is None:
            worker = self._local.worker = kernel.NATIVE.Worker()
        table, keep = self.sample_table(indices, epoch)
        failures = worker.run(table, self.size_of(out), self.small, out)
        del keep  # the memory the table points into lived until the call returned
        return failures

    def submit(self, pool, indices: np.ndarray, epoch: int, out: np.ndarray,
               boxes: augment.CropBoxes | None = None) -> "PendingBatch":
        """Queues the batch on a native `kernel.NATIVE.Pool`; returns at once. `boxes`: the
        batch's, when the caller drew them already (DecodeAhead, for many batches at once)."""
        indices = np.asarray(indices, dtype=np.int64)
        table, keep = self.sample_table(indices, epoch, boxes)
        return PendingBatch(self, indices, pool.submit(table, self.size_of(out), self.small, out,
                                                       (keep, out)))

    def size_of(self, out: np.ndarray) -> int:
        """The output size S of a (B, S, S, 3) batch; small images only at `image_size` (their
        pad-crop boxes are in its pixels)."""
        size = int(out.shape[1])
        if out.ndim != 4 or out.shape[2] != size or out.shape[3] != 3:
            raise ValueError(f"a batch is (B, S, S, 3) uint8, not {tuple(out.shape)}")
        if self.small and size != self.image_size:
            raise ValueError(f"small images decode at {self.image_size} px only (got {size})")
        return size

    def sample_table(self, indices: np.ndarray, epoch: int,
                     boxes: augment.CropBoxes | None = None) -> tuple[np.ndarray, object]:
        """The kernel's record per sample (kernel.SAMPLE_DTYPE), vectorised over the batch, and
        what keeps the memory it points into alive."""
        boxes = self.boxes(indices, epoch) if boxes is None else boxes
        addresses, sizes, keep = self.dataset.payload_addresses(indices)
        table = kernel.sample_table(data=addresses, size=sizes, height=self._heights[indices],
                                    width=self._widths[indices], top=boxes.top, left=boxes.left,
                                    box_h=boxes.height, box_w=boxes.width,
                                    mode=self._modes[indices], flip=boxes.flip)
        return table, keep

    def raise_failure(self, indices: np.ndarray, failures: list[tuple[int, str]]) -> None:
        """Raises the first of the kernel's [(position, reason)] of a batch, if any."""
        if failures:
            position, reason = failures[0]
            raise self._error(int(indices[position]), reason)

    # -- Python path ----------------------------------------------------------------------------
    def _decode_python(self, indices: np.ndarray, epoch: int,
                       out: np.ndarray) -> list[tuple[int, str]]:
        boxes = self.boxes(indices, epoch)
        self.size_of(out)
        failures = []
        for k, i in enumerate(indices.tolist()):
            try:
                self._python.decode_one(self._local, i, boxes.row(k), out[k])
            except (ValueError, OSError) as e:  # simplejpeg raises ValueError on corrupt data
                failures.append((k, str(e)))
        return failures

    def _error(self, i: int, reason: str) -> SampleDecodeError:
        what = "JPEG" if self._modes[i] == MODE_JPEG else "raw image"
        where = getattr(self.dataset, "where", None)  # predict's StoredImages has no shards
        place = where(i) if where else f"{self.dataset.path}: sample {i}"
        return SampleDecodeError(f"{place} does not decode as a {what} ({reason})")


class PendingBatch:
    """A batch queued on the native pool: `result()` waits (without the GIL) and raises the
    batch's SampleDecodeError; `cancel()` drops what has not started and waits for the rest,
    so the pool never writes into a buffer nobody holds."""

    def __init__(self, decoder: BatchDecoder, indices: np.ndarray, job):
        self.decoder, self.indices, self.job = decoder, indices, job

    def result(self) -> None:
        self.decoder.raise_failure(self.indices, self.job.wait())

    def cancel(self) -> None:
        self.job.cancel()


# Samples queued ahead per decode thread: with 2, a thread that finishes finds the next sample
# waiting while the consumer (which waits up to the 5 ms GIL switch interval beside a
# Python-busy thread) submits more.
SAMPLES_AHEAD_PER_THREAD = 2
# Batches the consumer keeps in flight at least: the one it waits for and two behind it.
MIN_BATCHES_AHEAD = 3
# The Python path's thread pool decodes one batch per task: 2 tasks per thread keep it busy
# while the consumer takes one (the DataLoader's prefetch_factor default too).
PYTHON_TASKS_PER_THREAD = 2
# Crop boxes are drawn for this many batches at once: augment's vectorised draw costs ~500 us
# of fixed numpy overhead per call and ~1 us per sample (64 samples: ~590 us; 2,000: ~1.5 ms).
# The next group is drawn on a helper thread while this one is decoded: numpy drops the GIL in
# each of the draw's few dozen array operations, and beside a Python-busy thread getting it back
# costs up to the 5 ms switch interval each time, so a group drawn by the consumer took 11-290 ms
# there (2.3 ms alone), longer than the batches in flight (3 x ~50 ms): the pool starved for
# 14-24 % of the time.
BOX_BATCHES = 64


class DecodeAhead:
    """Decodes batches in order, a few ahead of the consumer, on `threads` threads: a native
    pool (each batch spread over all threads) or, on the Python path, a thread pool running one
    batch per task. `allocate(indices)` gives each batch's output tensor (pinned, shared, a
    slice of a store, ...)."""

    def __init__(self, decoder: BatchDecoder, threads: int):
        self.decoder = decoder
        self.threads = max(1, threads)
        if decoder.native:
            self.pool, self._release_cv2 = kernel.NATIVE.Pool(self.threads), None
            self._drawer = ThreadPoolExecutor(1, thread_name_prefix="turbotrain-boxes")
            self._primed = None  # (epoch, future of (its first group, their boxes))
        else:
            self.pool = ThreadPoolExecutor(self.threads, thread_name_prefix="turbotrain-decode")
            self._release_cv2 = ONE_CV2_THREAD.hold()

    def depth(self, batch_size: int) -> int:
        if not self.decoder.native:
            return self.threads * PYTHON_TASKS_PER_THREAD
        per_batch = max(1, batch_size)
        return max(MIN_BATCHES_AHEAD,
                   math.ceil(SAMPLES_AHEAD_PER_THREAD * self.threads / per_batch) + 1)

    def run(self, epoch: int, batches: Iterable[np.ndarray],
            allocate: Callable[[np.ndarray], "torch.Tensor"],
            upcoming: Callable[[], list[np.ndarray]] | None = None
            ) -> Iterator[tuple[np.ndarray, object]]:
        """`upcoming()`: the batches of epoch + 1 as the order will give them, so that the
        boxes of its first group are drawn while this epoch ends (used only if that epoch's
        run starts with those very batches)."""
        pending = self._with_boxes(epoch, iter(batches), upcoming)
        in_flight: deque = deque()

        def submit_next() -> None:
            indices, boxes = next(pending, (None, None))
            if indices is None:
                return
            images = allocate(indices)
            if self.decoder.native:
                task = self.decoder.submit(self.pool, indices, epoch, images.numpy(), boxes)
            else:
                task = self.pool.submit(self.decoder.decode, indices, epoch, images.numpy())
            in_flight.append((indices, images, task))

        first = next(pending, (None, None))
        if first[0] is None:
            return
        pending = _prepend(first, pending)
        for _ in range(self.depth(len(first[0]))):
            submit_next()
        try:
            while in_flight:
                indices, images, task = in_flight[0]
                task.result()  # re-raises the batch's SampleDecodeError here
                in_flight.popleft()
                submit_next()
                yield indices, images
        finally:
            for _, _, task in in_flight:  # the caller stopped early or a batch failed
                task.cancel()

    def _with_boxes(self, epoch: int, batches: Iterator[np.ndarray],
                    upcoming: Callable[[], list[np.ndarray]] | None = None):
        """(indices, their CropBoxes or None) per batch; on the native path the boxes are
        drawn BOX_BATCHES batches at a time, the next group on the helper thread while this
        one is handed out, and the next epoch's first group while this epoch's last is (the
        Python path draws its own)."""
        if not self.decoder.native:
            while group := _box_group(batches):
                yield from ((indices, None) for indices in group)
            return
        group = _box_group(batches)
        drawn = (self._primed_boxes(epoch, group)
                 or self._drawer.submit(self._draw, group, epoch))
        while group:
            boxes = drawn.result()
            following = _box_group(batches)
            if following:
                drawn = self._drawer.submit(self._draw, following, epoch)
            elif upcoming is not None:
                self._prime(epoch + 1, upcoming)
            start = 0
            for indices in group:
                yield indices, boxes.slice(start, start + len(indices))
                start += len(indices)
            group = following

    def _draw(self, group: list[np.ndarray], epoch: int) -> augment.CropBoxes | None:
        return self.decoder.boxes(np.concatenate(group), epoch) if group else None

    def _prime(self, epoch: int, upcoming: Callable[[], list[np.ndarray]]) -> None:
        """Draws the boxes of `epoch`'s first group on the helper thread."""
        def draw():
            group = _box_group(iter(upcoming()))
            return group, self._draw(group, epoch)
        self._primed = (epoch, self._drawer.submit(draw))

    def _primed_boxes(self, epoch: int, group: list[np.ndarray]):
        """A future of `group`'s boxes if they were primed for exactly these batches."""
        primed, self._primed = self._primed, None
        if primed is None or primed[0] != epoch:
            return None
        expected, boxes = primed[1].result()
        if len(expected) != len(group) or not all(
                np.array_equal(a, b) for a, b in zip(expected, group)):
            return None  # resumed mid-epoch, another order, or another epoch number
        done: Future = Future()
        done.set_result(boxes)
        return done

    def close(self) -> None:
        if self.decoder.native:
            self.pool.close()
            self._drawer.shutdown(wait=True, cancel_futures=True)
        else:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self._release_cv2()


def _box_group(batches: Iterator[np.ndarray]) -> list[np.ndarray]:
    """The next BOX_BATCHES batches of `batches` (fewer at its end, [] once it is done)."""
    return [np.asarray(b, dtype=np.int64) for _, b in zip(range(BOX_BATCHES), batches)]


def _prepend(first, rest: Iterator) -> Iterator:
    yield first
    yield from rest
