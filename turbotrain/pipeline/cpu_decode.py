"""Decode, crop, resize and flip samples on the CPU straight into a preallocated uint8 NHWC batch.

The CPU kernel behind the `pytorch` pipeline (and a building block for any CPU loader). Speed
choices, measured on this project's 2-core AVX-512 machine with 500x375 q90 JPEGs (61 KB) going
to 224x224:

* Codec: simplejpeg (libjpeg-turbo) decodes ~1,650 img/s per core, cv2.imdecode ~1,620 (and
  gives BGR), PIL ~1,280; simplejpeg releases the GIL, so threads scale (2 threads: ~2,540/s).
* Crop before resizing: only the crop box is resized. The resize is the cost that matters after
  decode (~600 us): cv2 INTER_AREA costs ~420 us for a 300x340 -> 224 box (fractional ratios
  have no fast path), INTER_LINEAR ~60 us. So we shrink with INTER_LINEAR while the box is less
  than 2x the output (mild aliasing, the box is covered by the 2-tap filter at least every other
  pixel) and with INTER_AREA only at >= 2x, where bilinear would skip pixels.
* DCT-scaled decode: when the crop box is at least 2x the output on both sides, libjpeg-turbo
  decodes at 1/2, 1/4 or 1/8 scale inside the IDCT (a 1/2 decode runs ~1,960/s vs 1,650/s full),
  which also does the low-pass filtering for free. Only power-of-two factors are used
  (``min_factor=2``): the M/8 factors in between decode *slower* than full size (7/8: ~1,020/s).
* Allocate once: each thread owns a decode buffer sized for the largest image in the split;
  samples are written into their slot of the batch (``cv2.resize(dst=...)``), flipped in place.

Augmentation parameters come from `augment` (pure functions of seed, epoch and sample index),
so the output does not depend on which thread decodes which sample.
"""
from __future__ import annotations

import threading

import numpy as np

from turbotrain.datasets.format import MODE_JPEG, MODE_RAW
from turbotrain.held_setting import HeldSetting

from . import augment
from .base import PipelineError

# libjpeg-turbo DCT scaling factors we allow (see the module docstring): powers of two only.
_DCT_FACTORS = (8, 4, 2)
# The fast integer IDCT: what FFCV decodes with too (TJFLAG_FASTDCT in libffcv.cpp), so pixels
# match FFCV's quality; 5-15 % faster decodes here (907 -> 760 us per 500x375 photo, one core).
# `turbotrain bench`'s bare-decode limit uses the same options, so the ratio stays honest.
DECODE_OPTIONS = {"fastdct": True}


def _cv2_threads() -> int:
    import cv2
    return cv2.getNumThreads()


def _set_cv2_threads(count: int) -> None:
    import cv2
    cv2.setNumThreads(count)


# We parallelise across samples; cv2's own thread pool inside each resize only adds overhead.
# OpenCV's thread count is process-wide, so it is one explicit step of whoever runs decodes in
# threads of its own (the pytorch and resident pipelines while they live, predict while it
# runs): they hold this, and the last to let go gives the process its own count back
# (held_setting.py). Worker processes of ours set it for good in their setup.
ONE_CV2_THREAD = HeldSetting(_cv2_threads, _set_cv2_threads, lambda: 1)


class SampleDecodeError(PipelineError):
    """One stored sample cannot be decoded; the message names the file and the sample."""


class BatchDecoder:
    """Turns sample indices into a uint8 (B, S, S, 3) batch for one split and one augmentation.

        decoder = BatchDecoder(dataset, image_size=224, train=True, seed=0)
        decoder.decode(indices, epoch, out)    # out: writable uint8 array (>= B, S, S, 3)

    Thread-safe: per-thread scratch buffers are created on first use by each thread. Whoever
    calls `decode` from several threads holds ONE_CV2_THREAD meanwhile.
    """

    def __init__(self, dataset, *, image_size: int, train: bool, seed: int,
                 crop_ratio: float = 0.875,
                 scale: tuple[float, float] = augment.RESIZED_CROP_SCALE,
                 ratio: tuple[float, float] = augment.RESIZED_CROP_RATIO):
        # The split (or predict's StoredImages): payload(i) / raw_image(i) by global index; a
        # sharded split finds the shard.
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
        largest = int((self._heights * self._widths).max()) if len(self._heights) else 1
        self._decode_bytes = largest * 3
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
        """Writes sample ``indices[k]`` (augmented for `epoch`) into ``out[k]``."""
        boxes = self.boxes(indices, epoch)
        for k, i in enumerate(np.asarray(indices).tolist()):
            self.decode_one(i, boxes.row(k), out[k])

    def decode_one(self, i: int, box: tuple[int, int, int, int, bool], out: np.ndarray) -> None:
        """Sample i cropped to `box` = (top, left, height, width, flip), resized into `out`."""
        try:
            if self.small:
                self._small(i, box, out)
            else:
                self._cropped(i, box, out)
        except (ValueError, OSError) as e:  # simplejpeg raises ValueError on corrupt data
            what = "JPEG" if self._modes[i] == MODE_JPEG else "raw image"
            raise SampleDecodeError(f"{self._where(i)} does not decode as a {what} "
                                    f"({e})") from e

    def _where(self, i: int) -> str:
        where = getattr(self.dataset, "where", None)  # predict's StoredImages has no shards
        return where(i) if where else f"{self.dataset.path}: sample {i}"

    # -- kernels --------------------------------------------------------------------------------
    def _scratch(self):
        local = self._local
        if not hasattr(local, "decode_buffer"):
            s, p = self.image_size, augment.SMALL_IMAGE_PADDING
            local.decode_buffer = np.empty(self._decode_bytes, dtype=np.uint8)
            local.resized = np.empty((s, s, 3), dtype=np.uint8)
            local.padded = np.empty((s + 2 * p, s + 2 * p, 3), dtype=np.uint8)
        return local

    def _source(self, i: int, box_h: int, box_w: int) -> tuple[np.ndarray, float, float]:
        """Sample i as HWC uint8, possibly DCT-downscaled so the box stays >= the output; and
        the (y, x) scale from stored to returned pixels."""
        height, width = int(self._heights[i]), int(self._widths[i])
        if self._modes[i] == MODE_RAW:
            return self.dataset.raw_image(i), 1.0, 1.0
        import simplejpeg
        payload = self.dataset.payload(i)
        # The stored JPEG must be the size its metadata says (1.4 us, 0.2 % of a decode): the
        # buffer is sized for the split's largest image, so a lying one would otherwise decode
        # at a DCT scale that fits and be cropped as if it were the size the metadata gives.
        declared = simplejpeg.decode_jpeg_header(payload)[:2]
        if declared != (height, width):
            raise ValueError(f"its JPEG header declares {declared[1]}x{declared[0]} pixels, the "
                             f"metadata {width}x{height}")
        s = self.image_size
        factor = next((f for f in _DCT_FACTORS if box_h >= f * s and box_w >= f * s), 1)
        image = simplejpeg.decode_jpeg(
            payload, colorspace="rgb",
            min_height=-(-height // factor), min_width=-(-width // factor),
            min_factor=float(factor), buffer=self._scratch().decode_buffer, **DECODE_OPTIONS)
        return image, image.shape[0] / height, image.shape[1] / width

    def _cropped(self, i: int, box, out: np.ndarray) -> None:
        import cv2
        top, left, box_h, box_w, flip = box
        image, sy, sx = self._source(i, box_h, box_w)
        y0, x0 = int(top * sy), int(left * sx)
        y1 = min(max(y0 + 1, round((top + box_h) * sy)), image.shape[0])
        x1 = min(max(x0 + 1, round((left + box_w) * sx)), image.shape[1])
        crop = image[y0:y1, x0:x1]
        resize_into(cv2, crop, out)
        if flip:
            cv2.flip(out, 1, dst=out)

    def _small(self, i: int, box, out: np.ndarray) -> None:
        """Small images: resize to S if needed, then reflect-pad and crop (box may be outside)."""
        import cv2
        top, left, box_h, box_w, flip = box
        image, _, _ = self._source(i, 0, 0)
        s = self.image_size
        if image.shape[0] != s or image.shape[1] != s:
            image = resize_into(cv2, image, self._scratch().resized)
        if top == 0 and left == 0:
            np.copyto(out, image)
        else:
            p = augment.SMALL_IMAGE_PADDING
            padded = self._scratch().padded
            cv2.copyMakeBorder(image, p, p, p, p, cv2.BORDER_REFLECT_101, dst=padded)
            np.copyto(out, padded[top + p:top + p + box_h, left + p:left + p + box_w])
        if flip:
            cv2.flip(out, 1, dst=out)


def resize_into(cv2, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Resizes src into the preallocated dst (see the module docstring for the filter choice)."""
    out_h, out_w = dst.shape[:2]
    if src.shape[0] == out_h and src.shape[1] == out_w:
        np.copyto(dst, src)
        return dst
    shrink = min(src.shape[0] / out_h, src.shape[1] / out_w)
    interpolation = cv2.INTER_AREA if shrink >= 2 else cv2.INTER_LINEAR
    result = cv2.resize(src, (out_w, out_h), dst=dst, interpolation=interpolation)
    if result is not dst and result.ctypes.data != dst.ctypes.data:
        np.copyto(dst, result)  # cv2 reallocated (never seen; kept so a binding change is safe)
    return dst
