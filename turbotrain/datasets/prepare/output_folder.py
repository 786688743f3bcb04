"""Where prepare-dataset writes: OUT is checked before any work, built in a hidden sibling
folder, and renamed into place at the end.

One prepare-dataset at a time writes OUT: it holds `.OUT.lock` beside OUT
(turbotrain/files/folder_lock.py) from before the checks of OUT to the end, and a second one is
refused in one line naming the first; without it both passed the checks and the later replaced
the first's dataset, --overwrite or not. Parts (`--part i/N`, parts.py) are written into one
OUT by many processes at once by design: each holds the lock of its own part only,
`.OUT.part-0000i-of-0000N.lock`, so two runs of the same part (which would remove each other's
hidden folder) cannot overlap.

prepare-dataset deletes nothing it did not make. `--overwrite` replaces OUT only when OUT is a
dataset that prepare-dataset made (a folder holding `dataset.json` and nothing but the files it
writes), and never when OUT and SOURCE overlap: `prepare-dataset X X --overwrite` used to delete
the source images.
"""
from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path

from turbotrain import os_failure
from turbotrain.datasets.beton.dataset_json import DATASET_JSON, SPLITS
from turbotrain.datasets.beton.shards import parse_shard_filename
from turbotrain.datasets.beton.split import split_filename
from turbotrain.files import folder_lock


class OutputFolderError(ValueError):
    """OUT cannot be written as asked; the message is one line saying what to do."""


# Everything prepare-dataset writes into OUT, besides shard files (shards.shard_filename).
WRITTEN_NAMES = frozenset({DATASET_JSON, "skipped.txt", *(split_filename(s) for s in SPLITS)})


def check_output(out: Path, source: Path, overwrite: bool) -> None:
    """Refuses an OUT that overlaps SOURCE, or that exists and is not ours to replace."""
    check_not_overlapping(out, source)
    if not os.path.lexists(out):
        return
    if not overwrite:
        raise OutputFolderError(f"{out} already exists; pass --overwrite to replace it")
    check_replaceable(out)


def check_not_overlapping(out: Path, source: Path) -> None:
    real_out, real_source = os.path.realpath(out), os.path.realpath(source)
    if real_out == real_source:
        raise OutputFolderError(f"OUT {out} is SOURCE itself; choose another OUT")
    if _under(real_out, real_source):
        raise OutputFolderError(f"OUT {out} is inside SOURCE {source}; choose an OUT outside "
                                f"the source data")
    if _under(real_source, real_out):
        raise OutputFolderError(f"OUT {out} contains SOURCE {source}; choose an OUT that does "
                                f"not hold the source data")


def check_replaceable(out: Path) -> None:
    """Refuses to replace an OUT that prepare-dataset did not make, or that holds anything
    else; run again just before the replacement, in case files were added meanwhile."""
    if os.path.islink(out) or not out.is_dir():
        raise OutputFolderError(f"{out} is not a dataset folder (a file or a link); --overwrite "
                                f"replaces only a folder that prepare-dataset made")
    if not (out / DATASET_JSON).is_file():
        raise OutputFolderError(f"{out} has no {DATASET_JSON}, so prepare-dataset did not make "
                                f"it; --overwrite replaces only a prepared dataset: choose "
                                f"another OUT")
    foreign = sorted(name for name in os.listdir(out)
                     if name not in WRITTEN_NAMES and parse_shard_filename(name) is None)
    if foreign:
        shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
        raise OutputFolderError(f"{out} holds files prepare-dataset did not write ({shown}); "
                                f"move them out, or choose another OUT")


def _under(path: str, folder: str) -> bool:
    return path.startswith(folder.rstrip(os.sep) + os.sep)


class OutputLock:
    """OUT's lock (or one part's), taken by `lock_output`; released when the `with` block ends.
    The folders made to hold the lock file (OUT's missing parents) go again when the block
    fails, so a refused prepare leaves nothing."""

    def __init__(self, path: Path, fd: int, made: list[Path]):
        self.path, self.fd, self.made = path, fd, made

    def __enter__(self):
        return self

    def __exit__(self, kind, value, traceback):
        folder_lock.release(self.fd, self.path)
        if kind is not None:
            _remove_made(self.made)


def lock_output(out: Path, part: tuple[int, int] | None) -> OutputLock:
    """Holds OUT's lock file, a sibling of OUT (OUT itself may not exist yet, and the checks
    of OUT and merge must not find a file of ours in it); OutputFolderError when another
    prepare-dataset holds it."""
    name = f".{out.name}.lock" if part is None else \
        f".{out.name}.part-{part[0]:05d}-of-{part[1]:05d}.lock"
    path = out.parent / name
    made = _make_parents(out.parent)
    try:
        return OutputLock(path, folder_lock.hold(path), made)
    except folder_lock.FolderBusy as busy:
        what = "OUT" if part is None else f"part {part[0]}/{part[1]} of OUT"
        error = OutputFolderError(f"{what} {out} is in use by another prepare-dataset "
                                  f"({busy.holder}); wait for it or choose another OUT")
    except OSError as e:
        if e.errno in os_failure.WRITE_REFUSED:
            _remove_made(made)
            raise  # a full or read-only disk: os_failure names the file and what to do
        error = OutputFolderError(f"{path}: cannot use it as OUT's lock file ("
                                  f"{e.strerror or e}); remove it, or choose another OUT")
    _remove_made(made)
    raise error


def _make_parents(folder: Path) -> list[Path]:
    """Makes folder and its missing parents; returns those it made, deepest first."""
    missing = []
    while not os.path.lexists(folder) and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    for path in reversed(missing):
        path.mkdir(exist_ok=True)
    return missing


def _remove_made(made: list[Path]) -> None:
    for path in made:
        try:
            path.rmdir()
        except OSError:  # something was put in it meanwhile: it stays
            return


def partial_dir(out: Path) -> Path:
    return out.parent / f".{out.name}.partial-{os.getpid()}"


def remove_stale_partials(out: Path) -> None:
    """Removes the hidden folders that runs killed with SIGKILL left behind (named after OUT
    and a process that no longer exists)."""
    prefix = f".{out.name}.partial-"
    for entry in os.scandir(out.parent):
        pid = entry.name[len(prefix):].split("-")[0]  # (make_fresh_dir may add -<random>)
        if entry.name.startswith(prefix) and pid.isdigit() and not Path(f"/proc/{pid}").exists() \
                and entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)


def install(partial: Path, out: Path, overwrite: bool) -> None:
    """Moves the finished dataset into place; an old OUT (checked by check_output) is only
    removed after that succeeds. OUT is checked again first: the lock keeps other
    prepare-datasets out, not a user or another tool."""
    if os.path.lexists(out):
        if not overwrite:
            raise OutputFolderError(f"{out} already exists (it appeared while this dataset was "
                                    f"being prepared); pass --overwrite to replace it")
        check_replaceable(out)
        # A fresh name: renaming onto one planted there would fail or replace it.
        trash = out.parent / f".{out.name}.old-{os.getpid()}-{secrets.token_hex(4)}"
        out.rename(trash)
        partial.rename(out)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        partial.rename(out)
