"""Byte sizes as people type them: "1GB", "512MiB", "1.5g" or a plain number of bytes.

Every flag that takes a size (prepare-dataset --shard-size, train --cache-limit and
$TURBOTRAIN_CACHE_LIMIT) parses it here, so they all accept the same spellings. Decimal units
are powers of 10 ("1GB" = 10**9, as disks and object stores count), binary ones powers of 2
("1GiB" = 2**30); the trailing "B" is optional. Each caller names its flag in the error and
checks its own lower bound (a shard is at least one data page; a cache just above 0).
"""
from __future__ import annotations

import re

from turbotrain.printable import printable

_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgtp]?i?b?)\s*", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "p": 10**15,
          "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40, "pi": 2**50}


MAX_BYTES = 2**62


class SizeError(ValueError):
    """A size that cannot be read, or is not above 0; one line naming the flag it came from."""


def parse_size(text: str | int, flag: str) -> int:
    """Bytes (> 0) from "1GB", "512MiB", "1.5g", "268435456" or an int; SizeError otherwise."""
    if isinstance(text, int) and not isinstance(text, bool):
        value, unit = text, ""
    else:
        match = _SIZE.fullmatch(str(text))
        value = float(match[1]) if match else 0
        unit = match[2].lower().removesuffix("b") if match else ""
    # float("9" * 400) is inf, and int(inf) an OverflowError: no size is above 2**62 (4 EiB).
    if unit not in _UNITS or not 0 < value * _UNITS.get(unit, 1) <= MAX_BYTES:
        raise SizeError(f"{flag} {printable(repr(str(text)[:40]))}: expected a size above 0 such "
                        f"as 1GB, 512MB, 64MiB or a number of bytes")
    return int(value * _UNITS[unit])
