"""How many encoding workers fit in memory: prepare-dataset runs one per core, and each decodes
one image at a time, so the largest image sets what a worker may need.

Measured: peak RSS over the process's baseline while `encode_sample` encodes one 5000 x 4000
(20 Mpx) image, per format, max side 512 or none (the same either way):

    PNG RGBA 34 B/px, PNG RGB 14, PNG grey 11    (PIL's decode, RGBA->RGB over white, resize)
    JPEG progressive 6, baseline pass-through 0.3 (libjpeg's coefficient buffer, 1/4-scale check)

A 100 Mpx PNG (layout.MAX_PIXELS, the largest image we decode) can thus need 3.4 GB in one
worker, and there is one worker per core: 16 of them need 54 GB.
"""
from __future__ import annotations

import heapq
import os

from turbotrain.datasets.beton.layout import MAX_PIXELS
from turbotrain.datasets.beton.sample_codec import declared_size
from turbotrain.datasets.sources.source import ArraySplit, FileSplit, Source
from turbotrain.files.untrusted import UnsafeInput, open_regular

BYTES_PER_PIXEL = 34        # any format but JPEG: PNG RGBA, the worst measured
JPEG_BYTES_PER_PIXEL = 9    # progressive JPEG's 6 plus the decoded RGB
ARRAY_BYTES_PER_PIXEL = 14  # an array source: RGB conversion, resize and encode buffers
WORKER_BASE_BYTES = 128 << 20  # a worker's own RSS after importing cv2, PIL, simplejpeg (80-140 MB)
# Files whose headers are read to find the largest image: the largest files by size. A small
# file can still declare a huge image (a PNG of one colour); those are capped at MAX_PIXELS
# and a worker that meets one needs at most MAX_PIXELS x BYTES_PER_PIXEL.
SAMPLED_FILES = 16
HEADER_BYTES = 1 << 20  # enough for any JPEG's markers before the frame, and PNG/WebP headers


def largest_image(source: Source) -> tuple[int, str]:
    """(bytes one worker may need for the largest image found, a description of that image)."""
    need, what = 0, "no images"
    for split in source.splits.values():
        if isinstance(split, ArraySplit) and len(split):
            height, width = split.images.shape[1:3]
            candidates = [(height * width * ARRAY_BYTES_PER_PIXEL, f"{width}x{height} arrays")]
        elif isinstance(split, FileSplit):
            candidates = [_file_need(path) for path in _largest_files(split)]
        else:  # shards and HF rows: the headers of the largest samples the split knows of
            candidates = [_head_need(name, head)
                          for name, head in split.largest_heads(SAMPLED_FILES, HEADER_BYTES)]
        for bytes_needed, description in candidates:
            if bytes_needed > need:
                need, what = bytes_needed, description
    return WORKER_BASE_BYTES + need, what


def _largest_files(split: FileSplit) -> list[str]:
    """The SAMPLED_FILES largest files of the split (one stat each: ~1 s per million files)."""
    def size(path: str) -> int:
        try:
            return os.stat(path).st_size
        except OSError:
            return -1
    paths = (split.name(i) for i in range(len(split)))
    return heapq.nlargest(SAMPLED_FILES, paths, key=size)


def _file_need(path: str) -> tuple[int, str]:
    try:
        with open_regular(path) as f:
            head = f.read(HEADER_BYTES)
    except (OSError, UnsafeInput):
        return 0, ""
    return _head_need(path, head)


def _head_need(path: str, head: bytes) -> tuple[int, str]:
    declared = declared_size(head)
    if declared is None:
        return 0, ""
    height, width, is_jpeg = declared
    pixels = min(height * width, MAX_PIXELS)
    per_pixel = JPEG_BYTES_PER_PIXEL if is_jpeg else BYTES_PER_PIXEL
    return pixels * per_pixel, f"{os.path.basename(path)}, {width}x{height}"


def memory_bound_workers(wanted: int, source: Source, available: int) -> tuple[int, str]:
    """(workers, reason): wanted, or fewer so that every worker's largest image fits in the
    available memory, keeping a quarter of it for the parent and the rest of the machine."""
    per_worker, what = largest_image(source)
    fitting = max(1, int(available * 0.75) // per_worker)
    if fitting >= wanted:
        return wanted, ""
    return fitting, (f"{fitting} encoding workers, not {wanted}: each may need "
                     f"{per_worker / 2**30:.1f} GiB for the largest image ({what}) and "
                     f"{available / 2**30:.1f} GiB of memory is available")
