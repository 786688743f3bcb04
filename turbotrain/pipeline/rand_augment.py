"""RandAugment and TrivialAugment: which op each image gets, and its argument, as pure
functions of (seed, epoch, sample index); `apply_layer` runs one layer of them on a batch.

Op lists and magnitude mappings, as facts from timm's auto_augment.py (RandAugment, whose ops
follow the paper's list with timm's SolarizeAdd, magnitudes as tenths) and torchvision's
TrivialAugmentWide (the wide space of the TrivialAugment paper, 31 magnitude bins):

  op              RandAugment arg at level L = m / 10    TrivialAugment arg at bin b of 0..30
  AutoContrast    -                                      -
  Equalize        -                                      -
  Invert          -                                      (not in the list)
  Identity        (not in the list)                      -
  Rotate          +-30 L degrees                         +-135 b/30 degrees
  Posterize       int(4 L) bits kept (inc: 4 - int(4L))  8 - round(b / 5) bits kept
  Solarize        threshold int(256 L) (inc: 256 - ..)   threshold 255 (1 - b/30)
  SolarizeAdd     + int(110 L) below 128                 (not in the list)
  Color, Contrast,
  Brightness,
  Sharpness       factor 0.1 + 1.8 L (inc: 1 +- 0.9 L)   factor 1 +- 0.99 b/30
  ShearX, ShearY  +-0.3 L                                +-0.99 b/30
  TranslateX, Y   +-0.45 L of the side                   +-int(32 b/30) px

The +- sign is drawn per image (probability 1/2 each). The random draws of image i come from
`augment.sample_uniforms(seed, epoch, i, draws=...)` at fixed draw numbers (RAND_DRAWS), far
from the crops' (0-22), so no crop changes when these are turned on.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from turbotrain.augment_policy import TRIVIAL, RandAugmentSpec

from . import image_ops
from .augment import sample_uniforms

RAND_DRAWS = 1100  # first draw number; each layer takes _PER_LAYER after it
_PER_LAYER = 8
_OP, _APPLY, _M1, _M2, _SIGN = range(5)
RAND_PROB = 0.5  # timm's rand_augment_ops: each chosen op runs with probability 1/2
TRIVIAL_BINS = 31  # torchvision's TrivialAugmentWide num_magnitude_bins

RAND_OPS = ("AutoContrast", "Equalize", "Invert", "Rotate", "Posterize", "Solarize",
            "SolarizeAdd", "Color", "Contrast", "Brightness", "Sharpness", "ShearX", "ShearY",
            "TranslateX", "TranslateY")
TRIVIAL_OPS = ("Identity", "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate",
               "Brightness", "Color", "Contrast", "Sharpness", "Posterize", "Solarize",
               "AutoContrast", "Equalize")
_SIGNED = {"Rotate", "ShearX", "ShearY", "TranslateX", "TranslateY"}
_ENHANCE = {"Color": image_ops.color, "Contrast": image_ops.contrast,
            "Brightness": image_ops.brightness, "Sharpness": image_ops.sharpness}
GEOMETRIC = ("Rotate", "ShearX", "ShearY", "TranslateX", "TranslateY")


def ops_of(spec: RandAugmentSpec) -> tuple[str, ...]:
    return TRIVIAL_OPS if spec.kind == TRIVIAL else RAND_OPS


def layer_draws(spec: RandAugmentSpec, *, seed: int, epoch: int, indices: np.ndarray,
                layer: int) -> tuple[np.ndarray, np.ndarray]:
    """(op index, argument) per image for one layer; op -1 where the image skips this layer.
    Arguments are in each op's units (table above; translations as a fraction of the side for
    RandAugment, in pixels for TrivialAugment)."""
    base = RAND_DRAWS + _PER_LAYER * layer
    u = sample_uniforms(seed, epoch, indices, draws=np.arange(base, base + _PER_LAYER))
    ops = ops_of(spec)
    op = np.minimum((u[:, _OP] * len(ops)).astype(np.int64), len(ops) - 1)
    sign = np.where(u[:, _SIGN] < 0.5, -1.0, 1.0)
    names = np.array(ops)[op]
    if spec.kind == TRIVIAL:
        level = np.minimum(np.floor(u[:, _M1] * TRIVIAL_BINS), TRIVIAL_BINS - 1)
        args = _trivial_args(names, level, sign)
        return op, args
    magnitude = _rand_magnitude(spec, u[:, _M1], u[:, _M2])
    args = _rand_args(names, magnitude / 10.0, sign, spec.increasing)
    return np.where(u[:, _APPLY] < RAND_PROB, op, -1), args


def _rand_magnitude(spec: RandAugmentSpec, u1: np.ndarray, u2: np.ndarray) -> np.ndarray:
    """timm's AugmentOp magnitude: m, plus N(0, mstd) noise (Box-Muller on two draws) or
    uniform in [0, m] when mstd is infinite, clipped to [0, mmax]."""
    m = np.full(len(u1), float(spec.magnitude))
    if math.isinf(spec.magnitude_std):
        m = u1 * spec.magnitude
    elif spec.magnitude_std > 0:
        normal = np.sqrt(-2.0 * np.log1p(-u1)) * np.cos(2.0 * math.pi * u2)
        m = m + spec.magnitude_std * normal
    return np.clip(m, 0.0, spec.magnitude_max)


def _rand_args(names: np.ndarray, level: np.ndarray, sign: np.ndarray,
               increasing: bool) -> np.ndarray:
    args = np.zeros(len(names))
    table = {
        "Rotate": 30.0 * level * sign,
        "Posterize": (4 - np.floor(4 * level)) if increasing else np.floor(4 * level),
        "Solarize": (256 - np.floor(256 * level)) if increasing else np.floor(256 * level),
        "SolarizeAdd": np.floor(110 * level),
        "ShearX": 0.3 * level * sign, "ShearY": 0.3 * level * sign,
        "TranslateX": 0.45 * level * sign, "TranslateY": 0.45 * level * sign,
    }
    enhance = np.maximum(0.1, 1.0 + 0.9 * level * sign) if increasing else 0.1 + 1.8 * level
    for name in _ENHANCE:
        table[name] = enhance
    for name, values in table.items():
        args = np.where(names == name, values, args)
    return args


def _trivial_args(names: np.ndarray, level: np.ndarray, sign: np.ndarray) -> np.ndarray:
    frac = level / (TRIVIAL_BINS - 1)
    shift = np.trunc(32.0 * frac) * sign  # torchvision translates by int(magnitude) px
    table = {"Rotate": 135.0 * frac * sign, "ShearX": 0.99 * frac * sign,
             "ShearY": 0.99 * frac * sign, "TranslateX": shift, "TranslateY": shift,
             "Posterize": 8 - np.round(level / 5),
             "Solarize": 255.0 * (1 - frac)}
    for name in _ENHANCE:
        table[name] = 1.0 + 0.99 * frac * sign
    args = np.zeros(len(names))
    for name, values in table.items():
        args = np.where(names == name, values, args)
    return args


def affine_matrices(names: np.ndarray, args: np.ndarray, *, height: int, width: int,
                    relative: bool) -> np.ndarray:
    """(n, 6) PIL AFFINE data (output pixel -> input pixel) of geometric ops; `relative`:
    translations are fractions of the side (RandAugment's TranslateXRel/YRel)."""
    m = np.tile(np.array([1.0, 0, 0, 0, 1.0, 0]), (len(names), 1))
    shift_x = args * width if relative else args
    shift_y = args * height if relative else args
    m[:, 1] = np.where(names == "ShearX", args, 0.0)
    m[:, 3] = np.where(names == "ShearY", args, 0.0)
    m[:, 2] = np.where(names == "TranslateX", shift_x, 0.0)
    m[:, 5] = np.where(names == "TranslateY", shift_y, 0.0)
    # PIL's rotate(degrees): counter-clockwise about the centre (its matrix uses -angle).
    rotate = names == "Rotate"
    a = -np.radians(np.where(rotate, args, 0.0))
    cx, cy = width / 2.0, height / 2.0
    cos, sin = np.cos(a), np.sin(a)
    rot = np.stack([cos, sin, cx - cos * cx - sin * cy, -sin, cos, cy + sin * cx - cos * cy], 1)
    return np.where(rotate[:, None], rot, m)


def apply_op(name: str, x: torch.Tensor, args: torch.Tensor) -> torch.Tensor:
    """One non-geometric op on a uint8 batch, `args` one per image (on x's device)."""
    if name in _ENHANCE:
        return _ENHANCE[name](x, args)
    if name == "AutoContrast":
        return image_ops.auto_contrast(x)
    if name == "Equalize":
        return image_ops.equalize(x)
    if name == "Invert":
        return image_ops.invert(x)
    if name == "Posterize":
        return image_ops.posterize(x, args)
    if name == "Solarize":
        return image_ops.solarize(x, args)
    if name == "SolarizeAdd":
        return image_ops.solarize_add(x, args)
    if name == "Identity":
        return x
    raise ValueError(f"unknown augmentation op {name!r}")
