"""Turning one source image into what a .beton stores (`encode_sample`), and back (`decode_stored`).

prepare-dataset calls `encode_sample` once per image in its worker processes. Four paths, cheapest
first (times: one core of the 2-core build machine, a 500x375 q90 photo-like JPEG; see
tests/datasets/beton/test_images.py::test_encode_speed to re-measure):

1. JPEG pass-through, ~0.4 ms: a baseline 3-component JPEG that needs no resize and no rotation
   is stored byte for byte (no generation loss). It is still decoded once, strictly, at 1/4 scale:
   libjpeg-turbo must entropy-decode every coefficient to reach the end of the file, so this
   catches truncation and corrupt data, while the reduced IDCT and colour conversion make it
   cheaper than a full decode. The pixel stats come from that 1/4-scale image.
2. Other JPEGs (progressive, greyscale, EXIF-rotated, larger than max_side), 1.1-1.4 ms
   (progressive 2.2 ms, 1.6 of it decoding): decoded by simplejpeg at the smallest DCT scale
   that still covers the target size, rotated, resized with cv2.INTER_AREA, re-encoded at
   `quality`. CMYK/YCCK JPEGs go through PIL, which knows Adobe's inverted CMYK.
3. Everything else (PNG, WebP, BMP, GIF, TIFF): PIL, ~2.5 ms for a 500x375 PNG.
4. numpy arrays (CIFAR, MNIST, .npz sources): no decode at all.

Every library error becomes an `ImageError` whose text is a short reason; the caller adds the
file name. Decoding is strict: a truncated JPEG that libjpeg-turbo would silently pad with grey
(it only *warns* "Premature end of JPEG file") is refused, never stored.
"""
from __future__ import annotations

import io
import re
import struct
import warnings
from typing import NamedTuple

import cv2
import numpy as np
import simplejpeg
from PIL import Image, ImageOps, UnidentifiedImageError

from turbotrain.held_setting import HeldSetting

from .jpeg_header import JpegHeader, read_jpeg_header
from .layout import MAX_IMAGE_SIDE, MAX_PIXELS, MODE_JPEG, MODE_RAW, SMALL_IMAGE_MAX_SIDE

# FFCV stores width and height as '<u2' (layout.FIELD_METADATA_DTYPES).
MAX_STORED_SIDE = MAX_IMAGE_SIDE
# "auto" stores small images (layout.SMALL_IMAGE_MAX_SIDE) raw: a 64x64x3 raw image is 12 KiB and
# loads with a copy, no decode. JPEG would shrink a 32x32 CIFAR image ~5x (646 B vs 3 KiB at q90)
# but is lossy, and 4:2:0 leaves it 16x16 colour: small-image benchmarks are defined on the exact
# pixels.
ENCODINGS = ("auto", "jpeg", "raw")
# A pass-through JPEG is validated by a strict decode at 1/_VALIDATION_SCALE of its size, which
# also gives its pixel stats. Every scale entropy-decodes the whole file; smaller ones save IDCT
# and colour conversion but lose within-block detail, so the std is underestimated:
#   scale   ms (500x375 q90 synthetic)   std error, real 512x600 photo (grace_hopper.jpg)
#   1/8     0.34                          -5 .. -7.5%
#   1/4     0.38                          -2.5 .. -3.6%
#   1/2     0.41                          -0.7 .. -1.2%
#   1/1     0.50                           0
# 1/4: 25% cheaper than a full decode, and a 3% low std does not matter for input normalisation.
_VALIDATION_SCALE = 4

# PIL checks image size inside Image.open (and a GIF's frame seeks), before any pixels are
# decoded: it warns above Image.MAX_IMAGE_PIXELS (default 89.5 Mpx) and raises above twice that.
# Aligning its threshold with ours keeps one limit for every format; our own check then gives
# the refusal message. PIL reads the limit from a module global and takes none per call, so it
# is ours only while we open and decode (`with PIL_LIMIT:`); a library user's PIL keeps theirs.
PIL_MAX_PIXELS = MAX_PIXELS


def _set_pil_limit(pixels) -> None:
    Image.MAX_IMAGE_PIXELS = pixels


PIL_LIMIT = HeldSetting(lambda: Image.MAX_IMAGE_PIXELS, _set_pil_limit, lambda: PIL_MAX_PIXELS)

# What PIL's plugins raise on bad input: OSError (incl. UnidentifiedImageError, "image file is
# truncated"), SyntaxError ("broken PNG file"), EOFError / IndexError / KeyError / struct.error
# (GIF and TIFF readers walking short or inconsistent tables), ValueError (bad parameters).
_PIL_ERRORS = (OSError, SyntaxError, ValueError, EOFError, IndexError, KeyError, struct.error)

# The formats PIL may open for us (JPEG: the CMYK ones). Not "anything PIL reads": its EPS
# plugin runs Ghostscript on the data, and a dataset file named .jpg can hold anything.
_PIL_FORMATS = ("PNG", "JPEG", "WEBP", "BMP", "GIF", "TIFF")
# Only to word the refusal when PIL recognises nothing: a broken PNG is not "not an image".
# (offset, magic, name)
_SIGNATURES = ((0, b"\x89PNG", "PNG"), (0, b"GIF8", "GIF"), (0, b"BM", "BMP"),
               (8, b"WEBP", "WebP"), (0, b"II*\x00", "TIFF"), (0, b"MM\x00*", "TIFF"))
_ALPHA_MODES = {"RGBA", "LA", "PA", "RGBa", "La"}
_SIXTEEN_BIT_MODES = {"I;16", "I;16L", "I;16B", "I;16N", "I"}

# EXIF orientation -> how to turn the stored pixels upright (same results as PIL's
# ImageOps.exif_transpose; tests/datasets/beton/test_images.py checks all eight). cv2, because
# numpy's reversed/transposed views cost 0.55 ms to make contiguous on 500x375x3, cv2.rotate
# 0.05 ms.
_UPRIGHT = {
    1: lambda a: a,
    2: lambda a: cv2.flip(a, 1),                                  # mirrored left-right
    3: lambda a: cv2.rotate(a, cv2.ROTATE_180),
    4: lambda a: cv2.flip(a, 0),                                  # mirrored top-bottom
    5: lambda a: cv2.transpose(a),                                # about the main diagonal
    6: lambda a: cv2.rotate(a, cv2.ROTATE_90_CLOCKWISE),
    7: lambda a: cv2.flip(cv2.transpose(a), -1),                  # about the anti-diagonal
    8: lambda a: cv2.rotate(a, cv2.ROTATE_90_COUNTERCLOCKWISE),
}


class ImageError(ValueError):
    """A source image that cannot be stored; str(e) is a short reason without the file name."""


class EncodedSample(NamedTuple):
    """One image as stored, plus its contribution to the dataset's per-channel mean/std.

    The stats describe the stored image: pixel_count is height * width, pixel_sum and
    pixel_sq_sum are per RGB channel, in 0..255 units. On the pass-through path they are measured
    on the 1/4-scale validation decode and scaled up to pixel_count, so every path weighs an
    image by its stored size. The mean is then within ~0.2% (a reduced IDCT averages blocks);
    the std misses within-block detail (see _VALIDATION_SCALE).
    """
    mode: int                  # MODE_JPEG or MODE_RAW (layout.py)
    height: int
    width: int
    payload: bytes             # JPEG file bytes, or HWC uint8 RGB in C order
    pixel_sum: np.ndarray      # float64 (3,)
    pixel_sq_sum: np.ndarray   # float64 (3,)
    pixel_count: int


def encode_sample(source: bytes | np.ndarray, *, encoding: str, max_side: int,
                  quality: int, validate: bool = True) -> EncodedSample:
    """Turn one image file's bytes, or a uint8 array, into what a .beton stores.

    encoding: "jpeg", "raw", or "auto" (raw when the stored longest side <= SMALL_IMAGE_MAX_SIDE).
    max_side: shrink (never enlarge) so the longest side is at most this; 0 = keep the size.
    quality: JPEG quality 1..100 when we (re-)encode; a passed-through JPEG keeps its own.
    validate: False skips the strict 1/4-scale decode of a JPEG that passes through (its pixel
    stats are then zero): for `turbotrain predict`, which decodes the bytes next anyway and
    would pay ~0.4 ms an image for it. Everything else is the same, byte for byte.
    Raises ImageError for a bad image; ValueError/TypeError for bad arguments.
    """
    _check_options(encoding, max_side, quality)
    if isinstance(source, np.ndarray):
        rgb = _array_to_rgb(source)
        _check_size(*rgb.shape[:2], max_side)
        return _store(rgb, _target_size(*rgb.shape[:2], max_side), encoding, quality)
    if not isinstance(source, (bytes, bytearray, memoryview)):
        raise TypeError(f"source must be bytes or a numpy array, not {type(source).__name__}")
    data = bytes(source)
    if not data:
        raise ImageError("zero-byte file")
    if data.startswith(b"\xff\xd8"):
        return _encode_jpeg(data, encoding, max_side, quality, validate)
    rgb = _decode_with_pil(data, max_side)
    return _store(rgb, _target_size(*rgb.shape[:2], max_side), encoding, quality)


def decode_stored(mode: int, height: int, width: int, payload: bytes) -> np.ndarray:
    """The stored image as a (height, width, 3) uint8 RGB array (writable, owned).

    Nothing is allocated or decoded for more than the metadata's height x width, itself at most
    MAX_PIXELS: a stored JPEG's header is read first (libjpeg-turbo's, ~1.3 us; our pure-Python
    read_jpeg_header costs ~4 us on bytes and ~12 us on a memory-map view, which it must copy)
    and a JPEG of another size is refused before decoding (a 6000x6000 JPEG labelled 8x8 would
    otherwise decode 108 MB first)."""
    if height * width > MAX_PIXELS:
        raise ImageError(f"metadata claims {width}x{height} pixels, over the "
                         f"{MAX_PIXELS / 1e6:.0f} Mpx limit")
    if mode == MODE_RAW:
        if len(payload) != height * width * 3:
            raise ImageError(f"raw payload of {len(payload)} bytes, expected "
                             f"{height}x{width}x3 = {height * width * 3}")
        return np.frombuffer(payload, dtype=np.uint8).reshape(height, width, 3).copy()
    if mode == MODE_JPEG:
        declared = stored_jpeg_size(payload)
        if declared != (height, width):
            raise ImageError(f"JPEG header declares {declared[1]}x{declared[0]}, metadata says "
                             f"{width}x{height}")
        rgb = _decode_jpeg(payload)
        if rgb.shape[:2] != (height, width):
            raise ImageError(f"JPEG decodes to {rgb.shape[1]}x{rgb.shape[0]}, metadata says "
                             f"{width}x{height}")
        return rgb
    raise ImageError(f"unknown storage mode {mode} (expected {MODE_JPEG} jpeg or {MODE_RAW} raw)")


def stored_jpeg_size(payload) -> tuple[int, int]:
    """(height, width) a stored JPEG's header declares, without decoding anything (~1.3 us;
    payload may be any buffer, e.g. a read-only memory-map view). ImageError when the header is
    unreadable: simplejpeg.decode_jpeg reads the same header first, so it would fail too."""
    try:
        height, width, _, _ = simplejpeg.decode_jpeg_header(payload)
    except (ValueError, RuntimeError) as e:
        raise ImageError(f"corrupt JPEG header ({' '.join(str(e).split()).rstrip('.')})") from e
    return height, width


def _check_options(encoding: str, max_side: int, quality: int) -> None:
    if encoding not in ENCODINGS:
        raise ValueError(f"encoding {encoding!r} is not one of {', '.join(ENCODINGS)}")
    if not 0 <= max_side <= MAX_STORED_SIDE:
        raise ValueError(f"max_side {max_side} must be 0 (no limit) or 1..{MAX_STORED_SIDE}")
    if not 1 <= quality <= 100:
        raise ValueError(f"JPEG quality {quality} must be in 1..100")


def _check_size(height: int, width: int, max_side: int) -> None:
    """Refuse, from the header alone, what we must not decode or cannot store."""
    if height * width > MAX_PIXELS:
        raise ImageError(f"decompression bomb: {width}x{height} = {height * width / 1e6:.0f} Mpx "
                         f"exceeds the {MAX_PIXELS / 1e6:.0f} Mpx limit")
    longest = max(height, width)
    if longest > MAX_STORED_SIDE and not max_side:
        raise ImageError(f"{width}x{height} is larger than {MAX_STORED_SIDE} pixels, the largest "
                         f"side a .beton stores; set a max side to shrink it")


def _target_size(height: int, width: int, max_side: int) -> tuple[int, int]:
    """(height, width) with the longest side shrunk to max_side, aspect kept, never enlarged."""
    longest = max(height, width)
    if not max_side or longest <= max_side:
        return height, width
    scale = max_side / longest
    return max(1, round(height * scale)), max(1, round(width * scale))


def _stored_mode(encoding: str, height: int, width: int) -> int:
    if encoding == "raw" or (encoding == "auto" and max(height, width) <= SMALL_IMAGE_MAX_SIDE):
        return MODE_RAW
    return MODE_JPEG


def _encode_jpeg(data: bytes, encoding: str, max_side: int, quality: int,
                 validate: bool = True) -> EncodedSample:
    try:
        header = read_jpeg_header(data)
    except ValueError as e:
        raise ImageError(str(e)) from e
    if header.precision != 8:
        raise ImageError(f"unsupported JPEG: {header.precision}-bit samples (only 8-bit)")
    _check_size(header.height, header.width, max_side)
    rotated = header.orientation >= 5  # orientations 5..8 swap width and height
    upright = (header.width, header.height) if rotated else (header.height, header.width)
    target = _target_size(*upright, max_side)
    mode = _stored_mode(encoding, *target)
    if mode == MODE_JPEG and target == upright and _can_pass_through(header):
        if not validate:
            zero = np.zeros(3)
            return EncodedSample(MODE_JPEG, header.height, header.width, data, zero, zero.copy(),
                                 header.height * header.width)
        reduced = _decode_jpeg(data, min_height=max(1, header.height // _VALIDATION_SCALE),
                               min_width=max(1, header.width // _VALIDATION_SCALE))
        return EncodedSample(MODE_JPEG, header.height, header.width, data,
                             *_pixel_stats(reduced, header.height * header.width))
    if header.components == 4:
        # CMYK/YCCK: validate strictly with libjpeg-turbo (PIL ignores its warnings), then let
        # PIL convert, because it inverts Adobe's CMYK as Photoshop writes it.
        _decode_jpeg(data, colorspace="CMYK", min_height=1, min_width=1)
        return _store(_decode_with_pil(data, max_side), target, encoding, quality)
    # Decode at the smallest DCT scale (k/8) that still covers the target, then INTER_AREA the
    # rest of the way: a 1/2-scale IDCT is itself a good low-pass, and skips 3/4 of the work.
    need_h, need_w = (target[1], target[0]) if rotated else target
    decoded = _decode_jpeg(data, min_height=need_h, min_width=need_w)
    return _store(_UPRIGHT[header.orientation](decoded), target, encoding, quality)


def _can_pass_through(header: JpegHeader) -> bool:
    """Stored JPEGs must be what every reader decodes fast: sequential Huffman (not progressive
    or arithmetic; nvJPEG's hardware engine decodes only these), 8-bit, 3 components (YCbCr, or
    RGB per Adobe's marker), upright."""
    return (header.is_sequential_huffman and header.precision == 8
            and header.components == 3 and header.orientation == 1)


def _decode_jpeg(data: bytes, **options) -> np.ndarray:
    """simplejpeg decode in strict mode: libjpeg-turbo's recoverable warnings ("Premature end of
    JPEG file", "Corrupt JPEG data: bad Huffman code") raise instead of padding with grey."""
    try:
        return simplejpeg.decode_jpeg(data, strict=True, **options)
    except (ValueError, RuntimeError) as e:
        message = str(e).strip().rstrip(".")
        if "Premature end" in message:
            raise ImageError("truncated JPEG (premature end of data)") from e
        raise ImageError(f"corrupt JPEG ({message})") from e


def _decode_with_pil(data: bytes, max_side: int) -> np.ndarray:
    """Any format PIL reads -> upright HWC uint8 RGB. Animated images give their first frame."""
    try:
        # PIL's warnings are recorded and dropped, never shown nor raised (even under -W error):
        # its bomb warning, because the size check below refuses the same images with a clearer
        # message; the rest ("Tag data larger than file", "Corrupt EXIF data", palette
        # transparency notes) because the image then either decodes or raises, and a million
        # images' worth of them would bury prepare-dataset's own report. catch_warnings is
        # process-wide, not thread-safe: prepare-dataset encodes in worker processes.
        with PIL_LIMIT, warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            image = Image.open(io.BytesIO(data), formats=_PIL_FORMATS)  # reads the header only
            _check_size(image.height, image.width, max_side)
            return _pil_to_rgb(ImageOps.exif_transpose(image))  # decodes the pixels
    except ImageError:
        raise
    except Image.DecompressionBombError as e:
        # Raised inside Image.open for more than 2 x MAX_PIXELS, before we see the size; its
        # text names PIL's doubled limit, so restate it against ours.
        pixels = re.search(r"\((\d+) pixels\)", str(e))
        found = f"{int(pixels[1]) / 1e6:.0f} Mpx" if pixels else "the image"
        raise ImageError(f"decompression bomb: {found} exceeds the "
                         f"{MAX_PIXELS / 1e6:.0f} Mpx limit") from e
    except UnidentifiedImageError as e:
        known = _format_name(data)
        reason = (f"corrupt {known} header" if known else
                  "not an image (or not JPEG, PNG, WebP, BMP, GIF or TIFF)")
        raise ImageError(reason) from e
    except _PIL_ERRORS as e:
        raise ImageError(f"corrupt {_format_name(data) or 'image'} "
                         f"({str(e) or type(e).__name__})") from e


def _format_name(data: bytes) -> str | None:
    return next((name for at, magic, name in _SIGNATURES if data[at:at + len(magic)] == magic),
                None)


def _pil_to_rgb(image: Image.Image) -> np.ndarray:
    if image.mode in _SIXTEEN_BIT_MODES:
        # 16-bit greyscale PNG/TIFF: scale 0..65535 to 0..255 rounding to nearest (65535 -> 255,
        # 32768 -> 128); a plain convert("L") would clip everything above 255 to white.
        # Mode "I" is 32-bit signed; we read it as 16-bit data, which is what PNG/TIFF hold.
        values = np.clip(np.asarray(image), 0, 65535).astype(np.uint32)
        grey = ((values * 255 + 32767) // 65535).astype(np.uint8)
        return cv2.cvtColor(grey, cv2.COLOR_GRAY2RGB)
    if image.mode == "F":
        raise ImageError("unsupported image: floating-point pixels (mode F)")
    if image.mode in _ALPHA_MODES or "transparency" in image.info:
        return _over_white(np.asarray(image.convert("RGBA")))
    if image.mode != "RGB":
        # L, 1, P, CMYK (Adobe-inverted handled at decode), YCbCr, LAB, HSV. 16-bit RGB PNGs
        # arrive as RGB already: PIL keeps the high byte of each sample.
        image = image.convert("RGB")
    return np.asarray(image)


def _over_white(rgba: np.ndarray) -> np.ndarray:
    """Composite onto white, as a browser shows a transparent image on a white page (logos and
    product photos are made for that). Dropping alpha instead would expose whatever colour the
    editor left under transparent pixels: often black, sometimes garbage."""
    rgb = rgba[..., :3].astype(np.uint16)
    alpha = rgba[..., 3:].astype(np.uint16)
    return ((rgb * alpha + 255 * (255 - alpha) + 127) // 255).astype(np.uint8)


def _array_to_rgb(array: np.ndarray) -> np.ndarray:
    if array.dtype != np.uint8:
        raise ImageError(f"array of dtype {array.dtype}, expected uint8")
    channels = array.shape[2] if array.ndim == 3 else None
    if array.ndim == 2 or channels == 1:
        grey = np.ascontiguousarray(array.reshape(array.shape[:2]))
        rgb = cv2.cvtColor(grey, cv2.COLOR_GRAY2RGB) if grey.size else grey
    elif channels == 3:
        rgb = np.ascontiguousarray(array)
    elif channels == 4:
        rgb = _over_white(array)
    else:
        raise ImageError(f"array of shape {array.shape}, expected (H, W), (H, W, 1), (H, W, 3) "
                         f"or (H, W, 4)")
    if rgb.shape[0] == 0 or rgb.shape[1] == 0:
        raise ImageError(f"empty image ({array.shape[1]}x{array.shape[0]})")
    return rgb


def _store(rgb: np.ndarray, target: tuple[int, int], encoding: str,
           quality: int) -> EncodedSample:
    """Resize to target (height, width), computed from the source's full size (a reduced DCT
    decode must not change the rounding), measure, encode."""
    height, width = target
    if rgb.shape[:2] != (height, width):
        # INTER_AREA averages every source pixel under each output pixel: no aliasing when
        # shrinking, unlike bilinear which samples 4 of them.
        rgb = cv2.resize(rgb, (width, height), interpolation=cv2.INTER_AREA)
    mode = _stored_mode(encoding, height, width)
    if mode == MODE_RAW:
        payload = rgb.tobytes()
    else:
        # 4:2:0, like cameras and OpenCV's default (FFCV's writer): 4:4:4 files are 15% (real
        # photo) to 90% (noisy synthetic) larger at q90, for colour detail the eye, and
        # classifiers trained on camera JPEGs, barely use.
        payload = simplejpeg.encode_jpeg(np.ascontiguousarray(rgb), quality=quality,
                                         colorspace="RGB", colorsubsampling="420")
    return EncodedSample(mode, height, width, payload, *_pixel_stats(rgb, height * width))


def _pixel_stats(rgb: np.ndarray, stored_pixels: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Per-channel sum and sum of squares, scaled from the measured image to stored_pixels.

    cv2.meanStdDev takes 0.14 ms on 500x375x3; numpy's sum(dtype=float64) takes 2 ms.
    """
    mean, std = cv2.meanStdDev(rgb)
    mean = mean.reshape(3)
    mean_sq = std.reshape(3) ** 2 + mean ** 2
    return mean * stored_pixels, mean_sq * stored_pixels, stored_pixels


def declared_size(data: bytes) -> tuple[int, int, bool] | None:
    """(height, width, is_jpeg) as the image's header declares them, without decoding; None
    when the header is unreadable (the encoder will say why)."""
    if data.startswith(b"\xff\xd8"):
        try:
            header = read_jpeg_header(data)
        except ValueError:
            return None
        return header.height, header.width, True
    try:
        with PIL_LIMIT, warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            image = Image.open(io.BytesIO(data), formats=_PIL_FORMATS)
            return image.height, image.width, False
    except Image.DecompressionBombError:
        return MAX_STORED_SIDE, MAX_STORED_SIDE, False  # refused at encode; counts as the largest
    except (UnidentifiedImageError, *_PIL_ERRORS):
        return None
