"""Crops and flips of a whole batch gathered from a resident uint8 NHWC store, on its device.

Two operations, both writing a fresh uint8 (B, S, S, 3) batch:

* `ShiftedCrops`: fixed-size crops at per-sample offsets, optionally mirrored (pad-and-crop for
  small images; the store is padded and mirrored once at load time). One gather does the
  selection, the crop and the flip together (airbench spends ~3 kernels per batch on it).
* `resized_crops`: a box per sample resized to S x S, optionally mirrored (RandomResizedCrop).
  On CUDA: one `F.grid_sample` over the batch with per-sample affine grids (bilinear; the flip
  is a negative x scale). On the CPU grid_sample costs ~1.1 ms per 224 px sample (69 ms per 64
  on 2 cores; roi_align 220 ms), while a box resizes in ~60-100 us, so the CPU path hands the
  batch to the compiled kernel as raw samples (cpu_decode's crop, resize and flip, on its own
  threads, without the GIL), or without the kernel runs cv2 per sample on a thread pool.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
import torch.nn.functional as F

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
                 flip: torch.Tensor) -> torch.Tensor:
        """``out[k] = padded[indices[k], top[k]:top[k]+S, left[k]:left[k]+S]``, mirrored where
        ``flip[k]``; offsets are in padded pixels and must keep the crop inside."""
        if self.mirrored:
            # The mirror of a window at column `left` is the window at `width - S - left`.
            indices = indices + self.count * flip
            left = torch.where(flip, self.width - self.size - left, left)
        elif bool(flip.any()):
            raise ValueError("this store has no mirrored copies; build it with mirrored=True")
        rows = (indices * self.height + top)[:, None] + self.steps          # (B, S)
        starts = rows * self.width + left[:, None]                           # first pixel
        crops = self.windows.index_select(0, starts.view(-1))
        return crops.view(len(indices), self.size, self.size, self.channels)


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
        return self._grid_sample(indices, boxes, s)

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

    def _grid_sample(self, indices: torch.Tensor, boxes: torch.Tensor,
                     s: int | None = None) -> torch.Tensor:
        s = self.size if s is None else s
        batch = self.store[indices].permute(0, 3, 1, 2).float()   # (B, 3, H, W) channels_last
        height, width = batch.shape[2], batch.shape[3]
        top, left, box_h, box_w, flip = boxes.to(torch.float32).unbind(1)
        # align_corners=False: x_in = a * x_out + b maps the output's edges [-1, 1] onto the
        # box's pixel edges [left, left + w] in the input's [-1, 1] frame.
        sign = 1.0 - 2.0 * flip
        theta = torch.zeros(len(boxes), 2, 3, device=batch.device)
        theta[:, 0, 0] = sign * box_w / width
        theta[:, 0, 2] = (2 * left + box_w) / width - 1
        theta[:, 1, 1] = box_h / height
        theta[:, 1, 2] = (2 * top + box_h) / height - 1
        grid = F.affine_grid(theta, [len(boxes), 3, s, s], align_corners=False)
        out = F.grid_sample(batch, grid, mode="bilinear", padding_mode="border",
                            align_corners=False)
        out = out.round_().clamp_(0, 255).to(torch.uint8)
        return out.permute(0, 2, 3, 1).contiguous()                # NHWC bytes

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
