"""One line instead of a traceback when the machine, not our code, refused: a full disk, a
read-only one, a folder we may not write, or an address-space limit (`ulimit -v`).

Every command's top level (cli.py `main`, the console scripts) runs through `reporting`: an
OSError whose errno is one of DISK_ERRNOS, or a MemoryError, becomes

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
import resource
import sys
from collections.abc import Callable

from .printable import printable

EXIT_CODE = 2

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
_WRITE_ONLY = {errno.ENOSPC, errno.EDQUOT, errno.EROFS}


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
            if exc.errno in _WRITE_ONLY or what or exc.filename:
                return _disk_line(exc, what)
        exc, seen = exc.__cause__, seen + 1
    return None


def _disk_line(exc: OSError, what: str | None) -> str:
    written = exc.errno in _WRITE_ONLY or what is not None
    verb = "cannot write" if written else "cannot access"
    target = f" {exc.filename}" if exc.filename is not None else ""
    detail = f" ({what})" if what else ""
    reason = exc.strerror or os.strerror(exc.errno)
    return f"{verb}{target}{detail}: {reason}; {DISK_ERRNOS[exc.errno]}"


def address_space_limit() -> str:
    """`ulimit -v` as words: 'the address-space limit of 2.0 GiB (ulimit -v)', or 'no
    address-space limit' when there is none."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return "no address-space limit"
    return f"the address-space limit of {soft / 2**30:.1f} GiB (ulimit -v)"


def memory_line(stage: str) -> str:
    """The message for memory that ran out during `stage` (without `PROG: error: `)."""
    return (f"out of memory {stage} under {address_space_limit()}; raise the limit or free "
            f"memory, or ask for less (fewer --workers, a smaller --batch-size or --max-side)")


def reporting(prog: str, run: Callable[..., int], *args) -> int:
    """run(*args), with the failures above turned into one line on stderr and exit code 2."""
    try:
        return run(*args)
    except MemoryError:
        print(f"{prog}: error: {memory_line('in ' + prog)}", file=sys.stderr)
        return EXIT_CODE
    except Exception as exc:  # noqa: BLE001 - re-raised unless it is a mapped failure
        line = disk_failure(exc)
        if line is None:
            raise
        print(f"{prog}: error: {printable(line)}", file=sys.stderr)
        return EXIT_CODE
