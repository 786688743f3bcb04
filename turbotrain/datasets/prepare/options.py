"""What a conversion is asked to do (`PrepareOptions`, one field a prepare-dataset flag), the
checks on it, and `PrepareError`, the one-line refusal every part of a conversion raises."""
from __future__ import annotations

from dataclasses import dataclass

from turbotrain.datasets.beton import layout
from turbotrain.datasets.sources.class_labels import CLASS_CHOICES
from turbotrain.files.untrusted import Limits


class PrepareError(RuntimeError):
    """A user-caused problem with a conversion; the message is one line naming the culprit."""


@dataclass(frozen=True)
class PrepareOptions:
    encoding: str = "auto"        # auto | jpeg | raw
    max_side: int = 512           # 0: keep the source size
    quality: int = 90
    workers: int = 0              # 0: all cores
    val_fraction: float = 0.0
    on_error: str = "fail"        # fail | skip
    overwrite: bool = False
    seed: int = 0
    progress: bool = True
    limits: Limits = Limits()
    allow_outside_root: bool = False  # read CSV rows / symlinks that lead outside SOURCE
    shard_size: int | None = None     # bytes of source per shard (shard_plan.py); None: one file
    part: tuple[int, int] | None = None  # (i, N): only part i's shards, plus its manifest
    image_column: str | None = None   # a Hugging Face source's columns (sources/hf.py);
    label_column: str | None = None   # None: image/img, label/labels
    classes: str = "all"              # all | present (sources/class_labels.py)


def check_options(options: PrepareOptions) -> None:
    if options.on_error not in ("fail", "skip"):
        raise PrepareError(f"--on-error must be fail or skip, not {options.on_error!r}")
    if options.classes not in CLASS_CHOICES:
        raise PrepareError(f"--classes must be {' or '.join(CLASS_CHOICES)}, not "
                           f"{options.classes!r}")
    if options.encoding not in ("auto", "jpeg", "raw"):
        raise PrepareError(f"--encoding must be auto, jpeg or raw, not {options.encoding!r}")
    if not 1 <= options.quality <= 100:
        raise PrepareError(f"--quality must be in 1..100, not {options.quality}")
    if not 0 <= options.max_side <= layout.MAX_IMAGE_SIDE:
        raise PrepareError(f"--max-side must be in 0..{layout.MAX_IMAGE_SIDE} (0 keeps the size), "
                           f"not {options.max_side}")
    if options.shard_size is not None and options.shard_size < 1:
        raise PrepareError(f"--shard-size must be a positive size, not {options.shard_size}")
    if options.part is not None and not 0 <= options.part[0] < options.part[1]:
        raise PrepareError(f"--part {options.part[0]}/{options.part[1]}: expected i/N with "
                           f"0 <= i < N")
    if options.part is not None and options.shard_size is None:
        raise PrepareError("--part needs --shard-size: parts are made of whole shards "
                           "(e.g. --shard-size 1GB --part 0/4)")
    limits = options.limits
    if limits.max_file_bytes <= 0 or limits.max_array_bytes <= 0 or limits.max_inflate_ratio < 1:
        raise PrepareError("--max-file-mb and --max-array-mb must be positive and "
                           "--max-inflate-ratio at least 1")
