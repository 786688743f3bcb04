"""The augmentations after decode (`--aa`, `--color-jitter`, `--reprob`): off unless asked for,
and what runs when they are, in one Decision (pipeline/after_decode.py applies them)."""
from __future__ import annotations

from turbotrain.augment_policy import AugmentPolicy

from .decision import Decision

# Off by default: they are regularisers of long runs (the RandAugment paper and timm's ImageNet
# recipes train 100-600 epochs); on the short runs turbotrain plans they cost time per batch
# (bench/bench_augment.py) and nothing here has measured them paying that back.
OFF_REASON = ("none asked for (--aa rand-m9-mstd0.5 or trivial, --color-jitter F, "
              "--reprob P): regularisers for long runs that cost time per batch, off by "
              "default")


def augmentation(policy: AugmentPolicy, device: str) -> Decision:
    """The Decision for `policy` on a run training on `device`; shown when anything is on."""
    if not policy.enabled:
        return Decision("off", OFF_REASON, shown=False)
    reason = (f"asked for; on the {device} after decode, each sample's draws from (seed, "
              "epoch, sample index), the same for every pipeline")
    if policy.color_jitter > 0 and not policy.jitters:
        reason += (f"; --color-jitter {policy.color_jitter:g} not applied: timm drops colour "
                   "jitter when --aa is set")
    return Decision(policy.describe(), reason)


# Device memory pipeline/after_decode.py works in per image of S x S: a float copy of the image
# (12 bytes a pixel) and a sampling grid for the geometric ops (8): ~250 MB at batch 256, 224 px.
WORK_BYTES_PER_PIXEL = 20


def work_bytes(batch_size: int, image_size: int) -> int:
    """The augmentation stage's device memory for a batch (the batch search reserves it)."""
    return WORK_BYTES_PER_PIXEL * batch_size * image_size * image_size
