"""encode_sample / decode_stored: every source kind, every bad input, pass-through rules."""
from __future__ import annotations

import io
import struct
import time
import zlib

import numpy as np
import pytest
import simplejpeg
from PIL import Image, ImageOps

from turbotrain.datasets.beton import sample_codec
from turbotrain.datasets.beton.layout import MODE_JPEG, MODE_RAW
from turbotrain.datasets.beton.sample_codec import ImageError, decode_stored, encode_sample


def photo(height: int = 375, width: int = 500, seed: int = 0, noise: float = 12) -> np.ndarray:
    """Photo-like RGB: smooth gradients, sensor-like noise, flat discs with sharp edges."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    rgb = np.stack([x / width * 255, y / height * 255, (x + y) / (width + height) * 255], -1)
    rgb += rng.normal(0, noise, rgb.shape)
    for _ in range(12):
        cy, cx, r = rng.integers(0, height), rng.integers(0, width), rng.integers(10, 80)
        rgb[(y - cy) ** 2 + (x - cx) ** 2 < r * r] = rng.integers(0, 256, 3)
    return np.clip(rgb, 0, 255).astype(np.uint8)


def saved(image: Image.Image | np.ndarray, fmt: str = "JPEG", **options) -> bytes:
    if isinstance(image, np.ndarray):
        image = Image.fromarray(image)
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def encode(source, encoding: str = "auto", max_side: int = 0, quality: int = 90):
    return encode_sample(source, encoding=encoding, max_side=max_side, quality=quality)


def stored_pixels(sample) -> np.ndarray:
    return decode_stored(sample.mode, sample.height, sample.width, sample.payload)


def blocks(height: int = 64, width: int = 96) -> np.ndarray:
    """Four flat quadrants (red, green, blue, white): survive JPEG and show rotations."""
    rgb = np.zeros((height, width, 3), np.uint8)
    h, w = height // 2, width // 2
    rgb[:h, :w] = (255, 0, 0)
    rgb[:h, w:] = (0, 255, 0)
    rgb[h:, :w] = (0, 0, 255)
    rgb[h:, w:] = (255, 255, 255)
    return rgb


@pytest.fixture(scope="module")
def photo_jpeg() -> bytes:
    return saved(photo(), quality=90)


# --- pass-through -----------------------------------------------------------------------------

def test_baseline_jpeg_is_stored_byte_for_byte(photo_jpeg):
    sample = encode(photo_jpeg)
    assert sample.mode == MODE_JPEG
    assert (sample.height, sample.width) == (375, 500)
    assert sample.payload == photo_jpeg
    truth = decode_stored(MODE_JPEG, 375, 500, photo_jpeg).reshape(-1, 3).astype(np.float64)
    mean = sample.pixel_sum / sample.pixel_count
    std = np.sqrt(sample.pixel_sq_sum / sample.pixel_count - mean ** 2)
    assert sample.pixel_count == 375 * 500
    np.testing.assert_allclose(mean, truth.mean(0), rtol=0.01)
    np.testing.assert_allclose(std, truth.std(0), rtol=0.05)  # reduced decode: see sample_codec.py


def with_exif_orientation(rgb: np.ndarray, orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return saved(rgb, quality=95, exif=exif.tobytes())


@pytest.mark.parametrize("variant", ["progressive", "cmyk", "rotated", "oversized", "greyscale",
                                     "raw", "small-auto"])
def test_pass_through_only_when_nothing_changes(photo_jpeg, variant):
    rgb = photo()
    data, options, shape = {
        "progressive": (saved(rgb, quality=90, progressive=True), {}, (375, 500)),
        "cmyk": (saved(Image.fromarray(rgb).convert("CMYK"), quality=90), {}, (375, 500)),
        "rotated": (with_exif_orientation(rgb, 6), {}, (500, 375)),
        "oversized": (photo_jpeg, {"max_side": 256}, (192, 256)),
        "greyscale": (saved(Image.fromarray(rgb).convert("L")), {}, (375, 500)),
        "raw": (photo_jpeg, {"encoding": "raw"}, (375, 500)),
        "small-auto": (saved(rgb[:40, :60]), {}, (40, 60)),
    }[variant]
    sample = encode(data, **options)
    assert sample.payload != data
    assert (sample.height, sample.width) == shape
    assert stored_pixels(sample).shape == (*shape, 3)
    if variant != "raw" and variant != "small-auto":
        assert simplejpeg.decode_jpeg_header(sample.payload)[:2] == shape
        assert b"\xff\xc0" in sample.payload[:1000]  # what we write is baseline


def test_arithmetic_coded_jpeg_is_not_passed_through(photo_jpeg):
    # Same bytes with the SOF0 marker relabelled SOF9 (arithmetic): the Huffman data is then
    # undecodable, which must be refused, not copied.
    sof = photo_jpeg.index(b"\xff\xc0")
    relabelled = photo_jpeg[:sof] + b"\xff\xc9" + photo_jpeg[sof + 2:]
    with pytest.raises(ImageError):
        encode(relabelled)


# --- bad inputs -------------------------------------------------------------------------------

@pytest.mark.parametrize("keep", [0.5, 0.9, -100, -2])
def test_truncated_jpeg_is_refused(photo_jpeg, keep):
    # -2 drops only the EOI marker: libjpeg-turbo merely warns about that one.
    cut = int(len(photo_jpeg) * keep) if keep > 0 else len(photo_jpeg) + keep
    with pytest.raises(ImageError, match="truncated"):
        encode(photo_jpeg[:cut])


def test_truncated_jpeg_is_refused_on_every_path(photo_jpeg):
    cut = photo_jpeg[:-100]
    for options in ({"max_side": 100}, {"encoding": "raw"}):
        with pytest.raises(ImageError, match="truncated"):
            encode(cut, **options)
    cmyk = saved(Image.fromarray(photo()).convert("CMYK"))
    with pytest.raises(ImageError, match="truncated"):
        encode(cmyk[:-100])


def test_truncated_jpeg_header_is_refused(photo_jpeg):
    with pytest.raises(ImageError, match="truncated JPEG"):
        encode(photo_jpeg[:200])


@pytest.mark.parametrize("data, reason", [
    (b"", "zero-byte"),
    (b"this is a text file that someone named cat.jpg\n", "not an image"),
    (b"\xff\xd8 not really a jpeg", "JPEG"),
    (b"\x89PNG\r\n\x1a\n", "corrupt PNG header"),
    (b"RIFF\x00\x00\x00\x00WEBPVP8 ", "corrupt WebP"),
    (b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\n", "not an image"),  # no Ghostscript
])
def test_non_images_are_refused(data, reason):
    with pytest.raises(ImageError, match=reason):
        encode(data)


def test_truncated_png_is_refused():
    data = saved(photo(), "PNG")
    with pytest.raises(ImageError, match="truncated"):
        encode(data[:len(data) // 2])


def test_no_library_exception_escapes(photo_jpeg):
    """Cuts and scribbles at many offsets: every outcome is a sample or an ImageError."""
    rng = np.random.default_rng(1)
    small_jpeg = saved(photo(48, 64), quality=80)
    for data in (small_jpeg, saved(photo(48, 64), "PNG"), saved(photo(48, 64), "GIF"),
                 saved(photo(48, 64), "WEBP"), saved(photo(48, 64), "TIFF")):
        for _ in range(40):
            broken = bytearray(data[:rng.integers(1, len(data))])
            if rng.random() < 0.5 and len(broken) > 40:
                at = rng.integers(20, len(broken))
                broken[at:at + 4] = rng.integers(0, 256, 4, dtype=np.uint8).tobytes()
            try:
                encode(bytes(broken))
            except ImageError:
                pass


def png_with_declared_size(width: int, height: int) -> bytes:
    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + body))
        return struct.pack(">I", len(body)) + kind + body + crc
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + chunk(b"IEND", b""))


@pytest.mark.parametrize("side, message", [
    (20000, "decompression bomb: 400 Mpx exceeds the 100 Mpx limit"),   # PIL's own error
    (12000, "decompression bomb: 12000x12000 = 144 Mpx exceeds the 100 Mpx limit"),  # ours
])
def test_png_decompression_bomb_is_refused_from_the_header(side, message):
    data = png_with_declared_size(side, side)
    assert len(data) < 200
    with pytest.raises(ImageError, match=message):
        encode(data)


def test_jpeg_decompression_bomb_is_refused_from_the_header(photo_jpeg):
    sof = photo_jpeg.index(b"\xff\xc0")
    huge = bytearray(photo_jpeg)
    huge[sof + 5:sof + 9] = struct.pack(">HH", 30000, 30000)
    with pytest.raises(ImageError, match="decompression bomb: 30000x30000 = 900 Mpx"):
        encode(bytes(huge))


def test_pil_limit_is_ours_while_decoding_and_the_callers_after(monkeypatch):
    """Importing or calling turbotrain leaves a library user's PIL limit as it was; inside
    encode_sample PIL's own bomb check (in Image.open, before any pixel is decoded) uses ours."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1234)  # the user's setting
    seen = []
    real_open = Image.open

    def spying_open(*args, **kwargs):
        seen.append(Image.MAX_IMAGE_PIXELS)
        return real_open(*args, **kwargs)

    monkeypatch.setattr(Image, "open", spying_open)
    encode(saved(photo(), "PNG"))  # 187,500 pixels: over the user's limit, not ours
    assert seen == [sample_codec.PIL_MAX_PIXELS] and Image.MAX_IMAGE_PIXELS == 1234
    with pytest.raises(ImageError, match="decompression bomb: 400 Mpx"):  # raised by PIL
        encode(png_with_declared_size(20000, 20000))
    assert Image.MAX_IMAGE_PIXELS == 1234


def test_max_pixels_applies_to_every_path(monkeypatch, photo_jpeg):
    monkeypatch.setattr(sample_codec, "MAX_PIXELS", 100 * 100)
    for data in (photo_jpeg, saved(photo(), "PNG")):
        with pytest.raises(ImageError, match="decompression bomb: 500x375"):
            encode(data)


def test_side_beyond_uint16_needs_a_max_side():
    wide = np.zeros((1, 70000, 3), np.uint8)
    with pytest.raises(ImageError, match="65535"):
        encode(wide)
    assert encode(wide, max_side=7000)[1:3] == (1, 7000)


def test_bad_options_are_value_errors(photo_jpeg):
    for options in ({"encoding": "png"}, {"max_side": -1}, {"quality": 0}):
        with pytest.raises(ValueError) as caught:
            encode(photo_jpeg, **options)
        assert not isinstance(caught.value, ImageError)
    with pytest.raises(TypeError):
        encode("cat.jpg")


# --- conversions to RGB -----------------------------------------------------------------------

def test_cmyk_jpeg_converts_like_pil():
    rgb = blocks()
    data = saved(Image.fromarray(rgb).convert("CMYK"), quality=95)
    assert b"Adobe" in data  # PIL writes Adobe's inverted CMYK
    out = stored_pixels(encode(data, encoding="raw"))
    reference = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    np.testing.assert_array_equal(out, reference)
    assert np.abs(out.astype(int) - rgb).max() <= 8


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_greyscale_becomes_three_equal_channels(fmt):
    grey = photo(noise=2)[..., 0]
    out = stored_pixels(encode(saved(grey, fmt, quality=95), encoding="raw"))
    assert out.shape == (375, 500, 3)
    assert (out[..., 0] == out[..., 1]).all() and (out[..., 1] == out[..., 2]).all()
    error = np.abs(out[..., 0].astype(int) - grey)
    assert error.max() == 0 if fmt == "PNG" else error.mean() < 1.5


def test_palette_png_keeps_its_colours():
    rgb = blocks()
    palette = Image.fromarray(rgb).quantize(colors=4)
    assert palette.mode == "P"
    out = stored_pixels(encode(saved(palette, "PNG"), encoding="raw"))
    np.testing.assert_array_equal(out, np.asarray(palette.convert("RGB")))


def test_alpha_is_composited_on_white():
    rgba = np.zeros((2, 3, 4), np.uint8)
    rgba[..., :3] = (200, 10, 0)
    rgba[..., 3] = [[0, 255, 128], [0, 255, 128]]
    expected = [[255, 255, 255], [200, 10, 0], [227, 132, 127]]  # 128/255 of colour + white
    for source in (saved(rgba, "PNG"), rgba):
        out = stored_pixels(encode(source, encoding="raw"))
        np.testing.assert_array_equal(out[0], expected)


def test_palette_png_with_transparency_is_composited():
    image = Image.new("P", (4, 4), 1)
    image.putpalette([0, 0, 0, 10, 20, 30] + [0] * 762)
    image.putpixel((0, 0), 0)
    out = stored_pixels(encode(saved(image, "PNG", transparency=0), encoding="raw"))
    assert tuple(out[0, 0]) == (255, 255, 255)
    assert tuple(out[1, 1]) == (10, 20, 30)


def test_sixteen_bit_png_is_scaled_not_clipped():
    values = np.array([[0, 257, 32768, 65535]], np.uint16)
    data = saved(Image.fromarray(values), "PNG")
    assert Image.open(io.BytesIO(data)).mode.startswith("I")
    out = stored_pixels(encode(data, encoding="raw"))
    np.testing.assert_array_equal(out[0, :, 0], [0, 1, 128, 255])


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_is_applied(orientation):
    rgb = blocks()
    data = with_exif_orientation(rgb, orientation)
    out = stored_pixels(encode(data, encoding="raw"))
    reference = np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB"))
    assert out.shape == reference.shape
    assert np.abs(out.astype(int) - reference).max() <= 2
    if orientation == 6:  # 90 degrees clockwise: the red top-left quadrant is now top-right
        assert out.shape == (96, 64, 3)
        assert tuple(out[5, -5]) == pytest.approx((255, 0, 0), abs=8)
        assert tuple(out[5, 5]) == pytest.approx((0, 0, 255), abs=8)


def test_exif_orientation_in_png_is_applied():
    exif = Image.Exif()
    exif[0x0112] = 8
    out = stored_pixels(encode(saved(blocks(), "PNG", exif=exif.tobytes()), encoding="raw"))
    np.testing.assert_array_equal(out, np.rot90(blocks()))  # 8 = 90 degrees anticlockwise


def test_animated_gif_gives_its_first_frame():
    frames = [Image.new("RGB", (8, 8), colour) for colour in ((255, 0, 0), (0, 0, 255))]
    buffer = io.BytesIO()
    frames[0].save(buffer, "GIF", save_all=True, append_images=frames[1:], duration=100)
    out = stored_pixels(encode(buffer.getvalue(), encoding="raw"))
    assert out.shape == (8, 8, 3)
    assert (out == (255, 0, 0)).all()


@pytest.mark.parametrize("fmt", ["WEBP", "BMP", "TIFF"])
def test_other_formats_decode(fmt):
    rgb = blocks()
    out = stored_pixels(encode(saved(rgb, fmt, **({"lossless": True} if fmt == "WEBP" else {})),
                               encoding="raw"))
    np.testing.assert_array_equal(out, rgb)


# --- arrays, sizes, round trips ---------------------------------------------------------------

@pytest.mark.parametrize("shape", [(28, 28), (28, 28, 1), (32, 32, 3)])
def test_raw_round_trip_is_exact(shape):
    array = np.random.default_rng(0).integers(0, 256, shape, dtype=np.uint8)
    sample = encode(array)
    assert sample.mode == MODE_RAW and (sample.height, sample.width) == shape[:2]
    out = stored_pixels(sample)
    expected = array.reshape(shape[:2])[..., None] if len(shape) < 3 or shape[2] == 1 else array
    np.testing.assert_array_equal(out, np.broadcast_to(expected, (*shape[:2], 3)))
    flat = out.reshape(-1, 3).astype(np.float64)
    assert sample.pixel_count == shape[0] * shape[1]
    np.testing.assert_allclose(sample.pixel_sum, flat.sum(0), rtol=1e-9)
    np.testing.assert_allclose(sample.pixel_sq_sum, (flat ** 2).sum(0), rtol=1e-9)


def test_bad_arrays_are_refused():
    for array, reason in ((np.zeros((4, 4), np.uint16), "dtype"),
                          (np.zeros((4, 4, 2), np.uint8), "shape"),
                          (np.zeros((0, 4, 3), np.uint8), "empty")):
        with pytest.raises(ImageError, match=reason):
            encode(array)


def test_jpeg_round_trip_within_tolerance():
    rgb = photo(noise=2)
    sample = encode(rgb, encoding="jpeg", quality=90)
    assert sample.mode == MODE_JPEG
    out = stored_pixels(sample)
    assert out.shape == rgb.shape
    assert np.abs(out.astype(int) - rgb).mean() < 3  # 4:2:0 costs most of it, at disc edges


@pytest.mark.parametrize("source_shape, max_side, stored", [
    ((375, 500), 256, (192, 256)),
    ((500, 375), 256, (256, 192)),
    ((375, 500), 1000, (375, 500)),   # never enlarged
    ((375, 500), 64, (48, 64)),       # auto: small enough to store raw
    ((1, 500), 100, (1, 100)),
])
def test_max_side_keeps_aspect(source_shape, max_side, stored):
    rgb = photo(*source_shape)
    for source in (rgb, saved(rgb, quality=95)):
        sample = encode(source, max_side=max_side)
        assert (sample.height, sample.width) == stored
        assert sample.mode == (MODE_RAW if max(stored) <= 64 else MODE_JPEG)
        assert stored_pixels(sample).shape == (*stored, 3)


def test_reduced_jpeg_decode_resizes_like_a_full_decode(photo_jpeg):
    full = decode_stored(MODE_JPEG, 375, 500, photo_jpeg)
    import cv2
    reference = cv2.resize(full, (128, 96), interpolation=cv2.INTER_AREA)
    out = stored_pixels(encode(photo_jpeg, encoding="raw", max_side=128))
    assert np.abs(out.astype(int) - reference).mean() < 2


def test_decode_stored_checks_its_metadata(photo_jpeg):
    with pytest.raises(ImageError, match="metadata says"):
        decode_stored(MODE_JPEG, 100, 500, photo_jpeg)
    with pytest.raises(ImageError, match="raw payload"):
        decode_stored(MODE_RAW, 2, 2, b"\x00" * 11)
    with pytest.raises(ImageError, match="storage mode"):
        decode_stored(7, 2, 2, b"")


def test_encode_speed(photo_jpeg):
    """Prints per-image times for the numbers quoted in sample_codec.py; asserts only gross
    regressions (the build machine is shared, so timings wander by 2x)."""
    rotated = with_exif_orientation(photo(), 6)
    cases = {
        "pass-through": (photo_jpeg, {}),
        "re-encode (EXIF-rotated)": (rotated, {}),
        "resize to 256": (photo_jpeg, {"max_side": 256}),
        "png": (saved(photo(), "PNG"), {}),
    }
    for name, (data, options) in cases.items():
        encode(data, **options)
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            for _ in range(20):
                encode(data, **options)
            best = min(best, (time.perf_counter() - start) / 20)
        print(f"{name}: {best * 1e3:.2f} ms")
        assert best < 0.05
