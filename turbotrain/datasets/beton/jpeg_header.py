"""Reading a JPEG's markers without decoding it: frame type, size, components, EXIF orientation.

`sample_codec.encode_sample` stores a source JPEG byte for byte only when nothing about it needs
changing, and most of that question is answered by the markers in front of the first scan
(SOI ... SOS). Walking them costs ~3 us on a 500x375 photo (one pass over a few hundred bytes,
pure Python), against ~330 us for the cheapest validating decode, so it is never the bottleneck.

libjpeg-turbo's header call (simplejpeg.decode_jpeg_header) gives size and colour space but not
the frame type (baseline vs progressive vs arithmetic) nor the EXIF orientation, hence this module.
"""
from __future__ import annotations

import struct
from typing import NamedTuple

SOI = b"\xff\xd8"

# Start-of-frame markers (ITU T.81 table B.1). C4 (DHT), C8 (reserved) and CC (DAC) share the
# range but are not frames.
SOF_BASELINE = 0xC0
SOF_EXTENDED_HUFFMAN = 0xC1
SOF_PROGRESSIVE_HUFFMAN = 0xC2
_NOT_FRAMES = {0xC4, 0xC8, 0xCC}
_SOS = 0xDA
_APP1 = 0xE1
_APP14 = 0xEE
# Markers without a length field: TEM and the restart markers RST0..7.
_STANDALONE = {0x01, *range(0xD0, 0xD8)}

_EXIF_ORIENTATION_TAG = 0x0112


class JpegHeader(NamedTuple):
    frame: int          # the SOFn marker byte, e.g. 0xC0 baseline, 0xC2 progressive
    precision: int      # bits per sample: 8 (12 exists, rarely)
    height: int         # as stored, before any EXIF rotation
    width: int
    components: int     # 1 grey, 3 YCbCr/RGB, 4 CMYK/YCCK
    orientation: int    # EXIF orientation 1..8; 1 (upright) when absent or unreadable
    adobe_transform: int | None  # APP14 "Adobe" colour transform, None without the marker

    @property
    def is_sequential_huffman(self) -> bool:
        """Baseline or extended-sequential Huffman: what every JPEG decoder, including nvJPEG's
        hardware engine, handles. Progressive and arithmetic-coded frames are not."""
        return self.frame in (SOF_BASELINE, SOF_EXTENDED_HUFFMAN)


def read_jpeg_header(data: bytes) -> JpegHeader:
    """Parse the markers from SOI to the first SOS. Raises ValueError(reason) when they are
    malformed or end before a scan starts (the file is then truncated or not a JPEG)."""
    if not data.startswith(SOI):
        raise ValueError("not a JPEG (no SOI marker)")
    frame = None
    orientation = 1
    adobe_transform = None
    pos = 2
    end = len(data)
    while True:
        if pos + 2 > end:
            raise ValueError("truncated JPEG (ends inside the header)")
        if data[pos] != 0xFF:
            raise ValueError(f"corrupt JPEG header (expected a marker at byte {pos})")
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte before a marker
            pos += 1
            continue
        if marker in _STANDALONE:
            pos += 2
            continue
        if pos + 4 > end:
            raise ValueError("truncated JPEG (ends inside the header)")
        (length,) = struct.unpack_from(">H", data, pos + 2)
        if length < 2 or pos + 2 + length > end:
            raise ValueError("truncated JPEG (ends inside the header)")
        segment = data[pos + 4:pos + 2 + length]
        if 0xC0 <= marker <= 0xCF and marker not in _NOT_FRAMES:
            if len(segment) < 6:
                raise ValueError("corrupt JPEG header (short frame marker)")
            precision, height, width, components = struct.unpack_from(">BHHB", segment)
            frame = (marker, precision, height, width, components)
        elif marker == _APP1 and segment.startswith(b"Exif\x00\x00"):
            orientation = _exif_orientation(segment[6:])
        elif marker == _APP14 and segment.startswith(b"Adobe") and len(segment) >= 12:
            adobe_transform = segment[11]
        elif marker == _SOS:
            break
        pos += 2 + length
    if frame is None:
        raise ValueError("corrupt JPEG header (scan before any frame marker)")
    marker, precision, height, width, components = frame
    if height == 0 or width == 0:
        # Height 0 means "defined later by a DNL marker", which libjpeg-turbo does not support.
        raise ValueError(f"unsupported JPEG: frame declares {width}x{height} pixels")
    return JpegHeader(marker, precision, height, width, components, orientation, adobe_transform)


def _exif_orientation(tiff: bytes) -> int:
    """The Orientation tag of IFD0 in an EXIF TIFF block; 1 when absent or malformed.

    Malformed EXIF is common (editors truncate it); like browsers, we then show the image as
    stored rather than refusing it.
    """
    if tiff[:4] == b"II*\x00":
        order = "<"
    elif tiff[:4] == b"MM\x00*":
        order = ">"
    else:
        return 1
    try:
        (ifd,) = struct.unpack_from(order + "I", tiff, 4)
        (count,) = struct.unpack_from(order + "H", tiff, ifd)
        for entry in range(ifd + 2, ifd + 2 + 12 * count, 12):
            tag, kind, _, value = struct.unpack_from(order + "HHIH", tiff, entry)
            if tag == _EXIF_ORIENTATION_TAG:
                return value if kind == 3 and 1 <= value <= 8 else 1  # 3 = SHORT
    except struct.error:
        return 1
    return 1
