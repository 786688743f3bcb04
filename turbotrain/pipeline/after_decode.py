"""The augmentations after decode (`--aa`, `--color-jitter`, `--reprob`): one batch-level stage
on the uint8 batch, wherever it is (the GPU, or the CPU when training there), the same for
every pipeline.

`OrderedPipeline` (ordered.py) calls `AfterDecode` on each training batch with the batch's
sample indices, after the pipeline decoded, cropped and flipped it, so resident, pytorch, dali
and ffcv batches get exactly the same augmentations. Every image's draws are
`augment.sample_uniforms(seed, epoch, sample index, draws=...)` (counter-based, per sample),
made on the host with numpy, so an image gets the same augmentation whatever its batch, its
batch size, the pipeline, the worker count or a mid-epoch resume. Only the images an op
applies to go through it, and only their parameters cross to the device, from pinned memory,
without a synchronisation. Order as timm's transforms: RandAugment / TrivialAugment, or colour
jitter when --aa is off, then random erasing (timm erases the normalised tensor; here the fill
is written in pixels, `mean + std * z` rounded to uint8, with the dataset's mean and std, the
stem's normalisation, so the stem sees timm's N(0, 1) noise up to that rounding).

Draw numbers: colour jitter 1000-1003, RandAugment 1100 + 8 per layer (rand_augment.py),
random erasing 1200 on; the crops use 0-22.
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import torch

from turbotrain.augment_policy import TRIVIAL, AugmentPolicy

from . import image_ops, rand_augment
from .augment import sample_uniforms
from .transfer import host_array_to

JITTER_DRAWS = 1000
_ORDERS = np.array(list(itertools.permutations(range(3))))  # torchvision: a random order
_JITTER_OPS = (image_ops.brightness, image_ops.contrast, image_ops.color)
ERASE_DRAWS = 1200
_ERASE_APPLY, _ERASE_COUNT, _ERASE_SEED = 0, 1, 2
_ERASE_CHANNELS = 3  # 6 draws: a normal per channel (--remode rand)
_ERASE_ATTEMPTS = 10  # each box: 10 attempts x (area, aspect), then top, left
_PER_BOX = 2 * _ERASE_ATTEMPTS + 2
ERASE_AREA = (0.02, 1 / 3)  # timm's RandomErasing min_area, max_area
ERASE_ASPECT = 0.3  # min_aspect; max 1 / 0.3, log-uniform
FALLBACK_MEAN, FALLBACK_STD = 128.0, 64.0  # a dataset.json without pixel stats (timm fills 128)


class AfterDecode:
    """`stage(images, indices, epoch)`: the batch with `policy` applied (a new tensor when any
    image changes, else `images` itself, never written to: it may be a pipeline's store)."""

    def __init__(self, policy: AugmentPolicy, *, seed: int, mean=None, std=None):
        self.policy = policy
        self.seed = seed
        self.mean = np.array(mean if mean is not None else (FALLBACK_MEAN,) * 3, np.float32)
        self.std = np.array(std if std is not None else (FALLBACK_STD,) * 3, np.float32)

    def __call__(self, images: torch.Tensor, indices: np.ndarray, epoch: int) -> torch.Tensor:
        indices = np.asarray(indices, dtype=np.int64)
        batch = _Batch(images, epoch, indices)
        if self.policy.aa is not None:
            for layer in range(self.policy.aa.layers):
                self._rand_layer(batch, layer)
        elif self.policy.jitters:
            self._jitter(batch)
        if self.policy.reprob > 0:
            self._erase(batch)
        return batch.images

    def _rand_layer(self, batch: "_Batch", layer: int) -> None:
        spec = self.policy.aa
        op, args = rand_augment.layer_draws(spec, seed=self.seed, epoch=batch.epoch,
                                            indices=batch.indices, layer=layer)
        ops = rand_augment.ops_of(spec)
        names = np.array(ops + ("",))[op]  # op -1 (skipped) -> ""
        moved = np.isin(names, rand_augment.GEOMETRIC)
        if moved.any():  # every geometric op of the layer in one resampling
            height, width = batch.images.shape[-2:]
            matrices = rand_augment.affine_matrices(names, args, height=height, width=width,
                                                    relative=spec.kind != TRIVIAL)
            fill = batch.to_device(self.mean)
            batch.update(moved, lambda x, m: image_ops.affine(x, m, fill),
                         matrices.astype(np.float32))
        # The other ops, grouped: one upload of the rows and arguments for the whole layer.
        batch.update_groups(np.where(moved, -1, op), [
            (lambda x, a, name=name: rand_augment.apply_op(name, x, a)) for name in ops],
            args.astype(np.float32))

    def _jitter(self, batch: "_Batch") -> None:
        u = sample_uniforms(self.seed, batch.epoch, batch.indices,
                            draws=np.arange(JITTER_DRAWS, JITTER_DRAWS + 4))
        strength = self.policy.color_jitter
        factors = (max(0.0, 1.0 - strength) + (1.0 + strength - max(0.0, 1.0 - strength))
                   * u[:, :3]).astype(np.float32)
        order = _ORDERS[np.minimum((u[:, 3] * len(_ORDERS)).astype(np.int64), len(_ORDERS) - 1)]
        rows = np.arange(len(order))
        for position in range(3):
            op = order[:, position]
            batch.update_groups(op, _JITTER_OPS, factors[rows, op])

    def _erase(self, batch: "_Batch") -> None:
        height, width = batch.images.shape[-2:]
        boxes, seeds, normals = erase_draws(self.policy, seed=self.seed, epoch=batch.epoch,
                                            indices=batch.indices, height=height, width=width)
        erased = (boxes[:, :, 2] > 0).any(axis=1)
        if not erased.any():
            return
        mean, std = batch.to_device(self.mean), batch.to_device(self.std)
        rows = np.flatnonzero(erased)

        def fill(x: torch.Tensor, box: torch.Tensor) -> torch.Tensor:
            shape = (len(rows), 3, 1, 1)
            if self.policy.remode == "const":
                noise = torch.zeros(shape, device=x.device)
            elif self.policy.remode == "rand":
                noise = batch.to_device(normals[rows].astype(np.float32)).view(shape)
            else:
                noise = _pixel_noise(seeds[rows], x.shape[1:], x.device)
            values = torch.floor(mean.view(1, 3, 1, 1) + std.view(1, 3, 1, 1) * noise + 0.5)
            values = values.clamp_(0, 255).to(torch.uint8)
            return image_ops.erase(x, box, values)

        batch.update(erased, fill, boxes.astype(np.int64))


def erase_draws(policy: AugmentPolicy, *, seed: int, epoch: int, indices: np.ndarray,
                height: int, width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """timm's RandomErasing draws, vectorised: (boxes (n, recount, 4) as top, left, height,
    width, a height of 0 where a box is not drawn; a 53-bit noise seed per image; (n, 3)
    normals). Per image: erased with probability reprob; 1..recount boxes (uniform); each box
    tries 10 times an area of 2-33 % of the image / count and a log-uniform aspect ratio, and
    is placed uniformly where it fits (timm: strictly smaller than the image)."""
    count = policy.recount
    draws = np.arange(ERASE_DRAWS, ERASE_DRAWS + 3 + 2 * _ERASE_CHANNELS + count * _PER_BOX)
    u = sample_uniforms(seed, epoch, indices, draws=draws)
    n = len(indices)
    applied = u[:, _ERASE_APPLY] < policy.reprob
    boxes_drawn = np.minimum(np.floor(u[:, _ERASE_COUNT] * count).astype(np.int64) + 1, count)
    seeds = np.floor(u[:, _ERASE_SEED] * 2.0 ** 53).astype(np.int64)
    c0 = 3
    u1, u2 = u[:, c0:c0 + 3], u[:, c0 + 3:c0 + 6]
    normals = np.sqrt(-2.0 * np.log1p(-u1)) * np.cos(2.0 * math.pi * u2)
    per_box = u[:, c0 + 2 * _ERASE_CHANNELS:].reshape(n, count, _PER_BOX)
    area = (height * width) / boxes_drawn[:, None, None]
    attempts = per_box[..., :2 * _ERASE_ATTEMPTS]
    target = area * (ERASE_AREA[0] + (ERASE_AREA[1] - ERASE_AREA[0]) * attempts[..., 0::2])
    log_lo, log_hi = math.log(ERASE_ASPECT), math.log(1 / ERASE_ASPECT)
    aspect = np.exp(log_lo + (log_hi - log_lo) * attempts[..., 1::2])
    h = np.rint(np.sqrt(target * aspect)).astype(np.int64)
    w = np.rint(np.sqrt(target / aspect)).astype(np.int64)
    fits = (h < height) & (w < width)
    first = np.argmax(fits, axis=2)
    found = np.take_along_axis(fits, first[..., None], 2)[..., 0]
    h = np.take_along_axis(h, first[..., None], 2)[..., 0]
    w = np.take_along_axis(w, first[..., None], 2)[..., 0]
    top = np.floor(per_box[..., -2] * (height - h + 1)).astype(np.int64)
    left = np.floor(per_box[..., -1] * (width - w + 1)).astype(np.int64)
    used = (found & applied[:, None] & (np.arange(count)[None, :] < boxes_drawn[:, None]))
    boxes = np.stack([top, left, np.where(used, h, 0), np.where(used, w, 0)], axis=-1)
    return boxes, seeds, normals


def _pixel_noise(seeds: np.ndarray, shape, device: torch.device) -> torch.Tensor:
    """(n, *shape) N(0, 1) noise, image k's from a generator seeded with seeds[k] on `device`:
    the same for a sample whatever its batch (on one kind of device: CPU and CUDA generators
    differ)."""
    noise = torch.empty((len(seeds), *shape), device=device)
    for k, image_seed in enumerate(seeds.tolist()):
        generator = torch.Generator(device=device).manual_seed(image_seed)
        noise[k] = torch.randn(shape, generator=generator, device=device)
    return noise


class _Batch:
    """The batch being augmented: copied once, at the first op that changes an image."""

    def __init__(self, images: torch.Tensor, epoch: int, indices: np.ndarray):
        self.images = images
        self.epoch = epoch
        self.indices = indices
        self._owned = False

    def to_device(self, array: np.ndarray) -> torch.Tensor:
        return host_array_to(np.ascontiguousarray(array), self.images.device)

    def update(self, selected: np.ndarray, op, params: np.ndarray) -> None:
        """images[selected] = op(images[selected], params[selected] on the device)."""
        self.update_groups(np.where(selected, 0, -1), [op], params)

    def update_groups(self, groups: np.ndarray, ops, params: np.ndarray) -> None:
        """images[groups == k] = ops[k](those images, their params) for each k (-1: left as
        they are). The rows and params cross to the device once, sorted by group, and each
        group takes its slice: two small copies, not two per op (~15 ops a RandAugment
        layer)."""
        picked = np.flatnonzero(groups >= 0)
        if len(picked) == 0:
            return
        order = picked[np.argsort(groups[picked], kind="stable")]
        counts = np.bincount(groups[order], minlength=len(ops))
        if not self._owned:
            self.images = self.images.clone(memory_format=torch.preserve_format)
            self._owned = True
        rows, values = self.to_device(order), self.to_device(params[order])
        start = 0
        for k, count in enumerate(counts.tolist()):
            if count:
                where = rows[start:start + count]
                self.images[where] = ops[k](self.images[where], values[start:start + count])
            start += count
