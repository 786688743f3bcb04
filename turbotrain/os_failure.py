"""One line instead of a traceback when the machine, not our code, refused: a full disk, a
read-only one, a folder we may not write, or an address-space limit (`ulimit -v`).

Every command's top level (cli.py `main`, the console scripts) runs through `reporting`: an
OSError whose errno is one of DISK_ERRNOS, or memory that ran out (`memory_failure`), becomes

    PROG: error: cannot write PATH (WHAT): No space left on device; free space on that disk ...

and exit code 2; anything else goes on as before (a genuine bug keeps its traceback). Where
OSError.filename is empty (a write through a descriptor, an fsync, a page flush), the write
site wraps itself in `writing(path, what)`, which attaches the path and says what was being
written; the exception itself is re-raised unchanged otherwise.
"""
from __future__ import annotations

import contextlib
import errno
import os
import re
import resource
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

from .printable import printable

EXIT_CODE = 2
# The command `reporting` runs: lines written where Python cannot run (datasets/beton/map_guard.py's
# SIGBUS line, precomputed per mapped file) start with it.
RUNNING_PROG = "turbotrain"

# errno -> what the user can do about it.
DISK_ERRNOS = {
    errno.ENOSPC: "free space on that disk, or write somewhere else",
    errno.EDQUOT: "free space within your quota, or write somewhere else",
    errno.EROFS: "write to a folder on a writable disk",
    errno.EACCES: "choose a folder you may write to, or change its permissions",
    errno.EPERM: "choose a folder you may write to, or change its permissions",
}
# Only these always mean a write that failed; EACCES/EPERM may be a read (or a syscall not
# about files at all), so they are mapped only when a file name or a write site is known.
WRITE_REFUSED = {errno.ENOSPC, errno.EDQUOT, errno.EROFS}


@contextlib.contextmanager
def writing(path: str | os.PathLike, what: str | None = None, *,
            temporary: str | os.PathLike | None = None):
    """Names `path` (and `what`, when given) on an OSError of DISK_ERRNOS raised in the block,
    which is re-raised; a name or a `what` already there is kept (the innermost site knows),
    except a name under `temporary` (our temporary file or folder), replaced by `path`.

    A library that writes for us may hide the OSError: torch.save raises a RuntimeError (the
    OSError as its context), safetensors its own error saying "No space left on device (os
    error 28)". Inside a write site that is still the disk's refusal, so it becomes an OSError
    raised from the library's error."""
    try:
        yield
    except OSError as exc:
        if exc.errno in DISK_ERRNOS:
            _name(exc, path, what, temporary)
        raise
    except Exception as exc:  # noqa: BLE001 - re-raised as it was unless the disk refused
        code = _hidden_disk_errno(exc)
        if code is None:
            raise
        failure = OSError(code, os.strerror(code), os.fspath(path))
        _name(failure, path, what, temporary)
        raise failure from exc


def _name(exc: OSError, path, what: str | None, temporary) -> None:
    if exc.filename is None or (temporary is not None and os.fspath(exc.filename).startswith(
            os.fspath(temporary))):
        exc.filename = os.fspath(path)
    if what is not None and getattr(exc, "turbotrain_writing", None) is None:
        exc.turbotrain_writing = what


def _hidden_disk_errno(exc: BaseException) -> int | None:
    """The errno of a full or read-only disk behind a library's own exception, if any."""
    seen = exc.__cause__ or exc.__context__
    if isinstance(seen, OSError) and seen.errno in DISK_ERRNOS:
        return seen.errno
    text = str(exc)
    for code in DISK_ERRNOS:
        if f"(os error {code})" in text or os.strerror(code) in text:
            return code
    return None


def disk_failure(exc: BaseException) -> str | None:
    """The one-line message (without `PROG: error: `) for exc or an OSError it was raised
    from (`raise ... from`), or None when it is none of the failures this module maps."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, OSError) and exc.errno in DISK_ERRNOS:
            what = getattr(exc, "turbotrain_writing", None)
            if exc.errno in WRITE_REFUSED or what or exc.filename:
                return _disk_line(exc, what)
        exc, seen = exc.__cause__, seen + 1
    return None


def _disk_line(exc: OSError, what: str | None) -> str:
    written = exc.errno in WRITE_REFUSED or what is not None
    verb = "cannot write" if written else "cannot access"
    target = f" {exc.filename}" if exc.filename is not None else ""
    detail = f" ({what})" if what else ""
    reason = exc.strerror or os.strerror(exc.errno)
    return f"{verb}{target}{detail}: {reason}; {DISK_ERRNOS[exc.errno]}"


def address_space_limit() -> str:
    """`ulimit -v` as words: 'the address-space limit of 2.0 GiB (ulimit -v)', or 'no
    address-space limit' when there is none."""
    soft = _address_space()
    if soft is None:
        return "no address-space limit"
    return f"the address-space limit of {soft / 2**30:.1f} GiB (ulimit -v)"


def _address_space() -> int | None:
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return None if soft == resource.RLIM_INFINITY else soft


def memory_line(stage: str, advice: str = "free memory") -> str:
    """The message for memory that ran out during `stage` (without `PROG: error: `)."""
    return f"out of memory {stage} under {address_space_limit()}; raise the limit, or {advice}"


# dlopen's words when mmap of a shared library fails for want of address space (ENOMEM).
_DLOPEN_NO_MEMORY = ("failed to map segment from shared object", "cannot allocate memory")
# torch's CPU allocator's words when malloc fails (the RuntimeError says how much it asked).
_TORCH_NO_MEMORY = re.compile(r"DefaultCPUAllocator: can't allocate memory: you tried to "
                              r"allocate (\d+) bytes")
# oneDNN's words when it cannot allocate a kernel's scratch memory (a CPU convolution).
_ONEDNN_NO_MEMORY = "could not create a primitive"


def memory_failure(exc: BaseException, prog: str) -> str | None:
    """The stage memory ran out in, for an error that means it did, else None: a MemoryError,
    an ImportError of a library dlopen could not map, or oneDNN's failure to create a kernel
    under an address-space limit (without one, that error is not known to mean memory)."""
    if isinstance(exc, MemoryError):
        return f"in {prog}"
    text = str(exc)
    if isinstance(exc, ImportError) and any(words in text.lower()
                                            for words in _DLOPEN_NO_MEMORY):
        library = text.split(":")[0].strip()
        package = _imported_package(exc)
        return f"loading {library}" + (f" (importing {package})" if package else "")
    if isinstance(exc, RuntimeError) and _ONEDNN_NO_MEMORY in text and _address_space():
        return "in a CPU kernel (oneDNN could not create a primitive)"
    asked = _TORCH_NO_MEMORY.search(text) if isinstance(exc, RuntimeError) else None
    if asked:
        return f"allocating a tensor of {int(asked.group(1)) / 2**20:.1f} MiB on the CPU"
    return None


def _imported_package(exc: BaseException) -> str | None:
    """The installed package whose import failed (torch, cv2, matplotlib): the first frame
    of the traceback inside site-packages names it; exc.name is only the innermost module."""
    for frame in traceback.extract_tb(exc.__traceback__):
        parts = Path(frame.filename).parts
        for marker in ("site-packages", "dist-packages"):
            if marker in parts and parts.index(marker) + 1 < len(parts):
                return parts[parts.index(marker) + 1].removesuffix(".py")
    return getattr(exc, "name", None)


# What asks for less memory, per command (the flags it has).
MEMORY_ADVICE = {
    "prepare-dataset": "use fewer --workers or a smaller --max-side",
    "train": "use a smaller --batch-size or fewer --workers",
}


def reporting(prog: str, run: Callable[..., int], *args) -> int:
    """run(*args), with the failures above turned into one line on stderr and exit code 2."""
    global RUNNING_PROG
    RUNNING_PROG = prog
    try:
        return run(*args)
    except Exception as exc:  # noqa: BLE001 - re-raised unless it is a mapped failure
        stage = memory_failure(exc, prog)
        if stage is not None:
            line = memory_line(stage, MEMORY_ADVICE.get(prog, "free memory"))
        else:
            line = disk_failure(exc)
        if line is None:
            raise
        print(f"{prog}: error: {printable(line)}", file=sys.stderr)
        return EXIT_CODE
