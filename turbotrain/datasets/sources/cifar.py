"""CIFAR-10/100 "python version" sources: a folder of pickled batches, or the downloaded .tar.gz.

The batches are pickles, and a pickle can call anything it names, so they are loaded by an
unpickler that knows only what a pickled numpy array needs, and every object it returns is
checked for type, shape and size before numpy sees it (a list of references to one row would
otherwise become an array hundreds of times the file's size). The archive is read in one
streaming pass and every member is charged to an `InflateBudget` before it is extracted.
"""
from __future__ import annotations

import io
import pickle
import tarfile
import zlib
from pathlib import Path

import numpy as np

from turbotrain.datasets.beton.layout import MAX_CLASSES
from turbotrain.files.untrusted import (InflateBudget, Limits, UnsafeInput, open_regular,
                                        read_regular)

from .arrays import check_labels
from .source import ArraySplit, Source, SourceError

CIFAR10_DIR = "cifar-10-batches-py"
CIFAR100_DIR = "cifar-100-python"
CIFAR10_TRAIN = tuple(f"data_batch_{k}" for k in range(1, 6))
CIFAR_SIDE = 32
CIFAR_ROW_BYTES = 3 * CIFAR_SIDE ** 2
# The real archives hold 8 (CIFAR-10) and 5 (CIFAR-100) members; a stream of many more tiny
# headers is not CIFAR, and tarfile keeps a TarInfo per member.
MAX_ARCHIVE_MEMBERS = 1000


def looks_like_cifar(folder: Path) -> str | None:
    """'cifar10' or 'cifar100' when `folder` holds that dataset's python batches."""
    if (folder / "batches.meta").is_file() or (folder / "data_batch_1").is_file():
        return "cifar10"
    if (folder / "meta").is_file() and (folder / "train").is_file():
        return "cifar100"
    return None


def is_cifar_archive(archive: Path, downloaded_names: tuple[str, ...]) -> bool:
    """Whether a .tar/.tar.gz is a CIFAR archive (the downloaded name, or a first member under
    cifar-10-batches-py/ or cifar-100-python/) rather than a WebDataset tar file. Reads one
    header; an unreadable archive is left to the WebDataset reader's one-line error."""
    if archive.name.lower() in downloaded_names:
        return True
    try:
        with open_regular(archive) as f, tarfile.open(fileobj=f, mode="r|*") as tar:
            first = tar.next()
    except (tarfile.TarError, OSError, EOFError, ValueError, zlib.error, UnsafeInput):
        return False
    top = first.name.removeprefix("./").partition("/")[0] if first else ""
    return top in (CIFAR10_DIR, CIFAR100_DIR)


def cifar_members(kind: str) -> tuple[str, ...]:
    if kind == "cifar10":
        return (*CIFAR10_TRAIN, "test_batch", "batches.meta")
    return ("train", "test", "meta")


def read_cifar_folder(folder: Path, limits: Limits) -> Source:
    kind = looks_like_cifar(folder)
    wanted = cifar_members(kind)
    missing = [name for name in wanted if not (folder / name).is_file()]
    if missing:
        raise SourceError(f"{folder} looks like {kind} but lacks {', '.join(missing)}; "
                          f"re-extract the archive")
    pickles = {}
    for name in wanted:
        try:
            data = read_regular(folder / name, limits.max_file_bytes)
        except UnsafeInput as e:
            raise SourceError(f"{folder / name} {e}") from None
        pickles[name] = _unpickle(data, folder / name)
    return _cifar_source(kind, folder, pickles, tuple(folder / name for name in wanted))


def read_cifar_archive(archive: Path, limits: Limits) -> Source:
    """cifar-10-python.tar.gz / cifar-100-python.tar.gz, read in place in one pass (~1 s)."""
    pickles: dict[str, dict] = {}
    kind = None
    try:
        with open_regular(archive, limits.max_file_bytes) as f:
            budget = InflateBudget(archive, f.seek(0, io.SEEK_END), limits)
            f.seek(0)
            with tarfile.open(fileobj=f, mode="r|*") as tar:  # a stream: members in order
                for count, member in enumerate(tar, 1):
                    if count > MAX_ARCHIVE_MEMBERS:
                        raise SourceError(f"{archive} holds more than {MAX_ARCHIVE_MEMBERS} "
                                          f"entries; it is not a CIFAR archive")
                    # Everything up to this member's end is inflated to reach it, kept or not.
                    budget.reach(member.offset_data + member.size, f"entry {member.name!r}")
                    kind = _take_member(tar, member, pickles, kind, archive)
                    tar.members = []  # a stream needs no index; keeps memory flat
    except UnsafeInput as e:
        raise SourceError(f"{archive}: {e}") from None
    except SourceError:
        raise
    except (tarfile.TarError, OSError, EOFError, ValueError, zlib.error) as e:
        raise SourceError(f"{archive} is not a readable tar archive ({e})") from e
    if kind is None:
        raise SourceError(f"{archive} holds no {CIFAR10_DIR}/ or {CIFAR100_DIR}/ folder; "
                          f"extract it and pass the folder with the images")
    missing = [name for name in cifar_members(kind) if name not in pickles]
    if missing:
        raise SourceError(f"{archive} lacks {', '.join(missing)}; download it again")
    return _cifar_source(kind, archive, pickles, (archive,))


def _take_member(tar: tarfile.TarFile, member: tarfile.TarInfo, pickles: dict,
                 kind: str | None, archive: Path) -> str | None:
    """Unpickles `member` into pickles when it is one of the batches; returns the kind seen."""
    top, _, name = member.name.partition("/")
    if not member.isfile() or top not in (CIFAR10_DIR, CIFAR100_DIR):
        return kind
    member_kind = "cifar10" if top == CIFAR10_DIR else "cifar100"
    if kind is not None and member_kind != kind:
        raise SourceError(f"{archive} holds both {CIFAR10_DIR}/ and {CIFAR100_DIR}/; "
                          f"extract the one you want and pass its folder")
    if name in cifar_members(member_kind):
        pickles[name] = _unpickle(tar.extractfile(member).read(), f"{archive}:{member.name}")
    return member_kind


def _latin1(text, encoding="latin1"):
    """What Python 2 array pickles call `_codecs.encode` for: a str's code points as bytes.
    Only latin1: other codecs would turn the pickle into a decompressor ('zlib', 'hex' x N)."""
    if not isinstance(text, str) or encoding.replace("-", "").lower() != "latin1":
        raise pickle.UnpicklingError(f"refusing _codecs.encode with {encoding!r}")
    return text.encode("latin1")


class _ArraysOnlyUnpickler(pickle.Unpickler):
    """CIFAR ships as pickles; unpickling may run any callable the file names. Allow only what
    a pickled numpy array needs (the batches were written by Python 2's cPickle)."""
    ALLOWED = {("numpy", "ndarray"), ("numpy", "dtype"),
               ("numpy._core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "scalar")}

    def find_class(self, module: str, name: str):
        module = module.replace("numpy.core.", "numpy._core.")  # numpy 1 names, numpy 2 modules
        if (module, name) == ("_codecs", "encode"):
            return _latin1
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}")
        return super().find_class(module, name)


def _unpickle(data: bytes, where) -> dict:
    try:
        loaded = _ArraysOnlyUnpickler(io.BytesIO(data), encoding="bytes").load()
    except RecursionError:
        raise SourceError(f"{where} is not a CIFAR python batch (nested too deeply)") from None
    except MemoryError:
        raise SourceError(f"{where} is not a CIFAR python batch (it asks for more memory than "
                          f"there is)") from None
    except Exception as e:  # noqa: BLE001 - any failure of a crafted pickle is a bad file
        reason = " ".join(str(e).split())[:200]  # one line, however the library worded it
        raise SourceError(f"{where} is not a CIFAR python batch "
                          f"({type(e).__name__}: {reason})") from None
    if not isinstance(loaded, dict):
        raise SourceError(f"{where} is not a CIFAR python batch (holds a {type(loaded).__name__})")
    return loaded


def _cifar_source(kind: str, path: Path, pickles: dict[str, dict],
                  content_files: tuple[Path, ...]) -> Source:
    if kind == "cifar10":
        classes = _names(pickles["batches.meta"], b"label_names", path)
        train_parts, val_parts, label_key = list(CIFAR10_TRAIN), ["test_batch"], b"labels"
    else:
        classes = _names(pickles["meta"], b"fine_label_names", path)
        train_parts, val_parts, label_key = ["train"], ["test"], b"fine_labels"

    def split(names: list[str]) -> ArraySplit:
        return ArraySplit.from_parts([(name, *_cifar_batch(pickles[name], label_key, len(classes),
                                                           f"{path}:{name}")) for name in names])
    return Source(kind, path, classes, {"train": split(train_parts), "val": split(val_parts)},
                  content_files)


def _names(meta: dict, key: bytes, where: Path) -> list[str]:
    names = meta.get(key)
    if names is None:
        raise SourceError(f"{where}: the meta file has no {key.decode()}; is it CIFAR?")
    if not isinstance(names, list) or not 0 < len(names) <= MAX_CLASSES \
            or not all(isinstance(n, (bytes, str)) for n in names):
        raise SourceError(f"{where}: {key.decode()} in the meta file is not a list of at most "
                          f"{MAX_CLASSES} names; is it CIFAR?")
    return [n.decode("utf-8", "replace") if isinstance(n, bytes) else n for n in names]


def _cifar_batch(batch: dict, label_key: bytes, num_classes: int,
                 where: str) -> tuple[np.ndarray, np.ndarray]:
    """Rows of 3072 bytes (1024 R, then G, then B, each 32x32 row-major) -> (N, 32, 32, 3)."""
    if b"data" not in batch or label_key not in batch:
        raise SourceError(f"{where} has no {label_key.decode()!r}/'data'; keys: "
                          f"{sorted(repr(k) for k in batch)[:8]}")
    data, labels = batch[b"data"], batch[label_key]
    # Checked before numpy converts anything: np.asarray of a list of arrays copies every one.
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 \
            or data.shape[1] != CIFAR_ROW_BYTES:
        found = (f"{data.dtype} {data.shape}" if isinstance(data, np.ndarray)
                 else f"a {type(data).__name__}")
        raise SourceError(f"{where}: data is {found}, expected a uint8 array (N, 3072)")
    if isinstance(labels, list) and all(type(v) is int for v in labels):
        labels = np.array(labels, dtype=np.int64)
    elif isinstance(labels, np.ndarray) and labels.ndim == 1 \
            and np.issubdtype(labels.dtype, np.integer):
        labels = labels.astype(np.int64)
    else:
        raise SourceError(f"{where}: {label_key.decode()} is not a list of integers")
    check_labels(labels, len(data), num_classes, where)
    images = data.reshape(-1, 3, CIFAR_SIDE, CIFAR_SIDE).transpose(0, 2, 3, 1)
    return np.ascontiguousarray(images), labels
