"""One process at a time in a folder: an advisory `fcntl.flock` on a lock file, held for the
writer's whole life and refused at once (never waited for) to a second writer.

`train` holds `RUN/.lock` (train/engine/run_folder.py) and `prepare-dataset` holds
`.OUT.lock` beside OUT (datasets/prepare/output_folder.py): without it, two runs resumed into
one folder both appended to its metrics.jsonl, and of two prepares into one OUT the later
replaced the first without --overwrite. The holder writes `PID HOST` into the file, so the
refusal can name it; the kernel drops the lock when the holder dies, even by SIGKILL, so a lock
file left behind never blocks anyone. The holder removes the file when it is done, while still
holding it: whoever opened the old file then finds that its name now leads elsewhere, and tries
again (`hold`).
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import time
from pathlib import Path

from turbotrain.files.safe_create import open_lock_file
from turbotrain.printable import printable

_HOLDER_BYTES = 200  # "PID HOST\n": a planted file is read no further


class FolderBusy(Exception):
    """Another process holds the lock; `holder` says who: "pid 123" or "pid 123 on HOST"."""

    def __init__(self, path: Path, holder: str):
        super().__init__(f"{path} is held by {holder}")
        self.path, self.holder = path, holder


def hold(path: str | os.PathLike) -> int:
    """A descriptor holding the exclusive lock at path (closing it releases the lock).
    FolderBusy when another process holds it; OSError when path cannot be a lock file (a
    symlink there: ELOOP)."""
    path = Path(path)
    for _ in range(100):
        fd = open_lock_file(path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise FolderBusy(path, holder) from None
        except BaseException:
            os.close(fd)
            raise
        if _still_named(fd, path):
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())
            return fd
        os.close(fd)  # its holder removed it after we opened it: the name is a new file now
    raise BlockingIOError(f"{path}: the lock file keeps being replaced")


def release(fd: int, path: str | os.PathLike) -> None:
    """Removes the lock file (while still holding it, see the module's docstring), then drops
    the lock."""
    try:
        if _still_named(fd, Path(path)):
            with contextlib.suppress(OSError):
                os.unlink(path)
    finally:
        os.close(fd)


@contextlib.contextmanager
def held(path: str | os.PathLike):
    """`hold` for the block's duration."""
    fd = hold(path)
    try:
        yield fd
    finally:
        release(fd, path)


def _still_named(fd: int, path: Path) -> bool:
    try:
        named = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (mine.st_dev, mine.st_ino)


def _holder(fd: int) -> str:
    """Who holds the lock, from what the holder wrote in the file. It writes that just after
    taking the lock, so an empty file is read again for a moment."""
    deadline = time.monotonic() + 1.0
    while True:
        text = os.pread(fd, _HOLDER_BYTES, 0).decode("utf-8", "replace").split()
        if text or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    if not text or not text[0].isdigit():
        return "a process whose pid it did not record"
    pid, host = text[0], " ".join(text[1:2])
    if host and host != socket.gethostname():
        return f"pid {pid} on {printable(host)}"
    return f"pid {pid}"
