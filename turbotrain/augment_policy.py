"""timm's augmentation flags read into one `AugmentPolicy`: `--aa`, `--reprob`, `--remode`,
`--recount`, `--color-jitter` (train's flags, turbotrain.Loader's arguments, the pipelines'
`PipelineOptions.augment`).

The spellings are timm's (`timm/data/auto_augment.py`, `random_erasing.py`, `train.py`):

* `--aa rand-m9-mstd0.5`: RandAugment (Cubuk et al. 2019) as timm runs it: `n` ops per image
  (default 2), chosen uniformly with replacement from timm's 15, each applied with probability
  1/2, at magnitude `m` of 10 (default 10) plus Gaussian noise of std `mstd` (above 100:
  uniform in [0, m]), clipped to [0, `mmax`] (default 10); `inc1` takes timm's "increasing"
  variants (Posterize, Solarize, Color, Contrast, Brightness, Sharpness grow stronger with m).
* `--aa trivial`: TrivialAugment (Mueller & Hutter 2021) in its wide space, as torchvision's
  TrivialAugmentWide: one op of 14 per image, always applied, at a magnitude bin drawn
  uniformly from 31.
* `--reprob P --remode pixel|rand|const --recount N`: RandomErasing (Zhong et al. 2017) with
  timm's ranges: per image with probability P, 1..N boxes of 2-33 % of the area, aspect ratio
  log-uniform in [0.3, 1/0.3], filled with per-pixel or per-box normal noise in the normalised
  space, or the mean (const).
* `--color-jitter F`: torchvision's ColorJitter(F, F, F) (brightness, contrast, saturation each
  by a factor uniform in [max(0, 1 - F), 1 + F], in a random order), which timm applies only
  when `--aa` is off: so do we, and the plan says so.

This module is a leaf without torch (config.py validates with it, and `train --help` stays
cheap); the ops themselves are in turbotrain/pipeline/after_decode.py and its modules.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

RAND, TRIVIAL = "rand", "trivial"
ERASE_MODES = ("pixel", "rand", "const")
MAGNITUDE_MAX = 10  # timm's _LEVEL_DENOM: magnitudes are tenths of each op's full range
_SECTION = re.compile(r"([a-z]+)(\d.*)")


class AugmentError(ValueError):
    """A bad augmentation setting: one line naming the flag and what it takes. `setting` is
    the TrainConfig field (and Loader argument), `value` what was given, `why` the rule."""

    def __init__(self, setting: str, value, why: str):
        self.setting, self.value, self.why = setting, value, why
        super().__init__(f"--{setting.replace('_', '-')} {value}: {why}")


@dataclass(frozen=True)
class RandAugmentSpec:
    """A parsed `--aa`: the policy and, for RandAugment, timm's config sections."""
    kind: str  # RAND or TRIVIAL
    magnitude: float = 10.0  # m
    layers: int = 2  # n: ops per image
    magnitude_std: float = 0.0  # mstd; math.inf: uniform in [0, m]
    magnitude_max: float = 10.0  # mmax
    increasing: bool = False  # inc1

    def describe(self) -> str:
        if self.kind == TRIVIAL:
            return "TrivialAugment (wide: 1 op of 14 per image, magnitude uniform)"
        noise = ("uniform in [0, m]" if math.isinf(self.magnitude_std) else
                 f"std {self.magnitude_std:g}" if self.magnitude_std else "fixed")
        ops = "timm's increasing ops" if self.increasing else "timm's 15 ops"
        return (f"RandAugment ({self.layers} ops per image of {ops}, each p=0.5, magnitude "
                f"{self.magnitude:g}/10 {noise})")


def parse_aa(text: str | None) -> RandAugmentSpec | None:
    """`--aa`'s value: None, "" or "none" (off), "trivial", or "rand-m9-n2-mstd0.5-mmax10-inc1"
    (sections in any order, all optional). AugmentError for anything else."""
    if text is None or text.strip().lower() in ("", "none"):
        return None
    text = text.strip().lower()
    if text == TRIVIAL:
        return RandAugmentSpec(TRIVIAL, layers=1)
    head, *sections = text.split("-")
    if head != RAND:
        raise AugmentError("aa", text, "takes rand-m9-mstd0.5 (RandAugment, timm's syntax), "
                           "trivial (TrivialAugment) or none; timm's AutoAugment and AugMix "
                           "policies are not implemented")
    values = {"m": 10.0, "n": 2, "mstd": 0.0, "mmax": 10.0, "inc": False}
    for section in sections:
        match = _SECTION.fullmatch(section)
        if match is None or match[1] not in values:
            raise AugmentError("aa", text, f"unknown section {section!r}; RandAugment takes "
                               "m<magnitude>, n<ops>, mstd<std>, mmax<max>, inc<0|1>")
        key, raw = match[1], match[2]
        try:
            number = float(raw)
        except ValueError:
            raise AugmentError("aa", text, f"{key} needs a number, not {raw!r}") from None
        values[key] = number
    return _checked_rand(text, values)


def _checked_rand(text: str, values: dict) -> RandAugmentSpec:
    n, m, mstd, mmax = values["n"], values["m"], values["mstd"], values["mmax"]
    if not (float(n).is_integer() and 1 <= n <= 8):
        raise AugmentError("aa", text, "n (ops per image) must be a whole number 1..8")
    if not (math.isfinite(m) and 0 <= m <= 30) or not (math.isfinite(mmax) and 0 < mmax <= 30):
        raise AugmentError("aa", text, "m must be in [0, 30] and mmax in (0, 30] (10 is each "
                           "op's full range)")
    if not (mstd >= 0 and not math.isnan(mstd)):
        raise AugmentError("aa", text, "mstd must be >= 0")
    if values["inc"] not in (0, 1, False, True):
        raise AugmentError("aa", text, "inc takes 0 or 1")
    return RandAugmentSpec(RAND, magnitude=m, layers=int(n),
                           magnitude_std=math.inf if mstd > 100 else mstd,  # timm's rule
                           magnitude_max=mmax, increasing=bool(values["inc"]))


@dataclass(frozen=True)
class AugmentPolicy:
    """The augmentations applied after decode, on top of the crops and flips (augment.py)."""
    aa: RandAugmentSpec | None = None
    reprob: float = 0.0
    remode: str = "pixel"
    recount: int = 1
    color_jitter: float = 0.0

    @property
    def enabled(self) -> bool:
        return self.aa is not None or self.reprob > 0 or self.color_jitter > 0

    @property
    def jitters(self) -> bool:
        """Colour jitter runs: asked for, and no --aa (timm's create_transform drops it then)."""
        return self.color_jitter > 0 and self.aa is None

    def describe(self) -> str:
        """The policy in words, for the plan's line ("off" when nothing is on)."""
        parts = []
        if self.aa is not None:
            parts.append(self.aa.describe())
        if self.jitters:
            parts.append(f"colour jitter {self.color_jitter:g} (brightness, contrast, "
                         "saturation)")
        if self.reprob > 0:
            boxes = f"1-{self.recount} boxes" if self.recount > 1 else "1 box"
            parts.append(f"random erasing p={self.reprob:g}, {boxes}, {self.remode} fill")
        return " + ".join(parts) or "off"


def policy(aa: str | None = None, reprob: float = 0.0, remode: str = "pixel",
           recount: int = 1, color_jitter: float = 0.0) -> AugmentPolicy:
    """The policy of the flags' values; AugmentError (one line, naming the flag) when one is
    out of its range."""
    if aa is not None and not isinstance(aa, str):
        raise AugmentError("aa", aa, "needs a policy string such as rand-m9-mstd0.5 or trivial")
    spec = parse_aa(aa)
    for name, value in (("reprob", reprob), ("color_jitter", color_jitter)):
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise AugmentError(name, value, "needs a number")
    if not (math.isfinite(reprob) and 0.0 <= reprob <= 1.0):
        raise AugmentError("reprob", reprob, "must be in [0, 1] (0: off)")
    if remode not in ERASE_MODES:
        raise AugmentError("remode", remode, f"must be one of {', '.join(ERASE_MODES)}")
    if not (isinstance(recount, int) and not isinstance(recount, bool) and 1 <= recount <= 16):
        raise AugmentError("recount", recount, "must be a whole number 1..16")
    if not (math.isfinite(color_jitter) and 0.0 <= color_jitter <= 1.0):
        raise AugmentError("color_jitter", color_jitter, "must be in [0, 1] (0: off; 0.4 is "
                           "timm's)")
    return AugmentPolicy(spec, float(reprob), remode, recount, float(color_jitter))
