"""`prepare-dataset` on a SOURCE and an OUT nobody vouches for: every case of the safety issue
through the real CLI in a confined child (tests/security/confined.py). A refused case exits 2
with one line naming the file, ends, stays under a memory cap, and changes nothing outside OUT.
"""
from __future__ import annotations

import gzip
import io
import json
import os
import pickle
import struct
import tarfile
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from .confined import changed, run_confined, tree_state, turbotrain
from .fuzz_sources import cifar_batches, idx_header

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("child_processes")]

# prepare-dataset imports numpy, cv2, PIL and simplejpeg: a run of a dozen small images peaks at
# 80 MB RSS and fails to start under 1 GiB of address space (OpenBLAS and OpenCV thread
# stacks). 2 GiB and 256 MB leave room; each bomb below would inflate 200 MB to 600 MB.
ADDRESS_SPACE = 2 << 30
PEAK_RSS = 256 << 20
TIMEOUT = 60  # seconds; every case below ends in under 3


def prepare(tmp_path: Path, *args) -> object:
    return run_confined(turbotrain("prepare", *args, "--workers", "2"), cwd=tmp_path,
                        address_space=ADDRESS_SPACE, timeout=TIMEOUT)


def refused(tmp_path: Path, *args, expect: str, out: Path | None = None) -> str:
    """Runs prepare and asserts the refusal: one line containing `expect`, memory under the cap,
    nothing changed under tmp_path except inside OUT (`out`, or the second argument)."""
    out = out or Path(args[1])
    before = tree_state(tmp_path, skip=out)
    ran = prepare(tmp_path, *args)
    line = ran.error_line("prepare-dataset: error: ")
    assert expect in line, line
    assert ran.peak_rss < PEAK_RSS, f"peak RSS {ran.peak_rss >> 20} MB"
    assert changed(before, tree_state(tmp_path, skip=out)) == []
    return line


def write_png(path: Path, value: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((12, 16, 3), value, np.uint8)).save(path, "PNG")
    return path


def image_folder(root: Path) -> Path:
    for k in range(3):
        write_png(root / "cat" / f"{k}.png", 10 * k)
        write_png(root / "dog" / f"{k}.png", 200 - 10 * k)
    return root


# -- 2. data loss: --overwrite and OUT/SOURCE overlaps -------------------------------------------
def test_overwrite_refuses_a_folder_of_notes(tmp_path):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("mine")
    line = refused(tmp_path, image_folder(tmp_path / "src"), notes, "--overwrite",
                   expect="did not make it", out=tmp_path / "nothing")
    assert str(notes) in line and (notes / "todo.txt").read_text() == "mine"


def test_out_equal_to_source_is_refused(tmp_path):
    src = image_folder(tmp_path / "src")
    refused(tmp_path, src, src, "--overwrite", expect="is SOURCE itself", out=tmp_path / "x")
    assert sorted(p.name for p in (src / "cat").iterdir()) == ["0.png", "1.png", "2.png"]


@pytest.mark.parametrize("where", ["inside", "containing"])
def test_out_overlapping_source_is_refused(tmp_path, where):
    if where == "inside":
        src = image_folder(tmp_path / "src")
        out, expect = src / "prepared", "is inside SOURCE"
    else:
        src = image_folder(tmp_path / "work" / "raw")
        out, expect = tmp_path / "work", "contains SOURCE"
    refused(tmp_path, src, out, "--overwrite", expect=expect, out=tmp_path / "x")


def test_overwrite_keeps_a_prepared_dataset_that_holds_other_files(tmp_path):
    src = image_folder(tmp_path / "src")
    out = tmp_path / "ds"
    assert prepare(tmp_path, src, out).returncode == 0
    (out / "notes.txt").write_text("mine")
    refused(tmp_path, src, out, "--overwrite", expect="did not write (notes.txt)",
            out=tmp_path / "x")
    assert (out / "notes.txt").read_text() == "mine" and (out / "dataset.json").is_file()


def test_overwrite_refuses_a_link(tmp_path):
    src = image_folder(tmp_path / "src")
    assert prepare(tmp_path, src, tmp_path / "ds").returncode == 0
    (tmp_path / "link").symlink_to(tmp_path / "ds")
    refused(tmp_path, src, tmp_path / "link", "--overwrite", expect="a file or a link",
            out=tmp_path / "x")


# -- 3. hangs and endless reads from a source folder ---------------------------------------------
def test_symlink_to_dev_zero_is_refused(tmp_path):
    src = image_folder(tmp_path / "src")
    (src / "cat" / "x.png").symlink_to("/dev/zero")
    line = refused(tmp_path, src, tmp_path / "ds", expect="outside the source folder")
    assert "x.png" in line and "--allow-outside-root" in line
    line = refused(tmp_path, src, tmp_path / "ds", "--allow-outside-root",
                   expect="is a device, not a regular file")
    assert "x.png" in line


def test_named_pipe_is_refused_not_waited_on(tmp_path):
    src = image_folder(tmp_path / "src")
    os.mkfifo(src / "dog" / "p.png")
    line = refused(tmp_path, src, tmp_path / "ds", expect="is a named pipe, not a regular file")
    assert "p.png" in line


def test_special_files_are_skipped_and_listed_with_skip(tmp_path):
    src = image_folder(tmp_path / "src")
    os.mkfifo(src / "dog" / "p.png")
    (src / "cat" / "x.png").symlink_to("/dev/zero")
    ran = prepare(tmp_path, src, tmp_path / "ds", "--on-error", "skip")
    assert ran.returncode == 0, ran.stderr
    rows = (tmp_path / "ds" / "skipped.txt").read_text().splitlines()
    assert len(rows) == 2 and "named pipe" in rows[1] and "outside the source" in rows[0]


# -- 4. decompression bombs: refused before they inflate ---------------------------------------
def cifar_pickle(batch: dict) -> bytes:
    return pickle.dumps(batch, protocol=2)


def test_cifar_archive_bomb(tmp_path):
    """A 300 MB member of zeros, 0.3 MB compressed: refused from its tar header."""
    archive = write_tar_gz_bomb(tmp_path / "cifar-10-python.tar.gz",
                                "cifar-10-batches-py/data_batch_1")
    refused(tmp_path, archive, tmp_path / "ds", expect="a decompression bomb?")


def write_tar_gz_bomb(path: Path, member: str) -> Path:
    """A .tar.gz at `path` whose one `member` is 300 MB of zeros, under 1 MB gzipped."""
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo(member)
        info.size = 300 << 20
        tar.addfile(info, _Zeros(info.size))
    assert path.stat().st_size < 1 << 20
    return path


class _Zeros(io.RawIOBase):
    """A stream of n zero bytes, made as read."""

    def __init__(self, n: int):
        self.left = n

    def readable(self):
        return True

    def readinto(self, buffer):
        n = min(len(buffer), self.left)
        buffer[:n] = bytes(n)
        self.left -= n
        return n


def test_idx_gzip_bomb(tmp_path):
    folder = tmp_path / "mnist"
    folder.mkdir()
    shape = (60_000, 100, 100)  # 600 MB of zeros, 0.6 MB gzipped
    with gzip.open(folder / "train-images-idx3-ubyte.gz", "wb") as f:
        f.write(idx_header(3, shape))
        for _ in range(60):
            f.write(bytes(10 << 20))
    (folder / "train-labels-idx1-ubyte").write_bytes(idx_header(1, [60_000]) + bytes(60_000))
    line = refused(tmp_path, folder, tmp_path / "ds", expect="a decompression bomb?")
    assert "train-images-idx3-ubyte.gz" in line


def test_idx_dimensions_that_overflow(tmp_path):
    folder = tmp_path / "mnist"
    folder.mkdir()
    big = 2 ** 32 - 1
    (folder / "train-images-idx3-ubyte").write_bytes(idx_header(3, (big, 60_000, 60_000)))
    (folder / "train-labels-idx1-ubyte").write_bytes(idx_header(1, [big]))
    refused(tmp_path, folder, tmp_path / "ds", expect="train-images-idx3-ubyte")


def _npy(header: dict) -> bytes:
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(out, header)  # magic, length, header
    return out.getvalue()


def test_npz_header_claiming_ten_trillion_elements(tmp_path):
    path = tmp_path / "data.npz"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("images.npy", _npy({"descr": "|u1", "fortran_order": False,
                                        "shape": (10 ** 13 // 784, 28, 28)}))
        z.writestr("labels.npy", _npy({"descr": "<i8", "fortran_order": False, "shape": (4,)})
                   + bytes(32))
    refused(tmp_path, path, tmp_path / "ds", expect="data.npz")


def test_npz_compressed_bomb(tmp_path):
    """200 MB of zero pixels deflated to 0.2 MB: refused from the .npy header."""
    path = tmp_path / "data.npz"
    count = 200_000
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        with z.open("images.npy", "w", force_zip64=True) as f:
            f.write(_npy({"descr": "|u1", "fortran_order": False, "shape": (count, 32, 32, 1)}))
            for _ in range(20):
                f.write(bytes(count * 32 * 32 // 20))
        z.writestr("labels.npy", _npy({"descr": "|u1", "fortran_order": False,
                                        "shape": (count,)}) + bytes(count))
    assert path.stat().st_size < 1 << 20
    refused(tmp_path, path, tmp_path / "ds", expect="a decompression bomb?")


def cifar_folder(root: Path, data_batch_1: bytes) -> Path:
    """A valid CIFAR-10 python folder (fuzz_sources.py's) but for its data_batch_1."""
    root.mkdir(parents=True)
    for name, data in {**cifar_batches(), "data_batch_1": data_batch_1}.items():
        (root / name).write_bytes(data)
    return root


def test_cifar_pickle_with_shared_rows(tmp_path):
    """40,000 references to one row: 123 MB of pixels from a 160 KB pickle, if numpy stacked
    them. The data must be an array already."""
    row = np.zeros(3072, np.uint8)
    bomb = cifar_pickle({b"data": [row] * 40_000, b"labels": [0] * 40_000})
    assert len(bomb) < 200_000
    line = refused(tmp_path, cifar_folder(tmp_path / "c10", bomb), tmp_path / "ds",
                   expect="data is a list, expected a uint8 array")
    assert "data_batch_1" in line


def _global(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


@pytest.mark.parametrize("codec", ["hex", "no-such-codec", "zlib"])
def test_cifar_pickle_codec_tricks(tmp_path, codec):
    """_codecs.encode with 'hex' doubles a string per call (nested: 2^k), an unknown codec
    raised LookupError: only latin1, what numpy's Python 2 pickles use, is allowed."""
    bomb = _global("_codecs", "encode") + f"(Vabc\nV{codec}\ntR.".encode()
    refused(tmp_path, cifar_folder(tmp_path / "c10", bomb), tmp_path / "ds",
            expect=f"refusing _codecs.encode with '{codec}'")


def test_cifar_pickle_asking_for_an_impossible_array(tmp_path):
    bomb = _global("numpy", "dtype") + b"(VV99999999999999\ntR."
    refused(tmp_path, cifar_folder(tmp_path / "c10", bomb), tmp_path / "ds",
            expect="is not a CIFAR python batch")


# -- 5. files outside the dataset --------------------------------------------------------------
def test_csv_rows_outside_the_list_folder(tmp_path):
    secret = write_png(tmp_path / "secret.png", 99)
    root = tmp_path / "list"
    write_png(root / "a.png")
    for row in ("../secret.png", str(secret)):
        (root / "list.csv").write_text(f"path,label\na.png,cat\n{row},dog\n")
        line = refused(tmp_path, root / "list.csv", tmp_path / "ds",
                       expect="outside the source folder")
        assert "list.csv:3" in line and "--allow-outside-root" in line
    ran = prepare(tmp_path, root / "list.csv", tmp_path / "ds", "--allow-outside-root")
    assert ran.returncode == 0, ran.stderr


def test_symlinked_file_and_class_folder_outside(tmp_path):
    outside = image_folder(tmp_path / "elsewhere")
    src = image_folder(tmp_path / "src")
    (src / "cat" / "link.png").symlink_to(outside / "dog" / "0.png")
    line = refused(tmp_path, src, tmp_path / "ds", expect="outside the source folder")
    assert "link.png" in line
    (src / "cat" / "link.png").unlink()
    (src / "bird").symlink_to(outside / "dog")
    line = refused(tmp_path, src, tmp_path / "ds", expect="outside the source folder")
    assert "class folder" in line and "bird" in line


def test_symlinks_inside_the_source_are_fine(tmp_path):
    src = image_folder(tmp_path / "src")
    (src / "cat" / "link.png").symlink_to(src / "dog" / "0.png")
    (src / "bird").symlink_to(src / "dog")
    ran = prepare(tmp_path, src, tmp_path / "ds")
    assert ran.returncode == 0, ran.stderr
    assert json.loads((tmp_path / "ds" / "dataset.json").read_text())["classes"] == \
        ["bird", "cat", "dog"]


def test_csv_label_over_the_class_limit(tmp_path):
    root = tmp_path / "list"
    write_png(root / "a.png")
    for label in ("1099511627776", "9" * 5000):
        (root / "list.csv").write_text(f"a.png,{label}\n")
        refused(tmp_path, root / "list.csv", tmp_path / "ds", expect="classes a dataset may have")


# -- 6/7. names that are not UTF-8, or forge rows and drive terminals ----------------------------
def test_names_are_escaped_in_skipped_txt_and_errors(tmp_path):
    src = image_folder(tmp_path / "src")
    forged = "a\tb\nforged\trow\x1b[2J.png"
    (src / "cat" / forged).write_bytes(b"not an image")
    (src / "cat" / os.fsdecode(b"\xff\xfe.png")).write_bytes(b"not an image either")
    line = refused(tmp_path, src, tmp_path / "ds", expect="not an image")
    assert "\x1b" not in line and "\t" not in line
    ran = prepare(tmp_path, src, tmp_path / "ds", "--on-error", "skip")
    assert ran.returncode == 0, ran.stderr
    assert "\x1b" not in ran.stdout + ran.stderr
    rows = (tmp_path / "ds" / "skipped.txt").read_text().splitlines()
    assert len(rows) == 2 and all(row.count("\t") == 1 for row in rows)
    assert any("a\\tb\\nforged\\trow\\x1b[2J.png" in row for row in rows)
    assert any("\\xff\\xfe.png" in row for row in rows)


def test_non_utf8_file_name_is_prepared(tmp_path):
    src = image_folder(tmp_path / "src")
    write_png(src / "dog" / os.fsdecode(b"caf\xe9.png"), 7)
    ran = prepare(tmp_path, src, tmp_path / "ds")
    assert ran.returncode == 0, ran.stderr
    assert json.loads((tmp_path / "ds" / "dataset.json").read_text())["splits"]["train"][
        "num_samples"] == 7


def test_class_names_with_escapes_are_shown_escaped_by_inspect(tmp_path):
    src = image_folder(tmp_path / "src")
    (src / "dog").rename(src / "\x1b]0;pwned\x07dog")
    assert prepare(tmp_path, src, tmp_path / "ds").returncode == 0
    ran = run_confined(turbotrain("inspect", tmp_path / "ds"), cwd=tmp_path,
                       address_space=ADDRESS_SPACE, timeout=TIMEOUT)
    assert ran.returncode == 0 and "\x1b" not in ran.stdout and "\x07" not in ran.stdout
    assert "\\x1b]0;pwned\\x07dog" in ran.stdout


# -- 8. workers bounded by memory ----------------------------------------------------------------
def png_declaring(width: int, height: int) -> bytes:
    """69 bytes of PNG whose header declares width x height RGBA pixels."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(
            ">I", zlib.crc32(kind + data))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 6,
                                                               0, 0, 0))
            + chunk(b"IDAT", zlib.compress(bytes(100))) + chunk(b"IEND", b""))


def test_workers_are_bounded_by_the_largest_image(tmp_path):
    from turbotrain.datasets.sources.detect import detect_source
    from turbotrain.datasets.prepare.worker_memory import (BYTES_PER_PIXEL, WORKER_BASE_BYTES,
                                                           memory_bound_workers)
    src = image_folder(tmp_path / "src")
    gib = 1 << 30
    small = detect_source(src)
    assert memory_bound_workers(16, small, 8 * gib) == (16, "")
    (src / "dog" / "big.png").write_bytes(png_declaring(8000, 5000))  # 40 Mpx: 1.4 GB decoded
    big = detect_source(src)
    per_worker = WORKER_BASE_BYTES + 40_000_000 * BYTES_PER_PIXEL
    workers, reason = memory_bound_workers(16, big, 8 * gib)
    assert workers == 6 * gib // per_worker == 4
    assert "big.png, 8000x5000" in reason and "4 encoding workers, not 16" in reason
    assert memory_bound_workers(16, big, gib)[0] == 1  # never fewer than one
