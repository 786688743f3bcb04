"""Crops and flips of a whole batch gathered from a resident uint8 NHWC store, on its device.

Two operations, both writing a fresh uint8 (B, S, S, 3) batch:

* `ShiftedCrops`: fixed-size crops at per-sample offsets, optionally mirrored (pad-and-crop for
  small images; the store is padded and mirrored once at load time). One gather does the
  selection, the crop and the flip together (airbench spends ~3 kernels per batch on it).
* `ResizedCrops`: a box per sample resized to S x S, optionally mirrored (RandomResizedCrop).
  On CUDA: the CPU kernel's filter (linear, area from a 2x shrink) as per-sample weight taps,
  gathered and summed in float a chunk of samples at a time (`_on_device`: the same pixels as
  the CPU path within a grey level, in a fixed work memory). On the CPU such batched gathers
  cost far more than the kernel (grid_sample took ~1.1 ms per 224 px sample, 69 ms per 64 on
  2 cores), while a box resizes in ~60-100 us, so the CPU path hands the batch to the compiled
  kernel as raw samples (cpu_decode's crop, resize and flip, on its own threads, without the
  GIL), or without the kernel runs cv2 per sample on a thread pool.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from turbotrain.datasets.beton.layout import MODE_RAW
from turbotrain.held_setting import ONE_CV2_THREAD

from . import kernel
from .base import PipelineError
from .python_decode import resize_into


class ShiftedCrops:
    """Fixed-size crops at per-sample offsets, optionally mirrored, from a padded store.

    The store holds every padded image twice, as stored and mirrored (``store[n + count]`` is
    ``store[n]`` flipped left-right), so that a flip is only a different source window. A crop
    row is then 3 * S contiguous bytes of the store, and the whole batch is ONE `index_select`
    of B * S rows from a zero-copy `as_strided` view whose row k is the 3 * S bytes starting at
    pixel k. 512 CIFAR crops: 0.16 ms on one core, vs 0.86 ms for a per-pixel gather and
    another 0.86 ms to flip a masked half of the batch afterwards; mirroring costs 2x memory.
    """

    def __init__(self, store: torch.Tensor, count: int, size: int, mirrored: bool):
        total, height, width, channels = store.shape
        if total != count * (2 if mirrored else 1) or not store.is_contiguous():
            raise ValueError(f"store of shape {tuple(store.shape)} does not hold {count} "
                             f"images{' and their mirrors' if mirrored else ''}")
        self.count, self.size, self.mirrored = count, size, mirrored
        self.height, self.width, self.channels = height, width, channels
        pixels = total * height * width
        self.windows = torch.as_strided(store, (pixels - size + 1, size * channels),
                                        (channels, 1))
        self.steps = torch.arange(size, device=store.device)

    def __call__(self, indices: torch.Tensor, top: torch.Tensor, left: torch.Tensor,
                 flip: torch.Tensor | None = None) -> torch.Tensor:
        """``out[k] = padded[indices[k], top[k]:top[k]+S, left[k]:left[k]+S]``, mirrored where
        ``flip[k]``; offsets are in padded pixels and must keep the crop inside. A store
        without mirrors takes ``flip=None``: looking into a device tensor for a flip would wait
        for the GPU on every batch (the caller checks its host-side boxes once an epoch)."""
        if self.mirrored:
            # The mirror of a window at column `left` is the window at `width - S - left`.
            indices = indices + self.count * flip
            left = torch.where(flip, self.width - self.size - left, left)
        elif flip is not None and (flip.device.type != "cpu" or bool(flip.any())):
            raise ValueError("this store has no mirrored copies: pass flip=None, or build it "
                             "with mirrored=True")
        rows = (indices * self.height + top)[:, None] + self.steps          # (B, S)
        starts = rows * self.width + left[:, None]                           # first pixel
        crops = self.windows.index_select(0, starts.view(-1))
        return crops.view(len(indices), self.size, self.size, self.channels)


# Samples resized together on a device (ResizedCrops._on_device): bounds its float work to
# ~120 MB at 224 px from a 256 px store, whatever the batch, for a handful of launches more.
DEVICE_CHUNK = 64


def _taps(side: int, size: int) -> int:
    """Input pixels one output pixel can read along an axis: 2 (linear) or, for a box as large
    as the store (`side`), an area span of side / size pixels straddling ceil + 1."""
    return max(2, -(-side // size) + 1)


def _axis_weights(start: torch.Tensor, length: torch.Tensor, out: int, taps: int,
                  area: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(first input pixel (B, out) int64, weights (B, out, taps) float32) resizing each
    sample's span [start, start + length) to `out` pixels, as resample.c plans it: linear at
    x = (d + 0.5) * scale - 0.5 clamped inside the span, or where `area`, each input pixel
    weighted by its overlap with [d * scale, (d + 1) * scale). Weights past the span are 0."""
    span = length.to(torch.float32)[:, None]                              # (B, 1)
    scale = span / out
    d = torch.arange(out, device=start.device, dtype=torch.float32)[None]  # (1, out)
    t = torch.arange(taps, device=start.device, dtype=torch.float32)       # (T,)
    x = (d + 0.5) * scale - 0.5
    s0 = x.floor()
    edge = (s0 < 0) | (s0 >= span - 1)
    s0 = torch.minimum(s0.clamp(min=0), span - 1)
    frac = torch.where(edge, 0.0, x - x.floor())[..., None]
    linear = torch.where(t == 0, 1 - frac, torch.where(t == 1, frac, torch.zeros_like(frac)))
    f1 = d * scale
    a0 = f1.floor()
    pixel = a0[..., None] + t                                              # (B, out, T)
    overlap = torch.minimum(pixel + 1, (f1 + scale)[..., None]) - torch.maximum(pixel,
                                                                                f1[..., None])
    areas = overlap.clamp_(min=0) / scale[..., None]
    first = torch.where(area[:, None], a0, s0).long() + start[:, None]
    return first, torch.where(area[:, None, None], areas, linear)


class ResizedCrops:
    """Resizes one box per sample of a resident store to S x S (see the module docstring);
    S is `size` unless a call names another (an epoch's size under progressive resizing)."""

    def __init__(self, store: torch.Tensor, size: int, threads: int):
        self.store = store
        self.size = size
        self.pool = self.native = None
        if store.device.type == "cpu":
            self._store_np = store.numpy()
            self.threads = max(1, threads)
            if kernel.NATIVE is not None:
                self.native = kernel.NATIVE.Pool(self.threads)
            else:
                import cv2
                self._cv2 = cv2
                self._release_cv2 = ONE_CV2_THREAD.hold()  # parallel over samples instead
                self.pool = ThreadPoolExecutor(self.threads, thread_name_prefix="turbotrain-crop")

    def __call__(self, indices: torch.Tensor, boxes: torch.Tensor,
                 size: int | None = None) -> torch.Tensor:
        """`boxes`: int64 (B, 5) rows of (top, left, height, width, flip) in stored pixels."""
        s = self.size if size is None else size
        if self.native is not None:
            return self._native(indices.numpy(), boxes.numpy(), s)
        if self.pool is not None:
            return self._cpu(indices.numpy(), boxes.numpy(), s)
        return self._on_device(indices, boxes, s)

    def _native(self, indices: np.ndarray, boxes: np.ndarray, s: int) -> torch.Tensor:
        """The store's images as the kernel's raw samples: one call for the batch."""
        side = self._store_np.shape[1]
        per_image = side * side * 3
        table = kernel.sample_table(
            data=self._store_np.ctypes.data + indices.astype(np.int64) * per_image,
            size=per_image, height=side, width=side, top=boxes[:, 0], left=boxes[:, 1],
            box_h=boxes[:, 2], box_w=boxes[:, 3], mode=MODE_RAW, flip=boxes[:, 4])
        out = torch.empty((len(indices), s, s, 3), dtype=torch.uint8)
        failures = self.native.submit(table, s, False, out.numpy(), self._store_np).wait()
        if failures:  # boxes come from augment, inside the store: never seen
            position, reason = failures[0]
            raise PipelineError(f"resident: crop {position} of a batch failed ({reason})")
        return out

    def _on_device(self, indices: torch.Tensor, boxes: torch.Tensor,
                   s: int | None = None) -> torch.Tensor:
        """The CPU kernel's resize (resample.c: cv2's INTER_LINEAR, INTER_AREA from a 2x
        shrink, each clamped to its box) as float gathers on the store's device, DEVICE_CHUNK
        samples at a time, so its work memory is a constant (work_bytes) the batch search
        reserves, whatever the batch. Only the box's rows are gathered (the full-square float
        copy grid_sample needed took ~400 MB a batch at 512). Every pixel within 1 grey level
        of the kernel's, which rounds its fixed-point weights (test_batched_crops.py)."""
        s = self.size if s is None else s
        out = torch.empty((len(indices), s, s, 3), dtype=torch.uint8, device=self.store.device)
        for start in range(0, len(indices), DEVICE_CHUNK):
            part = slice(start, start + DEVICE_CHUNK)
            out[part] = self._resize_chunk(indices[part], boxes[part], s)
        return out

    def _resize_chunk(self, indices: torch.Tensor, boxes: torch.Tensor, s: int) -> torch.Tensor:
        store = self.store
        side = store.shape[1]
        taps = _taps(side, s)
        top, left, box_h, box_w, flip = boxes.unbind(1)
        area = torch.minimum(box_h, box_w) >= 2 * s  # the kernel's switch: a 2x shrink
        first_y, weight_y = _axis_weights(top, box_h, s, taps, area)
        first_x, weight_x = _axis_weights(left, box_w, s, taps, area)
        mirrored = flip.bool()[:, None]  # output column q reads the box's column S - 1 - q
        first_x = torch.where(mirrored, first_x.flip(1), first_x)
        weight_x = torch.where(mirrored[..., None], weight_x.flip(1), weight_x)
        sample = indices[:, None]
        mid = None  # (B, S, W, 3): the box's rows resampled, all columns
        for t in range(taps):
            rows = (first_y + t).clamp_(0, side - 1)
            term = store[sample, rows].float().mul_(weight_y[..., t, None, None])
            mid = term if mid is None else mid.add_(term)
        batch = torch.arange(len(indices), device=store.device)[:, None]
        out = None  # (B, S, S, 3)
        for t in range(taps):
            cols = (first_x + t).clamp_(0, side - 1)
            # mid[b, :, cols[b, q]] -> (B, S_q, S_y, 3), weighted in place; (B, S_y, S_q, 3)
            # by a view
            term = mid[batch, :, cols].mul_(weight_x[:, :, t, None, None]).permute(0, 2, 1, 3)
            out = term if out is None else out.add_(term)
        return out.round_().clamp_(0, 255).to(torch.uint8)

    @staticmethod
    def work_bytes(side: int, size: int) -> int:
        """Device memory _on_device works in beside its output, for a store of `side` px
        resized to `size`, per DEVICE_CHUNK samples at its peak: the row pass's float result,
        one float tap and its uint8 gather; then that result beside the column pass's float
        result and one float tap (the larger of the two passes, as a bound)."""
        rows = size * side * 3 * (4 + 4 + 1)
        cols = size * side * 3 * 4 + size * size * 3 * (4 + 4)
        return DEVICE_CHUNK * max(rows, cols)


    def _cpu(self, indices: np.ndarray, boxes: np.ndarray, s: int) -> torch.Tensor:
        cv2 = self._cv2
        out = torch.empty((len(indices), s, s, 3), dtype=torch.uint8)
        out_np = out.numpy()

        def work(start: int) -> None:
            for k in range(start, len(indices), self.threads):
                top, left, h, w, flip = (int(v) for v in boxes[k])
                resize_into(cv2, self._store_np[indices[k], top:top + h, left:left + w],
                             out_np[k])
                if flip:
                    cv2.flip(out_np[k], 1, dst=out_np[k])
        list(self.pool.map(work, range(self.threads)))
        return out

    def close(self) -> None:
        if self.native is not None:
            self.native.close()
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self._release_cv2()
