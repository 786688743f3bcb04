"""The one batch contract every pipeline honours; the trainer never knows which pipeline runs.

A pipeline turns one prepared split into batches for one rank:

* iterating yields ``(images, labels)``: ``images`` is a uint8 tensor of logical shape
  ``(B, 3, S, S)`` in ``torch.channels_last`` memory format (its bytes are NHWC, so the view is
  zero-copy) on the target device; ``labels`` is int64 ``(B,)`` on the same device. Pixels stay
  uint8 until the model's input stem normalises them on the device: shipping uint8 moves 4x fewer
  bytes over the bus than float32.
* ``len(pipeline)`` is the number of batches this rank yields per epoch.
* ``set_epoch(e)`` selects the epoch (order and augmentation depend on (seed, epoch)), and with
  a resolution schedule (``options.resolution``, training only) the batches' size S: every
  pipeline resizes the same crop boxes to ``size_at(epoch)`` (resolution.py).
* ``state_dict()`` / ``load_state_dict()`` save and restore the position inside an epoch, so a
  resumed run sees exactly the batches it would have seen.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Iterator

import torch

from turbotrain.augment_policy import AugmentPolicy

from . import augment
from .order import ORDERS
from .resolution import ResolutionSchedule


class PipelineError(RuntimeError):
    """A pipeline cannot be built or failed while running; the message is one line for the user."""


class PipelineUnavailable(PipelineError):
    """This pipeline cannot run here (missing package, no GPU, data too big for the budget).

    `auto` catches it and falls back to the next choice.
    """


@dataclass(frozen=True)
class PipelineOptions:
    """What every pipeline is built with (`build_pipeline` takes these as keywords)."""
    train: bool
    batch_size: int
    image_size: int
    device: torch.device
    seed: int = 0
    rank: int = 0
    world_size: int = 1
    workers: int | None = None  # None: from the thread budget
    drop_last: bool | None = None  # None: True when training, False for eval
    crop_ratio: float = 0.875  # eval centre crop = image_size / crop_ratio resized, then cropped
    # pytorch pipeline: "threads" (decode threads in this process, measured fastest), or
    # "processes" (a torch DataLoader with worker processes); None: the pipeline's default.
    worker_mode: str | None = None
    # RandomResizedCrop's area scale and aspect ratio ranges (training on photo-sized images;
    # train --scale / --ratio): every pipeline passes them to augment.crop_boxes.
    scale: tuple[float, float] = augment.RESIZED_CROP_SCALE
    ratio: tuple[float, float] = augment.RESIZED_CROP_RATIO
    # The training order (order.py): "random" (a full permutation per epoch) or "quasi-random"
    # (blocks permuted, samples shuffled within `order_window` blocks at a time: for splits
    # larger than memory or the remote cache). Evaluation is sequential either way.
    order: str = "random"
    order_window: int = 4
    # Progressive resizing (resolution.py; training only): each epoch's batches are
    # `resolution.size(epoch)` px, ending at `image_size` (its max_res). None: always image_size.
    resolution: ResolutionSchedule | None = None
    # RandAugment / TrivialAugment, colour jitter, random erasing (train --aa, --color-jitter,
    # --reprob): applied to training batches after decode by every pipeline alike
    # (after_decode.py). None: none of them.
    augment: AugmentPolicy | None = None

    def __post_init__(self):
        if self.order not in ORDERS:
            raise ValueError(f"order must be one of {', '.join(ORDERS)} (got {self.order!r})")
        if self.resolution is not None and self.resolution.max_res != self.image_size:
            raise ValueError(f"the resolution schedule ends at {self.resolution.max_res} px, "
                             f"the image size is {self.image_size}: they must be the same")
        if self.order_window < 1:
            raise ValueError(f"order_window must be >= 1 (got {self.order_window})")
        object.__setattr__(self, "scale", tuple(float(v) for v in self.scale))
        object.__setattr__(self, "ratio", tuple(float(v) for v in self.ratio))
        augment.check_crop_range(self.scale, self.ratio)

    @property
    def drops_last(self) -> bool:
        return self.train if self.drop_last is None else self.drop_last

    def size_at(self, epoch: int) -> int:
        """The batches' size S in `epoch`: the schedule's when training with one, else
        image_size (evaluation is always at image_size)."""
        if self.resolution is None or not self.train:
            return self.image_size
        return self.resolution.size(epoch)


class Pipeline(abc.ABC):
    """Base class of every registered pipeline (see the module docstring for the contract)."""

    name: str = ""
    # Whether the class runs options.augment on its training batches (OrderedPipeline does);
    # one that does not refuses to be built with it rather than train unaugmented silently.
    applies_augment: bool = False

    def __init__(self, dataset, options: PipelineOptions):
        augments = options.augment is not None and options.augment.enabled
        if options.train and augments and not self.applies_augment:
            raise PipelineError(f"the {self.name or type(self).__name__} pipeline does not "
                                "apply --aa / --color-jitter / --reprob; choose another "
                                "--pipeline or drop them")
        self.dataset = dataset
        self.options = options
        self.epoch = 0
        self.batch_index = 0  # next batch to yield within the epoch

    @abc.abstractmethod
    def __len__(self) -> int: ...

    @abc.abstractmethod
    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]: ...

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.batch_index = 0
        self.epoch = epoch

    @property
    def image_size(self) -> int:
        """The size S of the current epoch's batches (options.size_at)."""
        return self.options.size_at(self.epoch)

    def size_at(self, epoch: int) -> int:
        return self.options.size_at(epoch)

    def state_dict(self) -> dict:
        return {"pipeline": self.name, "epoch": self.epoch, "batch_index": self.batch_index}

    def load_state_dict(self, state: dict) -> None:
        self.epoch = int(state["epoch"])
        self.batch_index = int(state["batch_index"])

    def close(self) -> None:
        """Release workers/threads/device memory; safe to call twice."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
