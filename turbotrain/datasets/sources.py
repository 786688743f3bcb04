"""Finding the images and labels in a SOURCE path: `detect_source`, and `with_val_split`.

`detect_source(path)` decides what the path is by these checks, first match wins:

1. `path` does not exist -> SourceError.
2. `path` is a file:
   - `.tar.gz`, `.tgz`, `.tar`: a CIFAR-10/100 "python version" archive, read in place;
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
   d. ImageFolder: `train/` (and `val/`, or else `test/`, stored as "val") holding one
      subfolder per class; otherwise the class subfolders directly (one split, "train").
      Images are found recursively inside a class folder; classes are sorted by name and are
      the union over the splits, so a label means the same class in train and val.

Sample order inside a split never depends on the filesystem's listing order: ImageFolder sorts
by class, then path; CSV keeps the list's order; array sources keep the file's order.
"""
from __future__ import annotations

import csv
import os
import re
from pathlib import Path

import numpy as np

from turbotrain.datasets.array_sources import (CIFAR10_DIR, CIFAR100_DIR, IDX_NAME,
                                               find_idx_files, looks_like_cifar,
                                               read_cifar_archive, read_cifar_folder,
                                               read_idx_folder, read_npz)
from turbotrain.datasets.source_types import (ArraySplit, FileSplit, Source, SourceError,
                                              SplitSource)

__all__ = ["ArraySplit", "FileSplit", "Source", "SourceError", "SplitSource", "IMAGE_EXTENSIONS",
           "detect_source", "with_val_split"]

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff"})
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar")
LIST_SUFFIXES = (".csv", ".tsv", ".txt")
CIFAR_ARCHIVES = ("cifar-10-python.tar.gz", "cifar-100-python.tar.gz")
HELD_OUT_FOLDERS = ("val", "test")  # the first present becomes the "val" split

# A CSV's first row is a header when it names a column like these (case-insensitive).
PATH_COLUMNS = {"path", "file", "filename", "file_name", "filepath", "image", "image_path", "img"}
LABEL_COLUMNS = {"label", "class", "class_name", "target", "category", "y"}

NO_IMAGES_HINT = ("expected class subfolders (ImageFolder), CIFAR batches, MNIST idx files, "
                  "a .npz or a CSV/TSV list")


def detect_source(path: str | os.PathLike) -> Source:
    """Read SOURCE's layout (file lists, or arrays for array formats); see the module docstring
    for the order of checks. Raises SourceError with one line saying what is wrong."""
    path = Path(path).expanduser()
    if not path.exists():
        raise SourceError(f"SOURCE {path} does not exist")
    try:
        return _detect(path)
    except OSError as e:  # permissions, a file vanishing mid-listing, a broken mount
        raise SourceError(f"cannot read SOURCE {path}: {e}") from e


def _detect(path: Path) -> Source:
    if path.is_file():
        return _detect_file(path)
    if looks_like_cifar(path):
        return read_cifar_folder(path)
    inside = [path / name for name in (CIFAR10_DIR, CIFAR100_DIR) if (path / name).is_dir()]
    inside += [path / name for name in CIFAR_ARCHIVES if (path / name).is_file()]
    if inside:
        chosen = inside[0]  # an extracted folder is listed before its archive
        return read_cifar_folder(chosen) if chosen.is_dir() else read_cifar_archive(chosen)
    if find_idx_files(path):
        return read_idx_folder(path)
    return _read_image_folder(path)


def _detect_file(path: Path) -> Source:
    name = path.name.lower()
    if name.endswith(ARCHIVE_SUFFIXES):
        return read_cifar_archive(path)
    if name.endswith(".npz"):
        return read_npz(path)
    if name.endswith(LIST_SUFFIXES):
        return _read_list(path)
    if IDX_NAME.match(path.name):
        return read_idx_folder(path.parent)
    raise SourceError(f"SOURCE {path} is a file of unknown kind; {NO_IMAGES_HINT}")


# --- ImageFolder -------------------------------------------------------------------------------

def _read_image_folder(root: Path) -> Source:
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
    per_split = {split: _class_folders(folder, root) for split, folder in split_folders.items()}
    classes = sorted(set().union(*per_split.values()))
    index = {name: k for k, name in enumerate(classes)}
    splits = {}
    for split, by_class in per_split.items():
        relpaths: list[str] = []
        labels: list[int] = []
        for name in sorted(by_class):
            relpaths += by_class[name]
            labels += [index[name]] * len(by_class[name])
        splits[split] = FileSplit(str(root), relpaths, np.array(labels, dtype=np.int64))
    return Source("imagefolder", root, classes, splits)


def _subfolders(folder: Path) -> set[str]:
    return {entry.name for entry in os.scandir(folder)
            if entry.is_dir() and not entry.name.startswith(".")}


def _class_folders(folder: Path, root: Path) -> dict[str, list[str]]:
    """{class name: sorted image paths relative to root} for the class subfolders of folder."""
    by_class: dict[str, list[str]] = {}
    loose: list[str] = []
    for entry in sorted(os.scandir(folder), key=lambda entry: entry.name):
        if entry.name.startswith("."):
            continue
        if entry.is_dir():
            images = _images_under(entry.path, root)
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


def _images_under(folder: str, root: Path) -> list[str]:
    """Image files anywhere under folder, relative to root, sorted; dot-files (macOS '._x.jpg'
    resource forks, which are not images) and dot-folders skipped."""
    found = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        relative = os.path.relpath(dirpath, root)
        found += [os.path.join(relative, f) for f in filenames
                  if not f.startswith(".") and _is_image_name(f)]
    found.sort()
    return found


def _is_image_name(name: str) -> bool:
    return os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS


# --- CSV / TSV lists ---------------------------------------------------------------------------

def _read_list(path: Path) -> Source:
    """Rows of (image path, label). A label is an integer (kept as is: classes are "0".."max")
    or a class name (classes sorted, label = index). .tsv is tab-separated, .csv comma; a .txt
    is tab- or comma-separated when its first line holds one, else "path label" on spaces."""
    rows = _list_rows(path)
    root = path.parent
    relpaths, names = [], []
    for line, file, label in rows:
        if not os.path.isfile(os.path.join(root, file)):
            raise SourceError(f"{path}:{line}: {root / file} does not exist")
        relpaths.append(file)
        names.append(label)
    if not relpaths:
        raise SourceError(f"{path} lists no images; expected rows of 'path,label'")
    if all(re.fullmatch(r"\d+", name) for name in names):
        labels = np.array([int(name) for name in names], dtype=np.int64)
        classes = [str(k) for k in range(int(labels.max()) + 1)]
    else:
        classes = sorted(set(names))
        index = {name: k for k, name in enumerate(classes)}
        labels = np.array([index[name] for name in names], dtype=np.int64)
    split = FileSplit(str(root), relpaths, labels)
    return Source("csv", path, classes, {"train": split}, (path,))


def _list_rows(path: Path) -> list[tuple[int, str, str]]:
    """(line number, path, label) for each non-empty row, header skipped."""
    try:
        text = path.read_text(encoding="utf-8-sig")  # -sig: Excel's byte-order mark
    except (OSError, UnicodeDecodeError) as e:
        raise SourceError(f"{path} is not a readable UTF-8 list ({e})") from e
    lines = text.splitlines()
    first = next((line for line in lines if line.strip()), "")
    suffix = path.suffix.lower()
    delimiter = "\t" if suffix == ".tsv" or (suffix == ".txt" and "\t" in first) else ","
    if suffix == ".txt" and delimiter == "," and "," not in first:
        table = [line.rsplit(None, 1) for line in lines]  # "dir/a b.jpg 3": path may have spaces
    else:
        table = list(csv.reader(lines, delimiter=delimiter))
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
        if len(row) <= max(path_column, label_column) or not row[path_column] \
                or not row[label_column]:
            raise SourceError(f"{path}:{line}: expected 'path{delimiter}label', got "
                              f"{delimiter.join(row)!r}")
        rows.append((line, row[path_column], row[label_column]))
    return rows


# --- val split ---------------------------------------------------------------------------------

def with_val_split(source: Source, fraction: float, seed: int = 0) -> Source:
    """Move round(fraction * n) samples of each class (rounded half up; n = the class's train
    samples) to a new "val" split, keeping at least one in train; classes with one sample stay
    whole. Deterministic: the same source, fraction and seed give the same indices on any
    machine and numpy version. Both splits keep the source's sample order."""
    if not 0 < fraction < 1:
        raise SourceError(f"val fraction {fraction} must be between 0 and 1 (exclusive)")
    if set(source.splits) != {"train"}:
        raise SourceError(f"{source.path} already has a val split; do not ask for another")
    train = source.splits["train"]
    labels = train.labels
    order = np.argsort(labels, kind="stable")  # grouped by class, source order within each
    classes, starts, counts = np.unique(labels[order], return_index=True, return_counts=True)
    is_val = np.zeros(len(train), dtype=bool)
    for label, start, count in zip(classes.tolist(), starts.tolist(), counts.tolist()):
        take = min(int(np.floor(fraction * count + 0.5)), count - 1)
        if take <= 0:
            continue
        # Raw PCG64 output is a fixed algorithm (Generator.choice/permutation may change between
        # numpy releases); one stream per class, so adding a class does not reshuffle the others.
        keys = np.random.PCG64(np.random.SeedSequence([seed, label])).random_raw(count)
        is_val[order[start:start + count][np.argsort(keys, kind="stable")[:take]]] = True
    splits = {"train": train.subset(np.flatnonzero(~is_val)),
              "val": train.subset(np.flatnonzero(is_val))}
    return Source(source.kind, source.path, source.classes, splits, source.content_files)
