"""Loads the compiled batch kernel (`_native`, built from csrc/ by `pip install`) or says why not.

    from turbotrain.pipeline import kernel
    kernel.NATIVE      # the extension module, or None: the Python decode path runs instead
    kernel.STATUS      # one line for `info` and the pipelines' start-up line
    kernel.sample_table(data=..., size=..., height=..., ...)   # the kernel's records

The extension is optional at build time (setup.py): without libjpeg's headers pip still installs
turbotrain. Setting TURBOTRAIN_NATIVE=0 forces the Python path (CI runs the suite's decode
tests both ways).
"""
from __future__ import annotations

import os

import numpy as np

# Set to "0" to run the Python decode path even when the kernel is built.
DISABLE_VARIABLE = "TURBOTRAIN_NATIVE"

# The record layout csrc/sample.h's tt_sample has; checked against the extension's own offsets
# on import, so a layout change in C cannot silently misread a table.
_FIELDS = (("data", "<u8"), ("size", "<i8"), ("height", "<i4"), ("width", "<i4"),
           ("top", "<i4"), ("left", "<i4"), ("box_h", "<i4"), ("box_w", "<i4"),
           ("mode", "u1"), ("flip", "u1"))


def _load():
    if os.environ.get(DISABLE_VARIABLE, "1") == "0":
        return None, None, f"Python decode path ({DISABLE_VARIABLE}=0)"
    try:
        # lazy: the C extension is optional (unbuilt, or TURBOTRAIN_NATIVE=0)
        from . import _native
    except ImportError as e:
        return None, None, (f"Python decode path: the compiled kernel is missing ({e}); "
                            "reinstall turbotrain with libjpeg's headers present "
                            "(apt-get install libjpeg-dev) to build it")
    offsets = [_native.SAMPLE_FIELDS[name] for name, _ in _FIELDS]
    dtype = np.dtype({"names": [n for n, _ in _FIELDS], "formats": [f for _, f in _FIELDS],
                      "offsets": offsets, "itemsize": _native.SAMPLE_SIZE})
    return _native, dtype, f"native batch kernel ({_native.LIBJPEG})"


NATIVE, SAMPLE_DTYPE, STATUS = _load()


def sample_table(**columns) -> np.ndarray:
    """The kernel's per-sample records from one array (or scalar) per field of SAMPLE_DTYPE:
    data (addresses), size, height, width, top, left, box_h, box_w, mode, flip."""
    count = max(np.size(value) for value in columns.values())
    table = np.empty(count, dtype=SAMPLE_DTYPE)
    for name in SAMPLE_DTYPE.names:
        table[name] = columns[name]
    return table
