"""The common body of pipelines that control their sample order (all of ours).

`OrderedPipeline` owns the order (`order.order_for`: `SampleOrder`, or `QuasiRandomOrder` with
``options.order="quasi-random"``), `__len__`, and the position bookkeeping behind
`state_dict()`: the batch counter advances as each batch is handed to the caller, so a state
saved while batch k is being used resumes at batch k + 1. Subclasses only turn a list of index
batches into device batches (`_produce`). Training batches then go through the
augmentations after decode (`options.augment`: after_decode.py) here, with the sample indices
of each batch, so all pipelines apply them alike.

Before each pass it tells the split which shards the remaining batches read, in order
(``split.will_read(shard_ids)``): a remote split's cache prefetches them and keeps them from
eviction; a local split ignores the hint. A pipeline that reads nothing during an epoch
(`resident`: it decoded the split when built) declares ``reads_during_epoch=False`` in its
registry.Capabilities and sets the class attribute from it.

Under progressive resizing (resolution.py) a photo pipeline resizes each crop box to the epoch's
size itself (`decode_size`). Small images are pad-cropped at `image_size` in every pipeline as
at a fixed size, and the batch is then resized to the epoch's size here, on its device
(resolution.resize_batch): the same crops and order in all four pipelines, from one place.
"""
from __future__ import annotations

import abc
from typing import Iterator

import numpy as np
import torch

from . import augment
from .after_decode import AfterDecode
from .base import Pipeline, PipelineOptions
from .order import order_for, shards_in_order
from .resolution import resize_batch


class OrderedPipeline(Pipeline):
    """A Pipeline fed by `order.order_for(dataset, options)`."""

    reads_during_epoch = True
    applies_augment = True  # __iter__ runs options.augment (after_decode.py)

    def __init__(self, dataset, options: PipelineOptions):
        super().__init__(dataset, options)
        if options.batch_size < 1 or options.image_size < 1:
            raise ValueError(f"batch_size and image_size must be >= 1 "
                             f"(got {options.batch_size}, {options.image_size})")
        # Small (pad-cropped) images: a schedule's sizes are made by resize_batch, not decoded.
        self.small = augment.is_small(dataset.heights, dataset.widths)
        self.order = order_for(dataset, options)
        self.device = torch.device(options.device)
        policy = options.augment
        # Fill and noise in the stem's units: the dataset's pixel mean and std.
        self.after_decode = (AfterDecode(policy, seed=options.seed,
                                         mean=getattr(dataset, "mean", None),
                                         std=getattr(dataset, "std", None))
                             if options.train and policy is not None and policy.enabled
                             else None)

    def __len__(self) -> int:
        return len(self.order)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        epoch = self.epoch
        batches = self.order.batches(epoch)[self.batch_index:]
        self._announce(batches)
        size = self.size_at(epoch)
        shrink = size != self.decode_size(epoch)
        for indices, (images, labels) in zip(batches, self._produce(epoch, batches)):
            if shrink:  # small images: pad-cropped at their size, then the epoch's size
                images = resize_batch(images, size)
            if self.after_decode is not None:  # the same per-sample draws for every pipeline
                images = self.after_decode(images, indices, epoch)
            self.batch_index += 1
            yield images, labels
        if self.epoch == epoch:
            # A finished epoch starts over if iterated again without set_epoch (DataLoader-like).
            self.batch_index = 0

    def decode_size(self, epoch: int) -> int:
        """The side `_produce` makes `epoch`'s batches at: the epoch's size (size_at), except
        for small images, pad-cropped at `image_size` and resized after (module docstring)."""
        return self.options.image_size if self.small else self.size_at(epoch)

    def _announce(self, batches: list[np.ndarray]) -> None:
        """`split.will_read` with the shards `batches` read, in order (module docstring)."""
        will_read = getattr(self.dataset, "will_read", None)
        bounds = getattr(self.dataset, "shard_bounds", None)
        if will_read is None or bounds is None or not self.reads_during_epoch or not batches:
            return
        will_read(shards_in_order(bounds, np.concatenate(batches)))

    @abc.abstractmethod
    def _produce(self, epoch: int, batches: list[np.ndarray]
                 ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Yields one (images, labels) device batch per entry of `batches`, in order."""
