"""Per-sample augmentation parameters as pure functions of (seed, epoch, sample index, size).

Every pipeline draws its crop boxes and flips here, vectorised over a batch of sample indices
(about 15 us for a batch of 64, against ~50 ms to decode it), and then applies them its own way
(cv2 on the CPU, batched tensor ops on the device, DALI/FFCV operators). Because the parameters
depend only on (seed, epoch, index) — never on a worker's RNG state — a batch is the same
whatever the number of workers, and a run resumed mid-epoch sees the same crops.

Two augmentation families, chosen once per split by `choose_augmentation`:

* photo-sized images: training uses RandomResizedCrop (torchvision's semantics: area scale
  (0.08, 1), log-uniform aspect ratio (3/4, 4/3), 10 attempts, then a centre-crop fallback;
  `train --scale / --ratio` change the two ranges, for every pipeline alike) plus a horizontal
  flip; evaluation resizes the shorter side to ``image_size / crop_ratio`` and takes
  the centre ``image_size`` square, i.e. a centred square box of side ``crop_ratio * min(h, w)``.
* small images (largest side <= layout.SMALL_IMAGE_MAX_SIDE, CIFAR-style): the image is first
  resized to ``image_size`` if it is not already that size; training then pads by
  SMALL_IMAGE_PADDING (reflect) and takes a random ``image_size`` crop plus a flip; evaluation
  is the identity.

All families produce a `CropBoxes`: a box (top, left, height, width) in the source image's pixel
coordinates, to be resized to ``image_size`` square, and a flip bit. Pad-crop boxes may start
above/left of the image (top, left in [-padding, padding]); the uncovered part is padding.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from turbotrain.datasets.beton.layout import SMALL_IMAGE_MAX_SIDE

RESIZED_CROP_SCALE = (0.08, 1.0)
RESIZED_CROP_RATIO = (3 / 4, 4 / 3)
RESIZED_CROP_ATTEMPTS = 10  # torchvision's retry count before the centre-crop fallback

# Small images are reflect-padded 2 px each side, then randomly cropped (airbench's translate for
# its short CIFAR runs; reflect keeps the image's border statistics). The torchvision/ResNet
# recipe pads 4 for long runs, but on short ones that much shift costs accuracy: compact28 on
# Fashion-MNIST, 3 epochs, 3 seeds each, ended at 91.4-91.9% with 2 px against 91.2-91.5% with 4.
SMALL_IMAGE_PADDING = 2

# Augmentation families (values of choose_augmentation).
RESIZED_CROP = "resized_crop"   # train, photo-sized
CENTRE_CROP = "centre_crop"     # eval, photo-sized
PAD_CROP = "pad_crop"           # train, small
IDENTITY = "identity"           # eval, small (resize to image_size when it differs)

# Where each family's draws sit in a sample's random stream (fixed, so adding a family never
# changes another's numbers).
_DRAW_ATTEMPTS = 0                                # 2 per attempt: area, log-ratio
_DRAW_OFFSET = 2 * RESIZED_CROP_ATTEMPTS          # 2: vertical, horizontal
_DRAW_FLIP = _DRAW_OFFSET + 2                     # 1
_DRAWS_PER_SAMPLE = _DRAW_FLIP + 1


@dataclass(frozen=True)
class CropBoxes:
    """One box and flip per sample, int64/bool arrays of shape (B,), in source pixel units."""
    top: np.ndarray
    left: np.ndarray
    height: np.ndarray
    width: np.ndarray
    flip: np.ndarray

    def __len__(self) -> int:
        return len(self.top)

    def slice(self, start: int, stop: int) -> "CropBoxes":
        """Samples [start, stop) (views)."""
        return CropBoxes(self.top[start:stop], self.left[start:stop],
                         self.height[start:stop], self.width[start:stop], self.flip[start:stop])

    def row(self, k: int) -> tuple[int, int, int, int, bool]:
        """(top, left, height, width, flip) of sample k as Python scalars."""
        return (int(self.top[k]), int(self.left[k]), int(self.height[k]), int(self.width[k]),
                bool(self.flip[k]))


def is_small(heights: np.ndarray, widths: np.ndarray) -> bool:
    """Small (CIFAR-style) images get pad-and-crop rather than resized crops."""
    if len(heights) == 0:
        return False
    return int(max(np.max(heights), np.max(widths))) <= SMALL_IMAGE_MAX_SIDE


def choose_augmentation(heights: np.ndarray, widths: np.ndarray, *, train: bool) -> str:
    """The family for a split whose stored image sizes are `heights`, `widths`."""
    if is_small(heights, widths):
        return PAD_CROP if train else IDENTITY
    return RESIZED_CROP if train else CENTRE_CROP


def draws_flips(family: str) -> bool:
    """Whether `family`'s boxes carry random horizontal flips (the training families do; the
    evaluation families never flip)."""
    return family in (RESIZED_CROP, PAD_CROP)


def crop_boxes(family: str, *, seed: int, epoch: int, indices: np.ndarray, heights: np.ndarray,
               widths: np.ndarray, image_size: int, crop_ratio: float = 0.875,
               scale: tuple[float, float] = RESIZED_CROP_SCALE,
               ratio: tuple[float, float] = RESIZED_CROP_RATIO) -> CropBoxes:
    """The boxes of the samples `indices` for one family.

    `heights`/`widths` are the stored sizes of those samples (same length as `indices`). For
    PAD_CROP and IDENTITY the boxes are in the coordinates of the image resized to `image_size`.
    `scale` and `ratio` are RandomResizedCrop's (train --scale / --ratio); the other families
    ignore them.
    """
    if family == RESIZED_CROP:
        return random_resized_crop(seed, epoch, indices, heights, widths, scale, ratio)
    if family == CENTRE_CROP:
        return centre_crop(heights, widths, crop_ratio)
    if family == PAD_CROP:
        return pad_crop(seed, epoch, indices, image_size, SMALL_IMAGE_PADDING)
    if family == IDENTITY:
        n = len(indices)
        full = np.full(n, image_size, dtype=np.int64)
        zero = np.zeros(n, dtype=np.int64)
        return CropBoxes(zero, zero.copy(), full, full.copy(), np.zeros(n, dtype=bool))
    raise ValueError(f"unknown augmentation {family!r}; choose one of: "
                     f"{', '.join((RESIZED_CROP, CENTRE_CROP, PAD_CROP, IDENTITY))}")


def check_crop_range(scale, ratio) -> None:
    """ValueError unless 0 < scale lo <= hi <= 1 and 0 < ratio lo <= hi (finite numbers)."""
    for name, (lo, hi), rule, top in (("scale", scale, "0 < lo <= hi <= 1", 1.0),
                                      ("ratio", ratio, "0 < lo <= hi, both finite", math.inf)):
        if not (math.isfinite(lo) and math.isfinite(hi) and 0 < lo <= hi <= top):
            raise ValueError(f"{name} needs {rule}, not {lo} {hi}")


# -- counter-based randomness --------------------------------------------------------------------
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser: a bijective mix of uint64 arrays (wrapping arithmetic)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def sample_uniforms(seed: int, epoch: int, indices: np.ndarray, count: int | None = None, *,
                    draws: np.ndarray | None = None) -> np.ndarray:
    """(len(indices), k) float64 uniforms in [0, 1): draw j of sample i depends only on
    (seed, epoch, i, j). Either the first `count` draws, or just the draw numbers `draws`."""
    with np.errstate(over="ignore"):
        key = _splitmix64(np.array([seed], dtype=np.uint64) * _GOLDEN + np.uint64(1))
        key = _splitmix64(key ^ (np.array([epoch], dtype=np.uint64) * _GOLDEN))
        idx = np.asarray(indices, dtype=np.int64).astype(np.uint64)
        per_sample = _splitmix64(key ^ (idx * _GOLDEN + np.uint64(0x632BE59BD9B4E019)))
        which = np.arange(count) if draws is None else np.asarray(draws)
        offsets = which.astype(np.uint64) * _GOLDEN
        bits = _splitmix64(per_sample[:, None] + offsets[None, :] + _GOLDEN)
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def _draws(seed: int, epoch: int, indices: np.ndarray) -> np.ndarray:
    return sample_uniforms(seed, epoch, indices, _DRAWS_PER_SAMPLE)


def flips(seed: int, epoch: int, indices: np.ndarray) -> np.ndarray:
    """The horizontal-flip bit of each sample (probability 1/2)."""
    return sample_uniforms(seed, epoch, indices, draws=[_DRAW_FLIP])[:, 0] < 0.5


# -- the families ---------------------------------------------------------------------------------
def random_resized_crop(seed: int, epoch: int, indices: np.ndarray, heights: np.ndarray,
                        widths: np.ndarray, scale: tuple[float, float] = RESIZED_CROP_SCALE,
                        ratio: tuple[float, float] = RESIZED_CROP_RATIO) -> CropBoxes:
    """torchvision's RandomResizedCrop.get_params, vectorised, plus a flip bit."""
    u = _draws(seed, epoch, indices)
    h_img = np.asarray(heights, dtype=np.int64)
    w_img = np.asarray(widths, dtype=np.int64)
    area = (h_img * w_img).astype(np.float64)[:, None]
    attempts = u[:, _DRAW_ATTEMPTS:_DRAW_ATTEMPTS + 2 * RESIZED_CROP_ATTEMPTS]
    target_area = area * (scale[0] + (scale[1] - scale[0]) * attempts[:, 0::2])
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    aspect = np.exp(log_lo + (log_hi - log_lo) * attempts[:, 1::2])
    w_try = np.rint(np.sqrt(target_area * aspect)).astype(np.int64)
    h_try = np.rint(np.sqrt(target_area / aspect)).astype(np.int64)
    fits = (w_try > 0) & (h_try > 0) & (w_try <= w_img[:, None]) & (h_try <= h_img[:, None])
    first = np.argmax(fits, axis=1)
    found = fits[np.arange(len(first)), first]
    rows = np.arange(len(first))
    crop_h = np.where(found, h_try[rows, first], 0)
    crop_w = np.where(found, w_try[rows, first], 0)

    # Fallback (no attempt fits): the largest centred box whose ratio is clamped into `ratio`.
    in_ratio = w_img / h_img
    fb_w = np.where(in_ratio < ratio[0], w_img,
                    np.where(in_ratio > ratio[1], np.rint(h_img * ratio[1]).astype(np.int64), w_img))
    fb_h = np.where(in_ratio < ratio[0], np.rint(w_img / ratio[0]).astype(np.int64), h_img)
    crop_h = np.where(found, crop_h, np.minimum(fb_h, h_img))
    crop_w = np.where(found, crop_w, np.minimum(fb_w, w_img))

    off = u[:, _DRAW_OFFSET:_DRAW_OFFSET + 2]
    top = np.floor(off[:, 0] * (h_img - crop_h + 1)).astype(np.int64)
    left = np.floor(off[:, 1] * (w_img - crop_w + 1)).astype(np.int64)
    top = np.where(found, top, (h_img - crop_h) // 2)
    left = np.where(found, left, (w_img - crop_w) // 2)
    return CropBoxes(top, left, crop_h, crop_w, u[:, _DRAW_FLIP] < 0.5)


def centre_crop(heights: np.ndarray, widths: np.ndarray, crop_ratio: float) -> CropBoxes:
    """The evaluation box: a centred square of side ``crop_ratio * min(h, w)``, no flip.

    Same pixels as torchvision's ``Resize(round(S / crop_ratio))`` then ``CenterCrop(S)``.
    """
    if not 0 < crop_ratio <= 1:
        raise ValueError(f"crop_ratio must be in (0, 1] (got {crop_ratio})")
    h_img = np.asarray(heights, dtype=np.int64)
    w_img = np.asarray(widths, dtype=np.int64)
    side = np.maximum(np.rint(np.minimum(h_img, w_img) * crop_ratio).astype(np.int64), 1)
    return CropBoxes((h_img - side) // 2, (w_img - side) // 2, side, side.copy(),
                     np.zeros(len(h_img), dtype=bool))


def eval_rule(image_size: int, crop_ratio: float) -> dict[str, str]:
    """The evaluation families' rule in words, as `eval`, `predict` and an exported model's card
    state it (what CENTRE_CROP and IDENTITY compute, above and in crop_boxes)."""
    resized = round(image_size / crop_ratio)
    return {
        "photos": f"longest side over {SMALL_IMAGE_MAX_SIDE} px: resize the shorter side to "
                  f"{resized} px (image_size / {crop_ratio:g}), then take the centre "
                  f"{image_size}x{image_size} crop (torchvision: Resize({resized}), "
                  f"CenterCrop({image_size})); predict resizes with an area filter when "
                  "shrinking 2x or more, bilinear otherwise",
        "small images": f"longest side at most {SMALL_IMAGE_MAX_SIDE} px: resize to "
                        f"{image_size}x{image_size}, no crop"}


def pad_crop(seed: int, epoch: int, indices: np.ndarray, image_size: int,
             padding: int) -> CropBoxes:
    """A random `image_size` square from the image padded by `padding`, plus a flip bit.

    Boxes are in the unpadded image's coordinates: top, left in [-padding, padding].
    """
    # Only the 3 draws this family uses: a whole CIFAR epoch's boxes in ~4 ms, not ~60.
    u = sample_uniforms(seed, epoch, indices,
                        draws=[_DRAW_OFFSET, _DRAW_OFFSET + 1, _DRAW_FLIP])
    span = 2 * padding + 1
    top = np.floor(u[:, 0] * span).astype(np.int64) - padding
    left = np.floor(u[:, 1] * span).astype(np.int64) - padding
    size = np.full(len(top), image_size, dtype=np.int64)
    return CropBoxes(top, left, size, size.copy(), u[:, 2] < 0.5)
