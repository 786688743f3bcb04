"""Nothing a prepared dataset's `dataset.json` holds may run code, hang us, exhaust memory or print
a raw traceback: each reproduced case through the real CLI (inspect, verify, train) in a child
process under a memory cap and a timeout, and a seeded fuzz of dataset.json in one child.

Every CLI case asserts the same things (`assert_refused`): exit code 2, exactly one stderr line
naming the file and the field, no traceback, peak RSS under a cap, and no file changed under the
test's folder.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import simplejpeg

from turbotrain.datasets import DatasetError, open_dataset
from turbotrain.datasets.beton import layout
from turbotrain.datasets.beton.split import file_sha256
from turbotrain.datasets.beton.verify import describe
from turbotrain.datasets.beton.writer import BetonWriter

from .confined import Ran, run_confined, run_json_script, tree_state, turbotrain

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("child_processes")]

FUZZ_SCRIPT = Path(__file__).with_name("fuzz_dataset_json.py")

# Memory caps, measured on the 2-core dev box (python 3.11, torch CPU, DALI/cv2 installed):
# - inspect / verify of a tiny dataset peak at 32 / 75 MB RSS; verify maps ~0.55 GB of address
#   space (cv2 and OpenBLAS thread stacks: it crashes under a 512 MiB RLIMIT_AS). 2 GiB of
#   address space and 256 MB of RSS leave room, yet a 108 MB decode of a lying JPEG shows.
# - a 1-step CPU `train` peaks at 0.9 GB RSS and needs 4-6 GiB of address space (it fails to
#   start under 4 GiB: torch, oneDNN); 8 GiB and 2 GB RSS. A 2**40-class output layer fails both.
READER_ADDRESS_SPACE = 2 << 30
READER_PEAK_RSS = 256 << 20
TRAIN_ADDRESS_SPACE = 8 << 30
TRAIN_PEAK_RSS = 2 << 30
CLI_TIMEOUT = 60   # seconds; a normal inspect takes 0.3 s, a failing train ~5 s
TRAIN_FLAGS = ["--device", "cpu", "--threads", "1", "--workers", "0", "--max-steps", "1",
               "--epochs", "1", "--batch-size", "8", "--pipeline", "pytorch",
               "--no-tensorboard"]


# -- running the CLI confined (tests/security/confined.py) ------------------------------------
def cli(command: str, target: Path, *extra, cwd: Path) -> Ran:
    train = command == "train"
    args = turbotrain(command, *(["--data", target, *extra, *TRAIN_FLAGS] if train else [target]))
    return run_confined(args, cwd=cwd, timeout=CLI_TIMEOUT,
                        address_space=TRAIN_ADDRESS_SPACE if train else READER_ADDRESS_SPACE)


def assert_refused(ran: Ran, prefix: str, expected: str, *, peak_rss: int) -> str:
    """Exit 2 with exactly one stderr line, which starts with `prefix` and contains `expected`;
    no traceback; RSS."""
    line = ran.error_line(prefix)
    assert ran.stderr.splitlines() == [line], ran.stderr
    assert expected in line, line
    assert ran.peak_rss < peak_rss, f"peak RSS {ran.peak_rss >> 20} MB"
    return line


def check_cli(tmp_path: Path, commands, target: Path, expected: str) -> None:
    """Runs each command on target and asserts it is refused with `expected`, changing nothing
    under tmp_path (train's --out folder aside)."""
    for command in commands:
        run_dir = tmp_path / f"run-{command}"
        before = tree_state(tmp_path, skip=run_dir)
        extra = ["--out", run_dir] if command == "train" else []
        ran = cli(command, target, *extra, cwd=tmp_path)
        prefix = f"{'turbotrain ' if command != 'train' else ''}{command}: error: "
        assert_refused(ran, prefix, expected, peak_rss=TRAIN_PEAK_RSS if command == "train"
                       else READER_PEAK_RSS)
        assert tree_state(tmp_path, skip=run_dir) == before, f"{command} changed files"


# -- datasets ------------------------------------------------------------------------------------
def gradient_images(count: int, height: int = 24, width: int = 32) -> np.ndarray:
    y, x = np.mgrid[0:height, 0:width]
    return np.stack([np.clip(np.stack([x * 6 + 5 * k, y * 7 + 3 * k, (x + y) * 3 + k], -1),
                             0, 255) for k in range(count)]).astype(np.uint8)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    """A real prepare-dataset output (JPEG, train 12 + val 4, 3 classes), never modified."""
    from turbotrain.datasets.prepare.convert import PrepareOptions, prepare_dataset
    root = tmp_path_factory.mktemp("prepared")
    images = gradient_images(16)
    np.savez(root / "src.npz", images=images[:12], labels=np.arange(12) % 3,
             val_images=images[12:], val_labels=np.arange(4) % 3,
             classes=np.array(["cat", "dog", "bird"]))
    prepare_dataset(root / "src.npz", root / "out",
                    PrepareOptions(encoding="jpeg", workers=1, progress=False))
    return root / "out"


@pytest.fixture
def dataset(prepared, tmp_path) -> Path:
    """A private copy of the prepared dataset, to damage."""
    return Path(shutil.copytree(prepared, tmp_path / "ds"))


def edit_json(root: Path, edit) -> None:
    info = json.loads((root / "dataset.json").read_text())
    edit(info)
    (root / "dataset.json").write_text(json.dumps(info))


def write_split(path: Path, samples) -> Path:
    """A .beton of (mode, height, width, payload, label) samples, 2 MiB pages."""
    with BetonWriter(path, len(samples), page_size=layout.MIN_PAGE_SIZE) as writer:
        for sample in samples:
            writer.append(*sample)
    return path


def write_small_dataset(root: Path, *, train: int = 12, val: int = 4) -> Path:
    """A dataset.json + .beton folder as prepare writes it, with 2 MiB pages (4 MB files, so a
    fuzz loop can verify it hundreds of times) and both storage modes: even samples JPEG."""
    root.mkdir(parents=True)
    images = gradient_images(train + val)
    splits = {}
    for split, chunk in (("train", images[:train]), ("val", images[train:])):
        h, w = chunk.shape[1:3]
        path = write_split(root / f"{split}.beton", [
            (layout.MODE_JPEG, h, w, simplejpeg.encode_jpeg(image, quality=90), i % 3) if i % 2 == 0
            else (layout.MODE_RAW, h, w, image.tobytes(), i % 3) for i, image in enumerate(chunk)])
        splits[split] = {"file": path.name, "num_samples": len(chunk), "skipped": 0,
                         "encodings": {"jpeg": (len(chunk) + 1) // 2, "raw": len(chunk) // 2},
                         "bytes": path.stat().st_size, "sha256": file_sha256(path)}
    info = {"format_version": 1, "turbotrain_version": "0", "classes": ["cat", "dog", "bird"],
            "splits": splits,
            "pixel_stats": {"mean": [100.0, 90.0, 80.0], "std": [50.0, 40.0, 30.0],
                            "split": "train"},
            "encoding": {"encoding": "auto", "max_side": 512, "quality": 90,
                         "page_size": layout.MIN_PAGE_SIZE},
            "source": {"path": "/data/src.npz", "kind": "npz", "fingerprint": "0" * 64,
                       "val_fraction": 0.0}}
    (root / "dataset.json").write_text(json.dumps(info))
    return root


# -- a malformed dataset.json --------------------------------------------------------------------
def _parent(info: dict, keys: tuple):
    for key in keys[:-1]:
        info = info[key]
    return info


def _drop(*keys):
    def edit(info):
        del _parent(info, keys)[keys[-1]]
    return edit


def _set(value, *keys):
    def edit(info):
        _parent(info, keys)[keys[-1]] = value
    return edit


MALFORMED = {
    "classes missing": (_drop("classes"),
                        "classes must be a non-empty list of class names, not missing"),
    "classes a string": (_set("cat,dog", "classes"),
                         "classes must be a non-empty list of class names, not 'cat,dog'"),
    "class name a number": (_set(["cat", 7, "bird"], "classes"),
                            "classes[1] must be a name of at most 1,000 characters, not 7"),
    "splits missing": (_drop("splits"), "splits must be an object holding a train and/or val"),
    "splits a list": (_set(["train.beton"], "splits"), "splits must be an object"),
    "file missing": (_drop("splits", "train", "file"),
                     "splits.train.file must be a file name inside"),
    "file a number": (_set(3, "splits", "val", "file"), "splits.val.file must be a file name"),
    "file traverses": (_set("../ds/train.beton", "splits", "train", "file"),
                       "splits.train.file must be a file name inside"),
    "num_samples a boolean": (_set(True, "splits", "train", "num_samples"),
                              "splits.train.num_samples must be a whole number >= 0, not True"),
    "bytes negative": (_set(-5, "splits", "train", "bytes"),
                       "splits.train.bytes must be a whole number >= 0, not -5"),
    "sha256 not hex": (_set("z" * 64, "splits", "train", "sha256"),
                       "splits.train.sha256 must be 64 hexadecimal digits"),
    "mean missing": (_drop("pixel_stats", "mean"),
                     "pixel_stats.mean must be a list of 3 finite numbers (one per RGB channel), "
                     "not missing"),
    "mean a string": (_set("grey", "pixel_stats", "mean"),
                      "pixel_stats.mean must be a list of 3 finite numbers"),
    "std NaN": (_set([float("nan"), 1.0, 1.0], "pixel_stats", "std"),
                "pixel_stats.std must be a list of 3 finite numbers"),
    "mean out of range": (_set([300, 1, 1], "pixel_stats", "mean"),
                          "pixel_stats.mean must lie in 0..255, not [300, 1, 1]"),
    "version a boolean": (_set(True, "format_version"), "dataset format version True"),
    "encoding a list": (_set([1], "encoding"), "encoding must be an object, not [1]"),
    "source path a number": (_set(5, "source", "path"), "source.path must be a string, not 5"),
    "unknown split": (_set({"file": "train.beton", "num_samples": 1}, "splits", "test"),
                      "splits has a split named 'test'; expected train or val"),
}


@pytest.mark.parametrize("case", MALFORMED, ids=list(MALFORMED))
def test_malformed_dataset_json_is_one_line(case, dataset, tmp_path):
    edit, expected = MALFORMED[case]
    edit_json(dataset, edit)
    with pytest.raises(DatasetError, match="dataset.json: ") as error:
        open_dataset(dataset)
    assert expected in str(error.value) and "\n" not in str(error.value)
    check_cli(tmp_path, ["inspect", "verify"], dataset, f"{dataset}/dataset.json: {expected}")


def test_malformed_dataset_json_fails_train_in_one_line(dataset, tmp_path):
    edit_json(dataset, _drop("classes"))
    check_cli(tmp_path, ["train"], dataset, f"{dataset}/dataset.json: classes must be")


def test_zero_std_is_refused_before_training(dataset, tmp_path):
    """It used to train and stop at "loss is nan, try a lower lr"."""
    edit_json(dataset, _set([0, 0, 0], "pixel_stats", "std"))
    expected = (f"{dataset}/dataset.json: pixel_stats.std is [0, 0, 0]: the dataset's pixels "
                f"have zero spread; re-run prepare-dataset or fix dataset.json")
    check_cli(tmp_path, ["inspect", "train"], dataset, expected)


# -- split files that would hang a read ----------------------------------------------------------
def test_file_naming_a_device_is_refused(dataset, tmp_path):
    """"file": "/dev/zero" used to make verify hash an endless stream."""
    edit_json(dataset, _set("/dev/zero", "splits", "train", "file"))
    expected = (f"{dataset}/dataset.json: splits.train.file must be a file name inside "
                f"{dataset}, not '/dev/zero'")
    check_cli(tmp_path, ["verify", "inspect"], dataset, expected)


def test_split_file_that_is_a_named_pipe(dataset, tmp_path):
    """open() of a FIFO blocks until a writer comes: verify used to hang there."""
    (dataset / "train.beton").unlink()
    os.mkfifo(dataset / "train.beton")
    expected = f"{dataset}/train.beton: is a named pipe, not a regular file"
    check_cli(tmp_path, ["verify", "inspect"], dataset, expected)
    with pytest.raises(DatasetError, match="named pipe"):
        open_dataset(dataset / "train.beton")  # a bare .beton path too


def test_split_file_linking_outside_the_folder(dataset, tmp_path):
    (dataset / "val.beton").unlink()
    os.symlink("/dev/zero", dataset / "val.beton")
    expected = (f"{dataset}/val.beton: resolves to /dev/zero, outside the dataset folder "
                f"{dataset}; re-run prepare-dataset")
    check_cli(tmp_path, ["verify"], dataset, expected)


def test_dataset_json_that_is_a_named_pipe(dataset, tmp_path):
    (dataset / "dataset.json").unlink()
    os.mkfifo(dataset / "dataset.json")
    check_cli(tmp_path, ["inspect"], dataset,
              f"{dataset}/dataset.json: is a named pipe, not a regular file")


@pytest.mark.parametrize("bomb", [b"[" * 100_000, b'{"a":' * 100_000])
def test_json_nesting_bomb_is_one_line(bomb, dataset, tmp_path):
    (dataset / "dataset.json").write_bytes(bomb)
    check_cli(tmp_path, ["inspect"], dataset,
              f"{dataset}/dataset.json: not valid dataset metadata (JSON nested too deeply)")


def test_oversized_dataset_json_is_not_read(dataset, tmp_path):
    with open(dataset / "dataset.json", "ab") as f:
        f.truncate(64 << 20)  # a 64 MiB sparse file: over the 16 MiB cap, refused by its size
    check_cli(tmp_path, ["inspect"], dataset,
              f"{dataset}/dataset.json: is 64 MiB, over the 16 MiB limit for one file")


# -- names printed on the terminal ---------------------------------------------------------------
def test_inspect_escapes_names_from_the_dataset(dataset, tmp_path):
    hostile = ["\x1b]0;owned\x07cat", "dog\x1b[2J", "\u202egpj.exe"]
    edit_json(dataset, _set(hostile, "classes"))
    edit_json(dataset, _set("/data/\x1b[31mred", "source", "path"))
    ran = cli("inspect", dataset, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert "\x1b" not in ran.stdout and "\u202e" not in ran.stdout and "\x07" not in ran.stdout
    assert "\\x1b]0;owned\\x07cat, dog\\x1b[2J, \\u202egpj.exe" in ran.stdout
    assert "at /data/\\x1b[31mred" in ran.stdout
    assert describe(dataset) == ran.stdout.rstrip("\n")


def test_cli_errors_escape_the_path(tmp_path):
    missing = tmp_path / "no\x1b[2Jdataset"
    ran = cli("inspect", missing, cwd=tmp_path)
    assert ran.returncode == 2 and "\x1b" not in ran.stderr
    assert ran.stderr.count("\n") == 1 and "no\\x1b[2Jdataset: no such dataset" in ran.stderr


# -- the fuzz ------------------------------------------------------------------------------------
def run_fuzz(target: str, tmp_path: Path, *, seed: int, count: int) -> dict:
    source = write_small_dataset(tmp_path / "source")
    before = tree_state(source)
    report = run_json_script(FUZZ_SCRIPT, target, source, tmp_path / "work", "--seed", seed,
                             "--count", count, address_space=READER_ADDRESS_SPACE, timeout=100,
                             peak_rss=1 << 30)
    assert tree_state(source) == before
    assert report["runs"] == count and report["refused"] > count // 4  # the mutations bite
    return report


def test_fuzz_dataset_json(tmp_path):
    """Hundreds of seeded mutations of dataset.json (dropped keys, wrong types, booleans, huge,
    negative and non-finite numbers, path traversal, FIFOs and device links, terminal escapes,
    deep nesting, non-UTF-8 bytes, truncation), each through open_dataset, describe and verify:
    DatasetError with one printable line, or success, and nothing else."""
    report = run_fuzz("json", tmp_path, seed=20240601, count=300)
    assert report["failures"] == []
