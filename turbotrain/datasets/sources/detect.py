"""Finding the images and labels in a SOURCE path: `detect_source`, over one ordered table of
the source kinds (`KINDS`).

`detect_source(path)` decides what the path is, first match wins:

1. `path` does not exist -> SourceError, unless it holds a brace pattern
   (`data/train-{000000..000009}.tar`): the WebDataset .tar files or Parquet/Arrow files it
   names (source_files.py).
2. `path` is neither a file nor a folder (a FIFO, a device) -> SourceError; it is never opened.
3. the rows of `KINDS`, in order; each looks at a file or a folder:

   | kind        | a file                                | a folder                              |
   |-------------|---------------------------------------|---------------------------------------|
   | cifar       | `.tar.gz`/`.tgz`/`.tar` named so, or  | python batches (`data_batch_1..5`,    |
   |             | whose first member is under           | `test_batch`, `batches.meta`; or      |
   |             | `cifar-10-batches-py/`,               | `train`, `test`, `meta`), or an       |
   |             | `cifar-100-python/`                   | extracted/downloaded CIFAR inside     |
   | idx         | an idx file (`train-images-idx3-      | `[prefix]train-images-idx3-ubyte[.gz]`|
   |             | ubyte.gz`, ...): the set in its folder| + labels, `t10k-`/`test-` for val     |
   | npz         | `images` + `labels` (optional         |                                       |
   |             | `classes`, `val_images`, `val_labels`)|                                       |
   | csv         | `.csv`/`.tsv`/`.txt` rows `path,label`|                                       |
   | hf          |                                       | a `save_to_disk` folder (`state.json` |
   |             |                                       | or `dataset_dict.json`)               |
   | webdataset  | any other `.tar`/`.tar.gz`/`.tgz`     | such files, in it or in its `train/`  |
   |             |                                       | and `val/` (or `test/`) subfolders    |
   | hf          | `.parquet`, `.arrow`                  | such files, the same way              |
   | imagefolder |                                       | class subfolders (image_files.py)     |

   A file that no row takes is refused with the hint built from the rows (`NO_IMAGES_HINT`);
   a folder always reaches the last row, ImageFolder, the fallback.

Adding a source kind is one module with its reader and one row here. Nothing in SOURCE is
trusted (docs/SECURITY.md): every reader reads through turbotrain/files/untrusted.py.
"""
from __future__ import annotations

import os
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from turbotrain.files.untrusted import Limits, UnsafeInput
from turbotrain.printable import printable

from .arrays import IDX_NAME, find_idx_files, read_idx_folder, read_npz
from .cifar import (CIFAR100_DIR, CIFAR10_DIR, is_cifar_archive, looks_like_cifar,
                    read_cifar_archive, read_cifar_folder)
from .hf import HF_SUFFIXES, Columns, is_hf_folder, read_hf_files, read_hf_folder
from .image_files import LIST_SUFFIXES, NoImages, read_image_folder, read_list
from .source import IMAGE_EXTENSIONS, Source, SourceError
from .source_files import folder_files, is_pattern, pattern_files, split_by_name
from .webdataset import WEBDATASET_SUFFIXES, read_webdataset

ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar")
CIFAR_ARCHIVES = ("cifar-10-python.tar.gz", "cifar-100-python.tar.gz")
# Files that are a SOURCE by themselves: a folder without images that holds one is told so.
SINGLE_FILE_SUFFIXES = (".npz", *LIST_SUFFIXES, *ARCHIVE_SUFFIXES)


@dataclass(frozen=True)
class Asked:
    """What the caller asked for, handed to every detector and reader."""
    limits: Limits
    allow_outside_root: bool
    columns: Columns


@dataclass(frozen=True)
class Kind:
    """One row of KINDS. `detect(path, asked)`: what the reader reads (the path itself, the
    folder or archive chosen inside it, or {split: files}), or None when path is not this
    kind; `read(found, path, asked)`: the Source. `hint`: how the "no images" line names what
    this kind expects (None: another row of the same kind says it)."""
    name: str
    detect: Callable[[Path, Asked], object]
    read: Callable[[object, Path, Asked], Source]
    hint: str | None


def _is_file_with(suffixes: tuple[str, ...]) -> Callable[[Path, Asked], object]:
    return lambda path, asked: path if path.is_file() and path.name.lower().endswith(
        suffixes) else None


def _cifar(path: Path, asked: Asked) -> Path | None:
    """The CIFAR folder or archive to read: path itself, or (an extracted folder before its
    archive) the one inside it."""
    if path.is_file():
        return path if (path.name.lower().endswith(ARCHIVE_SUFFIXES)
                        and is_cifar_archive(path, CIFAR_ARCHIVES)) else None
    if looks_like_cifar(path):
        return path
    inside = [path / name for name in (CIFAR10_DIR, CIFAR100_DIR) if (path / name).is_dir()]
    inside += [path / name for name in CIFAR_ARCHIVES if (path / name).is_file()]
    return inside[0] if inside else None


def _read_cifar(found: Path, path: Path, asked: Asked) -> Source:
    return (read_cifar_folder(found, asked.limits) if found.is_dir()
            else read_cifar_archive(found, asked.limits))


def _idx(path: Path, asked: Asked) -> Path | None:
    """The folder of the idx set."""
    if path.is_file():
        return path.parent if IDX_NAME.match(path.name) else None
    return path if find_idx_files(path) else None


def _hf_saved(path: Path, asked: Asked) -> Path | None:
    return path if path.is_dir() and is_hf_folder(path) else None


def _files_of(suffixes: tuple[str, ...]) -> Callable[[Path, Asked], object]:
    """{split: files} of a kind made of many files: one file, or a folder of them
    (source_files.py)."""
    def detect(path: Path, asked: Asked) -> dict[str, list[Path]] | None:
        if path.is_file():
            return {"train": [path]} if path.name.lower().endswith(suffixes) else None
        return folder_files(path, suffixes, asked.allow_outside_root)
    return detect


def _read_image_folder(found: Path, path: Path, asked: Asked) -> Source:
    try:
        return read_image_folder(found, asked.limits, asked.allow_outside_root)
    except NoImages as e:
        lists = sorted(p.name for p in found.iterdir()
                       if p.name.lower().endswith(SINGLE_FILE_SUFFIXES))
        hint = f" (to use {lists[0]}, pass that file as SOURCE)" if lists else ""
        raise SourceError(f"{e}: {NO_IMAGES_HINT}{hint}") from None


# Ordered: the first row whose detector takes the path reads it (the module docstring's table).
# A CIFAR archive is a .tar before it is a WebDataset one; a save_to_disk folder holds .arrow
# files; ImageFolder takes any folder, so it is last.
KINDS = (
    Kind("cifar", _cifar, _read_cifar, "CIFAR batches"),
    Kind("idx", _idx, lambda found, path, asked: read_idx_folder(found, asked.limits),
         "MNIST idx files"),
    Kind("npz", _is_file_with((".npz",)), lambda found, path, asked: read_npz(found, asked.limits),
         "a .npz"),
    Kind("csv", _is_file_with(LIST_SUFFIXES),
         lambda found, path, asked: read_list(found, asked.limits, asked.allow_outside_root),
         "a CSV/TSV list"),
    Kind("hf", _hf_saved,
         lambda found, path, asked: read_hf_folder(found, asked.limits, asked.columns), None),
    Kind("webdataset", _files_of(WEBDATASET_SUFFIXES),
         lambda found, path, asked: read_webdataset(found, path, asked.limits),
         "WebDataset .tar shards"),
    Kind("hf", _files_of(HF_SUFFIXES),
         lambda found, path, asked: read_hf_files(found, path, asked.limits, asked.columns),
         "Hugging Face Parquet/Arrow files"),
    Kind("imagefolder", lambda path, asked: path if path.is_dir() else None, _read_image_folder,
         "class subfolders (ImageFolder)"),
)


def _no_images_hint() -> str:
    """"expected A, B, ... or Z": the fallback's words first (what most SOURCEs are meant to
    be), then every other row's, in order."""
    hints = [KINDS[-1].hint] + [kind.hint for kind in KINDS[:-1] if kind.hint]
    return f"expected {', '.join(hints[:-1])} or {hints[-1]}"


NO_IMAGES_HINT = _no_images_hint()


def detect_source(path: str | os.PathLike, limits: Limits = Limits(), *,
                  allow_outside_root: bool = False, columns: Columns = Columns()) -> Source:
    """Read SOURCE's layout (file lists, or arrays for array formats); see the module docstring
    for the order of checks. `columns`: the image and label columns of a Hugging Face source.
    Raises SourceError with one line saying what is wrong."""
    path = Path(path).expanduser()
    if not path.exists() and not is_pattern(path):
        raise SourceError(f"SOURCE {path} does not exist")
    try:
        source = _detect(path, Asked(limits, allow_outside_root, columns))
    except UnsafeInput as e:
        raise SourceError(f"SOURCE {path}: {e}") from None
    except OSError as e:  # permissions, a file vanishing mid-listing, a broken mount
        raise SourceError(f"cannot read SOURCE {path}: {e}") from e
    except RecursionError:  # a folder tree nested thousands deep
        raise SourceError(f"SOURCE {path} is nested too deeply to list") from None
    if columns != Columns() and source.kind != "hf":
        raise SourceError(f"--image-column and --label-column are for Parquet/Arrow (Hugging "
                          f"Face) sources; SOURCE {path} is {source.kind}")
    return source


def _detect(path: Path, asked: Asked) -> Source:
    if not path.exists():
        return _read_pattern(path, asked)
    if not path.is_file() and not path.is_dir():  # never opened: a FIFO would block
        raise SourceError(f"SOURCE {path} is neither a regular file nor a folder (a named "
                          f"pipe, a device or a socket)")
    for kind in KINDS:
        found = kind.detect(path, asked)
        if found is not None:
            return kind.read(found, path, asked)
    raise SourceError(f"SOURCE {path} is a file of unknown kind; {NO_IMAGES_HINT}")


def _read_pattern(path: Path, asked: Asked) -> Source:
    """The files a brace pattern names, {split: files}: all of one kind."""
    split_files = split_by_name(pattern_files(str(path)), path)
    files = [file for listed in split_files.values() for file in listed]
    if all(file.name.lower().endswith(WEBDATASET_SUFFIXES) for file in files):
        return read_webdataset(split_files, path, asked.limits)
    if all(file.name.lower().endswith(HF_SUFFIXES) for file in files):
        return read_hf_files(split_files, path, asked.limits, asked.columns)
    raise SourceError(f"SOURCE {path} names files that are neither all WebDataset shards "
                      f"(.tar, .tar.gz, .tgz) nor all Parquet/Arrow files (e.g. {files[0].name})")


# -- a path given where a prepared dataset was expected ------------------------------------------
# Entries looked at, at most, for an image under a folder without dataset.json: enough to tell
# an ImageFolder from an unrelated folder without listing a million files on an error path.
_LOOK_AT = 2000


def not_prepared_line(path: str | os.PathLike) -> str:
    """What `path` holds, said where a prepared dataset was expected (train/eval/tune --data),
    with the exact commands that prepare it. The hint it replaces, `prepare-dataset SOURCE
    PATH`, named PATH as OUT when PATH was the SOURCE, which prepare then refused as such."""
    path = Path(path)
    shown = printable(path)
    if not os.path.lexists(path):
        return (f"{shown}: no such dataset: nothing exists at that path (a prepared dataset is "
                "the OUT folder that `prepare-dataset SOURCE OUT` writes)")
    what = source_kind(path)
    if what is not None:
        out = _prepared_beside(path)
        return (f"{shown} is not a prepared dataset but a SOURCE: {what}; run "
                f"`prepare-dataset {_quoted(path)} {_quoted(out)}`, then "
                f"`train --data {_quoted(out)}`")
    if path.is_dir() and any(name.endswith(".beton") for name in os.listdir(path)):
        return (f"{shown}: .beton files but no dataset.json (a prepare that did not finish?): "
                "prepare it again, or pass one .beton file")
    return (f"{shown}: not a prepared dataset (no dataset.json) and no images found in it; a "
            "prepared dataset is the OUT folder that `prepare-dataset SOURCE OUT` writes")


def source_kind(path: Path) -> str | None:
    """How the "no images" hint names the first KINDS row that takes `path` (ImageFolder, the
    fallback, only for a folder with an image among its first _LOOK_AT entries); None when no
    row does. Reads nothing but listings."""
    asked = Asked(Limits(), allow_outside_root=False, columns=Columns())
    try:
        for kind in KINDS[:-1]:
            if kind.detect(path, asked) is not None:
                return kind.hint or "a Hugging Face save_to_disk folder"
        if path.is_dir() and _holds_an_image(path):
            return KINDS[-1].hint
    except (OSError, UnsafeInput, SourceError, RecursionError):
        pass
    return None


def _holds_an_image(folder: Path) -> bool:
    seen, pending = 0, [folder]
    while pending and seen < _LOOK_AT:
        with os.scandir(pending.pop()) as entries:
            for entry in entries:
                seen += 1
                if seen > _LOOK_AT:
                    break
                if entry.name.startswith("."):
                    continue
                if entry.is_dir(follow_symlinks=False):
                    pending.append(Path(entry.path))
                elif os.path.splitext(entry.name)[1].lower() in IMAGE_EXTENSIONS:
                    return True
    return False


def _prepared_beside(path: Path) -> Path:
    """NAME-prepared beside PATH, NAME without a file's suffix (for `.` or `..`, beside the
    folder it names)."""
    if path.name in ("", ".", ".."):
        path = path.resolve()
    name = path.name
    if path.is_file():
        suffix = next((s for s in (*ARCHIVE_SUFFIXES, *HF_SUFFIXES) if name.lower().endswith(s)),
                      Path(name).suffix)
        name = name[:len(name) - len(suffix)] or name
    return path.parent / f"{name or 'data'}-prepared"


def _quoted(path: Path) -> str:
    return printable(shlex.quote(str(path)))
