"""Mixup and CutMix (`train --mixup / --cutmix`): batch-level, on the device, after any pipeline.

Every pipeline hands over uint8 images (the batch contract); a micro-batch is mixed just before
the forward pass, so the mixing is the same whichever pipeline made it. timm's recipe, batch
mode: one weight `lam` per micro-batch, each image paired with another of the same micro-batch.

* Mixup: ``lam * x + (1 - lam) * x[perm]``, ``lam ~ Beta(alpha, alpha)``, in float32 on the
  uint8 pixel scale and never rounded back to uint8. The model's InputStem is affine
  (``(x - mean) / std``), so this equals mixing the normalised images.
* CutMix: the box ``sqrt(1 - lam)`` of each side, centred at a uniform pixel and clipped to the
  image, is pasted from ``x[perm]``; ``lam`` is then corrected to the share of pixels kept.
  Pasting copies pixels, so a CutMix-only run stays uint8.
* Targets: ``lam * y + (1 - lam) * y[perm]`` with ``y`` the label-smoothed one-hot
  (``1 - s + s / K`` and ``s / K``: what CrossEntropyLoss(label_smoothing=s) uses, so an
  unmixed batch gives the same loss), trained with soft-target cross-entropy.

Determinism: whether the micro-batch is mixed, mixup or CutMix, `lam`, the pairing and the box
are drawn by numpy's PCG64 seeded with ``SeedSequence([MIX_STREAM, seed, epoch, rank, micro])``
(``micro``: the micro-batch's index in its epoch), never from a global RNG: a pure function of
the run's position, like the data order (order.py) and the crops (augment.py), so a resumed run
mixes exactly as the uninterrupted one. Ranks draw apart (their micro-batches hold other
images anyway). The draws are made on the host (~50 us for 256 images) and only the pairing
crosses to the device, from pinned memory without a sync; `lam` and the box are Python numbers.

Training accuracy is not measured by the trainer at all (it logs the loss; accuracy comes from
evaluation on unmixed val batches), so there is nothing to redefine for mixed labels.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from turbotrain.pipeline.transfer import host_array_to

MIX_STREAM = 0x6D6978  # "mix": sets these draws apart from order.py's SeedSequence([seed, epoch])
NONE, MIXUP, CUTMIX = "none", "mixup", "cutmix"


@dataclass(frozen=True)
class MixPlan:
    """How one micro-batch is mixed: `lam` is the weight of each image's own label."""
    kind: str  # NONE, MIXUP or CUTMIX
    lam: float
    perm: np.ndarray  # int64 (B,): image k is mixed with image perm[k]
    box: tuple[int, int, int, int]  # CutMix (top, bottom, left, right), rows/cols [top, bottom)


@dataclass(frozen=True)
class MixSettings:
    mixup: float = 0.0  # Beta alpha, 0: off
    cutmix: float = 0.0
    prob: float = 1.0  # share of micro-batches mixed
    switch_prob: float = 0.5  # with both on: share of the mixed ones that get CutMix

    @property
    def enabled(self) -> bool:
        return self.mixup > 0 or self.cutmix > 0


def mix_plan(settings: MixSettings, *, seed: int, epoch: int, rank: int, micro: int,
             batch: int, height: int, width: int) -> MixPlan:
    """The plan of micro-batch `micro` of `epoch` on `rank`: a pure function of its arguments.

    The draws always come in the same order (apply, switch, lam, pairing, box centre), whatever
    the settings, so one setting never shifts another's numbers."""
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(
        [MIX_STREAM, seed, epoch, rank, micro])))
    u_apply, u_switch = rng.random(2)
    if settings.mixup > 0 and settings.cutmix > 0:
        kind = CUTMIX if u_switch < settings.switch_prob else MIXUP
    else:
        kind = CUTMIX if settings.cutmix > 0 else MIXUP
    alpha = settings.cutmix if kind == CUTMIX else settings.mixup
    lam = float(rng.beta(alpha, alpha)) if alpha > 0 else 1.0
    perm = rng.permutation(batch).astype(np.int64)
    centre_y, centre_x = int(rng.integers(height)), int(rng.integers(width))
    if not settings.enabled or u_apply >= settings.prob:
        return MixPlan(NONE, 1.0, perm, (0, 0, 0, 0))
    if kind == MIXUP:
        return MixPlan(MIXUP, lam, perm, (0, 0, 0, 0))
    # timm's rand_bbox: sides sqrt(1 - lam) of the image's, clipped; lam from the clipped area.
    cut = math.sqrt(1.0 - lam)
    half_h, half_w = int(height * cut) // 2, int(width * cut) // 2
    top, bottom = max(centre_y - half_h, 0), min(centre_y + half_h, height)
    left, right = max(centre_x - half_w, 0), min(centre_x + half_w, width)
    lam = 1.0 - (bottom - top) * (right - left) / (height * width)
    return MixPlan(CUTMIX, lam, perm, (top, bottom, left, right))


def smoothed_one_hot(labels: torch.Tensor, num_classes: int, smoothing: float) -> torch.Tensor:
    """float32 (B, K): 1 - s + s / K at the label, s / K elsewhere."""
    off = smoothing / num_classes
    targets = torch.full((labels.shape[0], num_classes), off, dtype=torch.float32,
                         device=labels.device)
    return targets.scatter_(1, labels.view(-1, 1), 1.0 - smoothing + off)


def soft_target_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean over the batch of -sum_k target_k log softmax_k (timm's SoftTargetCrossEntropy),
    in float32 whatever the autocast dtype of the logits."""
    log_probs = nn.functional.log_softmax(logits.float(), dim=-1)
    return -(targets * log_probs).sum(dim=-1).mean()


class Mixer:
    """Applies `mix_plan` to micro-batches on their device.

        images, targets = mixer(images, labels, epoch=e, micro=m)
        loss = soft_target_cross_entropy(model(images), targets)

    Images come back float32 for every micro-batch when --mixup is on (also unmixed or CutMix
    ones: a compiled model then sees one input dtype), uint8 otherwise."""

    def __init__(self, settings: MixSettings, *, num_classes: int, label_smoothing: float,
                 seed: int, rank: int = 0):
        self.settings = settings
        self.num_classes = num_classes
        self.label_smoothing = label_smoothing
        self.seed = seed
        self.rank = rank
        self.floats = settings.mixup > 0

    def plan(self, images: torch.Tensor, *, epoch: int, micro: int) -> MixPlan:
        batch, _, height, width = images.shape
        return mix_plan(self.settings, seed=self.seed, epoch=epoch, rank=self.rank, micro=micro,
                        batch=batch, height=height, width=width)

    def __call__(self, images: torch.Tensor, labels: torch.Tensor, *, epoch: int,
                 micro: int) -> tuple[torch.Tensor, torch.Tensor]:
        plan = self.plan(images, epoch=epoch, micro=micro)
        targets = smoothed_one_hot(labels, self.num_classes, self.label_smoothing)
        if plan.kind == NONE:
            return (images.float() if self.floats else images), targets
        perm = host_array_to(plan.perm, images.device)
        targets = torch.lerp(targets[perm], targets, plan.lam)  # lam * own + (1 - lam) * partner
        if plan.kind == MIXUP:
            pixels = images.float()
            return torch.lerp(pixels[perm], pixels, plan.lam), targets
        top, bottom, left, right = plan.box
        mixed = images.clone(memory_format=torch.preserve_format)
        mixed[:, :, top:bottom, left:right] = images[perm, :, top:bottom, left:right]
        return (mixed.float() if self.floats else mixed), targets


def mixer_for(config, *, num_classes: int, rank: int) -> Mixer | None:
    """The run's Mixer from its TrainConfig, or None when --mixup and --cutmix are both off."""
    settings = MixSettings(mixup=config.mixup, cutmix=config.cutmix, prob=config.mix_prob,
                           switch_prob=config.mix_switch_prob)
    if not settings.enabled:
        return None
    return Mixer(settings, num_classes=num_classes, label_smoothing=config.label_smoothing,
                 seed=config.seed, rank=rank)
