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
crops it depends on the epoch alone, so a run resumed mid-epoch gets the same size.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# FFCV's rounding step for its 160-192 px ImageNet ramp. Below 160 px a step of 32 leaves one
# size between 96 and 128 and none between 64 and 96 px; 16 keeps a ramp there gradual.
LARGE_STEP = 32
SMALL_STEP = 16
LARGE_FROM = 160


def default_step(max_res: int) -> int:
    """The rounding step for a schedule ending at `max_res` (constants above)."""
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
