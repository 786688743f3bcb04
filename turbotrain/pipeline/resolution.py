"""Progressive resizing: the training resolution as a pure function of the epoch.

FFCV's schedule (`get_resolution` in ffcv-imagenet's train_imagenet.py): `min_res` until
`start_ramp`, then a linear ramp to `max_res` at `end_ramp`, `max_res` after it, each size
rounded to a multiple of `step`. The rounding keeps the sizes few (160 -> 192 px at step 32 is
two sizes), so `torch.compile` builds one graph per size, never a dynamic-shape one.

    schedule = ResolutionSchedule(min_res=160, max_res=192, start_ramp=11, end_ramp=13)
    schedule.size(epoch)           # 160, ..., 160, 176 -> 160 or 192, 192, ...
    schedule.sizes(epochs=16)      # the size of each epoch

A pipeline is built with the schedule in `PipelineOptions.resolution` and asks it for the
epoch's size in `set_epoch` (base.Pipeline.size_at): the crop boxes and the sample order are
those of a fixed-size run; only the size each box is resized to changes. Like the order and the
crops it depends on the epoch alone, so a run resumed mid-epoch gets the same size. Small
images (pad-cropped at their own size) are cropped at the final size as always and the batch is
resized on its device (`resize_batch`, called by ordered.OrderedPipeline for every pipeline).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch.nn import functional as F

from turbotrain.datasets.beton.layout import SMALL_IMAGE_MAX_SIDE

# FFCV's rounding step for its 160-192 px ImageNet ramp. Below 160 px a step of 32 leaves one
# size between 96 and 128 and none between 64 and 96 px; 16 keeps a ramp there gradual.
LARGE_STEP = 32
SMALL_STEP = 16
LARGE_FROM = 160
# Schedules ending at a small image's size (<= SMALL_IMAGE_MAX_SIDE, pad-cropped) step by 4 px:
# our small nets pool 2x twice before their last stages (compact28: 28 -> 14 -> 7), so a
# multiple of 4 keeps every pooled map whole, and 28 px has sizes 16, 20, 24 below it.
TINY_STEP = 4


def default_step(max_res: int) -> int:
    """The rounding step for a schedule ending at `max_res` (constants above)."""
    if max_res <= SMALL_IMAGE_MAX_SIDE:
        return TINY_STEP
    return LARGE_STEP if max_res >= LARGE_FROM else SMALL_STEP


def resolution_for_epoch(epoch: float, *, min_res: int, max_res: int, start_ramp: float,
                         end_ramp: float, step: int) -> int:
    """The training size of `epoch`: np.interp from (start_ramp, min_res) to (end_ramp, max_res),
    rounded to a multiple of `step` and kept within [min_res, max_res] (FFCV's get_resolution,
    which can round past the ends; ours clamps so the first and last sizes are those asked)."""
    if end_ramp <= start_ramp:  # a step change at start_ramp (np.interp needs increasing xp)
        size = float(min_res if epoch < start_ramp else max_res)
    else:
        size = float(np.interp(epoch, [start_ramp, end_ramp], [min_res, max_res]))
    rounded = int(np.round(size / step)) * step
    return int(min(max(rounded, min_res), max_res))


@dataclass(frozen=True)
class ResolutionSchedule:
    """One progressive-resizing schedule (see resolution_for_epoch); picklable, so a worker
    process gets it with the pipeline's options."""
    min_res: int
    max_res: int
    start_ramp: float
    end_ramp: float
    step: int = 0  # 0: default_step(max_res)

    def __post_init__(self):
        if self.step == 0:
            object.__setattr__(self, "step", default_step(self.max_res))
        check_schedule(self.min_res, self.max_res, self.start_ramp, self.end_ramp, self.step)

    def size(self, epoch: int) -> int:
        return resolution_for_epoch(epoch, min_res=self.min_res, max_res=self.max_res,
                                    start_ramp=self.start_ramp, end_ramp=self.end_ramp,
                                    step=self.step)

    def sizes(self, epochs: int) -> list[int]:
        """The size of each of epochs 0 .. epochs - 1."""
        return [self.size(e) for e in range(epochs)]

    def shares(self, epochs: int) -> dict[int, float]:
        """Each size of an `epochs`-epoch run and the share of its epochs at it (each epoch has
        the same images, so the share of its training images): what a measurement that stands
        for the whole run weighs each size by (tune)."""
        sizes = self.sizes(epochs)
        return {size: sizes.count(size) / len(sizes) for size in sorted(set(sizes))}

    def first_epoch_at(self, size: int, epochs: int) -> int:
        """The first of `epochs` epochs trained at `size` (ValueError if none is)."""
        return self.sizes(epochs).index(size)

    def __str__(self) -> str:  # how a run's decisions and `info` show it
        return (f"{self.min_res} -> {self.max_res} px between epochs {self.start_ramp:g} and "
                f"{self.end_ramp:g}, in steps of {self.step} px")


def check_schedule(min_res: int, max_res: int, start_ramp: float, end_ramp: float,
                   step: int) -> None:
    """ValueError naming the setting that cannot make a schedule."""
    if not 8 <= min_res <= max_res:
        raise ValueError(f"the resolution schedule needs 8 <= min_res <= max_res "
                         f"(got {min_res}, {max_res})")
    if not 0 <= start_ramp <= end_ramp:
        raise ValueError(f"the resolution ramp needs 0 <= start <= end epochs "
                         f"(got {start_ramp:g}, {end_ramp:g})")
    if step < 1:
        raise ValueError(f"the resolution step must be >= 1 (got {step})")


def resize_batch(images: torch.Tensor, size: int) -> torch.Tensor:
    """A (B, 3, S, S) uint8 channels_last batch resized to `size` px on its device: bilinear,
    antialiased (an area average when shrinking, as the photo pipelines' resized crops). On the
    CPU torch resizes uint8 channels_last directly (0.8 ms for 128 images 28 -> 20 px, 15x less
    than through float32); CUDA has no uint8 kernel for it, so it goes through float32 there."""
    if images.shape[-1] == size and images.shape[-2] == size:
        return images
    if images.device.type == "cpu":
        out = F.interpolate(images, size=(size, size), mode="bilinear", antialias=True)
    else:
        out = F.interpolate(images.float(), size=(size, size), mode="bilinear",
                            antialias=True).round_().clamp_(0, 255).to(torch.uint8)
    return out.contiguous(memory_format=torch.channels_last)
