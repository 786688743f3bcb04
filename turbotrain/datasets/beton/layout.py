"""The on-disk layout of one split: FFCV's `.beton` (version 2), defined once as dtypes.

Every dtype below is explicitly little-endian ('<u2', not 'uint16') so a file written on one
machine reads the same on any other. The layout (byte tables in docs/FORMAT.md):

    [header][field descriptors][metadata table: one row per sample]
    [data pages ...: page k is bytes [k x page_size, (k+1) x page_size)][allocation table]

We write the layout FFCV 1.0's `DatasetWriter` writes, without its padding (it starts the data
on a page boundary and writes whole pages; writer.py says why neither is needed), so FFCV's own
`Loader` reads our files and we read theirs, without importing FFCV. Our own bookkeeping (class names, mean/std,
checksums) lives beside the split in `dataset.json`, never inside the `.beton`.
"""
from __future__ import annotations

import numpy as np

# FFCV's CURRENT_VERSION. A reader refuses any other: the layout has no forward compatibility.
BETON_VERSION = 2

HEADER_DTYPE = np.dtype([
    ("version", "<u2"),
    ("num_fields", "<u2"),
    ("page_size", "<u4"),
    ("num_samples", "<u8"),
    ("alloc_table_ptr", "<u8"),
], align=True)

FIELD_NAME_BYTES = 16
FIELD_ARGUMENT_BYTES = 1024
FIELD_DESC_DTYPE = np.dtype([
    ("type_id", "<u1"),
    ("name", ("<u1", FIELD_NAME_BYTES)),       # ASCII, zero-padded
    ("arguments", ("<u1", (FIELD_ARGUMENT_BYTES,))),  # per-type; zeros for image and int
], align=True)

# One row per allocation: which sample owns the bytes at [ptr, ptr + size).
ALLOC_DTYPE = np.dtype([
    ("sample_id", "<u8"),
    ("ptr", "<u8"),
    ("size", "<u8"),
])

# FFCV's type ids (ffcv/types.py TYPE_ID_HANDLER). We write IMAGE and INT; we can read all
# fixed-size scalar ones.
TYPE_FLOAT = 0
TYPE_INT = 1
TYPE_RGB_IMAGE = 2
TYPE_BYTES = 3
TYPE_NDARRAY = 4
TYPE_JSON = 5
TYPE_TORCH_TENSOR = 6

# Per-sample image storage modes (ffcv/fields/rgb_image.py IMAGE_MODES).
MODE_JPEG = 0
MODE_RAW = 1
MODE_NAMES = {MODE_JPEG: "jpeg", MODE_RAW: "raw"}

# The one "small image" rule: an image whose longest side is at most this many pixels (MNIST's
# 28, CIFAR's 32, 64 px thumbnails) is a whole picture, not a photo to crop from.
# prepare-dataset's `--encoding auto` stores it raw (beton/sample_codec.py: exact pixels, loaded
# with a copy), every pipeline pads and crops it instead of RandomResizedCrop
# (pipeline/augment.py), and the trainer trains it at its native size with a net made for small
# inputs (train/plan/rules.py). One value, so that what is stored raw is what
# is trained as small.
SMALL_IMAGE_MAX_SIDE = 64

# Metadata dtype of each field kind. RGB_IMAGE's struct is packed (not aligned), exactly as FFCV
# declares it; the row that combines fields is aligned.
FIELD_METADATA_DTYPES = {
    TYPE_FLOAT: np.dtype("<f8"),
    TYPE_INT: np.dtype("<i8"),
    TYPE_RGB_IMAGE: np.dtype([
        ("mode", "<u1"),
        ("width", "<u2"),
        ("height", "<u2"),
        ("data_ptr", "<u8"),
    ]),
    TYPE_BYTES: np.dtype([("ptr", "<u8"), ("size", "<u8")]),
    TYPE_NDARRAY: np.dtype("<u8"),
    TYPE_JSON: np.dtype([("ptr", "<u8"), ("size", "<u8")]),
}

# FFCV's writer allocates pages of 4 * 2 MiB by default; a sample never crosses a page, so this is
# also the largest sample we can store (a 1,670 x 1,670 raw RGB image).
DEFAULT_PAGE_SIZE = 8 << 20
MIN_PAGE_SIZE = 2 << 20

IMAGE_FIELD = "image"
LABEL_FIELD = "label"
MAX_IMAGE_SIDE = np.iinfo(np.uint16).max  # width/height are '<u2' in the metadata
# The most pixels one stored image may have, checked from headers and metadata before anything
# is decoded. Decoding costs 14 bytes per pixel for RGB and 34 for RGBA (PIL's decode plus our
# conversion and resize buffers), so 100 Mpx is 1.4-3.4 GB in one worker: above any ordinary
# camera photo (12-50 Mpx), far below what a crafted header can declare (~100 bytes of PNG can
# claim 20,000 x 20,000 pixels; a .beton's '<u2' sides allow 65,535 x 65,535 = 4.3 Gpx).
MAX_PIXELS = 100_000_000
# The most classes a dataset may have: 10x ImageNet-21k's 21,841. The class count sizes the
# output layer (2,048 x 200,000 fp32 weights = 1.6 GB), so a label read from a file (a bare
# .beton's largest label, a CSV's integer labels) is checked against it before anything is
# allocated for it.
MAX_CLASSES = 200_000


def metadata_dtype(type_ids: list[int]) -> np.dtype:
    """The metadata row of a file whose fields have these type ids (FFCV's get_metadata_type)."""
    return np.dtype([(f"f{i}", FIELD_METADATA_DTYPES[t]) for i, t in enumerate(type_ids)],
                    align=True)


def align_up(offset: int, page_size: int) -> int:
    return -(-offset // page_size) * page_size


def metadata_offset(num_fields: int) -> int:
    return HEADER_DTYPE.itemsize + num_fields * FIELD_DESC_DTYPE.itemsize


def encode_field_name(name: str) -> np.ndarray:
    raw = np.frombuffer(name.encode("ascii")[:FIELD_NAME_BYTES], dtype="<u1")
    out = np.zeros(FIELD_NAME_BYTES, dtype="<u1")
    out[: raw.size] = raw
    return out


def decode_field_name(raw: np.ndarray) -> str:
    return raw.tobytes().split(b"\x00", 1)[0].decode("ascii", errors="replace")
