"""`prepare-dataset` end to end: every source kind through the CLI, determinism, atomicity,
bad input, inspect and verify."""
from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests import expect
from tests.expect import FASHION_MNIST as FASHION
from turbotrain.datasets import open_dataset
from turbotrain.datasets.synthetic import write_shapes_imagefolder

pytestmark = pytest.mark.usefixtures("child_processes")  # not in make test-fast


def cli(*args, check=None, timeout=240):
    result = subprocess.run([sys.executable, "-m", "turbotrain", *map(str, args)],
                            capture_output=True, text=True, timeout=timeout)
    if check is not None:
        assert result.returncode == check, result.stderr + result.stdout
    return result


@pytest.fixture(scope="module")
def photo_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("photos")
    return write_shapes_imagefolder(root, train_per_class=4, val_per_class=2, size=(160, 120))


def test_imagefolder_jpeg_round_trip_and_pass_through(photo_folder, tmp_path):
    out = tmp_path / "ds"
    result = cli("prepare", photo_folder, out, check=0)
    assert "prepared" in result.stdout and "60 images" in result.stdout
    info = json.loads((out / "dataset.json").read_text())
    assert info["classes"][:3] == ["circle", "cross", "diamond"]  # sorted folder names
    assert set(info["splits"]) == {"train", "val"}
    assert info["splits"]["train"]["num_samples"] == 40
    assert info["source"]["kind"] == "imagefolder"
    assert len(info["pixel_stats"]["mean"]) == 3
    ds = open_dataset(out, "val")
    assert ds.classes == info["classes"] and len(ds) == 20
    # Unchanged baseline JPEGs within --max-side are stored byte for byte.
    files = sorted((photo_folder / "val").rglob("*.jpg"))
    by_class = sorted(files, key=lambda p: (info["classes"].index(p.parent.name), p.name))
    for i, path in enumerate(by_class):
        stored, label = ds.read(i)
        assert bytes(stored) == path.read_bytes()
        assert info["classes"][label] == path.parent.name


def test_a_small_split_is_about_its_images_size(photo_folder, tmp_path):
    """60 small JPEGs made 16 MB .beton files (the data started on the next 8 MiB page and the
    last page was whole): now the first page is the rest of the one the metadata ends in and
    the file ends after the last sample, so each file is its images plus a few KB."""
    from turbotrain.datasets import BetonFile
    out = tmp_path / "ds"
    cli("prepare", photo_folder, out, check=0)
    for split in ("train", "val"):
        beton = BetonFile(out / f"{split}.beton")
        payload = int(beton.sizes.sum())
        overhead = (out / f"{split}.beton").stat().st_size - payload
        assert 0 < overhead < 64 * 1024, (split, payload, overhead)  # header, tables: ~3 KB
        pages = beton.data_ptrs // beton.page_size  # still: no sample crosses a page
        assert (pages == (beton.data_ptrs + beton.sizes - 1) // beton.page_size).all()
    assert "20 images" in cli("inspect", out, check=0).stdout


def test_workers_start_after_cv2_used_its_thread_pool(photo_folder, tmp_path):
    """A program that used cv2's thread pool (here: drawing images, as bench_pipelines.py does
    before preparing them) then prepares with 2 workers: forked workers that set their own cv2
    thread count beside the inherited pool hung in pthread_cond_destroy for good."""
    code = ("import sys, cv2, numpy\n"
            "from turbotrain.datasets.prepare.convert import PrepareOptions, prepare_dataset\n"
            "cv2.setNumThreads(2)\n"
            "for _ in range(4):\n"
            "    cv2.resize(numpy.zeros((1500, 1500, 3), numpy.uint8), (300, 300),\n"
            "               interpolation=cv2.INTER_AREA)\n"
            "prepare_dataset(sys.argv[1], sys.argv[2], PrepareOptions(workers=2, "
            "progress=False))\n"
            "print(cv2.getNumThreads())\n")
    done = subprocess.run([sys.executable, "-c", code, str(photo_folder), str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["2"]  # the program's own setting is given back
    assert len(open_dataset(tmp_path / "out")) == 40


def test_max_side_downsizes_keeping_aspect(photo_folder, tmp_path):
    out = tmp_path / "small"
    cli("prepare", photo_folder, out, "--max-side", "80", check=0)
    ds = open_dataset(out)
    assert set(ds.widths.tolist()) == {80} and set(ds.heights.tolist()) == {60}
    original = np.asarray(Image.open(sorted((photo_folder / "train").rglob("*.jpg"))[0]))
    small = np.asarray(Image.fromarray(original).resize((80, 60), Image.BOX)).astype(int)
    assert np.abs(ds.image(0).astype(int) - small).mean() < 8


def test_deterministic_across_worker_counts(photo_folder, tmp_path):
    outs = []
    for workers in (1, 2):
        out = tmp_path / f"w{workers}"
        cli("prepare", photo_folder, out, "--workers", workers, "--max-side", "100", check=0)
        outs.append(out)
    for name in ("train.beton", "val.beton", "dataset.json"):
        assert (outs[0] / name).read_bytes() == (outs[1] / name).read_bytes(), name


def test_npz_raw_exact_and_val_fraction(tmp_path):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (50, 32, 32, 3), dtype=np.uint8)
    labels = np.arange(50) % 5
    np.savez(tmp_path / "d.npz", images=images, labels=labels)
    out = tmp_path / "ds"
    cli("prepare", tmp_path / "d.npz", out, "--val-fraction", "0.2", check=0)
    train, val = open_dataset(out, "train"), open_dataset(out, "val")
    assert len(train) + len(val) == 50 and len(val) == 10
    assert np.bincount(val.labels).tolist() == [2] * 5  # stratified
    seen = {}
    for ds in (train, val):
        assert (ds.modes == 1).all()  # 32 px -> raw under auto
        for i in range(len(ds)):
            seen[ds.image(i).tobytes()] = int(ds.labels[i])
    for image, label in zip(images, labels):
        assert seen[image.tobytes()] == label


def _fake_cifar_tar(path: Path) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    data = rng.integers(0, 256, (12, 3072), dtype=np.uint8)
    labels = [i % 10 for i in range(12)]
    names = [f"class{i}".encode() for i in range(10)]
    members = {"batches.meta": {b"label_names": names}}
    for k in range(1, 6):
        members[f"data_batch_{k}"] = {b"data": data[(k - 1) * 2:k * 2],
                                      b"labels": labels[(k - 1) * 2:k * 2]}
    members["test_batch"] = {b"data": data[10:], b"labels": labels[10:]}
    staging = path.parent / "cifar-10-batches-py"
    staging.mkdir()
    for name, content in members.items():
        (staging / name).write_bytes(pickle.dumps(content))
    with tarfile.open(path, "w:gz") as tar:
        tar.add(staging, arcname="cifar-10-batches-py")
    hwc = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return hwc, np.array(labels)


def test_cifar_tar_gz_raw_exact(tmp_path):
    images, labels = _fake_cifar_tar(tmp_path / "cifar-10-python.tar.gz")
    out = tmp_path / "ds"
    cli("prepare", tmp_path / "cifar-10-python.tar.gz", out, check=0)
    train, val = open_dataset(out, "train"), open_dataset(out, "val")
    assert (len(train), len(val)) == (10, 2) and train.classes[1] == "class1"
    for i in range(10):
        np.testing.assert_array_equal(train.image(i), images[i])
        assert train.labels[i] == labels[i]
    np.testing.assert_array_equal(val.image(1), images[11])


@pytest.mark.timeout(300)
def test_fashion_mnist_real_files(tmp_path):
    expect.need("fashion_mnist")
    out = tmp_path / "fmnist"
    cli("prepare", FASHION, out, check=0)
    train, val = open_dataset(out, "train"), open_dataset(out, "val")
    assert (len(train), len(val)) == (60000, 10000)
    assert train.classes[0].lower().startswith("t-shirt")
    image = train.image(0)
    assert image.shape == (28, 28, 3) and (image[..., 0] == image[..., 2]).all()
    assert np.bincount(val.labels).tolist() == [1000] * 10


def test_bad_image_fails_with_one_line_and_leaves_out_untouched(tmp_path):
    src = tmp_path / "src"
    write_shapes_imagefolder(src, train_per_class=2, val_per_class=0, size=(96, 64))
    bad = src / "train" / "circle" / "000001.jpg"
    bad.write_bytes(bad.read_bytes()[:400])  # truncated JPEG
    out = tmp_path / "ds"
    result = cli("prepare", src, out, check=2)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(bad) in lines[0] and "truncated" in lines[0].lower()
    assert not out.exists()
    assert not list(tmp_path.glob(".ds.partial-*"))


def test_skip_lists_bad_files(tmp_path):
    src = tmp_path / "src"
    write_shapes_imagefolder(src, train_per_class=2, val_per_class=0, size=(96, 64))
    (src / "train" / "circle" / "000000.jpg").write_bytes(b"")
    (src / "train" / "ring" / "notes.jpg").write_text("this is not an image")
    out = tmp_path / "ds"
    result = cli("prepare", src, out, "--on-error", "skip", check=0)
    assert "2 skipped" in result.stdout
    skipped = (out / "skipped.txt").read_text().splitlines()
    assert len(skipped) == 2 and any("000000.jpg" in s for s in skipped)
    assert len(open_dataset(out)) == 19


def test_jfif_is_read_and_every_file_passed_over_is_in_skipped_txt(tmp_path):
    """Issue 46: `.jfif` files were ignored and not listed anywhere. They are JPEGs (read by
    their bytes); every other file the listing passes over is a skipped.txt line with why."""
    src = tmp_path / "src"
    write_shapes_imagefolder(src, train_per_class=2, val_per_class=1, size=(96, 64))
    circle = src / "train" / "circle"
    jpeg = (circle / "000000.jpg").read_bytes()
    (circle / "web.jfif").write_bytes(jpeg)
    (circle / "old.JPE").write_bytes(jpeg)
    (circle / "notes.txt").write_text("drawn by hand")
    (circle / "photo.heic").write_bytes(b"\0" * 64)
    (circle / ".DS_Store").write_bytes(b"\0" * 8)
    (src / "README.md").write_text("shapes")
    (src / "train" / "LICENSE").write_text("CC0")
    out = tmp_path / "ds"
    result = cli("prepare", src, out, check=0)
    before = sum(1 for p in (src / "train").rglob("*.jpg"))
    assert len(open_dataset(out)) == before + 2  # web.jfif and old.JPE are images
    rows = dict(line.split("\t") for line in (out / "skipped.txt").read_text().splitlines())
    assert set(rows) == {str(circle / "notes.txt"), str(circle / "photo.heic"),
                         str(circle / ".DS_Store"), str(src / "README.md"),
                         str(src / "train" / "LICENSE")}
    assert rows[str(circle / "photo.heic")].startswith("not an image name (.heic; read: ")
    assert rows[str(src / "README.md")] == "not inside a class folder: not read"
    assert rows[str(circle / ".DS_Store")].startswith("a hidden (dot) file")
    assert "5 skipped" in result.stdout and "skipped.txt" in result.stdout


def test_existing_out_needs_overwrite(photo_folder, tmp_path):
    out = tmp_path / "ds"
    cli("prepare", photo_folder, out, "--max-side", "32", check=0)
    result = cli("prepare", photo_folder, out, check=2)
    assert "--overwrite" in result.stderr
    cli("prepare", photo_folder, out, "--overwrite", "--max-side", "64", check=0)
    assert json.loads((out / "dataset.json").read_text())["encoding"]["max_side"] == 64


def test_overwrite_never_replaces_a_folder_it_did_not_make(photo_folder, tmp_path):
    """--overwrite replaces a prepared dataset only; tests/security has the other cases."""
    out = tmp_path / "notes"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    result = cli("prepare", photo_folder, out, "--overwrite", check=2)
    assert "did not make it" in result.stderr and (out / "keep.txt").read_text() == "mine"


@pytest.mark.parametrize("problem", ["missing", "empty"])
def test_bad_source_is_one_clear_line(tmp_path, problem):
    src = tmp_path / "src"
    if problem == "empty":
        src.mkdir()
    result = cli("prepare", src, tmp_path / "ds", check=2)
    assert len(result.stderr.strip().splitlines()) == 1 and str(src) in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.timeout(300)
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_interrupted_conversion_leaves_no_dataset(tmp_path, sig):
    src = tmp_path / "src"
    write_shapes_imagefolder(src, train_per_class=150, val_per_class=0, size=(320, 240))
    out = tmp_path / "ds"
    # --max-side forces re-encoding so the run lasts long enough to be interrupted.
    proc = subprocess.Popen([sys.executable, "-m", "turbotrain", "prepare", str(src), str(out),
                             "--max-side", "200", "--workers", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    # The split being written: a temporary file, renamed to train.beton once complete.
    while not list(tmp_path.glob(".ds.partial-*/.train.beton.*.tmp")) and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert not out.exists()
    if sig == signal.SIGINT:
        assert "interrupted" in stderr and "Traceback" not in stderr
        assert not list(tmp_path.glob(".ds.partial-*"))
    # A later run succeeds and cleans up what a killed run left.
    cli("prepare", src, out, "--max-side", "64", check=0)
    assert not list(tmp_path.glob(".ds.partial-*"))


def test_inspect_and_verify(photo_folder, tmp_path):
    out = tmp_path / "ds"
    cli("prepare", photo_folder, out, check=0)
    text = cli("inspect", out, check=0).stdout
    assert "train: 40 images (40 jpeg, 0 raw)" in text and "circle" in text
    assert cli("verify", out, check=0).stdout.strip().endswith("ok")
    beton = out / "train.beton"
    data = bytearray(beton.read_bytes())
    ds = open_dataset(out)
    data[int(ds.beton.data_ptrs[3]) + 200] ^= 0xFF
    beton.write_bytes(data)
    result = cli("verify", out, check=2)
    assert "checksum mismatch" in result.stderr
    assert cli("inspect", tmp_path / "nothing", check=2).stderr.count("\n") == 1


def _die(bounds):
    os._exit(3)


@pytest.mark.timeout(120)
def test_a_dead_worker_is_an_error_not_a_hang(photo_folder, tmp_path, monkeypatch):
    from turbotrain.datasets.prepare import convert
    monkeypatch.setattr(convert, "_encode_range", _die)  # workers are forked: they see it
    with pytest.raises(convert.PrepareError, match="worker died"):
        convert.prepare_dataset(photo_folder, tmp_path / "ds",
                                convert.PrepareOptions(workers=2, progress=False))
    assert not (tmp_path / "ds").exists()


def test_inspect_describes_an_empty_split(tmp_path):
    """A --val-fraction of classes with one sample each leaves val empty: inspect says so."""
    from tests.train.tiny_data import write_tiny_dataset
    out = write_tiny_dataset(tmp_path / "ds", train=8, val=0)
    result = cli("inspect", out, check=0)
    assert "val: 0 images (0 jpeg, 0 raw)" in result.stdout and "Traceback" not in result.stderr
