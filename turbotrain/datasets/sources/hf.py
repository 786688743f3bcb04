"""Hugging Face datasets on local disk as a SOURCE, read with pyarrow only (hf_splits.py).

Layouts:

* a `save_to_disk` folder: `state.json`, whose `_data_files` name the `.arrow` files (bare names
  inside the folder), and `dataset_info.json` (the features). A DatasetDict's folder has
  `dataset_dict.json` listing one such subfolder per split: `train` is train, the first of
  `validation`, `val`, `valid`, else `test`, is val; any other split is not read.
* `.parquet` or `.arrow` files: one file, a folder of them, or a brace pattern; splits by
  source_files.py's rule (`train-00000-of-00002.parquet`, `test-...`: HF's own names fit it).

Columns: the image is `--image-column`, else `image` or `img`: HF's Image feature (a struct of
`bytes` and `path`; a row must hold the bytes) or plain binary. The label is `--label-column`,
else `label` or `labels`: integers, with class names from the ClassLabel feature when the
features say so (dataset_info.json, or the `huggingface` key of the schema's metadata, which
`to_parquet` writes), else "0".."max"; or strings, each a class name (sorted). Labels are read
in record batches, one column at a time: never a whole table.

Untrusted-input checks (docs/SECURITY.md): files are regular files inside the folder, JSON files
at most 16 MiB; a Parquet file's row groups are sized from its footer before anything is
decoded (each at most --max-file-mb, since a worker decodes one whole; all of them charged to
the file's InflateBudget, labels at 16 bytes a row so a run-length bomb of rows counts); Arrow
batches are validated in full; an image value over --max-file-mb or without bytes is refused.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from turbotrain.datasets.beton.dataset_json import MAX_CLASS_NAME_CHARS, MAX_JSON_BYTES
from turbotrain.datasets.beton.layout import MAX_CLASSES
from turbotrain.files.untrusted import (InflateBudget, Limits, UnsafeInput, open_regular,
                                        read_regular)

from .class_labels import classes_and_labels
from .hf_splits import HFSplit, open_arrow, pyarrow_modules
from .source import Source, SourceError

HF_SUFFIXES = (".parquet", ".arrow")
IMAGE_COLUMNS = ("image", "img")
LABEL_COLUMNS = ("label", "labels")
DICT_SPLITS = (("train", ("train",)), ("val", ("validation", "val", "valid", "test")))
LABEL_BATCH_ROWS = 65_536
LABEL_BYTES_PER_ROW = 16  # what a decoded label costs, charged per declared row


@dataclass(frozen=True)
class Columns:
    """--image-column / --label-column; None: the default names."""
    image: str | None = None
    label: str | None = None


@dataclass
class _Listed:
    """One file's rows as the listing pass found them."""
    image: str
    labels: list            # ints, or str class names
    sizes: np.ndarray
    group_starts: np.ndarray | None
    names: list[str] | None  # ClassLabel names


def is_hf_folder(folder: Path) -> bool:
    return (folder / "dataset_dict.json").is_file() or (folder / "state.json").is_file()


def read_hf_folder(folder: Path, limits: Limits, columns: Columns) -> Source:
    """A save_to_disk folder (a Dataset or a DatasetDict)."""
    if (folder / "dataset_dict.json").is_file():
        listed = _json(folder / "dataset_dict.json").get("splits")
        if not isinstance(listed, list) or not all(isinstance(s, str) for s in listed):
            raise SourceError(f"{folder / 'dataset_dict.json'}: 'splits' is not a list of names")
        folders = {}
        for split, names in DICT_SPLITS:
            chosen = next((name for name in names if name in listed), None)
            if chosen is not None:
                folders[split] = _inside(folder, chosen, "dataset_dict.json")
        if "train" not in folders:
            raise SourceError(f"{folder} has no train split (it has {', '.join(listed[:5])}); "
                              f"prepare-dataset needs one")
    else:
        folders = {"train": folder}
    files = {split: _state_files(path) for split, path in folders.items()}
    features = {split: _json(path / "dataset_info.json").get("features")
                if (path / "dataset_info.json").is_file() else None
                for split, path in folders.items()}
    return read_hf_files(files, folder, limits, columns, features)


def read_hf_files(split_files: dict[str, list[Path]], root: Path, limits: Limits,
                  columns: Columns, features: dict | None = None) -> Source:
    """The Source of these Arrow / Parquet files ({split: files, in order})."""
    pyarrow_modules(root)
    for split, files in split_files.items():
        kinds = {path.suffix.lower() for path in files}
        if len(kinds) > 1:
            raise SourceError(f"{root}: the {split} split mixes {' and '.join(sorted(kinds))} "
                              f"files; use one kind per split")
    listed = {split: [_list_file(path, limits, columns, (features or {}).get(split))
                      for path in files] for split, files in split_files.items()}
    classes, labels = _classes(listed, root)
    splits, start = {}, 0
    for split, files in split_files.items():
        rows = [len(item.labels) for item in listed[split]]
        count = sum(rows)
        splits[split] = HFSplit(
            tuple(str(path) for path in files),
            np.repeat(np.arange(len(files), dtype=np.int32), rows),
            np.concatenate([np.arange(n, dtype=np.int64) for n in rows]),
            np.concatenate([item.sizes for item in listed[split]]),
            labels[start:start + count], listed[split][0].image,
            files[0].name.lower().endswith(".parquet"),
            tuple(item.group_starts for item in listed[split]
                  if item.group_starts is not None))
        start += count
    content = tuple(path for files in split_files.values() for path in files)
    return Source("hf", root, classes, splits, content)


def _classes(listed: dict[str, list[_Listed]], root: Path) -> tuple[list[str], np.ndarray]:
    items = [item for per_split in listed.values() for item in per_split]
    values = [label for item in items for label in item.labels]
    if not all(isinstance(value, int) for value in values):  # names (strings)
        return classes_and_labels([str(v) for v in values], lambda k: str(root), str(root))
    labels = np.array(values, dtype=np.int64)
    if len(labels) and labels.min() < 0:
        raise SourceError(f"{root}: label {labels.min()} (HF marks an unlabelled row -1); "
                          f"prepare only labelled splits")
    top = int(labels.max()) if len(labels) else -1
    if top >= MAX_CLASSES:
        raise SourceError(f"{root}: label {top} is over the {MAX_CLASSES:,} classes a dataset "
                          f"may have")
    names = next((item.names for item in items if item.names), None)
    if names is None:
        return [str(k) for k in range(top + 1)], labels
    if top >= len(names):
        raise SourceError(f"{root}: label {top} but the ClassLabel feature names only "
                          f"{len(names)} classes")
    return names, labels


def _list_file(path: Path, limits: Limits, columns: Columns, features) -> _Listed:
    pa, _, _ = pyarrow_modules(path)
    try:
        if path.name.lower().endswith(".parquet"):
            return _list_parquet(path, limits, columns, features)
        return _list_arrow(path, limits, columns, features)
    except UnsafeInput as e:
        raise SourceError(f"{path} {e}") from None
    except SourceError:
        raise
    except (pa.ArrowException, OSError, ValueError, TypeError, KeyError, IndexError) as e:
        reason = " ".join(str(e).split())[:200] or type(e).__name__
        raise SourceError(f"{path} is not a readable {path.suffix[1:]} file ({reason})") from None


def _list_arrow(path: Path, limits: Limits, columns: Columns, features) -> _Listed:
    import pyarrow.compute as pc
    schema, batches, _ = open_arrow(str(path))
    image, label, names = _choose(schema, features, columns, path)
    sizes, labels = [], []
    first = 0
    for batch in batches:
        column = batch.column(schema.get_field_index(image))
        values = column.field("bytes") if _is_struct(column.type) else column
        if column.null_count or values.null_count:
            row = first + _first_null(column, values)
            raise SourceError(f"{path}[row {row}] has no image bytes (only a path?); save the "
                              f"dataset with the images embedded")
        lengths = pc.binary_length(values).to_numpy(zero_copy_only=False).astype(np.int64)
        if len(lengths) and lengths.max() > limits.max_file_bytes:
            row = first + int(np.argmax(lengths))
            raise SourceError(f"{path}[row {row}]: the image is {lengths.max() >> 20:,} MiB, over "
                              f"the {limits.max_file_bytes >> 20:,} MiB limit (--max-file-mb)")
        sizes.append(lengths)
        labels += _label_values(batch.column(schema.get_field_index(label)), path, label)
        first += batch.num_rows
    sizes_all = np.concatenate(sizes) if sizes else np.zeros(0, np.int64)
    return _Listed(image, labels, sizes_all, None, names)


def _list_parquet(path: Path, limits: Limits, columns: Columns, features) -> _Listed:
    _, _, pq = pyarrow_modules(path)
    with open_regular(path) as f:
        budget = InflateBudget(path, os.fstat(f.fileno()).st_size, limits)
        parquet = pq.ParquetFile(f)
        meta = parquet.metadata
        image, label, names = _choose(parquet.schema_arrow, features, columns, path)
        starts, sizes = [0], []
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            if group.total_byte_size > limits.max_file_bytes:
                raise SourceError(f"{path}: row group {g} is {group.total_byte_size >> 20:,} MiB "
                                  f"decoded, over the {limits.max_file_bytes >> 20:,} MiB a "
                                  f"worker reads at once (--max-file-mb); write smaller row "
                                  f"groups")
            budget.charge(group.total_byte_size + group.num_rows * LABEL_BYTES_PER_ROW,
                          f"row group {g}")
            image_bytes = sum(group.column(c).total_uncompressed_size
                              for c in range(group.num_columns)
                              if group.column(c).path_in_schema.split(".")[0] == image)
            sizes.append(np.full(group.num_rows, image_bytes // max(group.num_rows, 1),
                                 dtype=np.int64))
            starts.append(starts[-1] + group.num_rows)
        labels = []
        for batch in parquet.iter_batches(batch_size=LABEL_BATCH_ROWS, columns=[label],
                                          use_threads=False):
            labels += _label_values(batch.column(0), path, label)
    if len(labels) != starts[-1]:
        raise SourceError(f"{path}: the footer declares {starts[-1]:,} rows but {len(labels):,} "
                          f"labels were read; the file is damaged")
    sizes_all = np.concatenate(sizes) if sizes else np.zeros(0, np.int64)
    return _Listed(image, labels, sizes_all, np.array(starts, dtype=np.int64), names)


def _choose(schema, features, columns: Columns, path: Path):
    """(image column, label column, ClassLabel names or None) of a file's schema."""
    features = features if isinstance(features, dict) else _schema_features(schema)
    present = list(schema.names)
    image = _column(columns.image, IMAGE_COLUMNS, present, path, "image", "--image-column")
    if image is None:  # the one column of HF's Image feature, whatever its name
        typed = [name for name, feature in (features or {}).items()
                 if isinstance(feature, dict) and feature.get("_type") == "Image"]
        image = typed[0] if len(typed) == 1 else None
    label = _column(columns.label, LABEL_COLUMNS, present, path, "label", "--label-column")
    if image is None or label is None:
        what, flag = ("image", "--image-column") if image is None else ("label",
                                                                         "--label-column")
        raise SourceError(f"{path} has no {what} column (columns: {', '.join(present[:12])}); "
                          f"name it with {flag}")
    kind = schema.field(image).type
    if not (_is_binary(kind) or (_is_struct(kind) and kind.get_field_index("bytes") >= 0
                                 and _is_binary(kind.field("bytes").type))):
        raise SourceError(f"{path}: column {image!r} is {kind}, not images (HF's Image "
                          f"feature, a struct with 'bytes', or binary)")
    return image, label, _class_names((features or {}).get(label), path)


def _column(asked: str | None, defaults: tuple[str, ...], present: list[str], path: Path,
            what: str, flag: str) -> str | None:
    if asked is not None:
        if asked not in present:
            raise SourceError(f"{path} has no column {asked!r} ({flag}); columns: "
                              f"{', '.join(present[:12])}")
        return asked
    return next((name for name in defaults if name in present), None)


def _schema_features(schema) -> dict | None:
    """The features `datasets` stores in the schema metadata (to_parquet, save_to_disk)."""
    raw = (schema.metadata or {}).get(b"huggingface")
    if raw is None or len(raw) > MAX_JSON_BYTES:
        return None
    try:
        info = json.loads(raw)
    except (ValueError, RecursionError):
        return None  # metadata only names classes: without it the labels are "0".."N-1"
    features = info.get("info", {}).get("features") if isinstance(info, dict) else None
    return features if isinstance(features, dict) else None


def _class_names(feature, path: Path) -> list[str] | None:
    if not isinstance(feature, dict) or feature.get("_type") != "ClassLabel":
        return None
    names = feature.get("names")
    if not (isinstance(names, list) and 0 < len(names) <= MAX_CLASSES
            and all(isinstance(n, str) and len(n) <= MAX_CLASS_NAME_CHARS for n in names)):
        raise SourceError(f"{path}: the ClassLabel feature's names are not 1 to "
                          f"{MAX_CLASSES:,} names of at most {MAX_CLASS_NAME_CHARS} characters")
    return names


def _label_values(column, path: Path, name: str) -> list:
    import pyarrow as pa
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    if column.null_count:
        raise SourceError(f"{path}: column {name!r} has empty (null) labels; fill or drop them")
    if pa.types.is_integer(column.type):
        return column.to_numpy(zero_copy_only=False).astype(np.int64).tolist()
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        values = [value.strip() for value in column.to_pylist()]
        if any(not value or len(value) > MAX_CLASS_NAME_CHARS for value in values):
            raise SourceError(f"{path}: column {name!r} holds an empty class name or one over "
                              f"{MAX_CLASS_NAME_CHARS} characters")
        return values
    raise SourceError(f"{path}: column {name!r} is {column.type}; expected integer labels or "
                      f"class names")


def _first_null(column, values) -> int:
    valid = np.asarray(column.is_valid()) & np.asarray(values.is_valid())
    return int(np.argmin(valid))


def _is_struct(kind) -> bool:
    import pyarrow as pa
    return pa.types.is_struct(kind)


def _is_binary(kind) -> bool:
    import pyarrow as pa
    return pa.types.is_binary(kind) or pa.types.is_large_binary(kind)


def _json(path: Path) -> dict:
    try:
        value = json.loads(read_regular(path, MAX_JSON_BYTES))
    except UnsafeInput as e:
        raise SourceError(f"{path} {e}") from None
    except (ValueError, RecursionError) as e:
        raise SourceError(f"{path} is not readable JSON ({str(e)[:120]})") from None
    if not isinstance(value, dict):
        raise SourceError(f"{path} is not a JSON object")
    return value


def _inside(folder: Path, name: str, listed_in: str) -> Path:
    """folder/name for a bare name read from a file in folder (never a path elsewhere)."""
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise SourceError(f"{folder / listed_in} names {name[:80]!r}, not a bare name of a "
                          f"file or folder beside it")
    return folder / name


def _state_files(folder: Path) -> list[Path]:
    """The .arrow files of a save_to_disk Dataset folder, in order."""
    if (folder / "state.json").is_file():
        entries = _json(folder / "state.json").get("_data_files")
        if not isinstance(entries, list) or not all(
                isinstance(e, dict) and isinstance(e.get("filename"), str) for e in entries):
            raise SourceError(f"{folder / 'state.json'}: '_data_files' is not a list of "
                              f"{{'filename': ...}}")
        files = [_inside(folder, e["filename"], "state.json") for e in entries]
    else:
        files = sorted(p for p in folder.glob("*.arrow") if not p.name.startswith("."))
    if not files:
        raise SourceError(f"{folder} holds no .arrow files; is it a save_to_disk folder?")
    for path in files:
        if not path.is_file() or path.is_symlink():
            raise SourceError(f"{path} (listed in {folder / 'state.json'}) is missing or not a "
                              f"regular file")
    return files
