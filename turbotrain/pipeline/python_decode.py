"""The Python decode path: what `cpu_decode.BatchDecoder` runs when the compiled kernel is not
built (or TURBOTRAIN_NATIVE=0), and the reference the kernel's tests compare against.

Per sample: simplejpeg (libjpeg-turbo) decodes, DCT-scaled when the box is at least 2x the
output, numpy slices the box, cv2 resizes it into its slot of the batch and flips it. Each of
those calls releases the GIL, but the ~15 Python steps between them take it back, so beside a
Python-busy thread (a training loop's main thread) a decode thread waits up to the 5 ms switch
interval after each: 64 images/s instead of 1,478 alone (issue 21). The kernel has no such steps.

Speed choices (2-core AVX-512 box, 500x375 q90 JPEGs -> 224):
* codec: simplejpeg ~1,650 img/s per core, cv2.imdecode ~1,620 (and BGR), PIL ~1,280;
* resize filter: INTER_LINEAR (~60 us) while the box is < 2x the output, INTER_AREA (~420 us
  for 300x340 -> 224, no fast path for fractional ratios) only at >= 2x, where bilinear would
  skip pixels; DCT scaling (1/2: ~1,960 img/s vs 1,650 full) covers the big boxes for free.
"""
from __future__ import annotations

import numpy as np

from turbotrain.datasets.beton.layout import MODE_RAW

from . import augment

# libjpeg-turbo DCT scaling factors we allow: powers of two only (the M/8 factors in between
# decode *slower* than full size: 7/8 ~1,020/s against 1,650/s).
DCT_FACTORS = (8, 4, 2)
# The fast integer IDCT: what FFCV decodes with too (TJFLAG_FASTDCT in libffcv.cpp), so pixels
# match FFCV's quality; 5-15 % faster decodes here (907 -> 760 us per 500x375 photo, one core).
# `turbotrain bench`'s bare-decode limit uses the same options, so the ratio stays honest.
DECODE_OPTIONS = {"fastdct": True}


def dct_factor(box_h: int, box_w: int, image_size: int) -> int:
    """The largest allowed DCT scale at which the box still covers the output (1: none)."""
    return next((f for f in DCT_FACTORS if box_h >= f * image_size and box_w >= f * image_size),
                1)


class PythonSamples:
    """Decodes one sample at a time into its slot (see the module docstring); `scratch` is a
    per-thread namespace with the buffers it reuses."""

    def __init__(self, dataset, modes: np.ndarray, heights: np.ndarray, widths: np.ndarray,
                 image_size: int, small: bool):
        self.dataset = dataset
        self.modes, self.heights, self.widths = modes, heights, widths
        self.image_size = image_size
        self.small = small
        largest = int((heights * widths).max()) if len(heights) else 1
        self.decode_bytes = largest * 3

    def decode_one(self, scratch, i: int, box: tuple[int, int, int, int, bool],
                   out: np.ndarray) -> None:
        """Sample i cropped to `box` = (top, left, height, width, flip), resized into `out`.
        Raises ValueError or OSError when the sample does not decode."""
        if self.small:
            self._small(scratch, i, box, out)
        else:
            self._cropped(scratch, i, box, out)

    def _buffers(self, scratch):
        if not hasattr(scratch, "decode_buffer"):
            s, p = self.image_size, augment.SMALL_IMAGE_PADDING
            scratch.decode_buffer = np.empty(self.decode_bytes, dtype=np.uint8)
            scratch.resized = np.empty((s, s, 3), dtype=np.uint8)
            scratch.padded = np.empty((s + 2 * p, s + 2 * p, 3), dtype=np.uint8)
        return scratch

    def _source(self, scratch, i: int, box_h: int, box_w: int, size: int):
        """Sample i as HWC uint8, possibly DCT-downscaled so the box stays >= the output's
        `size`; and the (y, x) scale from stored to returned pixels."""
        height, width = int(self.heights[i]), int(self.widths[i])
        if self.modes[i] == MODE_RAW:
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
        factor = dct_factor(box_h, box_w, size)
        image = simplejpeg.decode_jpeg(
            payload, colorspace="rgb",
            min_height=-(-height // factor), min_width=-(-width // factor),
            min_factor=float(factor), buffer=self._buffers(scratch).decode_buffer,
            **DECODE_OPTIONS)
        return image, image.shape[0] / height, image.shape[1] / width

    def _cropped(self, scratch, i: int, box, out: np.ndarray) -> None:
        import cv2
        top, left, box_h, box_w, flip = box
        image, sy, sx = self._source(scratch, i, box_h, box_w, out.shape[0])
        y0, x0 = int(top * sy), int(left * sx)
        y1 = min(max(y0 + 1, round((top + box_h) * sy)), image.shape[0])
        x1 = min(max(x0 + 1, round((left + box_w) * sx)), image.shape[1])
        resize_into(cv2, image[y0:y1, x0:x1], out)
        if flip:
            cv2.flip(out, 1, dst=out)

    def _small(self, scratch, i: int, box, out: np.ndarray) -> None:
        """Small images: resize to S if needed, then reflect-pad and crop (box may be outside)."""
        import cv2
        top, left, box_h, box_w, flip = box
        image, _, _ = self._source(scratch, i, 0, 0, self.image_size)
        s = self.image_size
        if image.shape[0] != s or image.shape[1] != s:
            image = resize_into(cv2, image, self._buffers(scratch).resized)
        if top == 0 and left == 0:
            np.copyto(out, image)
        else:
            p = augment.SMALL_IMAGE_PADDING
            padded = self._buffers(scratch).padded
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
