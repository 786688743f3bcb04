"""SOURCEs whose pixels are arrays: MNIST-style idx files and .npz (CIFAR: cifar.py).

Each reader validates what it loads (shapes, dtypes, label ranges, truncation) and raises
SourceError naming the file, so a bad download fails here, in one line, not in a worker. Sizes
come from headers a stranger wrote: each is multiplied out with Python integers (no overflow)
and charged to an `InflateBudget` before a byte is inflated or allocated.
"""
from __future__ import annotations

import gzip
import math
import re
import zipfile
import zlib
from pathlib import Path

import numpy as np

from turbotrain.datasets.beton.layout import MAX_CLASSES, MAX_IMAGE_SIDE
from turbotrain.files.untrusted import InflateBudget, Limits, UnsafeInput, open_regular

from .source import ArraySplit, Source, SourceError

# Fashion-MNIST's classes (github.com/zalandoresearch/fashion-mnist#labels).
FASHION_MNIST_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal",
                         "Shirt", "Sneaker", "Bag", "Ankle boot"]
# train-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte, emnist-letters-train-images-idx3-ubyte,
# and the "train-images.idx3-ubyte" spelling of some mirrors.
IDX_NAME = re.compile(r"^(?P<prefix>.*?)(?P<split>train|t10k|test)-(?P<what>images|labels)"
                      r"[-.]idx[13]-ubyte(?:\.gz)?$")
_IDX_UBYTE = 0x08  # idx type code for unsigned bytes (yann.lecun.com/exdb/mnist)


def check_labels(labels: np.ndarray, count: int, num_classes: int | None, where) -> None:
    if labels.ndim != 1 or len(labels) != count:
        raise SourceError(f"{where}: {labels.size} labels for {count} images")
    if len(labels) and labels.min() < 0:
        raise SourceError(f"{where}: negative label {labels.min()}")
    if num_classes is not None and len(labels) and labels.max() >= num_classes:
        raise SourceError(f"{where}: label {labels.max()} but only {num_classes} classes")
    if len(labels) and labels.max() >= MAX_CLASSES:
        raise SourceError(f"{where}: label {labels.max()} is over the {MAX_CLASSES:,} classes "
                          f"a dataset may have")


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


def read_idx_folder(folder: Path, limits: Limits) -> Source:
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
        images = _read_idx(images_path, 3, limits)
        labels = _read_idx(labels_path, 1, limits).astype(np.int64)
        check_labels(labels, len(images), None, labels_path)
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


def _read_idx(path: Path, ndim: int, limits: Limits) -> np.ndarray:
    """An idx file (big-endian header: 0, 0, type code, ndim, then ndim uint32 sizes), gzipped
    or not, as a uint8 array of the declared shape. The declared size is checked against the
    limits before the data is inflated; the data is read in one pass, never past that size."""
    try:
        with open_regular(path, limits.max_array_bytes) as raw:
            budget = InflateBudget(path, raw.seek(0, 2), limits)
            raw.seek(0)
            stream = gzip.GzipFile(fileobj=raw) if path.suffix == ".gz" else raw
            shape, data = _read_idx_stream(stream, ndim, path, budget)
    except UnsafeInput as e:
        raise SourceError(f"{path} {e}") from None
    except (OSError, EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise SourceError(f"{path} is damaged ({e}); download it again") from e
    return np.frombuffer(data, dtype=np.uint8).reshape(shape)


def _read_idx_stream(stream, ndim: int, path: Path, budget: InflateBudget):
    header = stream.read(4 + 4 * ndim)
    if len(header) < 4 + 4 * ndim:
        raise SourceError(f"{path} is too short for an idx header ({len(header)} bytes)")
    magic = int.from_bytes(header[:4], "big")
    if magic != (_IDX_UBYTE << 8 | ndim):
        raise SourceError(f"{path}: idx magic {magic:#010x}, expected "
                          f"{_IDX_UBYTE << 8 | ndim:#010x} (unsigned bytes, {ndim} dimensions)")
    shape = tuple(int.from_bytes(header[4 + 4 * k:8 + 4 * k], "big") for k in range(ndim))
    dims = "x".join(map(str, shape))
    if ndim == 3 and not all(1 <= side <= MAX_IMAGE_SIDE for side in shape[1:]):
        raise SourceError(f"{path}: header declares {dims} images; each side must be "
                          f"1..{MAX_IMAGE_SIDE}")
    expected = math.prod(shape)  # Python ints: 4 x uint32 cannot overflow
    budget.charge(expected, f"its header ({dims} = {expected:,} bytes)")
    data = stream.read(expected)
    if len(data) != expected or stream.read(1):
        found = len(data) if len(data) != expected else "more"
        raise SourceError(f"{path}: header says {dims} = {expected} bytes, file has {found}; "
                          f"it is truncated or damaged, download it again")
    return shape, data


# The arrays read_npz uses; anything else in the file is not read.
NPZ_ARRAYS = ("images", "labels", "val_images", "val_labels", "classes")
MAX_NPZ_ENTRIES = 1000


def read_npz(path: Path, limits: Limits) -> Source:
    """'images' (N, H, W[, C]) uint8 and 'labels' (N,) ints; optional 'val_images'/'val_labels'
    and 'classes' (names, index = label)."""
    arrays, held = _read_npz_arrays(path, limits)
    if "images" not in arrays or "labels" not in arrays:
        raise SourceError(f"{path} needs arrays 'images' and 'labels'; it holds "
                          f"{', '.join(held[:10]) or 'nothing'}")
    if ("val_images" in arrays) != ("val_labels" in arrays):
        raise SourceError(f"{path} has only one of 'val_images'/'val_labels'; give both or none")
    classes = _npz_classes(arrays, path)
    splits = {}
    for split, prefix in (("train", ""), ("val", "val_")):
        if prefix + "images" not in arrays:
            continue
        images, labels = arrays[prefix + "images"], arrays[prefix + "labels"]
        if images.dtype != np.uint8 or images.ndim not in (3, 4) or (
                images.ndim == 4 and images.shape[3] not in (1, 3, 4)) or (
                not all(1 <= side <= MAX_IMAGE_SIDE for side in images.shape[1:3])):
            raise SourceError(f"{path}: {prefix}images is {images.dtype} {images.shape}, expected "
                              f"uint8 (N, H, W) or (N, H, W, 1|3|4)")
        if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
            raise SourceError(f"{path}: {prefix}labels is {labels.dtype} {labels.shape}, "
                              f"expected integers (N,)")
        labels = labels.astype(np.int64)
        check_labels(labels, len(images), len(classes) if classes else None,
                     f"{path}:{prefix}labels")
        splits[split] = ArraySplit.from_parts([(f"{path.name}:{prefix}images", images, labels)])
    if classes is None:
        top = max((int(s.labels.max()) for s in splits.values() if len(s)), default=-1)
        classes = [str(k) for k in range(top + 1)]
    return Source("npz", path, classes, splits, (path,))


def _npz_classes(arrays: dict, path: Path) -> list[str] | None:
    if "classes" not in arrays:
        return None
    names = arrays["classes"]
    if names.ndim != 1 or names.dtype.kind not in "US" or not 0 < len(names) <= MAX_CLASSES:
        raise SourceError(f"{path}: classes is {names.dtype} {names.shape}, expected 1 to "
                          f"{MAX_CLASSES:,} strings")
    return [n.decode("utf-8", "replace") if isinstance(n, bytes) else str(n) for n in names]


def _read_npz_arrays(path: Path, limits: Limits) -> tuple[dict[str, np.ndarray], list[str]]:
    """The NPZ_ARRAYS present in the file, and the names of all it holds. Each array's .npy header (dtype, shape) is read and
    its size charged to the budget before its data is inflated; no pickled (object) arrays."""
    arrays = {}
    try:
        with open_regular(path, limits.max_array_bytes) as raw:
            budget = InflateBudget(path, raw.seek(0, 2), limits)
            raw.seek(0)
            with zipfile.ZipFile(raw) as npz:
                entries = npz.infolist()
                if len(entries) > MAX_NPZ_ENTRIES:
                    raise SourceError(f"{path} holds {len(entries)} entries; a .npz of images "
                                      f"holds a few arrays")
                names = {info.filename: info for info in entries}
                held = [name.removesuffix(".npy") for name in names]
                for key in NPZ_ARRAYS:
                    if key + ".npy" in names:
                        with npz.open(names[key + ".npy"]) as member:
                            arrays[key] = _read_npy(member, budget, f"{path}:{key}")
    except UnsafeInput as e:
        raise SourceError(f"{path}: {e}") from None
    except SourceError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, NotImplementedError,
            zlib.error) as e:
        reason = (str(e).splitlines() or [type(e).__name__])[0][:200]
        raise SourceError(f"{path} is not a readable .npz ({reason})") from e
    return arrays, held


def _read_npy(member, budget: InflateBudget, where: str) -> np.ndarray:
    version = np.lib.format.read_magic(member)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(member)
    elif version == (2, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(member)
    else:
        raise SourceError(f"{where}: .npy format version {version} is not supported; save it "
                          f"with numpy.savez")
    if dtype.hasobject:
        raise SourceError(f"{where} holds Python objects (a pickle); save it as a numeric or "
                          f"string array")
    nbytes = math.prod(shape) * dtype.itemsize
    budget.charge(nbytes, f"array {where.rsplit(':', 1)[-1]!r} ({shape} {dtype})")
    data = member.read(nbytes)
    if len(data) != nbytes:
        raise SourceError(f"{where}: the array is truncated ({len(data)} of {nbytes} bytes)")
    array = np.frombuffer(data, dtype=dtype)
    return array.reshape(shape, order="F" if fortran else "C")
