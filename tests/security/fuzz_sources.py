"""A seeded fuzz of every SOURCE kind's headers, run as one confined child by test_source_fuzz.py.

    python tests/security/fuzz_sources.py WORKDIR ROUNDS SEED

For each kind (idx raw and gzipped, .npz, CIFAR pickles, the CIFAR .tar.gz, CSV lists, the
image formats a folder may hold, WebDataset .tar and .tar.gz shards written by webdataset's
TarWriter, and Parquet and Arrow files written by `datasets`) it writes a valid small source,
then ROUNDS mutated copies (bytes flipped or overwritten with extreme values near the start,
where the headers are, or near the end for Parquet, whose footer is there, or the file cut
short), and reads each as prepare-dataset does: detect_source, then load and encode a few
samples. The only acceptable outcomes are success or our own one-line errors; it prints one
JSON line: {"cases": N, "problems": [...]}, each problem naming the kind, round and exception.
"""
from __future__ import annotations

import gzip
import io
import json
import pickle
import shutil
import sys
import tarfile
import traceback
from pathlib import Path

import numpy as np
from PIL import Image

from turbotrain.datasets.beton.sample_codec import ImageError, encode_sample
from turbotrain.datasets.sources.detect import detect_source
from turbotrain.datasets.sources.source import SourceError
from turbotrain.files.untrusted import UnsafeInput

EXPECTED = (SourceError, ImageError, UnsafeInput)
# A mutated header may declare any size up to the real cap (100 Mpx: up to 3.4 GB to decode),
# and decoding it would be correct behaviour; the fuzz looks for crashes, not for that, so it
# lowers the cap to keep the child small. test_prepare_safety.py covers the real cap.
FUZZ_MAX_PIXELS = 1_000_000
EXTREMES = (b"\xff\xff\xff\xff", b"\x7f\xff\xff\xff", b"\x00\x00\x00\x00", b"\x80\x00\x00\x00",
            b"\xff", b"\x00", b"9999999999", b"-1", b"(", b"\n", b"\x1b[2J")


def mutate(data: bytes, rng: np.random.Generator, head: int = 256,
           from_end: bool = False) -> bytes:
    """One random change, mostly within the first `head` bytes (the headers), or the last
    ones with from_end."""
    data = bytearray(data)
    choice = rng.integers(4)
    at = int(rng.integers(0, max(1, min(head, len(data)))))
    if from_end:
        at = max(0, len(data) - 1 - at)
    if choice == 0:
        data[at] ^= 1 << int(rng.integers(8))
    elif choice == 1:
        value = EXTREMES[int(rng.integers(len(EXTREMES)))]
        data[at:at + len(value)] = value
    elif choice == 2:
        del data[int(rng.integers(0, len(data))):]
    else:
        data[at:at] = bytes(rng.integers(0, 256, int(rng.integers(1, 16)), dtype=np.uint8))
    return bytes(data)


# -- valid sources, one file each (the one mutated) ---------------------------------------------
def idx_header(ndim: int, shape) -> bytes:
    """An idx file's header: magic (uint8 data, ndim dimensions), then each size, big-endian."""
    return bytes([0, 0, 8, ndim]) + b"".join(int(d).to_bytes(4, "big") for d in shape)


def idx_source(folder: Path, compress: bool) -> Path:
    rng = np.random.default_rng(0)
    for what, array in (("images-idx3", rng.integers(0, 256, (6, 28, 28))),
                        ("labels-idx1", np.arange(6) % 3)):
        data = idx_header(array.ndim, array.shape) + array.astype(np.uint8).tobytes()
        name = f"train-{what}-ubyte" + (".gz" if compress else "")
        (folder / name).write_bytes(gzip.compress(data, mtime=0) if compress else data)
    return folder / ("train-images-idx3-ubyte" + (".gz" if compress else ""))


def npz_source(folder: Path, compress: bool) -> Path:
    rng = np.random.default_rng(0)
    save = np.savez_compressed if compress else np.savez
    save(folder / "data.npz", images=rng.integers(0, 256, (6, 8, 8, 3), dtype=np.uint8),
         labels=np.arange(6) % 3, classes=np.array(["a", "b", "c"]))
    return folder / "data.npz"


def cifar_batches() -> dict[str, bytes]:
    """The files of a CIFAR-10 python folder, two random rows a batch."""
    rows = np.random.default_rng(0).integers(0, 256, (2, 3072), dtype=np.uint8)
    batch = pickle.dumps({b"data": rows, b"labels": [0, 1]}, protocol=2)
    files = {f"data_batch_{k}": batch for k in range(1, 6)}
    files["test_batch"] = batch
    files["batches.meta"] = pickle.dumps({b"label_names": [b"a", b"b"]}, protocol=2)
    return files


def cifar_pickle_source(folder: Path) -> Path:
    target = folder / "cifar-10-batches-py"
    target.mkdir()
    for name, data in cifar_batches().items():
        (target / name).write_bytes(data)
    return target / "data_batch_1"


def cifar_tar_source(folder: Path) -> Path:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, data in cifar_batches().items():
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    (folder / "cifar.tar").write_bytes(raw.getvalue())
    return folder / "cifar.tar"


def image_bytes(fmt: str) -> bytes:
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (20, 24, 3),
                                                              dtype=np.uint8))
    out = io.BytesIO()
    image.save(out, fmt)
    return out.getvalue()


def image_folder_source(folder: Path, fmt: str) -> Path:
    for label in ("a", "b"):
        (folder / label).mkdir()
        (folder / label / f"x.{fmt.lower()}").write_bytes(image_bytes(fmt))
    return folder / "a" / f"x.{fmt.lower()}"


def csv_source(folder: Path) -> Path:
    (folder / "img").mkdir()
    for k in range(3):
        (folder / "img" / f"{k}.png").write_bytes(image_bytes("PNG"))
    (folder / "list.csv").write_text("path,label\nimg/0.png,cat\nimg/1.png,dog\nimg/2.png,7\n")
    return folder / "list.csv"


def webdataset_source(folder: Path, compress: bool) -> Path:
    """A shard laid out as webdataset's TarWriter writes one (KEY.ext members, a key's members
    together). Written with tarfile: importing webdataset imports torch, which does not fit in
    this child's address space; tests/datasets build theirs with the real TarWriter."""
    path = folder / ("train-0.tar.gz" if compress else "train-0.tar")
    with tarfile.open(path, "w:gz" if compress else "w", format=tarfile.GNU_FORMAT) as tar:
        for k in range(3):
            label = ("cls", str(k).encode()) if k != 1 else ("json", b'{"label": 1}')
            for ext, data in (("png", image_bytes("PNG")), label):
                info = tarfile.TarInfo(f"s{k}.{ext}")
                info.size, info.mode = len(data), 0o444
                tar.addfile(info, io.BytesIO(data))
    return path


def hf_source(folder: Path, parquet: bool) -> Path:
    from datasets import ClassLabel, Dataset, Features, Image as HFImage
    data = {"image": [{"bytes": image_bytes("PNG"), "path": None}] * 3, "label": [0, 1, 2]}
    dataset = Dataset.from_dict(data, features=Features({"image": HFImage(),
                                                         "label": ClassLabel(names=list("abc"))}))
    if parquet:
        dataset.to_parquet(str(folder / "train.parquet"))
        return folder / "train.parquet"
    dataset.save_to_disk(str(folder / "disk"))
    return next((folder / "disk").glob("*.arrow"))


KINDS = {
    "idx": lambda f: idx_source(f, False), "idx.gz": lambda f: idx_source(f, True),
    "npz": lambda f: npz_source(f, False), "npz-compressed": lambda f: npz_source(f, True),
    "cifar-pickle": cifar_pickle_source, "cifar-tar": cifar_tar_source, "csv": csv_source,
    **{f"image-{fmt}": (lambda f, fmt=fmt: image_folder_source(f, fmt))
       for fmt in ("PNG", "JPEG", "GIF", "BMP", "WEBP", "TIFF")},
    "webdataset-tar": lambda f: webdataset_source(f, False),
    "webdataset-tgz": lambda f: webdataset_source(f, True),
    "parquet": lambda f: hf_source(f, True), "arrow": lambda f: hf_source(f, False),
}
# Where each kind's headers are: the number of leading bytes mutated (tar: the first members'
# headers and labels), or the trailing ones (Parquet's footer).
HEAD_BYTES = {"cifar-tar": 600, "webdataset-tar": 2600, "webdataset-tgz": 300,
              "arrow": 1200, "parquet": 1500}
FROM_END = {"parquet"}


def read_like_prepare(source_path: Path) -> None:
    source = detect_source(source_path)
    for split in source.splits.values():
        for i in range(min(3, len(split))):
            encode_sample(split.load(i), encoding="auto", max_side=64, quality=90)


def fuzz(workdir: Path, rounds: int, seed: int) -> dict:
    from turbotrain.datasets.beton import sample_codec
    sample_codec.MAX_PIXELS = sample_codec.PIL_MAX_PIXELS = FUZZ_MAX_PIXELS
    problems, cases = [], 0
    for k, (kind, make) in enumerate(KINDS.items()):
        folder = workdir / kind.replace(".", "_")
        folder.mkdir(parents=True)
        target = make(folder)
        valid = target.read_bytes()
        source = folder if kind.startswith(("idx", "cifar-pickle", "image")) else target
        if kind == "cifar-pickle":
            source = folder / "cifar-10-batches-py"
        if kind == "arrow":
            source = target.parent  # the save_to_disk folder
        read_like_prepare(source)  # the unmutated source must read
        rng = np.random.default_rng([seed, k])
        for round_ in range(rounds):
            target.write_bytes(mutate(valid, rng, head=HEAD_BYTES.get(kind, 256),
                                      from_end=kind in FROM_END))
            cases += 1
            try:
                read_like_prepare(source)
            except EXPECTED as e:
                if "\n" in str(e) or not str(e):
                    problems.append(f"{kind} round {round_}: message {str(e)!r}")
            except Exception as e:  # noqa: BLE001 - this is what the fuzz looks for
                where = traceback.extract_tb(e.__traceback__)[-1]
                problems.append(f"{kind} round {round_}: {type(e).__name__}: {str(e)[:200]} "
                                f"at {Path(where.filename).name}:{where.lineno}")
        shutil.rmtree(folder)
    return {"cases": cases, "problems": problems}


if __name__ == "__main__":
    print(json.dumps(fuzz(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))))
