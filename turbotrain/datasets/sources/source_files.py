"""Which source files a SOURCE of many files is made of (WebDataset's tar files, its "shards";
Parquet and Arrow files), and which split each file belongs to.

Such a SOURCE is one file, a folder of them, or a brace pattern such as
`data/train-{000000..000009}.tar` (numeric ranges keep their zero padding; `{a,b}` lists
alternatives; several groups multiply), which we expand ourselves: WebDataset's own `braceexpand`
is not a dependency, and a pattern a stranger wrote must not expand to millions of names.

The split rule, the same for every kind made of many files:

* a folder holding `train/` and `val/` (or else `test/`) subfolders of such files: split by folder;
* otherwise split by file name: a name starting with `train` is train, one starting with `val`,
  `valid` or `validation` is val, one starting with `test` is val when no file is (as
  ImageFolder's `test/`); when no name starts with any of these, every file is train. A name
  that starts with none of them beside names that do is refused: it would be guessed.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from turbotrain.files.untrusted import outside_root_reason

from .source import HELD_OUT_NAMES, SourceError

# Files one SOURCE may name (MAX_SHARDS of the output, beton/dataset_json.py): a pattern or
# folder that lists more is refused before a file is opened.
MAX_SOURCE_FILES = 100_000
_GROUP = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"(\d{1,9})\.\.(\d{1,9})")
_SPLIT_WORDS = {"train": "train", "val": "val", "valid": "val", "validation": "val",
                "test": "test"}


def is_pattern(path: str | os.PathLike) -> bool:
    return "{" in os.fspath(path)


def expand_braces(pattern: str) -> list[str]:
    """Every name the pattern spells, in order; SourceError for a malformed or huge one."""
    groups = []
    for match in _GROUP.finditer(pattern):
        groups.append((match.span(), _alternatives(match[1], pattern)))
    rest = _GROUP.sub("", pattern)
    if "{" in rest or "}" in rest:
        raise SourceError(f"SOURCE pattern {pattern} has an unmatched or nested brace; write "
                          f"ranges as {{000..009}} and lists as {{a,b}}")
    count = 1
    for _, choices in groups:
        count *= len(choices)
        if count > MAX_SOURCE_FILES:
            raise SourceError(f"SOURCE pattern {pattern} names more than {MAX_SOURCE_FILES:,} "
                              f"files; use fewer, larger shards")
    names = [""]
    cursor = 0
    for (start, stop), choices in groups:
        literal = pattern[cursor:start]
        names = [name + literal + choice for name in names for choice in choices]
        cursor = stop
    return [name + pattern[cursor:] for name in names]


def _alternatives(group: str, pattern: str) -> list[str]:
    """{000..009} -> '000'..'009' (padded to the bounds' width when either has a leading
    zero); {a,b} -> 'a', 'b'."""
    match = _RANGE.fullmatch(group)
    if match:
        low, high = match[1], match[2]
        if int(low) > int(high):
            raise SourceError(f"SOURCE pattern {pattern}: range {{{group}}} counts down; write "
                              f"it low..high")
        if int(high) - int(low) >= MAX_SOURCE_FILES:
            raise SourceError(f"SOURCE pattern {pattern} names more than {MAX_SOURCE_FILES:,} "
                              f"files; use fewer, larger shards")
        padded = low.startswith("0") or high.startswith("0")
        width = max(len(low), len(high)) if padded else 0
        return [str(k).zfill(width) for k in range(int(low), int(high) + 1)]
    if "," in group:
        return group.split(",")
    raise SourceError(f"SOURCE pattern {pattern}: {{{group}}} is neither a range like "
                      f"{{000..009}} nor a list like {{a,b}}")


def pattern_files(pattern: str) -> list[Path]:
    """The files a brace pattern names; each must exist."""
    files = [Path(name).expanduser() for name in expand_braces(pattern)]
    for path in files:
        if not path.is_file():
            raise SourceError(f"SOURCE pattern {pattern} names {path}, which does not exist or "
                              f"is not a regular file")
    return files


def has_suffix(name: str, suffixes: tuple[str, ...]) -> bool:
    return name.lower().endswith(suffixes) and not name.startswith(".")


def folder_files(folder: Path, suffixes: tuple[str, ...],
                  allow_outside_root: bool = False) -> dict[str, list[Path]] | None:
    """{split: source files} of a folder of them (the module docstring's rule); None when it
    holds none, directly or in train/ (val/, test/). A file that is a symlink must resolve
    inside the folder unless allow_outside_root, as an ImageFolder's files must."""
    direct = _files_in(folder, suffixes, folder, allow_outside_root)
    if direct:
        return split_by_name(direct, folder)
    if not (folder / "train").is_dir():
        return None
    train = _files_in(folder / "train", suffixes, folder, allow_outside_root)
    if not train:
        return None
    splits = {"train": train}
    for name in HELD_OUT_NAMES:
        if (folder / name).is_dir():
            held = _files_in(folder / name, suffixes, folder, allow_outside_root)
            if not held:
                raise SourceError(f"{folder / name} holds no {'/'.join(suffixes)} shards, but "
                                  f"{folder / 'train'} does; add them or remove the folder")
            splits["val"] = held
            break
    return splits


def _files_in(folder: Path, suffixes: tuple[str, ...], root: Path,
               allow_outside_root: bool) -> list[Path]:
    """The source files named so in folder. Anything so named that is not a folder is listed, a
    FIFO or a device too: reading it is then refused in one line (open_regular), where skipping
    it would lose a file without a word."""
    found = []
    with os.scandir(folder) as entries:
        for entry in entries:
            if has_suffix(entry.name, suffixes) and not entry.is_dir():
                outside = (None if allow_outside_root or not entry.is_symlink()
                           else outside_root_reason(entry.path, root))
                if outside:
                    raise SourceError(f"shard {entry.path} {outside}")
                found.append(Path(entry.path))
                if len(found) > MAX_SOURCE_FILES:
                    raise SourceError(f"{folder} holds more than {MAX_SOURCE_FILES:,} shard "
                                      f"files; use fewer, larger shards")
    return sorted(found)


def split_by_name(files: list[Path], where) -> dict[str, list[Path]]:
    """{split: files, in the given order} by the names' first word (module docstring)."""
    words = {path: _SPLIT_WORDS.get(re.split(r"[-_.]", path.name.lower(), maxsplit=1)[0])
             for path in files}
    if not any(words.values()):
        return {"train": list(files)}
    unnamed = [path for path in files if words[path] is None]
    if unnamed:
        raise SourceError(f"{where}: {unnamed[0].name} does not start with train, val or test "
                          f"but other shards do; name every shard train-*, val-* (or test-*), "
                          f"or put them in train/ and val/ folders")
    splits = {"train": [path for path in files if words[path] == "train"]}
    if not splits["train"]:
        raise SourceError(f"{where}: no shard name starts with train; name the training "
                          f"shards train-*")
    for held in HELD_OUT_NAMES:
        chosen = [path for path in files if words[path] == held]
        if chosen:
            splits["val"] = chosen
            break
    return splits
