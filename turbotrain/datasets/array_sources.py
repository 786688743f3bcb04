"""SOURCEs whose pixels are arrays: CIFAR-10/100 python pickles, MNIST-style idx files, .npz.

Each reader validates what it loads (shapes, dtypes, label ranges, truncation) and raises
SourceError naming the file, so a bad download fails here, in one line, not in a worker.
"""
from __future__ import annotations

import gzip
import io
import pickle
import re
import tarfile
import zipfile
from pathlib import Path

import numpy as np

from turbotrain.datasets.source_types import ArraySplit, Source, SourceError

CIFAR10_DIR = "cifar-10-batches-py"
CIFAR100_DIR = "cifar-100-python"
CIFAR10_TRAIN = tuple(f"data_batch_{k}" for k in range(1, 6))
CIFAR_SIDE = 32

# Fashion-MNIST's classes (github.com/zalandoresearch/fashion-mnist#labels).
FASHION_MNIST_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal",
                         "Shirt", "Sneaker", "Bag", "Ankle boot"]
# train-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte, emnist-letters-train-images-idx3-ubyte,
# and the "train-images.idx3-ubyte" spelling of some mirrors.
IDX_NAME = re.compile(r"^(?P<prefix>.*?)(?P<split>train|t10k|test)-(?P<what>images|labels)"
                      r"[-.]idx[13]-ubyte(?:\.gz)?$")
_IDX_UBYTE = 0x08  # idx type code for unsigned bytes (yann.lecun.com/exdb/mnist)


def looks_like_cifar(folder: Path) -> str | None:
    """'cifar10' or 'cifar100' when `folder` holds that dataset's python batches."""
    if (folder / "batches.meta").is_file() or (folder / "data_batch_1").is_file():
        return "cifar10"
    if (folder / "meta").is_file() and (folder / "train").is_file():
        return "cifar100"
    return None


def read_cifar_folder(folder: Path) -> Source:
    kind = looks_like_cifar(folder)
    wanted = _cifar_members(kind)
    missing = [name for name in wanted if not (folder / name).is_file()]
    if missing:
        raise SourceError(f"{folder} looks like {kind} but lacks {', '.join(missing)}; "
                          f"re-extract the archive")
    pickles = {name: _unpickle((folder / name).read_bytes(), folder / name) for name in wanted}
    return _cifar_source(kind, folder, pickles, tuple(folder / name for name in wanted))


def read_cifar_archive(archive: Path) -> Source:
    """cifar-10-python.tar.gz / cifar-100-python.tar.gz, read in place (one pass, ~1 s)."""
    pickles = {}
    kind = None
    try:
        with tarfile.open(archive, "r:*") as tar:
            for member in tar:
                top, _, name = member.name.partition("/")
                if member.isfile() and top in (CIFAR10_DIR, CIFAR100_DIR):
                    kind = "cifar10" if top == CIFAR10_DIR else "cifar100"
                    if name in _cifar_members(kind):
                        data = tar.extractfile(member).read()
                        pickles[name] = _unpickle(data, f"{archive}:{member.name}")
    except (tarfile.TarError, OSError, EOFError) as e:
        raise SourceError(f"{archive} is not a readable tar archive ({e})") from e
    if kind is None:
        raise SourceError(f"{archive} holds no {CIFAR10_DIR}/ or {CIFAR100_DIR}/ folder; "
                          f"extract it and pass the folder with the images")
    missing = [name for name in _cifar_members(kind) if name not in pickles]
    if missing:
        raise SourceError(f"{archive} lacks {', '.join(missing)}; download it again")
    return _cifar_source(kind, archive, pickles, (archive,))


def _cifar_members(kind: str) -> tuple[str, ...]:
    if kind == "cifar10":
        return (*CIFAR10_TRAIN, "test_batch", "batches.meta")
    return ("train", "test", "meta")


class _ArraysOnlyUnpickler(pickle.Unpickler):
    """CIFAR ships as pickles; unpickling may run any callable the file names. Allow only what
    a pickled numpy array needs (the batches were written by Python 2's cPickle)."""
    ALLOWED = {("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode"),
               ("numpy._core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "scalar")}

    def find_class(self, module: str, name: str):
        module = module.replace("numpy.core.", "numpy._core.")  # numpy 1 names, numpy 2 modules
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}")
        return super().find_class(module, name)


def _unpickle(data: bytes, where) -> dict:
    try:
        loaded = _ArraysOnlyUnpickler(io.BytesIO(data), encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as e:
        raise SourceError(f"{where} is not a CIFAR python batch ({e})") from e
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
    if key not in meta:
        raise SourceError(f"{where}: the meta file has no {key.decode()}; is it CIFAR?")
    return [n.decode() if isinstance(n, bytes) else str(n) for n in meta[key]]


def _cifar_batch(batch: dict, label_key: bytes, num_classes: int,
                 where: str) -> tuple[np.ndarray, np.ndarray]:
    """Rows of 3072 bytes (1024 R, then G, then B, each 32x32 row-major) -> (N, 32, 32, 3)."""
    if b"data" not in batch or label_key not in batch:
        raise SourceError(f"{where} has no {label_key.decode()!r}/'data'; keys: "
                          f"{sorted(k.decode() for k in batch if isinstance(k, bytes))}")
    data, labels = np.asarray(batch[b"data"]), np.asarray(batch[label_key], dtype=np.int64)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * CIFAR_SIDE ** 2:
        raise SourceError(f"{where}: data is {data.dtype} {data.shape}, expected uint8 (N, 3072)")
    _check_labels(labels, len(data), num_classes, where)
    images = data.reshape(-1, 3, CIFAR_SIDE, CIFAR_SIDE).transpose(0, 2, 3, 1)
    return np.ascontiguousarray(images), labels


def _check_labels(labels: np.ndarray, count: int, num_classes: int | None, where) -> None:
    if labels.ndim != 1 or len(labels) != count:
        raise SourceError(f"{where}: {labels.size} labels for {count} images")
    if len(labels) and labels.min() < 0:
        raise SourceError(f"{where}: negative label {labels.min()}")
    if num_classes is not None and len(labels) and labels.max() >= num_classes:
        raise SourceError(f"{where}: label {labels.max()} but only {num_classes} classes")


def find_idx_files(folder: Path) -> dict[tuple[str, str], Path]:
    """{(split, 'images'|'labels'): path} for one MNIST-style set in folder; {} when none."""
    found: dict[str, dict[tuple[str, str], Path]] = {}
    for path in sorted(folder.iterdir()):
        match = IDX_NAME.match(path.name)
        if match and path.is_file():
            split = "train" if match["split"] == "train" else "val"
            found.setdefault(match["prefix"], {})[(split, match["what"])] = path
    if len(found) > 1:
        raise SourceError(f"{folder} holds several idx sets ({', '.join(repr(p) for p in found)}"
                          f"); move each into its own folder")
    return next(iter(found.values()), {})


def read_idx_folder(folder: Path) -> Source:
    files = find_idx_files(folder)
    splits: dict[str, ArraySplit] = {}
    for split in ("train", "val"):
        images_path, labels_path = files.get((split, "images")), files.get((split, "labels"))
        if images_path is None and labels_path is None:
            continue
        if images_path is None or labels_path is None:
            have = images_path or labels_path
            raise SourceError(f"{have} has no matching {'labels' if images_path else 'images'} "
                              f"file in {folder}")
        images = _read_idx(images_path, ndim=3)
        labels = _read_idx(labels_path, ndim=1).astype(np.int64)
        _check_labels(labels, len(images), None, labels_path)
        splits[split] = ArraySplit.from_parts([(images_path.name, images, labels)])
    if "train" not in splits:
        raise SourceError(f"{folder} has idx files but no train-images/train-labels pair")
    num_classes = 1 + max((int(s.labels.max()) for s in splits.values() if len(s)), default=-1)
    fashion = "fashion" in str(folder).lower() or any("fashion" in p.name.lower()
                                                       for p in files.values())
    if fashion and num_classes <= len(FASHION_MNIST_CLASSES):
        classes = list(FASHION_MNIST_CLASSES)
    else:
        classes = [str(k) for k in range(max(num_classes, 10))]
    return Source("idx", folder, classes, splits, tuple(files[key] for key in sorted(files)))


def _read_idx(path: Path, ndim: int) -> np.ndarray:
    """An idx file (big-endian header: 0, 0, type code, ndim, then ndim uint32 sizes), gzipped
    or not, as a uint8 array of the declared shape."""
    try:
        data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise SourceError(f"{path} is damaged ({e}); download it again") from e
    if len(data) < 4 + 4 * ndim:
        raise SourceError(f"{path} is too short for an idx header ({len(data)} bytes)")
    magic = int.from_bytes(data[:4], "big")
    if magic != (_IDX_UBYTE << 8 | ndim):
        raise SourceError(f"{path}: idx magic {magic:#010x}, expected "
                          f"{_IDX_UBYTE << 8 | ndim:#010x} (unsigned bytes, {ndim} dimensions)")
    shape = tuple(int.from_bytes(data[4 + 4 * k:8 + 4 * k], "big") for k in range(ndim))
    offset, expected = 4 + 4 * ndim, int(np.prod(shape))
    if len(data) - offset != expected:
        dims = "x".join(map(str, shape))
        raise SourceError(f"{path}: header says {dims} = {expected} bytes, file has "
                          f"{len(data) - offset}; it is truncated or damaged, download it again")
    return np.frombuffer(data, dtype=np.uint8, offset=offset).reshape(shape)


def read_npz(path: Path) -> Source:
    """'images' (N, H, W[, C]) uint8 and 'labels' (N,) ints; optional 'val_images'/'val_labels'
    and 'classes' (names, index = label)."""
    try:
        with np.load(path, allow_pickle=False) as npz:  # no pickle: no code runs from the file
            arrays = {key: npz[key] for key in npz.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise SourceError(f"{path} is not a readable .npz ({e})") from e
    if "images" not in arrays or "labels" not in arrays:
        raise SourceError(f"{path} needs arrays 'images' and 'labels'; it holds "
                          f"{', '.join(arrays) or 'nothing'}")
    if ("val_images" in arrays) != ("val_labels" in arrays):
        raise SourceError(f"{path} has only one of 'val_images'/'val_labels'; give both or none")
    classes = [str(c) for c in arrays["classes"]] if "classes" in arrays else None
    splits = {}
    for split, prefix in (("train", ""), ("val", "val_")):
        if prefix + "images" not in arrays:
            continue
        images, labels = arrays[prefix + "images"], arrays[prefix + "labels"]
        if images.dtype != np.uint8 or images.ndim not in (3, 4) or (
                images.ndim == 4 and images.shape[3] not in (1, 3, 4)):
            raise SourceError(f"{path}: {prefix}images is {images.dtype} {images.shape}, expected "
                              f"uint8 (N, H, W) or (N, H, W, 1|3|4)")
        if not np.issubdtype(labels.dtype, np.integer):
            raise SourceError(f"{path}: {prefix}labels is {labels.dtype}, expected integers")
        labels = labels.astype(np.int64)
        _check_labels(labels, len(images), len(classes) if classes else None,
                      f"{path}:{prefix}labels")
        splits[split] = ArraySplit.from_parts([(f"{path.name}:{prefix}images", images, labels)])
    if classes is None:
        top = max((int(s.labels.max()) for s in splits.values() if len(s)), default=-1)
        classes = [str(k) for k in range(top + 1)]
    return Source("npz", path, classes, splits, (path,))
