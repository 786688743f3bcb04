"""detect_source / with_val_split over every SOURCE kind, built small in tmp_path."""
from __future__ import annotations

import gzip
import io
import os
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from turbotrain.datasets.beton.sample_codec import encode_sample
from turbotrain.datasets.prepare.split_order import with_val_split
from turbotrain.datasets.sources.arrays import FASHION_MNIST_CLASSES
from turbotrain.datasets.sources.detect import detect_source
from turbotrain.datasets.sources.source import ArraySplit, FileSplit, SourceError

FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")


def write_image(path: Path, value: int = 0, fmt: str | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (8, 6), (value, 255 - value, 7)).save(path, fmt)
    return path


def image_folder(root: Path, layout: dict[str, list[str]]) -> Path:
    """layout: {class folder (may include a split prefix): [file names]}."""
    root.mkdir(parents=True, exist_ok=True)
    for folder, names in layout.items():
        (root / folder).mkdir(parents=True, exist_ok=True)
        for k, name in enumerate(reversed(names)):  # created out of order on purpose
            write_image(root / folder / name, value=10 * k, fmt="PNG")
    return root


def relpaths(split) -> list[str]:
    return [os.path.relpath(split.name(i), split.root) for i in range(len(split))]


# --- ImageFolder -------------------------------------------------------------------------------

def test_image_folder_one_split(tmp_path):
    root = image_folder(tmp_path / "pets", {
        "dog": ["b.jpg", "a.PNG", "sub/c.jpeg"],
        "cat": ["z.webp", "y.tif"],
    })
    (root / "dog" / "notes.txt").write_text("not an image")
    (root / "dog" / "._a.jpg").write_bytes(b"macOS resource fork")
    (root / "README.md").write_text("hi")
    source = detect_source(root)
    assert source.kind == "imagefolder" and source.path == root
    assert source.classes == ["cat", "dog"]
    assert list(source.splits) == ["train"]
    train = source.splits["train"]
    assert isinstance(train, FileSplit) and len(train) == 5
    assert relpaths(train) == ["cat/y.tif", "cat/z.webp", "dog/a.PNG", "dog/b.jpg",
                               "dog/sub/c.jpeg"]
    assert train.labels.dtype == np.int64 and train.labels.tolist() == [0, 0, 1, 1, 1]
    assert train.load(3) == (root / "dog" / "b.jpg").read_bytes()
    assert train.name(3) == str(root / "dog" / "b.jpg")


def test_image_folder_train_val_shares_labels(tmp_path):
    root = image_folder(tmp_path / "ds", {
        "train/cat": ["1.jpg"], "train/dog": ["2.jpg"],
        "val/dog": ["3.jpg"], "val/eel": ["4.jpg"],  # val lacks cat, has eel
    })
    source = detect_source(root)
    assert source.classes == ["cat", "dog", "eel"]
    assert source.splits["train"].labels.tolist() == [0, 1]
    assert source.splits["val"].labels.tolist() == [1, 2]
    assert relpaths(source.splits["val"]) == ["val/dog/3.jpg", "val/eel/4.jpg"]


def test_image_folder_test_becomes_val(tmp_path):
    root = image_folder(tmp_path / "ds", {"train/a": ["1.png"], "test/a": ["2.png", "3.png"]})
    source = detect_source(root)
    assert sorted(source.splits) == ["train", "val"]
    assert len(source.splits["val"]) == 2


def test_class_named_train_is_a_class(tmp_path):
    root = image_folder(tmp_path / "vehicles", {"train": ["1.png"], "bus": ["2.png"]})
    source = detect_source(root)
    assert source.classes == ["bus", "train"] and list(source.splits) == ["train"]


@pytest.mark.parametrize("layout, message", [
    ({"cat": ["1.png"], "dog": []}, "class folder .*dog is empty"),
    ({"train/cat": ["1.png"], "val/dog": []}, "class folder .*val/dog is empty"),
    ({"train/cat": ["1.png"], "extra/x": ["2.png"]}, "also extra/"),
    ({"train/cat": ["1.png"], "val": []}, "ds/val holds no class subfolders"),
    ({}, "holds no images: expected class subfolders"),
    ({".": ["loose.jpg"], "cat": ["1.png"]}, "outside class folders \\(e.g. loose.jpg\\)"),
])
def test_image_folder_errors(tmp_path, layout, message):
    root = image_folder(tmp_path / "ds", layout)
    with pytest.raises(SourceError, match=message):
        detect_source(root)


def test_missing_source(tmp_path):
    with pytest.raises(SourceError, match="SOURCE .*nope does not exist"):
        detect_source(tmp_path / "nope")


def test_folder_with_a_list_file_hints_to_pass_it(tmp_path):
    (tmp_path / "data.npz").write_bytes(b"")
    with pytest.raises(SourceError, match="pass that file as SOURCE"):
        detect_source(tmp_path)


# --- CSV / TSV lists ---------------------------------------------------------------------------

@pytest.mark.parametrize("name, text", [
    ("list.csv", "path,label\nimg/b.png,dog\nimg/a.png,cat\n\nimg/c.png,dog\n"),
    ("list.csv", "img/b.png,dog\nimg/a.png,cat\nimg/c.png,dog\n"),
    ("list.tsv", "file\tclass\nimg/b.png\tdog\nimg/a.png\tcat\nimg/c.png\tdog\n"),
    ("list.txt", "img/b.png dog\nimg/a.png cat\nimg/c.png dog\n"),
])
def test_list_with_class_names(tmp_path, monkeypatch, name, text):
    for image in "abc":
        write_image(tmp_path / "img" / f"{image}.png", fmt="PNG")
    (tmp_path / name).write_text(text)
    monkeypatch.chdir(Path("/"))  # paths are relative to the list, not the working directory
    source = detect_source(tmp_path / name)
    assert source.kind == "csv" and source.classes == ["cat", "dog"]
    train = source.splits["train"]
    assert train.labels.tolist() == [1, 0, 1]  # list order kept
    assert train.load(1) == (tmp_path / "img" / "a.png").read_bytes()


def test_list_with_integer_labels_and_absolute_paths(tmp_path):
    image = write_image(tmp_path / "x.png", fmt="PNG")
    (tmp_path / "list.csv").write_text(f"{image},3\nx.png,1\n")
    source = detect_source(tmp_path / "list.csv")
    assert source.classes == ["0", "1", "2", "3"]
    assert source.splits["train"].labels.tolist() == [3, 1]


@pytest.mark.parametrize("text, message", [
    ("missing.png,cat\n", "list.csv:1: .*missing.png does not exist"),
    ("path,label\nx.png\n", "list.csv:2: expected 'path,label'"),
    ("path,label\n", "lists no images"),
])
def test_list_errors(tmp_path, text, message):
    write_image(tmp_path / "x.png", fmt="PNG")
    (tmp_path / "list.csv").write_text(text)
    with pytest.raises(SourceError, match=message):
        detect_source(tmp_path / "list.csv")


# --- CIFAR -------------------------------------------------------------------------------------

def cifar_rows(count: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (count, 3072), dtype=np.uint8)


def numpy1_pickle(obj) -> bytes:
    """Protocol 2 with numpy 1's module names, as in the real (Python 2 cPickle) batches."""
    return pickle.dumps(obj, protocol=2).replace(b"numpy._core.multiarray",
                                                 b"numpy.core.multiarray")


def cifar10_files(per_batch: int = 4) -> dict[str, bytes]:
    files = {}
    for k, name in enumerate([f"data_batch_{b}" for b in range(1, 6)] + ["test_batch"]):
        files[name] = numpy1_pickle({
            b"batch_label": name.encode(), b"data": cifar_rows(per_batch, k),
            b"labels": [(k + i) % 10 for i in range(per_batch)],
            b"filenames": [f"img{i}.png".encode() for i in range(per_batch)]})
    files["batches.meta"] = numpy1_pickle({
        b"label_names": [n.encode() for n in ["airplane", "automobile", "bird", "cat", "deer",
                                              "dog", "frog", "horse", "ship", "truck"]],
        b"num_cases_per_batch": per_batch, b"num_vis": 3072})
    return files


def cifar100_files() -> dict[str, bytes]:
    files = {}
    for k, (name, count) in enumerate([("train", 6), ("test", 3)]):
        files[name] = numpy1_pickle({
            b"data": cifar_rows(count, 10 + k), b"fine_labels": list(range(count)),
            b"coarse_labels": [0] * count, b"filenames": [b"x.png"] * count})
    files["meta"] = numpy1_pickle({b"fine_label_names": [f"f{i}".encode() for i in range(100)],
                                   b"coarse_label_names": [f"c{i}".encode() for i in range(20)]})
    return files


def write_folder(folder: Path, files: dict[str, bytes]) -> Path:
    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return folder


def write_tar(path: Path, top: str, files: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def check_cifar10(source, per_batch: int = 4):
    assert source.kind == "cifar10"
    assert source.classes[:3] == ["airplane", "automobile", "bird"] and len(source.classes) == 10
    train, val = source.splits["train"], source.splits["val"]
    assert isinstance(train, ArraySplit)
    assert (len(train), len(val)) == (5 * per_batch, per_batch)
    assert train.labels.tolist()[:per_batch] == [0, 1, 2, 3]
    assert train.name(per_batch + 1) == "data_batch_2[1]" and val.name(2) == "test_batch[2]"
    rows = cifar_rows(per_batch, 1)  # data_batch_2
    image = train.load(per_batch + 1)
    assert image.shape == (32, 32, 3) and image.dtype == np.uint8
    for channel in range(3):  # planes R, G, B; each 32 rows of 32
        assert image[1, 2, channel] == rows[1, channel * 1024 + 1 * 32 + 2]


def test_cifar10_folder(tmp_path):
    check_cifar10(detect_source(write_folder(tmp_path / "cifar-10-batches-py", cifar10_files())))


def test_cifar10_extracted_inside_a_folder(tmp_path):
    write_folder(tmp_path / "cifar-10-batches-py", cifar10_files())
    check_cifar10(detect_source(tmp_path))


def test_cifar10_archive(tmp_path):
    archive = write_tar(tmp_path / "cifar-10-python.tar.gz", "cifar-10-batches-py",
                        cifar10_files())
    check_cifar10(detect_source(archive))
    check_cifar10(detect_source(tmp_path))  # the folder the archive was downloaded to


def test_cifar100_folder_and_archive(tmp_path):
    folder = write_folder(tmp_path / "cifar-100-python", cifar100_files())
    archive = write_tar(tmp_path / "c100.tar.gz", "cifar-100-python", cifar100_files())
    for source in (detect_source(folder), detect_source(archive)):
        assert source.kind == "cifar100" and len(source.classes) == 100
        assert source.classes[5] == "f5"
        assert source.splits["train"].labels.tolist() == [0, 1, 2, 3, 4, 5]
        assert len(source.splits["val"]) == 3 and source.splits["val"].name(0) == "test[0]"


def test_cifar_missing_batch(tmp_path):
    files = cifar10_files()
    del files["data_batch_3"]
    with pytest.raises(SourceError, match="lacks data_batch_3"):
        detect_source(write_folder(tmp_path / "c10", files))
    with pytest.raises(SourceError, match="lacks data_batch_3"):
        detect_source(write_tar(tmp_path / "c10.tar.gz", "cifar-10-batches-py", files))


def test_cifar_pickle_cannot_run_code(tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.getcwd, ())  # harmless if the guard ever fails
    files = cifar10_files()
    files["data_batch_1"] = pickle.dumps({b"data": Evil()}, protocol=2)
    with pytest.raises(SourceError, match="refusing to load"):
        detect_source(write_folder(tmp_path / "c10", files))


def test_not_a_cifar_archive(tmp_path):
    archive = write_tar(tmp_path / "other.tar.gz", "something", {"a": b"x"})
    with pytest.raises(SourceError, match="extract it"):
        detect_source(archive)


# --- MNIST-style idx ---------------------------------------------------------------------------

def idx_bytes(array: np.ndarray) -> bytes:
    header = bytes([0, 0, 8, array.ndim]) + b"".join(d.to_bytes(4, "big") for d in array.shape)
    return header + array.astype(np.uint8).tobytes()


def write_idx_set(folder: Path, compress: bool, train: int = 12, val: int = 5) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for prefix, count in (("train", train), ("t10k", val)):
        for what, array in (("images-idx3", rng.integers(0, 256, (count, 28, 28))),
                            ("labels-idx1", np.arange(count) % 10)):
            data = idx_bytes(array)
            name = f"{prefix}-{what}-ubyte"
            if compress:
                (folder / f"{name}.gz").write_bytes(gzip.compress(data))
            else:
                (folder / name).write_bytes(data)
    return folder


@pytest.mark.parametrize("compress", [True, False])
def test_idx_folder(tmp_path, compress):
    source = detect_source(write_idx_set(tmp_path / "mnist", compress))
    assert source.kind == "idx" and source.classes == [str(k) for k in range(10)]
    train, val = source.splits["train"], source.splits["val"]
    assert (len(train), len(val)) == (12, 5)
    assert train.load(0).shape == (28, 28) and train.labels.tolist()[:3] == [0, 1, 2]
    suffix = ".gz" if compress else ""
    assert val.name(4) == f"t10k-images-idx3-ubyte{suffix}[4]"


def test_idx_fashion_names_and_file_path(tmp_path):
    folder = write_idx_set(tmp_path / "fashion-mnist", compress=True)
    source = detect_source(folder / "train-images-idx3-ubyte.gz")
    assert source.path == folder and source.classes == FASHION_MNIST_CLASSES


def test_idx_truncated(tmp_path):
    folder = write_idx_set(tmp_path / "mnist", compress=False)
    path = folder / "train-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(SourceError, match="header says 12x28x28 = 9408 bytes, file has 9308"):
        detect_source(folder)


def test_idx_damaged_gzip_and_magic(tmp_path):
    folder = write_idx_set(tmp_path / "a", compress=True)
    path = folder / "train-labels-idx1-ubyte.gz"
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(SourceError, match="is damaged"):
        detect_source(folder)
    folder = write_idx_set(tmp_path / "b", compress=False)
    (folder / "train-labels-idx1-ubyte").write_bytes(bytes([0, 0, 8, 3]) + b"\0" * 20)
    with pytest.raises(SourceError, match="magic 0x00000803, expected 0x00000801"):
        detect_source(folder)


def test_idx_count_mismatch_and_missing_pair(tmp_path):
    folder = write_idx_set(tmp_path / "a", compress=False)
    (folder / "t10k-labels-idx1-ubyte").write_bytes(idx_bytes(np.zeros(4, np.uint8)))
    with pytest.raises(SourceError, match="4 labels for 5 images"):
        detect_source(folder)
    os.remove(folder / "t10k-labels-idx1-ubyte")
    with pytest.raises(SourceError, match="no matching labels"):
        detect_source(folder)


def test_real_fashion_mnist():
    if not FASHION_MNIST.is_dir():
        pytest.fail(f"{FASHION_MNIST} is missing: `apt-get install dataset-fashion-mnist` "
                    f"(CI installs it; this test checks the idx reader on the real files)")
    source = detect_source(FASHION_MNIST)
    assert source.kind == "idx" and source.classes == FASHION_MNIST_CLASSES
    train, val = source.splits["train"], source.splits["val"]
    assert (len(train), len(val)) == (60000, 10000)
    assert np.bincount(train.labels).tolist() == [6000] * 10
    assert np.bincount(val.labels).tolist() == [1000] * 10
    image = train.load(0)
    assert image.shape == (28, 28) and image.dtype == np.uint8 and image.max() > 0
    assert encode_sample(image, encoding="auto", max_side=0, quality=90).mode == 1  # raw
    assert len(source.fingerprint()) == 64


# --- npz ---------------------------------------------------------------------------------------

def test_npz_with_val_and_classes(tmp_path):
    path = tmp_path / "d.npz"
    rng = np.random.default_rng(0)
    np.savez(path, images=rng.integers(0, 256, (6, 16, 16, 3), dtype=np.uint8),
             labels=np.array([0, 1, 2, 0, 1, 2]), classes=np.array(["a", "b", "c"]),
             val_images=rng.integers(0, 256, (2, 16, 16, 3), dtype=np.uint8),
             val_labels=np.array([2, 0], dtype=np.uint8))
    source = detect_source(path)
    assert source.kind == "npz" and source.classes == ["a", "b", "c"]
    assert len(source.splits["train"]) == 6 and source.splits["val"].labels.tolist() == [2, 0]
    assert source.splits["val"].name(1) == "d.npz:val_images[1]"
    assert source.splits["train"].load(0).shape == (16, 16, 3)


def test_npz_greyscale_without_classes(tmp_path):
    path = tmp_path / "g.npz"
    np.savez(path, images=np.zeros((3, 28, 28), np.uint8), labels=np.array([4, 0, 1]))
    source = detect_source(path)
    assert source.classes == ["0", "1", "2", "3", "4"] and list(source.splits) == ["train"]


@pytest.mark.parametrize("arrays, message", [
    ({"arr_0": np.zeros((1, 2, 2), np.uint8)},
     "needs arrays 'images' and 'labels'; it holds arr_0"),
    ({"images": np.zeros((2, 4, 4), np.float32), "labels": np.zeros(2, int)}, "float32"),
    ({"images": np.zeros((2, 4, 4), np.uint8), "labels": np.zeros(3, int)}, "3 labels for 2"),
    ({"images": np.zeros((2, 4, 4), np.uint8), "labels": np.array([0, 5]),
      "classes": np.array(["a", "b"])}, "label 5 but only 2 classes"),
    ({"images": np.zeros((2, 4, 4), np.uint8), "labels": np.zeros(2, int),
      "val_images": np.zeros((2, 4, 4), np.uint8)}, "only one of"),
])
def test_npz_errors(tmp_path, arrays, message):
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(SourceError, match=message):
        detect_source(tmp_path / "bad.npz")


def test_npz_not_a_zip(tmp_path):
    (tmp_path / "x.npz").write_text("hello")
    with pytest.raises(SourceError, match="not a readable .npz"):
        detect_source(tmp_path / "x.npz")


# --- val carving, fingerprints, pickling -------------------------------------------------------

def array_source(tmp_path, class_sizes: list[int]):
    labels = np.concatenate([np.full(n, c) for c, n in enumerate(class_sizes)])
    labels = labels[np.random.default_rng(5).permutation(len(labels))]  # classes interleaved
    images = np.arange(len(labels), dtype=np.uint8)[:, None, None] * np.ones((1, 2, 2), np.uint8)
    np.savez(tmp_path / "s.npz", images=images, labels=labels)
    return detect_source(tmp_path / "s.npz")


def test_val_split_is_stratified_and_deterministic(tmp_path):
    source = array_source(tmp_path, [10, 5, 1, 2, 3, 20])
    carved = with_val_split(source, 0.2)
    train, val = carved.splits["train"], carved.splits["val"]
    # round half up of 0.2 * n, at least one left in train: 2, 1, 0 (n = 1), 0 (0.4), 1 (0.6), 4
    assert np.bincount(val.labels, minlength=6).tolist() == [2, 1, 0, 0, 1, 4]
    assert np.bincount(train.labels).tolist() == [8, 4, 1, 2, 2, 16]
    ids = lambda split: [int(split.load(i)[0, 0]) for i in range(len(split))]  # noqa: E731
    assert sorted(ids(train) + ids(val)) == list(range(41))
    assert ids(train) == sorted(ids(train)) and ids(val) == sorted(ids(val))  # order kept
    assert val.name(0) == f"s.npz:images[{ids(val)[0]}]"
    again = with_val_split(source, 0.2)
    assert ids(again.splits["val"]) == ids(val)
    assert ids(with_val_split(source, 0.2, seed=1).splits["val"]) != ids(val)
    assert carved.classes == source.classes and carved.kind == "npz"


def test_val_split_keeps_one_train_sample(tmp_path):
    source = array_source(tmp_path, [2, 2])
    carved = with_val_split(source, 0.9)
    assert np.bincount(carved.splits["train"].labels).tolist() == [1, 1]
    assert np.bincount(carved.splits["val"].labels).tolist() == [1, 1]


def test_val_split_refusals(tmp_path):
    source = array_source(tmp_path, [4])
    for fraction in (0, 1, 1.5):
        with pytest.raises(SourceError, match="between 0 and 1"):
            with_val_split(source, fraction)
    with pytest.raises(SourceError, match="already has a val split"):
        with_val_split(with_val_split(source, 0.5), 0.5)


def test_val_split_of_files(tmp_path):
    root = image_folder(tmp_path / "ds", {"a": [f"{k}.png" for k in range(6)], "b": ["x.png"]})
    carved = with_val_split(detect_source(root), 0.5)
    assert len(carved.splits["val"]) == 3 and set(carved.splits["val"].labels) == {0}
    assert isinstance(carved.splits["val"], FileSplit)


def test_fingerprint_follows_the_files(tmp_path):
    root = image_folder(tmp_path / "ds", {"a": ["1.png", "2.png"], "b": ["3.png"]})
    first = detect_source(root).fingerprint()
    assert detect_source(root).fingerprint() == first
    assert with_val_split(detect_source(root), 0.5).fingerprint() == first
    os.utime(root / "a" / "1.png", ns=(1, 1))
    touched = detect_source(root).fingerprint()
    assert touched != first
    write_image(root / "b" / "4.png", fmt="PNG")
    assert detect_source(root).fingerprint() != touched


def test_fingerprint_of_single_file_sources(tmp_path):
    path = tmp_path / "s.npz"
    np.savez(path, images=np.zeros((2, 4, 4), np.uint8), labels=np.zeros(2, int))
    first = detect_source(path).fingerprint()
    stat = path.stat()
    np.savez(path, images=np.ones((2, 4, 4), np.uint8), labels=np.zeros(2, int))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same size and mtime...
    assert detect_source(path).fingerprint() != first  # ...but different bytes


def test_splits_pickle_for_worker_processes(tmp_path):
    folder_source = detect_source(image_folder(tmp_path / "ds", {"a": ["1.png"]}))
    array = detect_source(write_folder(tmp_path / "c10", cifar10_files())).splits["val"]
    for split in (folder_source.splits["train"], array):
        copy = pickle.loads(pickle.dumps(split))
        assert len(copy) == len(split) and copy.name(0) == split.name(0)
        assert np.array_equal(np.asarray(copy.load(0)), np.asarray(split.load(0)))
    assert "FileSplit(1 files" in repr(folder_source.splits["train"])


def test_every_source_kind_encodes(tmp_path):
    sources = [detect_source(write_folder(tmp_path / "c10", cifar10_files())),
               detect_source(write_idx_set(tmp_path / "m", compress=True)),
               detect_source(image_folder(tmp_path / "ds", {"a": ["1.png"]}))]
    for source in sources:
        for split in source.splits.values():
            sample = encode_sample(split.load(0), encoding="auto", max_side=0, quality=90)
            assert sample.mode == 1 and sample.height in (6, 28, 32)
