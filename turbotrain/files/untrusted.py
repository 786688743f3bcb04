"""Reading files that nobody vouches for: source images, archives, dataset folders, checkpoints.

Nothing a dataset contains is trusted (docs/SECURITY.md). Every read of such a file goes through
these few functions, so each of them holds for every format:

* only a regular file is read: a named pipe would block `open()` forever, `/dev/zero` or
  `/dev/urandom` would never end. The file is opened with O_NONBLOCK (a FIFO then opens at once)
  and checked with fstat on the open descriptor, so swapping the file after a check changes
  nothing;
* a file is read only up to a cap, checked against its size before a byte is read;
* a path taken from a dataset (a CSV row, a symlink in an ImageFolder) must resolve inside its
  root, unless the user allowed otherwise;
* what a compressed stream inflates to is charged to an `InflateBudget` before it is allocated.
"""
from __future__ import annotations

import errno
import functools
import os
import stat
from dataclasses import dataclass
from pathlib import Path

MIB = 1 << 20

# A decompression bomb inflates 1,000x or more (a 199 KB .tar.gz to 256 MB); real data does not:
# CIFAR-10's .tar.gz inflates 1.1x, MNIST's idx .gz files 2-5x, np.savez_compressed photos
# ~1.5x. Apache POI refuses zip entries above the same 100x. A stream may always inflate to
# INFLATE_FLOOR_BYTES, so small, very regular test arrays (all zeros) still load.
DEFAULT_MAX_INFLATE_RATIO = 100
INFLATE_FLOOR_BYTES = 64 * MIB


@dataclass(frozen=True)
class Limits:
    """The caps on what one dataset may make us read or allocate (prepare-dataset's --max-*)."""
    # One image file, or one small source file read whole (a CSV list, a CIFAR pickle): 1 GiB
    # is 20x the largest camera JPEG and above a 100 Mpx 16-bit TIFF (600 MB).
    max_file_bytes: int = 1024 * MIB
    # The pixels of one array source (CIFAR, idx, .npz), decoded: 16 GiB holds ImageNet 64x64
    # (1.28 M x 12 KiB = 15.7 GB) and is 100x CIFAR-100.
    max_array_bytes: int = 16384 * MIB
    max_inflate_ratio: float = DEFAULT_MAX_INFLATE_RATIO


class UnsafeInput(ValueError):
    """A file that must not be read as asked; str(e) is one line naming it and what to do."""


def _is_regular(fd: int) -> os.stat_result:
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        kind = ("a named pipe" if stat.S_ISFIFO(info.st_mode) else
                "a device" if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode) else
                "a socket" if stat.S_ISSOCK(info.st_mode) else
                "a folder" if stat.S_ISDIR(info.st_mode) else "not a regular file")
        raise UnsafeInput(f"is {kind}, not a regular file")
    return info


def open_regular(path: str | os.PathLike, max_bytes: int | None = None, *,
                 follow_symlinks: bool = True):
    """`open(path, "rb")` for a regular file of at most max_bytes, without ever blocking.

    Raises UnsafeInput (a reason without the path) for a pipe, device, socket or folder, a
    symlink when follow_symlinks is False, or a file over the cap; OSError as open() does
    (missing, permissions)."""
    fd, _ = _open_checked(path, max_bytes, follow_symlinks)
    try:
        # A regular file ignores O_NONBLOCK for reads, so it can stay set.
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _open_checked(path: str | os.PathLike, max_bytes: int | None,
                  follow_symlinks: bool = True) -> tuple[int, int]:
    """(descriptor, size) of a regular file of at most max_bytes (see open_regular)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags if follow_symlinks else flags | os.O_NOFOLLOW)
    except OSError as e:
        if e.errno == errno.ELOOP and not follow_symlinks:
            raise UnsafeInput("is a symlink, not a regular file") from None
        raise
    try:
        info = _is_regular(fd)
        if max_bytes is not None and info.st_size > max_bytes:
            raise UnsafeInput(f"is {info.st_size / MIB:,.0f} MiB, over the "
                              f"{max_bytes / MIB:,.0f} MiB limit for one file")
        return fd, info.st_size
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | os.PathLike, max_bytes: int, *,
                 follow_symlinks: bool = True) -> bytes:
    """The whole content of a regular file of at most max_bytes (see open_regular). A file that
    grows while it is read is cut at max_bytes + 1 and refused, never read to the end.

    Plain os.read on the descriptor: 13 us for a 60 KB JPEG against 20 us through a buffered
    file object (`turbotrain predict` reads every image this way)."""
    fd, size = _open_checked(path, max_bytes, follow_symlinks)
    try:
        # Ask for the size fstat gave (+1 to see growth), not for max_bytes: read(n) allocates
        # n bytes up front, 1 GiB per image at the default cap.
        data = os.read(fd, size + 1)
        while len(data) <= max_bytes:  # until end of file: a short read, or growth
            more = os.read(fd, min(max(size + 1 - len(data), 1 << 16), max_bytes + 1 - len(data)))
            if not more:
                break
            data += more
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise UnsafeInput(f"grew past the {max_bytes / MIB:,.0f} MiB limit while being read")
    return data


def read_range(path: str | os.PathLike, offset: int, size: int) -> bytes:
    """`size` bytes at `offset` of a regular file (a member of a plain .tar, read by the offset
    its index recorded). UnsafeInput when the file is not regular or ends before offset + size:
    a header that declares more than the file holds, or a file cut since it was indexed."""
    fd, file_size = _open_checked(path, None)
    try:
        if offset < 0 or size < 0 or offset + size > file_size:
            raise UnsafeInput(f"is {file_size:,} bytes, too short for {size:,} bytes at offset "
                              f"{offset:,} (truncated, or changed since it was listed)")
        data = os.pread(fd, size, offset)
    finally:
        os.close(fd)
    if len(data) != size:
        raise UnsafeInput(f"was cut while being read ({len(data):,} of {size:,} bytes at "
                          f"offset {offset:,})")
    return data


@functools.lru_cache(maxsize=64)
def _real_root(root: str) -> str:
    """A dataset's root, resolved once per process (a handful of roots, a million files)."""
    return os.path.realpath(root)


def is_inside(path: str | os.PathLike, root: str | os.PathLike) -> bool:
    """Whether path, with every symlink and '..' resolved, is root or lies under it."""
    real, real_root = os.path.realpath(path), _real_root(os.fspath(root))
    return real == real_root or real.startswith(real_root.rstrip(os.sep) + os.sep)


def outside_root_reason(path: str | os.PathLike, root: str | os.PathLike) -> str | None:
    """None when path resolves inside root; else a short reason naming where it leads."""
    if is_inside(path, root):
        return None
    return (f"resolves to {os.path.realpath(path)}, outside the source folder {root} "
            f"(pass --allow-outside-root to read it)")


class InflateBudget:
    """How much one compressed file may inflate to: at most `ratio` x its size on disk (with a
    floor of INFLATE_FLOOR_BYTES) and never more than `cap`. Charge before allocating."""

    def __init__(self, path: str | os.PathLike, compressed_bytes: int, limits: Limits):
        self.path = Path(path)
        self.ratio = limits.max_inflate_ratio
        by_ratio = max(INFLATE_FLOOR_BYTES, int(compressed_bytes * self.ratio))
        self.allowed = min(by_ratio, limits.max_array_bytes)
        self.capped_by_ratio = by_ratio <= limits.max_array_bytes
        self.used = 0

    def charge(self, nbytes: int, what: str) -> None:
        """Books nbytes about to be inflated for `what`; raises UnsafeInput past the budget."""
        if nbytes < 0:
            raise UnsafeInput(f"{what} declares a negative size")
        self.reach(self.used + nbytes, what)

    def reach(self, total: int, what: str) -> None:
        """Books that the stream inflates to `total` bytes by the end of `what` (a tar stream:
        every member before the one wanted is inflated too, kept or not)."""
        self.used = max(self.used, total)
        if self.used <= self.allowed:
            return
        if self.capped_by_ratio:
            raise UnsafeInput(
                f"{what} would inflate {self.path.name} to {self.used / MIB:,.0f} MiB, more than "
                f"{self.ratio:g}x its size (a decompression bomb?); if the data is real, raise "
                f"--max-inflate-ratio")
        raise UnsafeInput(f"{what} would need {self.used / MIB:,.0f} MiB, over the "
                          f"{self.allowed / MIB:,.0f} MiB limit for an array source; if the data "
                          f"is real, raise --max-array-mb")
