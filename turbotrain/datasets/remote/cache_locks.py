"""The shard cache's lock files (`DIR/.locks/`), opened so that a planted link is refused.

`<key>.dl`, `<key>.use` and `cache.lock` are `fcntl.flock` locks (shard_cache.py says who holds
which); the mtime of `<key>.use` is the shard's last use.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from pathlib import Path

from turbotrain.datasets.errors import DatasetError
from turbotrain.printable import printable


def open_lock(path: Path) -> int:
    """A lock file's descriptor; O_NOFOLLOW: a symlink planted there would make O_CREAT create
    the file it points to, wherever that is."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0),
                       0o644)
    except OSError as e:
        raise DatasetError(f"{printable(path)}: cannot use it as a lock file ("
                           f"{'a symlink' if e.errno == errno.ELOOP else e.strerror or e}); "
                           f"remove it, or pass another --cache-dir") from None


@contextlib.contextmanager
def flock(path: Path, mode: int):
    fd = open_lock(path)
    try:
        fcntl.flock(fd, mode)
        yield fd
    finally:
        os.close(fd)  # closing the descriptor drops its lock


def is_held(path: Path) -> bool:
    """Whether some process holds the lock at path (shared or exclusive); it is not taken."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return False  # no lock file: nobody ever held it
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
