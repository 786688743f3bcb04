"""SOURCEs of image files, one file per sample: an ImageFolder (`read_image_folder`), a CSV/TSV
list of `path,label` rows (`read_list`), and the plain lists of images `turbotrain predict`
reads (`list_images`). Which kind a SOURCE is: detect.py.

ImageFolder: `train/` (and `val/`, or else `test/`, stored as "val") holding one subfolder per
class; otherwise the class subfolders directly (one split, "train"). Images are found
recursively inside a class folder; classes are sorted by name and are the union over the
splits, so a label means the same class in train and val. Sample order never depends on the
filesystem's listing order: an ImageFolder sorts by class, then path; a list keeps its order.

Nothing in SOURCE is trusted (docs/SECURITY.md): a CSV row or a symlinked class folder that
leads outside SOURCE is refused unless `allow_outside_root`, and every file is read through
`turbotrain/files/untrusted.py` (regular files only, size caps from `Limits`).
"""
from __future__ import annotations

import csv
import os
from pathlib import Path

import numpy as np

from turbotrain.datasets.beton.layout import MAX_CLASSES
from turbotrain.files.untrusted import Limits, UnsafeInput, outside_root_reason, read_regular

from .class_labels import classes_and_labels
from .source import HELD_OUT_NAMES, IMAGE_EXTENSIONS, FileSplit, Source, SourceError

LIST_SUFFIXES = (".csv", ".tsv", ".txt")

# A CSV's first row is a header when it names a column like these (case-insensitive).
PATH_COLUMNS = {"path", "file", "filename", "file_name", "filepath", "image", "image_path", "img"}
LABEL_COLUMNS = {"label", "class", "class_name", "target", "category", "y"}


class NoImages(SourceError):
    """A folder with neither class subfolders nor images (detect.py adds what else a SOURCE
    may be)."""


# --- ImageFolder -------------------------------------------------------------------------------

def read_image_folder(root: Path, limits: Limits, allow_outside_root: bool) -> Source:
    """The ImageFolder at root (module docstring); NoImages when root holds neither class
    folders nor a train/ of them."""
    subfolders = _subfolders(root)
    # train/ holding folders means a split layout; a "train" folder of images is a class.
    if "train" in subfolders and _subfolders(root / "train"):
        unexpected = sorted(subfolders - {"train", *HELD_OUT_NAMES})
        if unexpected:
            raise SourceError(f"{root} has train/ with class folders but also "
                              f"{', '.join(unexpected)}/; expected only train/ and val/ (or test/)")
        split_folders = {"train": root / "train"}
        held_out = [name for name in HELD_OUT_NAMES if name in subfolders]
        if held_out:
            split_folders["val"] = root / held_out[0]
        passed = [(str(root / name), f"a held-out folder beside {held_out[0]}/, which is the "
                                     "val split: not read") for name in held_out[1:]]
        passed += _files_beside_splits(root)
    else:
        split_folders, passed = {"train": root}, []
    links: set[str] = set()
    per_split = {split: _class_folders(folder, root, allow_outside_root, links, passed)
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
    return Source("imagefolder", root, classes, splits, passed_over=tuple(sorted(passed)))


# Why the listing passes over an entry (skipped.txt; Source.passed_over).
_HIDDEN_FILE = "a hidden (dot) file: not read (macOS '._' files and .DS_Store are not images)"
_HIDDEN_FOLDER = "a hidden (dot) folder: not entered"
_LINKED_FOLDER = "a symlinked folder inside a class folder: not entered (as os.walk does)"
_OUTSIDE_CLASSES = "not inside a class folder: not read"


def _not_an_image(name: str) -> str:
    suffix = os.path.splitext(name)[1].lower() or "no suffix"
    return (f"not an image name ({suffix}; read: "
            f"{' '.join(sorted(IMAGE_EXTENSIONS))}): not read")


def _files_beside_splits(root: Path) -> list[tuple[str, str]]:
    """The files beside train/ and val/ in a split layout (a README, a labels file), and its
    hidden folders."""
    return [(entry.path, _OUTSIDE_CLASSES if not entry.is_dir() else _HIDDEN_FOLDER)
            for entry in os.scandir(root)
            if not entry.is_dir() or entry.name.startswith(".")]


def _subfolders(folder: Path) -> set[str]:
    return {entry.name for entry in os.scandir(folder)
            if entry.is_dir() and not entry.name.startswith(".")}


def _class_folders(folder: Path, root: Path, allow_outside_root: bool,
                   links: set[str], passed: list) -> dict[str, list[str]]:
    """{class name: sorted image paths relative to root} for the class subfolders of folder;
    symlinked files found are added to `links`, the entries passed over (path, why) to
    `passed`."""
    by_class: dict[str, list[str]] = {}
    loose: list[str] = []
    for entry in sorted(os.scandir(folder), key=lambda entry: entry.name):
        if entry.name.startswith("."):
            passed.append((entry.path, _HIDDEN_FOLDER if entry.is_dir() else _HIDDEN_FILE))
            continue
        if entry.is_dir():
            # A symlinked class folder is walked (that is how people share a class between
            # datasets) only when it stays inside SOURCE, or the user allows otherwise: a link
            # to / would walk the whole disk and embed whatever it finds.
            outside = None if allow_outside_root else outside_root_reason(entry.path, root)
            if outside:
                raise SourceError(f"class folder {entry.path} {outside}")
            images = _images_under(entry.path, root, links, passed)
            if not images:
                raise SourceError(f"class folder {entry.path} is empty (no "
                                  f"{'/'.join(sorted(e[1:] for e in IMAGE_EXTENSIONS))} files); "
                                  f"add images or remove it")
            by_class[entry.name] = images
        elif _is_image_name(entry.name):
            loose.append(entry.name)
        else:
            passed.append((entry.path, _OUTSIDE_CLASSES))
    if loose:
        raise SourceError(f"{folder} has image files outside class folders (e.g. {min(loose)}); "
                          f"move them into one subfolder per class")
    if not by_class:
        if folder == root:
            raise NoImages(f"{root} holds no images")
        raise SourceError(f"{folder} holds no class subfolders; put each class's images in "
                          f"{folder}/<class name>/")
    return by_class


def _images_under(folder: str, root: Path, links: set[str], passed: list | None = None
                  ) -> list[str]:
    """Image files anywhere under folder, relative to root, sorted; dot-files (macOS '._x.jpg'
    resource forks, which are not images) and dot-folders skipped. Symlinked sub-folders are not
    entered (as os.walk does); symlinked files are added to `links`, the only files that
    FileSplit.load must resolve to keep reads inside root: the rest are inside by construction,
    and scandir says which entries are links without a system call per file. Each entry passed
    over is added to `passed` as (path, why), when given."""
    passed = [] if passed is None else passed
    found = []
    pending = [folder]
    # Every path below starts with root's own spelling (scandir joins names onto it), so
    # cutting that prefix is relpath's answer; relpath itself cost 20 us a file (0.5 s of a
    # 24,000-photo listing, paid again by every part of a Ray or Slurm run).
    prefix = os.path.join(os.fspath(root), "")
    while pending:
        with os.scandir(pending.pop()) as entries:
            for entry in entries:
                if entry.name.startswith("."):
                    passed.append((entry.path, _HIDDEN_FOLDER if entry.is_dir()
                                   else _HIDDEN_FILE))
                elif entry.is_dir(follow_symlinks=False):
                    pending.append(entry.path)
                elif _is_image_name(entry.name):
                    relative = (entry.path[len(prefix):] if entry.path.startswith(prefix)
                                else os.path.relpath(entry.path, root))
                    found.append(relative)
                    if entry.is_symlink():
                        links.add(relative)
                else:
                    passed.append((entry.path, _LINKED_FOLDER if entry.is_dir()
                                   else _not_an_image(entry.name)))
    found.sort()
    return found


def _is_image_name(name: str) -> bool:
    return os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS


# --- CSV / TSV lists ---------------------------------------------------------------------------

def read_list(path: Path, limits: Limits, allow_outside_root: bool) -> Source:
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
    inside it when read; a .csv/.tsv/.txt list gives its rows' paths (a relative one from the
    list's folder, checked to stay inside it; an absolute one as it is written, as a file named
    on the command line is: the list is the user's own, and `predict` only reads the images to
    classify them; a label column may be there or not); any other file is itself. SourceError
    (one line) when the path or the list cannot be read."""
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
                outside = (None if allow_outside_root or os.path.isabs(file) else
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
