"""Finding the images and labels in a SOURCE path: `detect_source` (the val split and the stored
order: split_order.py, re-exported here).

`detect_source(path)` decides what the path is by these checks, first match wins:

1. `path` does not exist -> SourceError.
0. `path` does not exist but holds a brace pattern (`data/train-{000000..000009}.tar`): the
   WebDataset shards or Parquet/Arrow files it names (shard_names.py).
2. `path` is a file:
   - `.tar.gz`, `.tgz`, `.tar`: a CIFAR-10/100 "python version" archive, read in place, when
     it is named so or its first member is under `cifar-10-batches-py/` or `cifar-100-python/`;
     else one WebDataset shard (webdataset.py);
   - `.parquet`, `.arrow`: Hugging Face rows of images and labels (hf_sources.py);
   - `.npz`: arrays `images` + `labels` (optional `classes`, `val_images` + `val_labels`);
   - `.csv`, `.tsv`, `.txt`: a list of `path,label` rows (paths relative to the list's folder);
   - an idx file (`train-images-idx3-ubyte.gz`, ...): the idx set in its folder.
3. `path` is a folder:
   a. CIFAR python batches in it: `data_batch_1..5` + `test_batch` + `batches.meta` (CIFAR-10),
      or the files `train` + `test` + `meta` (CIFAR-100, fine labels);
   b. an extracted `cifar-10-batches-py/` or `cifar-100-python/` in it, or the downloaded
      `cifar-10-python.tar.gz` / `cifar-100-python.tar.gz`;
   c. MNIST-style idx files: `[prefix]train-images-idx3-ubyte[.gz]`, `...-labels-idx1-...`, and
      `t10k-` (or `test-`) ones for val (MNIST, Fashion-MNIST, KMNIST, EMNIST);
   c2. a Hugging Face `save_to_disk` folder (`state.json` or `dataset_dict.json`);
   c3. WebDataset shards (`.tar`, `.tar.gz`, `.tgz`), else `.parquet`/`.arrow` files, in the
      folder or in its `train/` and `val/` (or `test/`) subfolders;
   d. ImageFolder: `train/` (and `val/`, or else `test/`, stored as "val") holding one
      subfolder per class; otherwise the class subfolders directly (one split, "train").
      Images are found recursively inside a class folder; classes are sorted by name and are
      the union over the splits, so a label means the same class in train and val.

Sample order inside a split never depends on the filesystem's listing order: ImageFolder sorts
by class, then path; CSV keeps the list's order; array sources keep the file's order.

Nothing in SOURCE is trusted (docs/SECURITY.md): a CSV row or a symlinked class folder that
leads outside SOURCE is refused unless `allow_outside_root`, and every file is read through
`untrusted.py` (regular files only, size caps from `Limits`).
"""
from __future__ import annotations

import csv
import os
from pathlib import Path

import numpy as np

from turbotrain.datasets.array_sources import IDX_NAME, find_idx_files, read_idx_folder, read_npz
from turbotrain.datasets.cifar import (CIFAR10_DIR, CIFAR100_DIR, is_cifar_archive,
                                       looks_like_cifar, read_cifar_archive, read_cifar_folder)
from turbotrain.datasets.class_labels import classes_and_labels
from turbotrain.datasets.format import MAX_CLASSES
from turbotrain.datasets.hf_sources import HF_SUFFIXES, Columns, is_hf_folder, read_hf_folder, \
    read_hf_files
from turbotrain.datasets.shard_names import folder_shards, is_pattern, pattern_files, \
    split_by_name
from turbotrain.datasets.source_types import (ArraySplit, FileSplit, Source, SourceError,
                                              SplitSource)
from turbotrain.datasets.split_order import shuffled_order, shuffled_train, with_val_split
from turbotrain.datasets.untrusted import Limits, UnsafeInput, outside_root_reason, read_regular
from turbotrain.datasets.webdataset import WEBDATASET_SUFFIXES, read_webdataset

__all__ = ["ArraySplit", "Columns", "FileSplit", "Limits", "Source", "SourceError", "SplitSource",
           "IMAGE_EXTENSIONS", "detect_source", "list_images", "shuffled_order", "shuffled_train",
           "with_val_split"]

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff"})
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar")
LIST_SUFFIXES = (".csv", ".tsv", ".txt")
CIFAR_ARCHIVES = ("cifar-10-python.tar.gz", "cifar-100-python.tar.gz")
HELD_OUT_FOLDERS = ("val", "test")  # the first present becomes the "val" split

# A CSV's first row is a header when it names a column like these (case-insensitive).
PATH_COLUMNS = {"path", "file", "filename", "file_name", "filepath", "image", "image_path", "img"}
LABEL_COLUMNS = {"label", "class", "class_name", "target", "category", "y"}

NO_IMAGES_HINT = ("expected class subfolders (ImageFolder), CIFAR batches, MNIST idx files, "
                  "a .npz, a CSV/TSV list, WebDataset .tar shards or Hugging Face "
                  "Parquet/Arrow files")


def detect_source(path: str | os.PathLike, limits: Limits = Limits(), *,
                  allow_outside_root: bool = False, columns: Columns = Columns()) -> Source:
    """Read SOURCE's layout (file lists, or arrays for array formats); see the module docstring
    for the order of checks. `columns`: the image and label columns of a Hugging Face source.
    Raises SourceError with one line saying what is wrong."""
    path = Path(path).expanduser()
    if not path.exists() and not is_pattern(path):
        raise SourceError(f"SOURCE {path} does not exist")
    try:
        source = _detect(path, limits, allow_outside_root, columns)
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


def _detect(path: Path, limits: Limits, allow_outside_root: bool, columns: Columns) -> Source:
    if not path.exists():
        return _read_shard_files(split_by_name(pattern_files(str(path)), path), path, limits,
                                 columns)
    if path.is_file():
        return _detect_file(path, limits, allow_outside_root, columns)
    if not path.is_dir():  # never opened: a FIFO would block, a device never end
        raise SourceError(f"SOURCE {path} is neither a regular file nor a folder (a named "
                          f"pipe, a device or a socket)")
    if looks_like_cifar(path):
        return read_cifar_folder(path, limits)
    inside = [path / name for name in (CIFAR10_DIR, CIFAR100_DIR) if (path / name).is_dir()]
    inside += [path / name for name in CIFAR_ARCHIVES if (path / name).is_file()]
    if inside:
        chosen = inside[0]  # an extracted folder is listed before its archive
        return (read_cifar_folder(chosen, limits) if chosen.is_dir()
                else read_cifar_archive(chosen, limits))
    if find_idx_files(path):
        return read_idx_folder(path, limits)
    if is_hf_folder(path):
        return read_hf_folder(path, limits, columns)
    for suffixes in (WEBDATASET_SUFFIXES, HF_SUFFIXES):
        shards = folder_shards(path, suffixes, allow_outside_root)
        if shards:
            return _read_shard_files(shards, path, limits, columns)
    return _read_image_folder(path, limits, allow_outside_root)


def _read_shard_files(split_files: dict[str, list[Path]], root: Path, limits: Limits,
                      columns: Columns) -> Source:
    """WebDataset shards or Parquet/Arrow files, {split: files}; one kind for all."""
    files = [path for listed in split_files.values() for path in listed]
    if all(path.name.lower().endswith(WEBDATASET_SUFFIXES) for path in files):
        return read_webdataset(split_files, root, limits)
    if all(path.name.lower().endswith(HF_SUFFIXES) for path in files):
        return read_hf_files(split_files, root, limits, columns)
    raise SourceError(f"SOURCE {root} names files that are neither all WebDataset shards "
                      f"(.tar, .tar.gz, .tgz) nor all Parquet/Arrow files (e.g. {files[0].name})")


def _detect_file(path: Path, limits: Limits, allow_outside_root: bool,
                 columns: Columns) -> Source:
    name = path.name.lower()
    if name.endswith(ARCHIVE_SUFFIXES):
        if is_cifar_archive(path, CIFAR_ARCHIVES):
            return read_cifar_archive(path, limits)
        return read_webdataset({"train": [path]}, path, limits)
    if name.endswith(HF_SUFFIXES):
        return read_hf_files({"train": [path]}, path, limits, columns)
    if name.endswith(".npz"):
        return read_npz(path, limits)
    if name.endswith(LIST_SUFFIXES):
        return _read_list(path, limits, allow_outside_root)
    if IDX_NAME.match(path.name):
        return read_idx_folder(path.parent, limits)
    raise SourceError(f"SOURCE {path} is a file of unknown kind; {NO_IMAGES_HINT}")


# --- ImageFolder -------------------------------------------------------------------------------

def _read_image_folder(root: Path, limits: Limits, allow_outside_root: bool) -> Source:
    subfolders = _subfolders(root)
    # train/ holding folders means a split layout; a "train" folder of images is a class.
    if "train" in subfolders and _subfolders(root / "train"):
        unexpected = sorted(subfolders - {"train", *HELD_OUT_FOLDERS})
        if unexpected:
            raise SourceError(f"{root} has train/ with class folders but also "
                              f"{', '.join(unexpected)}/; expected only train/ and val/ (or test/)")
        split_folders = {"train": root / "train"}
        held_out = next((name for name in HELD_OUT_FOLDERS if name in subfolders), None)
        if held_out:
            split_folders["val"] = root / held_out
    else:
        split_folders = {"train": root}
    links: set[str] = set()
    per_split = {split: _class_folders(folder, root, allow_outside_root, links)
                 for split, folder in split_folders.items()}
    classes = sorted(set().union(*per_split.values()))
    if len(classes) > MAX_CLASSES:
        raise SourceError(f"{root} has {len(classes):,} class folders, over the {MAX_CLASSES:,} "
                          f"classes a dataset may have")
    index = {name: k for k, name in enumerate(classes)}
    splits = {}
    for split, by_class in per_split.items():
        relpaths: list[str] = []
        labels: list[int] = []
        for name in sorted(by_class):
            relpaths += by_class[name]
            labels += [index[name]] * len(by_class[name])
        splits[split] = FileSplit(str(root), relpaths, np.array(labels, dtype=np.int64),
                                  limits.max_file_bytes,
                                  frozenset() if allow_outside_root else frozenset(links))
    return Source("imagefolder", root, classes, splits)


def _subfolders(folder: Path) -> set[str]:
    return {entry.name for entry in os.scandir(folder)
            if entry.is_dir() and not entry.name.startswith(".")}


def _class_folders(folder: Path, root: Path, allow_outside_root: bool,
                   links: set[str]) -> dict[str, list[str]]:
    """{class name: sorted image paths relative to root} for the class subfolders of folder;
    symlinked files found are added to `links`."""
    by_class: dict[str, list[str]] = {}
    loose: list[str] = []
    for entry in sorted(os.scandir(folder), key=lambda entry: entry.name):
        if entry.name.startswith("."):
            continue
        if entry.is_dir():
            # A symlinked class folder is walked (that is how people share a class between
            # datasets) only when it stays inside SOURCE, or the user allows otherwise: a link
            # to / would walk the whole disk and embed whatever it finds.
            outside = None if allow_outside_root else outside_root_reason(entry.path, root)
            if outside:
                raise SourceError(f"class folder {entry.path} {outside}")
            images = _images_under(entry.path, root, links)
            if not images:
                raise SourceError(f"class folder {entry.path} is empty (no "
                                  f"{'/'.join(sorted(e[1:] for e in IMAGE_EXTENSIONS))} files); "
                                  f"add images or remove it")
            by_class[entry.name] = images
        elif _is_image_name(entry.name):
            loose.append(entry.name)
    if loose:
        raise SourceError(f"{folder} has image files outside class folders (e.g. {min(loose)}); "
                          f"move them into one subfolder per class")
    if not by_class:
        if folder == root:
            lists = sorted(p.name for p in root.iterdir()
                           if p.name.lower().endswith((".npz", *LIST_SUFFIXES, *ARCHIVE_SUFFIXES)))
            hint = f" (to use {lists[0]}, pass that file as SOURCE)" if lists else ""
            raise SourceError(f"{root} holds no images: {NO_IMAGES_HINT}{hint}")
        raise SourceError(f"{folder} holds no class subfolders; put each class's images in "
                          f"{folder}/<class name>/")
    return by_class


def _images_under(folder: str, root: Path, links: set[str]) -> list[str]:
    """Image files anywhere under folder, relative to root, sorted; dot-files (macOS '._x.jpg'
    resource forks, which are not images) and dot-folders skipped. Symlinked sub-folders are not
    entered (as os.walk does); symlinked files are added to `links`, the only files that
    FileSplit.load must resolve to keep reads inside root: the rest are inside by construction,
    and scandir says which entries are links without a system call per file."""
    found = []
    pending = [folder]
    while pending:
        with os.scandir(pending.pop()) as entries:
            for entry in entries:
                if entry.name.startswith("."):
                    continue
                if entry.is_dir(follow_symlinks=False):
                    pending.append(entry.path)
                elif _is_image_name(entry.name):
                    relative = os.path.relpath(entry.path, root)
                    found.append(relative)
                    if entry.is_symlink():
                        links.add(relative)
    found.sort()
    return found


def _is_image_name(name: str) -> bool:
    return os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS


# --- CSV / TSV lists ---------------------------------------------------------------------------

def _read_list(path: Path, limits: Limits, allow_outside_root: bool) -> Source:
    """Rows of (image path, label). A label is an integer (kept as is: classes are "0".."max")
    or a class name (classes sorted, label = index). .tsv is tab-separated, .csv comma; a .txt
    is tab- or comma-separated when its first line holds one, else "path label" on spaces."""
    rows = _list_rows(path, limits)
    root = path.parent
    relpaths, names = [], []
    for line, file, label in rows:
        if "\0" in file:
            raise SourceError(f"{path}:{line}: the path holds a NUL byte")
        listed = os.path.join(root, file)
        outside = None if allow_outside_root else outside_root_reason(listed, root)
        if outside:
            raise SourceError(f"{path}:{line}: {file} {outside}")
        if not os.path.isfile(listed):
            raise SourceError(f"{path}:{line}: {root / file} does not exist or is not a "
                              f"regular file")
        relpaths.append(file)
        names.append(label)
    if not relpaths:
        raise SourceError(f"{path} lists no images; expected rows of 'path,label'")
    classes, labels = _list_labels(path, [line for line, _, _ in rows], names)
    # Every row was resolved above: nothing is left to check when the files are read.
    split = FileSplit(str(root), relpaths, labels, limits.max_file_bytes)
    return Source("csv", path, classes, {"train": split}, (path,))


def _list_labels(path: Path, lines: list[int], names: list[str]) -> tuple[list[str], np.ndarray]:
    """(classes, labels): integer labels are kept as is (classes "0".."max"), names are sorted."""
    return classes_and_labels(names, lambda k: f"{path}:{lines[k]}", str(path))


def _list_rows(path: Path, limits: Limits, *,
               labelled: bool = True) -> list[tuple[int, str, str]]:
    """(line number, path, label) for each non-empty row, header skipped. `labelled=False`
    (`list_images`): the label column is optional ("" when absent) and a .txt without tabs or
    commas holds one path per line."""
    try:
        text = read_regular(path, limits.max_file_bytes).decode("utf-8-sig")  # Excel's BOM
    except (OSError, UnicodeDecodeError) as e:
        raise SourceError(f"{path} is not a readable UTF-8 list ({e})") from e
    lines = text.splitlines()
    first = next((line for line in lines if line.strip()), "")
    suffix = path.suffix.lower()
    delimiter = "\t" if suffix == ".tsv" or (suffix == ".txt" and "\t" in first) else ","
    if suffix == ".txt" and delimiter == "," and "," not in first:
        # "dir/a b.jpg 3": path may have spaces
        table = [line.rsplit(None, 1) if labelled else [line] for line in lines]
    else:
        try:
            table = list(csv.reader(lines, delimiter=delimiter))
        except csv.Error as e:  # a field over csv's 128 KiB limit, a NUL byte
            raise SourceError(f"{path} is not a readable list ({e})") from None
    numbered = [(k + 1, [cell.strip() for cell in row]) for k, row in enumerate(table)
                if any(cell.strip() for cell in row)]
    path_column, label_column = 0, 1
    if numbered:
        header = [cell.lower() for cell in numbered[0][1]]
        if PATH_COLUMNS & set(header) or LABEL_COLUMNS & set(header):
            path_column = next((k for k, c in enumerate(header) if c in PATH_COLUMNS), 0)
            label_column = next((k for k, c in enumerate(header) if c in LABEL_COLUMNS), 1)
            numbered = numbered[1:]
    rows = []
    for line, row in numbered:
        label = row[label_column] if len(row) > label_column else ""
        if len(row) <= path_column or not row[path_column] or (labelled and not label):
            raise SourceError(f"{path}:{line}: expected 'path{delimiter}label', got "
                              f"{delimiter.join(row)!r}")
        rows.append((line, row[path_column], label))
    return rows


# --- plain lists of images (turbotrain predict) ---------------------------------------------------

def list_images(path: str | os.PathLike, limits: Limits = Limits(), *,
                allow_outside_root: bool = False) -> FileSplit:
    """The image files `path` names, in order, with the same rules as a SOURCE (labels are not
    needed and all 0): a folder gives every image under it, sorted, symlinked files resolved
    inside it when read; a .csv/.tsv/.txt list gives its rows' paths (relative to the list's
    folder, each checked to stay inside it; a label column may be there or not); any other file
    is itself. SourceError (one line) when the path or the list cannot be read."""
    path = Path(path).expanduser()
    try:
        if path.is_dir():
            links: set[str] = set()
            relpaths = _images_under(str(path), path, links)
            if not relpaths:
                raise SourceError(f"{path} holds no image files "
                                  f"({', '.join(sorted(IMAGE_EXTENSIONS))})")
            return FileSplit(str(path), relpaths, np.zeros(len(relpaths), dtype=np.int64),
                             limits.max_file_bytes,
                             frozenset() if allow_outside_root else frozenset(links))
        if path.name.lower().endswith(LIST_SUFFIXES) and path.is_file():
            root, relpaths = path.parent, []
            for line, file, _ in _list_rows(path, limits, labelled=False):
                if "\0" in file:
                    raise SourceError(f"{path}:{line}: the path holds a NUL byte")
                outside = (None if allow_outside_root else
                           outside_root_reason(os.path.join(root, file), root))
                if outside:
                    raise SourceError(f"{path}:{line}: {file} {outside}")
                relpaths.append(file)
            if not relpaths:
                raise SourceError(f"{path} lists no images; expected one path per row")
            return FileSplit(str(root), relpaths, np.zeros(len(relpaths), dtype=np.int64),
                             limits.max_file_bytes)
    except UnsafeInput as e:
        raise SourceError(f"{path}: {e}") from None
    except OSError as e:
        raise SourceError(f"cannot read {path}: {e}") from e
    except RecursionError:
        raise SourceError(f"{path} is nested too deeply to list") from None
    # One file named by the user: read as it is (a missing or unreadable one fails when read),
    # and named as given.
    return FileSplit("", [str(path)], np.zeros(1, dtype=np.int64), limits.max_file_bytes)
