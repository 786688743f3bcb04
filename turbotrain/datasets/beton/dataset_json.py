"""What `dataset.json` may hold, checked every time it is read (docs/FORMAT.md, docs/SECURITY.md).

A prepared dataset is often made by someone else, so its `dataset.json` is input like any other:
`read_dataset_json` is the one way every reader (open_dataset, inspect, verify, train) gets it,
and it returns only a dict that passed `check_dataset_info`. Each refusal is one `DatasetError`
line naming the file and the field (`OUT/dataset.json: splits.train.num_samples must be ...`), so
no reader ever meets a missing key, a wrong type or a path that leaves OUT.
"""
from __future__ import annotations

import json
import math
import re
import reprlib
from pathlib import Path

from turbotrain.datasets.errors import DatasetError, NotPrepared
from turbotrain.files.untrusted import MIB, UnsafeInput, is_inside, open_regular, read_regular
from turbotrain.printable import printable

from .layout import MAX_CLASSES

# Version of `dataset.json` (ours; the `.beton` inside has FFCV's own version number). A dataset
# with a sharded split says 2, so a turbotrain that predates shards refuses it with a hint
# instead of missing a split's `file`; an unsharded one still says 1, for those that predate.
DATASET_FORMAT_VERSION = 1
SHARDED_FORMAT_VERSION = 2
READ_FORMAT_VERSIONS = (DATASET_FORMAT_VERSION, SHARDED_FORMAT_VERSION)
# The most shards a split may list: what a 5-digit shard number counts (shards.py), and a bound
# on the index a reader walks (100,000 entries are ~15 MB of JSON, under MAX_JSON_BYTES).
MAX_SHARDS = 100_000
DATASET_JSON = "dataset.json"
SPLITS = ("train", "val")

# ImageNet-21k's dataset.json is ~0.8 MB (21,841 names); MAX_CLASSES names of 60 characters are
# ~13 MB. The cap is also what bounds json.loads' memory: objects cost far more than their text
# (16 MiB of "[{},{},...]" peaks at 400 MB, 64 MiB at 1.5 GB; measured on CPython 3.11).
MAX_JSON_BYTES = 16 * MIB
MAX_CLASS_NAME_CHARS = 1000
_SHA256 = re.compile(r"[0-9a-fA-F]{64}")
_SHOWN_CHARS = 60  # a refused value is quoted up to this many characters
_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother = 3, _SHOWN_CHARS, _SHOWN_CHARS
_REPR.maxlist = _REPR.maxdict = 4


def read_dataset_json(root: Path) -> dict:
    """OUT/dataset.json, parsed and checked (`check_dataset_info`); DatasetError otherwise."""
    root = Path(root)
    path = root / DATASET_JSON
    try:
        data = read_regular(path, MAX_JSON_BYTES)
    except FileNotFoundError:
        # Not `prepare-dataset SOURCE ROOT`: ROOT is often the SOURCE itself, which prepare
        # then refuses as OUT. open_dataset says what ROOT holds (NotPrepared).
        what = "nothing exists at that path" if not root.exists() else f"no {DATASET_JSON}"
        raise NotPrepared(f"{printable(root)}: not a prepared dataset ({what}); a prepared "
                          "dataset is the OUT folder that `prepare-dataset SOURCE OUT` writes",
                          root) from None
    except UnsafeInput as e:
        raise DatasetError(f"{printable(path)}: {e}") from None
    except OSError as e:
        raise DatasetError(f"{printable(path)}: unreadable ({e.strerror or e})") from None
    return parse_dataset_json(data, root)


def prepared_folder_of(file: Path) -> Path | None:
    """The prepared dataset whose train or val split `file` is, when that dataset has both
    splits (`--data DS/train.beton` trains without the val split that `--data DS` would
    evaluate on); None for a file of no such folder, or a folder that does not check out."""
    folder = Path(file).parent
    try:
        splits = read_dataset_json(folder)["splits"]
    except DatasetError:
        return None
    if not all(name in splits for name in SPLITS):
        return None
    files = {entry.get("file") for meta in splits.values()
             for entry in (meta, *meta.get("shards", ()))}
    return folder if Path(file).name in files else None


def parse_dataset_json(data: bytes, root, check_files: bool = True) -> dict:
    """dataset.json's bytes (at most MAX_JSON_BYTES), parsed and checked; `root` names the
    folder (or URL) in messages. A remote index passes check_files=False."""
    path = _json_shown(root)
    try:
        info = json.loads(data)
    except RecursionError:
        raise DatasetError(f"{path}: not valid dataset metadata (JSON nested too "
                           f"deeply); re-run prepare-dataset") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, a 5,000-digit number
        raise DatasetError(f"{path}: not valid JSON ({_one_line(e)}); "
                           f"re-run prepare-dataset") from None
    check_dataset_info(info, root, check_files)
    return info


def _json_shown(root: Path | str) -> str:
    """OUT/dataset.json for a folder (a Path: every local reader passes one), URL/dataset.json
    for a store (the URL as remote/split.py shows it)."""
    if isinstance(root, Path):
        return printable(root / DATASET_JSON)
    return printable(f"{root.rstrip('/')}/{DATASET_JSON}")


def check_dataset_info(info: object, root: Path, check_files: bool = True) -> None:
    """Raises DatasetError unless info is a dataset.json this turbotrain reads safely: the types
    and ranges of docs/FORMAT.md, and split files that are regular files inside root
    (`check_files=False`: a remote index, whose files are objects in a store)."""
    path = _json_shown(root)

    def fail(field: str, problem: str) -> DatasetError:
        return DatasetError(f"{path}: {field} {problem}")

    if not isinstance(info, dict):
        raise DatasetError(f"{path}: not dataset metadata (a JSON {_json_type(info)}, expected "
                           f"an object); re-run prepare-dataset")
    version = info.get("format_version")
    if not _is_int(version) or version not in READ_FORMAT_VERSIONS:
        raise DatasetError(f"{path}: dataset format version {_shown(version)}, this turbotrain "
                           f"reads versions {DATASET_FORMAT_VERSION} and "
                           f"{SHARDED_FORMAT_VERSION}; re-run prepare-dataset")
    _check_classes(info.get("classes", _MISSING), fail)
    splits = info.get("splits", _MISSING)
    if not isinstance(splits, dict) or not splits:
        raise fail("splits", f"must be an object holding a train and/or val split, "
                             f"not {_shown(splits)}")
    sharded = any(isinstance(meta, dict) and "shards" in meta for meta in splits.values())
    if sharded and version != SHARDED_FORMAT_VERSION:
        raise fail("format_version", f"must be {SHARDED_FORMAT_VERSION} for a dataset with "
                                     f"sharded splits, not {_shown(version)}")
    for name, meta in splits.items():
        if name not in SPLITS:
            raise fail("splits", f"has a split named {_shown(name)}; expected "
                                 f"{' or '.join(SPLITS)}")
        _check_split(name, meta, root, fail, check_files)
    _check_pixel_stats(info.get("pixel_stats"), fail)
    _check_object(info, "encoding", {"encoding": str, "max_side": int, "quality": int,
                                     "page_size": int, "shard_size": int}, fail)
    _check_object(info, "source", {"path": str, "kind": str, "fingerprint": str,
                                   "val_fraction": float}, fail)
    dropped = (info.get("source") or {}).get("dropped_classes")
    if dropped is not None:  # --classes present: the names left out, maybe none
        _check_classes(dropped, fail, "source.dropped_classes", may_be_empty=True)
    _check_object(info, "turbotrain_version", None, fail)


def _check_classes(classes: object, fail, field: str = "classes",
                   may_be_empty: bool = False) -> None:
    if not isinstance(classes, list) or not (classes or may_be_empty):
        raise fail(field, f"must be a{'' if may_be_empty else ' non-empty'} list of class "
                          f"names, not {_shown(classes)}")
    if not classes:
        return
    if len(classes) > MAX_CLASSES:
        raise fail(field, f"lists {len(classes):,} names, more than the {MAX_CLASSES:,} "
                          f"a dataset may have")
    # Whole-list checks first (18 ms for 200,000 names), the loop below only names the bad one.
    if (all(isinstance(name, str) for name in classes)
            and max(map(len, classes)) <= MAX_CLASS_NAME_CHARS and _is_unicode("".join(classes))):
        return
    for k, name in enumerate(classes):
        if not isinstance(name, str) or len(name) > MAX_CLASS_NAME_CHARS:
            raise fail(f"{field}[{k}]", f"must be a name of at most {MAX_CLASS_NAME_CHARS:,} "
                                        f"characters, not {_shown(name)}")
        if not _is_unicode(name):
            raise fail(f"{field}[{k}]", f"is not valid Unicode text: {_shown(name)}")


def _check_split(name: str, meta: object, root: Path, fail, check_files: bool) -> None:
    field = f"splits.{name}"
    if not isinstance(meta, dict):
        raise fail(field, f"must be an object, not {_shown(meta)}")
    _check_counts_and_digest(meta, field, fail)
    encodings = meta.get("encodings")
    if encodings is not None:
        if not isinstance(encodings, dict):
            raise fail(f"{field}.encodings", f"must be an object, not {_shown(encodings)}")
        for kind in encodings:
            _check_count(encodings, kind, f"{field}.encodings", fail)
    if "shards" in meta:
        entries = _check_shards(name, meta, root, fail)
    else:
        _check_file_name(meta, field, root, fail)
        entries = [meta]
    if check_files:
        for entry in entries:
            _check_split_file(name, Path(root) / entry["file"])


def _check_counts_and_digest(meta: dict, field: str, fail) -> None:
    _check_count(meta, "num_samples", field, fail, required=True)
    _check_count(meta, "bytes", field, fail)
    _check_count(meta, "skipped", field, fail)
    digest = meta.get("sha256")
    if digest is not None and not (isinstance(digest, str) and _SHA256.fullmatch(digest)):
        raise fail(f"{field}.sha256", f"must be 64 hexadecimal digits, not {_shown(digest)}")


def _check_file_name(meta: dict, field: str, root: Path, fail) -> None:
    file = meta.get("file", _MISSING)
    if not _is_bare_name(file):
        raise fail(f"{field}.file", f"must be a file name inside {printable(root)}, "
                                    f"not {_shown(file)}")


def _check_shards(name: str, meta: dict, root: Path, fail) -> list[dict]:
    """A sharded split: a list of shard entries whose counts add up to the split's totals, each
    a distinct bare file name with its size and checksum (the shards are verified by these)."""
    field = f"splits.{name}"
    shards = meta["shards"]
    if "file" in meta:
        raise fail(field, "must have either a file or shards, not both")
    if not isinstance(shards, list) or not 1 <= len(shards) <= MAX_SHARDS:
        raise fail(f"{field}.shards", f"must be a list of 1 to {MAX_SHARDS:,} shard entries, "
                                      f"not {_shown(shards)}")
    for k, entry in enumerate(shards):
        at = f"{field}.shards[{k}]"
        if not isinstance(entry, dict):
            raise fail(at, f"must be an object, not {_shown(entry)}")
        _check_file_name(entry, at, root, fail)
        _check_counts_and_digest(entry, at, fail)
        for key in ("bytes", "sha256"):
            if key not in entry:
                raise fail(f"{at}.{key}", "is missing (every shard records its size and "
                                          "checksum)")
    files = [entry["file"] for entry in shards]
    if len(set(files)) != len(files):
        raise fail(f"{field}.shards", "lists one file twice")
    total = sum(entry["num_samples"] for entry in shards)
    if total != meta["num_samples"]:
        raise fail(f"{field}.num_samples", f"is {meta['num_samples']}, but its shards hold "
                                           f"{total} samples")
    if "bytes" in meta and sum(entry["bytes"] for entry in shards) != meta["bytes"]:
        raise fail(f"{field}.bytes", f"is {meta['bytes']}, but its shards add up to "
                                     f"{sum(entry['bytes'] for entry in shards)}")
    return shards


def _check_split_file(split: str, path: Path) -> None:
    """The split file must resolve inside the dataset folder and be a regular file: a symlink to
    /dev/zero or a named pipe called train.beton would otherwise hang verify's checksum."""
    shown = printable(path)
    if not is_inside(path, path.parent):
        raise DatasetError(f"{shown}: resolves to {printable(path.resolve())}, outside the "
                           f"dataset folder {printable(path.parent)}; re-run prepare-dataset")
    try:
        with open_regular(path):
            pass
    except FileNotFoundError:
        raise DatasetError(f"{shown}: missing (dataset.json lists it as the {split} split); "
                           f"re-run prepare-dataset") from None
    except UnsafeInput as e:
        raise DatasetError(f"{shown}: {e}") from None
    except OSError as e:
        raise DatasetError(f"{shown}: cannot open ({e.strerror or e})") from None


def _check_count(meta: dict, key: str, field: str, fail, required: bool = False) -> None:
    value = meta.get(key, _MISSING)
    if value is _MISSING and not required:
        return
    if not _is_int(value) or value < 0:
        raise fail(f"{field}.{key}", f"must be a whole number >= 0, not {_shown(value)}")


def _check_pixel_stats(stats: object, fail) -> None:
    """mean and std normalise every input (x - mean) / std: std 0 would divide by zero and
    surface much later as a NaN loss."""
    if stats is None:
        return
    if not isinstance(stats, dict):
        raise fail("pixel_stats", f"must be an object or null, not {_shown(stats)}")
    for key in ("mean", "std"):
        values = stats.get(key, _MISSING)
        if not (isinstance(values, list) and len(values) == 3
                and all(_is_number(v) and math.isfinite(v) for v in values)):
            raise fail(f"pixel_stats.{key}", f"must be a list of 3 finite numbers (one per "
                                             f"RGB channel), not {_shown(values)}")
    if not all(0 <= v <= 255 for v in stats["mean"]):
        raise fail("pixel_stats.mean", f"must lie in 0..255, not {_shown(stats['mean'])}")
    std = stats["std"]
    if any(v == 0 for v in std) and all(0 <= v <= 255 for v in std):
        raise fail("pixel_stats.std", f"is {_shown(std)}: the dataset's pixels have zero "
                                      f"spread; re-run prepare-dataset or fix dataset.json")
    if not all(0 < v <= 255 for v in std):
        raise fail("pixel_stats.std", f"must lie in (0, 255], not {_shown(std)}")
    if "split" in stats and not isinstance(stats["split"], str):
        raise fail("pixel_stats.split", f"must be a split name, not {_shown(stats['split'])}")


def _check_object(info: dict, key: str, fields: dict | None, fail) -> None:
    """An optional entry that inspect prints: `fields` maps each printed key to its type
    (float also admits an int); None means the entry itself is a string."""
    value = info.get(key)
    if value is None:
        return
    if fields is None:
        if not isinstance(value, str):
            raise fail(key, f"must be a string, not {_shown(value)}")
        return
    if not isinstance(value, dict):
        raise fail(key, f"must be an object, not {_shown(value)}")
    for name, kind in fields.items():
        item = value.get(name)
        ok = (item is None or (_is_number(item) if kind is float else
                               _is_int(item) if kind is int else isinstance(item, kind)))
        if not ok:
            raise fail(f"{key}.{name}", f"must be {_TYPE_WORDS[kind]}, not {_shown(item)}")
        if isinstance(item, str) and (len(item) > 4096 or not _is_unicode(item)):
            raise fail(f"{key}.{name}", f"must be Unicode text of at most 4,096 characters, "
                                        f"not {_shown(item)}")


_MISSING = object()
_TYPE_WORDS = {str: "a string", int: "a whole number", float: "a number"}


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # JSON true is not 1


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_unicode(text: str) -> bool:
    """False for lone surrogates ("\\ud800" is valid JSON): they cannot be written as UTF-8."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _is_bare_name(name: object) -> bool:
    """A plain file name: no directory part, no '..', not hidden, no NUL."""
    return (isinstance(name, str) and 0 < len(name) <= 255 and not name.startswith(".")
            and not any(bad in name for bad in ("/", "\\", "..", "\0")) and _is_unicode(name))


def _json_type(value: object) -> str:
    return {dict: "object", list: "list", str: "string", int: "number", float: "number",
            bool: "boolean", type(None): "null"}.get(type(value), type(value).__name__)


def _shown(value: object) -> str:
    """A refused value as a short, printable quote ('missing' when the key is absent); reprlib
    stops after a few items and levels, so quoting a 16 MiB structure costs nothing."""
    if value is _MISSING:
        return "missing"
    text = _REPR.repr(value)
    if len(text) > _SHOWN_CHARS:
        text = text[:_SHOWN_CHARS - 3] + "..."
    return printable(text)


def _one_line(error: BaseException) -> str:
    return printable(" ".join(str(error).split()))
