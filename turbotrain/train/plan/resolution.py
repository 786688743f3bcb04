"""Progressive resizing's plan decision: whether a run ramps its training size, and the ramp.

The schedule itself is `turbotrain.pipeline.resolution` (FFCV's get_resolution, rounded to a
step); this module decides it, as a pure function of the run's image size, epochs, model and
data, with its reason (`progressive`), and turns a resolved config back into the schedule the
pipelines and the budget read (`schedule_of`).

The rule, in one place so the time-to-accuracy benchmark (bench/) can tune it:

* on for a conv net trained at PHOTO_MIN_SIZE px or more for MIN_EPOCHS or more: FFCV's
  ImageNet recipes (rn18/rn50, 16-88 epochs: 160 -> 192 px, ramp at ~70-85 % of the run) and
  Composer's Mild recipe (scale 0.5, ramp from 40 % to 80 % of the run) reach the same accuracy
  sooner by training the early epochs small;
* off by default for small images (pad-cropped), where it was measured not to pay; with
  --progressive (or --min-res / --res-ramp) they ramp from MIN_RES_FRACTION of the size (28 ->
  20 px, in 4 px steps) over the first quarter of the run (SMALL_RAMP), the rest at full size.
  Measured on Fashion-MNIST (compact28, 4 epochs, no TTA, 2 torch threads, the 2-core CPU box;
  final accuracy for seeds 0, 1, 2): a fixed 28 px 92.37, 92.21, 92.00 %; 20, 28, 28, 28 px
  (this ramp) 92.34, 92.06, 92.06 % (0.04 pt lower on average) for ~88 % of the time; 20, 24,
  28, 28 px 92.18, 91.78, 92.06 %; 24, 24, 28, 28 px 92.27, 91.81, 91.90 %. No ramp reached the
  fixed run's final accuracy in more than one seed of three (then 1.07-1.09x sooner), and even
  at equal accuracy ~12 % less time is not the 1.15x issue 42 asks for. Above SMALL_MAX_SIZE
  (CIFAR-size images and the airbench net) not measured;
* off for nets with a fixed input size (ViTs' patch grid), for runs too short to hold a ramp
  and, unless --res-ramp names its epochs, for a --time-budget run (its epochs are measured at
  start).

Defaults between the two recipes: from MIN_RES_FRACTION of the final size (FFCV 0.83, Composer
0.5), ramping between RAMP_START and RAMP_END of the epochs (Composer's start, FFCV's end).
"""
from __future__ import annotations

import math

from turbotrain.pipeline.resolution import ResolutionSchedule, default_step

from ..errors import TrainError
from .decision import Decision

PHOTO_MIN_SIZE = 128
MIN_EPOCHS = 8
MIN_RES_FRACTION = 0.75
RAMP_START = 0.4
RAMP_END = 0.85
# No schedule starts below this: torchvision's ResNets shrink 32x, and 64 px is already a 2x2
# last feature map.
SMALLEST_MIN_RES = 64
# Small images (module docstring): measured at 28 px only, and off unless asked for.
SMALL_MAX_SIZE = 28
# The ramp's start and end as shares of the epochs: the first quarter ramps, the rest trains at
# the full size (the ramp over the first half lost 0.19 pt on average, see the docstring).
SMALL_RAMP = (0.0, 0.25)
# Our small nets pool 2x twice (compact28: 28 -> 7): 16 px still leaves a 4x4 last map.
SMALLEST_SMALL_MIN_RES = 16

OFF = "off"


def progressive(asked: bool | None, *, image_size: int, epochs: int, small_images: bool,
                fixed_input: bool, min_res: int | None = None,
                res_ramp: tuple[float, float] | None = None,
                epochs_measured: bool = False) -> Decision:
    """The decision: a ResolutionSchedule (ending at `image_size`, the final training size) or
    OFF, with its reason. `asked`: --progressive / --no-progressive (None: the rule above);
    `min_res`, `res_ramp`: what --min-res and --res-ramp gave (None: the defaults);
    `epochs_measured`: --time-budget without --epochs. TrainError for a schedule that cannot
    run on this data or model."""
    if asked is False:
        return Decision(OFF, "--no-progressive", shown=False)
    given = asked is True or min_res is not None or res_ramp is not None
    why_not = _why_not(image_size=image_size, epochs=epochs, small_images=small_images,
                       fixed_input=fixed_input, ramp_given=res_ramp is not None,
                       epochs_measured=epochs_measured)
    if epochs_measured and given and res_ramp is None:
        raise TrainError("progressive resizing under --time-budget needs --res-ramp START END: "
                         "the run's epochs are measured at its start, so the default ramp "
                         "(a share of --epochs) has no epochs to go by")
    if why_not is not None:
        if given and fixed_input:
            raise TrainError(f"progressive resizing (--progressive, --min-res, --res-ramp) "
                             f"cannot run here: {why_not}; drop it or give --no-progressive")
        if not given:
            return Decision(OFF, why_not)
    schedule = default_schedule(image_size, epochs, min_res=min_res, res_ramp=res_ramp,
                                small_images=small_images)
    if schedule.min_res == schedule.max_res:
        return Decision(OFF, f"the first size, {schedule.min_res} px, is the final size: "
                        "nothing to ramp", shown=given)
    reason = "asked for" if given else _reason(image_size, epochs)
    return Decision(schedule, reason)


def _reason(image_size: int, epochs: int) -> str:
    return (f"a conv net at {image_size} px (>= {PHOTO_MIN_SIZE}) for {epochs} epochs "
            f"(>= {MIN_EPOCHS}): the early epochs train at {MIN_RES_FRACTION:g}x the size "
            f"(FFCV's and Composer's recipes), ramping over {RAMP_START:.0%}-{RAMP_END:.0%} "
            "of the run")


def _why_not(*, image_size: int, epochs: int, small_images: bool, fixed_input: bool,
             ramp_given: bool, epochs_measured: bool) -> str | None:
    if fixed_input:
        return "the model takes one input size (a ViT's patch grid)"
    if small_images and image_size > SMALL_MAX_SIZE:
        return (f"small images at {image_size} px (> {SMALL_MAX_SIZE}): not measured; "
                "--progressive ramps them")
    if small_images:
        return (f"small images at {image_size} px (<= {SMALL_MAX_SIZE}): measured on "
                "Fashion-MNIST (4 epochs, 3 seeds), the ramps from 20 or 24 px reached the "
                "fixed size's accuracy in at most one seed of three, 1.07-1.09x sooner; "
                "--progressive ramps them")
    if not small_images and image_size < PHOTO_MIN_SIZE:
        return (f"{image_size} px training (< {PHOTO_MIN_SIZE}): too little room to shrink "
                "for the saving to pay")
    if epochs_measured and not ramp_given:
        return ("a --time-budget run's epochs are measured at its start; --res-ramp START END "
                "ramps it by epoch")
    if epochs < MIN_EPOCHS and not ramp_given:
        return (f"{epochs} epochs (< {MIN_EPOCHS}): too short a run for a ramp and enough "
                "epochs at the final size")
    return None


def default_schedule(image_size: int, epochs: int, *, min_res: int | None = None,
                     res_ramp: tuple[float, float] | None = None,
                     small_images: bool = False) -> ResolutionSchedule:
    """The schedule ending at `image_size`, with the defaults for what was not given
    (`small_images`: the small-image defaults, module docstring)."""
    step = default_step(image_size)
    if min_res is None:
        floor = SMALLEST_SMALL_MIN_RES if small_images else SMALLEST_MIN_RES
        low = math.floor(MIN_RES_FRACTION * image_size / step) * step
        min_res = min(image_size, max(floor, low))
    if min_res > image_size:
        raise TrainError(f"--min-res {min_res} is above the final training size {image_size} "
                         "(--max-res / --image-size)")
    if res_ramp is None:
        first, last = (SMALL_RAMP if small_images else (RAMP_START, RAMP_END))
        res_ramp = (round(first * epochs), round(last * epochs))
    start, end = res_ramp
    return ResolutionSchedule(min_res=min_res, max_res=image_size, start_ramp=float(start),
                              end_ramp=float(end), step=step)


def schedule_of(config) -> ResolutionSchedule | None:
    """The schedule a resolved TrainConfig holds (progressive on, min_res and res_ramp set by
    the plan), or None: what the pipelines (PipelineOptions.resolution) and the budget read."""
    if not config.progressive or config.min_res is None or config.res_ramp is None:
        return None
    start, end = config.res_ramp
    return ResolutionSchedule(min_res=config.min_res, max_res=config.image_size,
                              start_ramp=float(start), end_ramp=float(end),
                              step=default_step(config.image_size))
