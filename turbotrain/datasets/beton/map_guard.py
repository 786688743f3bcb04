"""A `.beton` that shrinks while this process reads its memory map ends the process with one
line naming the file (exit 2), not a silent SIGBUS death.

Truncating or rewriting a mapped file makes every read of a page past its new end fault with
SIGBUS, in whichever thread reads it: Python's numpy views or the decode kernel's C threads.
Python cannot handle that signal (its handlers run later; the faulting read repeats first), so
the compiled extension does (csrc/map_guard.c): `guard` registers a map's address range and the
line to print, precomputed, since a signal handler may only write and exit.

Without the compiled extension (not built; it is optional) the process still dies by SIGBUS;
`python -X faulthandler` (or PYTHONFAULTHANDLER=1) then prints the Python stack of the read.
The guard does not depend on TURBOTRAIN_NATIVE, which only picks the decode path.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import mmap
import os
import sys
import weakref
from pathlib import Path

import numpy as np

from turbotrain import os_failure
from turbotrain.printable import printable

# The exit code of a pipeline worker process whose read faulted in a guarded map; its parent
# reports it (`shrunk_problem`), so the worker itself writes nothing.
QUIET_EXIT = 75

# slot -> (path, mapped size) of the maps this process guards (the parent of a worker that
# ended with QUIET_EXIT looks for the one that shrank; a file opened twice has two slots).
_sizes: dict = {}


def shrank_problem(path) -> str:
    return (f"{printable(path)} shrank while it was being read (the dataset was changed under "
            "this run): prepare it again or restore the file")


def shrank_line(path) -> str:
    # The running command's name (`train`, `turbotrain bench`), as its other error lines.
    return f"{os_failure.RUNNING_PROG}: error: {shrank_problem(path)}"


def shrunk_problem() -> str | None:
    """`shrank_problem` for a guarded file now shorter than its map (or gone), else None."""
    for path, size in list(_sizes.values()):
        try:
            now = os.stat(path).st_size
        except OSError:
            now = -1
        if now < size:
            return shrank_problem(path)
    return None


def guard_quietly() -> None:
    """In a pipeline worker process: re-arm the guard over the handler torch installed there,
    and on a fault exit QUIET_EXIT without a word (the parent says which file shrank)."""
    native = _native()
    if native is not None and hasattr(native, "guard_quietly"):
        native.guard_quietly(QUIET_EXIT)


_NATIVE_NAME = "turbotrain.pipeline._native"


def _native():
    """The compiled extension, loaded from its file without importing turbotrain.pipeline:
    that package imports torch (~1.5 s, ~300 MB resident), which `turbotrain verify` and
    `inspect` never need (and which a confined verify could not even map). Registered under
    its own name, so the pipeline's `from . import _native` finds this same module."""
    module = sys.modules.get(_NATIVE_NAME)
    if module is None:
        folder = Path(__file__).resolve().parents[2] / "pipeline"
        paths = [folder / f"_native{suffix}" for suffix in importlib.machinery.EXTENSION_SUFFIXES]
        path = next((p for p in paths if p.is_file()), None)
        if path is None:  # not built: no guard (the module's docstring says what then)
            return None
        spec = importlib.util.spec_from_file_location(_NATIVE_NAME, path)
        try:
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        except ImportError:
            return None
        sys.modules[_NATIVE_NAME] = module
    return module if hasattr(module, "guard_map") else None


def guard(mapped: np.memmap, path) -> bool:
    """Registers `mapped` (a whole-file np.memmap) so that a SIGBUS in it prints
    `shrank_line(path)` and exits 2; unregistered when the map is freed. False where the
    compiled extension is missing (then nothing is guarded)."""
    native = _native()
    backing = getattr(mapped, "_mmap", None)
    if native is None or backing is None or mapped.size == 0:
        return False
    # The fault can hit anywhere in the last page too: cover whole pages.
    length = -(-mapped.size // mmap.PAGESIZE) * mmap.PAGESIZE
    line = (shrank_line(path) + "\n").encode("utf-8", "replace")
    slot = native.guard_map(mapped.ctypes.data, length, line)
    if slot < 0:
        return False
    weakref.finalize(backing, _unguard, native, slot)
    _sizes[slot] = (path, mapped.size)
    return True


def _unguard(native, slot: int) -> None:
    native.unguard_map(slot)
    _sizes.pop(slot, None)
