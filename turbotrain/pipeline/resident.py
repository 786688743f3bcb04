"""`resident`: the whole split decoded once into one uint8 tensor on the device (airbench-style).

Loading decodes every sample once, with the CPU kernel and all workers, into a uint8 NHWC
store on the target device:

* small images (CIFAR-style, see `augment`): at ``image_size`` (resized if stored otherwise),
  reflect-padded once by SMALL_IMAGE_PADDING and, for training, kept mirrored too, so a
  pad-and-crop + flip is one gather of whole crop rows (`batched_crops.ShiftedCrops`: 5.9 M
  CIFAR crops/s on one CPU core at batch 512, ~6x a per-pixel gather plus a flip);
* photo-sized images: the centred ``min(h, w)`` square resized to ``round(image_size /
  crop_ratio)`` (256 for 224), the resolution evaluation crops from. Training's RandomResizedCrop
  boxes are then drawn on that square (the edges of non-square photos are not seen; that is the
  price of one fixed-size tensor). Under progressive resizing the store stays at the final
  size and each epoch's boxes are resized to that epoch's size, on the device on CUDA.

Each batch is then pure device work with no workers: the epoch's order and every crop box are
computed once per epoch (numpy, see `order`/`augment`) and moved to the device in one copy;
a batch is an index slice, one gather (small images) or one batched resized crop (photos), and
a label gather. Keeping uint8 on the device costs 4x less memory than float32 and the stem
normalises anyway.

If the store would not fit in the memory budget (a fraction of the free device memory, or of
the available RAM on a CPU device) the builder raises PipelineUnavailable naming both sizes,
and `auto` falls back to a streaming pipeline.
"""
from __future__ import annotations

import logging

import numpy as np
import torch

from ..host import available_ram
from . import augment
from .base import PipelineError, PipelineOptions, PipelineUnavailable
from .batched_crops import ResizedCrops, ShiftedCrops
from .cpu_decode import BatchDecoder, DecodeAhead
from .ordered import OrderedPipeline
from .registry import Capabilities, register_pipeline
from .transfer import as_nchw
from .workers import choose_workers

log = logging.getLogger(__name__)

# Share of the free memory the store may take: the model, its activations, optimizer state
# (and on the CPU the OS page cache of the .beton) need the rest.
RESIDENT_MEMORY_FRACTION = 0.5
# Samples decoded per loading step: ~50 MB of 224 px images, bounded host memory.
LOAD_CHUNK = 256
# First in auto's order when the decoded split fits its budget: nothing is decoded after the
# first epoch. Its batches are index slices and gathers made in the training process between
# steps (cpu_workers = 0 below says why that leaves torch every core).
CAPABILITIES = Capabilities(preference=10, holds_decoded_split=True, reads_during_epoch=False,
                            loads_in_process=True)


def memory_budget(device: torch.device) -> tuple[int, str]:
    """(bytes the store may use on `device`, how that was worked out)."""
    device = torch.device(device)
    free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else available_ram()
    return budget_of(free, device)


def budget_of(free: int, device: torch.device | str) -> tuple[int, str]:
    """memory_budget for `free` bytes on `device` (train/plan.py plans with a Machine's)."""
    device = torch.device(device)
    where = (f"{free / 2**30:.1f} GiB free on {device}" if device.type == "cuda" else
             f"{free / 2**30:.1f} GiB of available RAM")
    return int(free * RESIDENT_MEMORY_FRACTION), f"{RESIDENT_MEMORY_FRACTION:.0%} of the {where}"


class StoreLayout:
    """What the resident store of a split looks like (computable before decoding anything)."""

    def __init__(self, dataset, options: PipelineOptions):
        self.small = augment.is_small(dataset.heights, dataset.widths)
        if self.small:
            self.side = options.image_size   # the decoded image
            self.pad = augment.SMALL_IMAGE_PADDING
        else:
            self.side = max(options.image_size, round(options.image_size / options.crop_ratio))
            self.pad = 0
        self.stored = self.side + 2 * self.pad
        self.num_samples = len(dataset)
        self.mirrored = self.small and options.train  # flips are only drawn when training
        self.copies = 2 if self.mirrored else 1

    @property
    def nbytes(self) -> int:
        return self.copies * self.num_samples * self.stored * self.stored * 3

    def crop_work_bytes(self, image_size: int) -> int:
        """Device memory the photo crops work in beside the store and the batch (a constant:
        ResizedCrops.work_bytes); small images are gathered, not resized: 0."""
        return 0 if self.small else ResizedCrops.work_bytes(self.stored, image_size)


def resident_bytes(dataset, options: PipelineOptions) -> int:
    """Device bytes the resident store of `dataset` would take with `options`."""
    return StoreLayout(dataset, options).nbytes


def crop_work_bytes(dataset, options: PipelineOptions) -> int:
    """Device bytes the resident pipeline's CUDA crops work in (the batch search reserves them)."""
    return StoreLayout(dataset, options).crop_work_bytes(options.image_size)


class ResidentPipeline(OrderedPipeline):
    name = "resident"
    # The split is decoded into the store when built: no shards to announce.
    reads_during_epoch = CAPABILITIES.reads_during_epoch

    def __init__(self, dataset, options: PipelineOptions):
        super().__init__(dataset, options)
        self.layout = StoreLayout(dataset, options)
        budget, how = memory_budget(self.device)
        if self.layout.nbytes > budget:
            raise PipelineUnavailable(
                f"resident: the decoded split needs {_gib(self.layout.nbytes)} "
                f"({len(dataset)} images of {self.layout.stored}x{self.layout.stored}x3 uint8), "
                f"more than the memory budget of {_gib(budget)} ({how}); use a streaming "
                f"pipeline such as pytorch")
        self.workers, _ = choose_workers(options.workers, "cpu")
        self.family = augment.choose_augmentation(dataset.heights, dataset.widths,
                                                  train=options.train)
        self.store = self._load(dataset)
        self.labels = torch.as_tensor(np.asarray(dataset.labels, dtype=np.int64),
                                      device=self.device)
        if self.layout.small:
            self.crops = ShiftedCrops(self.store, len(dataset), options.image_size,
                                      mirrored=self.layout.mirrored)
        else:
            self.crops = ResizedCrops(self.store, options.image_size, max(1, self.workers))
        # CPU threads busy beside the model's compute (the trainer's thread budget gives the
        # rest to torch): none. Every batch is made inside next(), between steps, while torch's
        # threads are idle; even the photo crops' cv2 pool is waited for there. Counting that
        # pool as busy gave torch 1 of 2 cores on the demo (airbench at 64 px: 126 images/s,
        # data wait 0 %) for crops that take ~2 ms of a ~1 s step.
        self.cpu_workers = 0
        log.info("resident: %d images stored as %dx%d uint8 on %s (%s)", len(dataset),
                 self.layout.stored, self.layout.stored, self.device, _gib(self.layout.nbytes))

    def _load(self, dataset) -> torch.Tensor:
        """Decodes every sample once into the (N, stored, stored, 3) uint8 device store."""
        layout, n = self.layout, len(dataset)
        # Photos: the centred min-side square (crop_ratio=1) at `side`; small: resized to side.
        decoder = BatchDecoder(dataset, image_size=layout.side, train=False, seed=0,
                               crop_ratio=1.0)
        store = torch.empty((layout.copies * n, layout.stored, layout.stored, 3),
                            dtype=torch.uint8, device=self.device)
        p = layout.pad
        pinned = self.device.type == "cuda"
        # Straight into the store when it is host memory in the decoded layout (CPU photos): no
        # staging copy. Otherwise a host batch, padded and mirrored here, then copied over.
        in_place = self.device.type == "cpu" and not p and not layout.mirrored
        chunks = [np.arange(s, min(s + LOAD_CHUNK, n)) for s in range(0, n, LOAD_CHUNK)]

        def allocate(indices: np.ndarray) -> torch.Tensor:
            if in_place:
                return store[int(indices[0]):int(indices[0]) + len(indices)]
            return torch.empty((len(indices), layout.side, layout.side, 3), dtype=torch.uint8,
                               pin_memory=pinned)
        ahead = DecodeAhead(decoder, max(1, self.workers))
        try:
            for indices, host in ahead.run(0, chunks, allocate):
                if in_place:
                    continue
                if p:  # padded into another pinned buffer: the copy below stays asynchronous
                    padded = torch.empty((len(indices), layout.stored, layout.stored, 3),
                                         dtype=torch.uint8, pin_memory=pinned)
                    reflect_pad_into(host.numpy(), padded.numpy(), p)
                    host = padded
                start = int(indices[0])
                stored = store[start:start + len(indices)]
                stored.copy_(host, non_blocking=pinned)  # pinned: no wait for the GPU
                if layout.mirrored:  # copy 1, the mirrors at index + n: made where they live
                    store[n + start:n + start + len(indices)].copy_(stored.flip(2))
        finally:
            ahead.close()
        if pinned:
            torch.cuda.synchronize(self.device)
        return store

    def _produce(self, epoch: int, batches: list[np.ndarray]):
        if not batches:
            return
        samples = np.concatenate(batches)
        side, size = self.layout.side, self.decode_size(epoch)
        full = np.full(len(samples), side, dtype=np.int64)
        boxes = augment.crop_boxes(self.family, seed=self.options.seed, epoch=epoch,
                                   indices=samples, heights=full, widths=full,
                                   image_size=self.options.image_size,
                                   crop_ratio=self.options.crop_ratio,
                                   scale=self.options.scale, ratio=self.options.ratio)
        if self.layout.small and not self.layout.mirrored and boxes.flip.any():  # host-side
            raise PipelineError("resident: flips drawn for a store kept without mirrors")
        # One host-to-device copy per epoch for the order and every box.
        table = np.stack([samples, boxes.top + self.layout.pad, boxes.left + self.layout.pad,
                          boxes.height, boxes.width, boxes.flip.astype(np.int64)], axis=1)
        table = torch.from_numpy(table).to(self.device)
        start = 0
        for indices in batches:
            rows = table[start:start + len(indices)]
            start += len(indices)
            index = rows[:, 0]
            if self.layout.small:
                flip = rows[:, 5].bool() if self.layout.mirrored else None
                images = self.crops(index, rows[:, 1], rows[:, 2], flip)
            else:
                images = self.crops(index, rows[:, 1:6], size)
            yield as_nchw(images), self.labels[index]

    def close(self) -> None:
        if isinstance(self.crops, ResizedCrops):
            self.crops.close()
        self.store = self.crops = None


def reflect_pad_into(images: np.ndarray, out: np.ndarray, pad: int) -> np.ndarray:
    """`images` (N, H, W, C) reflect-padded by `pad` on each side into `out` (N, H+2p, W+2p, C):
    torch's 'reflect' = cv2's BORDER_REFLECT_101 = np.pad's "reflect" (no repeated edge). Into
    the caller's buffer (pinned for a CUDA store) rather than np.pad's fresh pageable array,
    which made every chunk's host-to-device copy synchronous."""
    h, w = images.shape[1:3]
    if pad > min(h, w) - 2:  # tiny images: np.pad reflects more than once (never stored so)
        np.copyto(out, np.pad(images, ((0, 0), (pad, pad), (pad, pad), (0, 0)), mode="reflect"))
        return out
    out[:, pad:pad + h, pad:pad + w] = images
    out[:, pad:pad + h, :pad] = images[:, :, pad:0:-1]                # left: columns p..1
    out[:, pad:pad + h, pad + w:] = images[:, :, w - 2:w - 2 - pad:-1]  # right: w-2 down
    out[:, :pad] = out[:, 2 * pad:pad:-1]                               # top, whole rows
    out[:, pad + h:] = out[:, pad + h - 2:h - 2:-1]                     # bottom
    return out


def _gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:.2f} GiB"


@register_pipeline("resident", CAPABILITIES)
def build_resident(dataset, options: PipelineOptions) -> ResidentPipeline:
    return ResidentPipeline(dataset, options)
