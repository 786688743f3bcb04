"""Creating files in folders that others can write to: never following or reusing what is there.

A run folder, a dataset's OUT, a shared shard cache or the folder of a `--out FILE` may hold
names planted by someone else: a symlink called `.eval.json.tmp-4242` (our old temporary name,
guessable from the process id) made us truncate whatever it pointed to. So every file turbotrain
writes is made by one of these few functions (docs/SECURITY.md):

* `create_new(path)`: `O_CREAT | O_EXCL | O_NOFOLLOW`: a new file or FileExistsError; a symlink,
  even a dangling one, is never followed;
* `create_unique(folder, prefix, suffix)`: the same under a fresh random name (mkstemp's idea,
  with our names and the usual permissions); `new_unique_file` gives it as a file object;
* `replacing(path)`: a file object for writing `path` whole: written under a fresh name in
  the same folder and renamed onto `path` when the block succeeds, so a reader never sees half
  a file and a link at `path` is replaced, never written through. `overwrite=False` refuses an
  existing `path` without a race (a hard link cannot replace anything);
* `replacing_path(path)`: the same for a library that writes by file name (matplotlib,
  safetensors, torch.onnx, torch.jit): it writes into a private folder of ours (mkdtemp, 0700)
  beside `path`, where nobody else can plant anything;
* `open_append(path)`: append to our own file (metrics.jsonl), refusing a link or a pipe there;
* `real_folder(path)`: a folder to write into, made if missing; a link there is refused;
* `open_lock_file(path)`: a lock file (folder_lock.py), made if missing, kept if there, and
  written by its holder only when it is a regular file with no other name.
"""
from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import stat
import tempfile
from pathlib import Path

from turbotrain.os_failure import writing

_NEW = os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
# What open() gives a new file: 0o666, less the umask.
FILE_MODE = 0o666


def create_new(path: str | os.PathLike, mode: int = FILE_MODE, *, readable: bool = False) -> int:
    """The descriptor of a new, empty file at path (write-only, or read-write with readable).
    FileExistsError if anything is there, a symlink included: it is never followed."""
    return os.open(path, _NEW | (os.O_RDWR if readable else os.O_WRONLY), mode)


def create_unique(folder: str | os.PathLike, prefix: str, suffix: str = "",
                  mode: int = FILE_MODE, *, readable: bool = False) -> tuple[int, Path]:
    """(descriptor, path) of a new file `folder/<prefix><16 random hex digits><suffix>`."""
    for _ in range(100):
        path = Path(folder, f"{prefix}{secrets.token_hex(8)}{suffix}")
        try:
            return create_new(path, mode, readable=readable), path
        except FileExistsError:
            continue  # 2**64 names: only someone trying could collide, and not 100 times
    raise FileExistsError(errno.EEXIST, "no free temporary name", str(folder))


def new_unique_file(folder: str | os.PathLike, prefix: str, suffix: str = ""):
    """(binary file object, path) of a new file from `create_unique`, for a writer that keeps
    its file open and writes through it (TensorBoard's event file)."""
    fd, path = create_unique(folder, prefix, suffix)
    return os.fdopen(fd, "wb"), path


def install(tmp: Path, path: Path, *, overwrite: bool) -> None:
    """Renames tmp onto path. Without overwrite an existing path (a file, a link, anything) is
    FileExistsError, decided atomically: a hard link never replaces a name."""
    if overwrite:
        os.replace(tmp, path)
        return
    try:
        os.link(tmp, path, follow_symlinks=False)
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
            raise
        # A filesystem without hard links (FAT, some network mounts): check, then rename.
        if os.path.lexists(path):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(path)) from None
        os.rename(tmp, path)
        return
    os.unlink(tmp)


def existing_refusal(path: Path, flag: str) -> str:
    """The line for a refused overwrite: the same words for every command."""
    return f"{path} already exists; pass {flag} to replace it, or choose another name"


@contextlib.contextmanager
def replacing(path: str | os.PathLike, mode: str = "w", *, overwrite: bool = True,
              durable: bool = False, encoding: str | None = "utf-8", newline: str | None = None):
    """A file object (mode "w" or "wb") that becomes `path` when the block ends without an
    error; the temporary file goes otherwise. durable: fsync before the rename."""
    path = Path(path)
    fd, tmp = create_unique(path.parent, f".{path.name}.", ".tmp")
    try:
        # Writes through the descriptor name no file: a full disk names `path` (os_failure.py).
        with writing(path, temporary=tmp):
            binary = "b" in mode
            with os.fdopen(fd, "wb" if binary else "w", encoding=None if binary else encoding,
                           newline=newline) as f:
                yield f
                if durable:
                    f.flush()
                    os.fsync(f.fileno())
            install(tmp, path, overwrite=overwrite)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def write_file(path: str | os.PathLike, data: str | bytes, *, overwrite: bool = True,
               durable: bool = False) -> Path:
    """`path` holding data, written through `replacing`."""
    with replacing(path, "wb" if isinstance(data, bytes) else "w", overwrite=overwrite,
                   durable=durable) as f:
        f.write(data)
    return Path(path)


@contextlib.contextmanager
def replacing_path(path: str | os.PathLike, *, overwrite: bool = True):
    """A file name for a library to write, inside a private folder beside `path`; renamed onto
    `path` when the block ends without an error. The folder is removed whatever happens."""
    path = Path(path)
    private = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        tmp = private / path.name  # the name keeps its suffix: savefig picks the format by it
        with writing(path, temporary=private):  # a full disk names path, not our private copy
            yield tmp
            install(tmp, path, overwrite=overwrite)
    finally:
        shutil.rmtree(private, ignore_errors=True)


def make_fresh_dir(path: str | os.PathLike) -> Path:
    """A new folder at path, or at path-<random> when that name is taken: mkdir never follows a
    link and never reuses a folder (a planted one could hold links)."""
    path = Path(path)
    for candidate in [path] + [path.with_name(f"{path.name}-{secrets.token_hex(4)}")
                               for _ in range(100)]:
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free folder name", str(path))


def real_folder(path: str | os.PathLike, *, parents: bool = False) -> bool:
    """Makes folder `path` if nothing is there (mkdir never follows a link); whether what is
    there now is a real folder: False for a symlink (to a folder too), a file or anything
    else. OSError when it cannot be made."""
    try:
        Path(path).mkdir(parents=parents)
    except FileExistsError:  # ours from before, or something planted: looked at next
        pass
    return stat.S_ISDIR(os.lstat(path).st_mode)


def open_append(path: str | os.PathLike, encoding: str = "utf-8"):
    """A text file appending to path (created if missing). A symlink there is ELOOP (OSError), a
    pipe or device is refused: only a regular file of ours is appended to."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
                 | getattr(os, "O_CLOEXEC", 0), FILE_MODE)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        return os.fdopen(fd, "a", encoding=encoding)
    except BaseException:
        os.close(fd)
        raise


def open_lock_file(path: str | os.PathLike) -> int:
    """A read-write descriptor of the lock file at path, created if missing. A symlink there is
    ELOOP (never followed), and anything but a regular file with one name is EINVAL: its holder
    truncates it and writes its pid, and a hard link planted there would make that someone
    else's file."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
                 | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink > 1:  # 0: just removed
            raise OSError(errno.EINVAL, "not a lock file (a pipe, a device or a hard link)",
                          str(path))
        return fd
    except BaseException:
        os.close(fd)
        raise
